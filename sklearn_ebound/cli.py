"""The ``ebound`` command line: the Entropic Bound on a planted task or on your own data.

Every command prints a human-readable report, or one JSON document with ``--json``; files go
to ``--out`` only. Errors end with a one-line message and a non-zero exit code.
"""

import argparse
import json
import sys
import warnings
from pathlib import Path

import numpy as np

__all__ = ["main"]


class CLIError(Exception):
    """A user error: printed as one line, exit code 2."""


class _Progress:
    """A one-line progress bar on stderr, shown only when stderr is a terminal."""

    def __init__(self, label, enabled=None):
        self.label = label
        self.enabled = sys.stderr.isatty() if enabled is None else enabled

    def __call__(self, done, total):
        if not self.enabled:
            return
        width = 30
        filled = int(width * done / max(total, 1))
        sys.stderr.write(f"\r{self.label} [{'#' * filled}{' ' * (width - filled)}] "
                         f"{done}/{total}")
        if done >= total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def _out_dir(args):
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    return out


def _write_json(path, payload):
    path.write_text(json.dumps(payload, indent=2))


def _emit(args, payload, text):
    print(json.dumps(payload, indent=2) if args.json else text)


def _set_threads():
    # Small torch problems run fastest on one intra-op thread on a shared CPU.
    import torch

    torch.set_num_threads(1)


def _save_sweep_png(result, path, title):
    """Draw the deficiency curve; returns the path, or None when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        from .display import RankSweepDisplay
    except ImportError:
        return None
    display = RankSweepDisplay.from_result(result)
    display.ax_.set_title(title)
    display.figure_.savefig(path, dpi=120, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(display.figure_)
    return path


# --- demo ------------------------------------------------------------------------------------


def _demo(args):
    from . import IntrinsicRankEstimator
    from .datasets import make_attention_task
    from .experiments import rank_sweep
    from .nn import LowRankAttentionRegressor

    _set_threads()
    progress = _Progress("demo: estimate, sweep, train")
    progress(0, 3)
    r_star = args.rank
    X, Y, params = make_attention_task(
        "softmax", args.n_samples, args.n_tokens, args.n_features, rank=r_star,
        logit_scale=args.logit_scale, value="random", noise=args.noise, random_state=args.seed,
        return_params=True,
    )
    lines = [f"Planted softmax-attention task: N={args.n_samples} sequences, n={args.n_tokens} "
             f"tokens, d={args.n_features} channels, rank(W_Q W_K^T)={r_star}, "
             f"logit scale {args.logit_scale}, noise {args.noise}"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        native = IntrinsicRankEstimator("attention").fit(X, Y).rank_
        static = IntrinsicRankEstimator("static").fit(X, Y).rank_
    lines.append(f"Data-only attention-native r* (before training, value map unknown): {native}")
    lines.append(f"Naive static token-mixing rank (the failing transfer): {static} of "
                 f"{args.n_tokens}")
    training = {"attention": "softmax", "logit_scale": args.logit_scale, "lr": 0.05,
                "max_epochs": args.max_epochs, "batch_size": -1, "device": args.device,
                "random_state": args.seed}
    progress(1, 3)
    ranks = range(1, args.n_features + 1)
    sweep = rank_sweep(LowRankAttentionRegressor(**training), X, Y, ranks, cv=3,
                       n_jobs=args.n_jobs, noise_floor=params.noise_floor)
    lines.append("Rank sweep of LowRankAttentionRegressor (3-fold held-out risk per token):")
    lines.append(sweep.format())
    lines.append(f"Knee of the sweep: rank {sweep.knee} (noise floor {params.noise_floor:.4g})")
    progress(2, 3)
    recovered = LowRankAttentionRegressor(**training, init_scale=1e-2).fit(X, Y)
    progress(3, 3)
    lines.append(f"Gradient descent at full width (k = d = {args.n_features}) from a small "
                 f"initialisation: energy rank of the learned W_Q W_K^T = "
                 f"{recovered.effective_rank_}")
    agree = native == sweep.knee == recovered.effective_rank_ == r_star
    verdict = (f"Verdict: r* = {native}: data-only estimate, sweep knee and gradient descent "
               f"{'agree with' if agree else 'do not all match'} the planted rank {r_star}.")
    lines.append(verdict)
    out = _out_dir(args)
    payload = {
        "planted_rank": r_star, "data_only_rank": native, "naive_static_rank": static,
        "knee": sweep.knee, "gradient_descent_rank": recovered.effective_rank_,
        "agree": agree, "sweep": sweep.to_dict(),
        "learned_kernel_singular_values": np.linalg.svd(recovered.qk_kernel_,
                                                        compute_uv=False).tolist(),
    }
    _write_json(out / "demo.json", payload)
    png = _save_sweep_png(sweep, out / "deficiency_curve.png",
                          "Deficiency curve of a planted softmax-attention task")
    lines.append(f"Wrote {out / 'demo.json'}" + (f" and {png}" if png else
                                                   " (install matplotlib for the PNG)"))
    _emit(args, payload, "\n".join(lines))
    return 0 if agree else 1


# --- estimate --------------------------------------------------------------------------------


def _load_array(path, name):
    try:
        array = np.load(path, allow_pickle=False, mmap_mode="r")
    except ValueError as exc:
        raise CLIError(f"{path}: cannot read `{name}` without unpickling ({exc}); save it as a "
                       "plain numeric array") from None
    except OSError as exc:
        raise CLIError(f"{path}: not a readable .npy file ({exc})") from None
    return array


def _load_data(args):
    """(X, Y) from .npz, a pair of .npy files or a .csv (2-D data)."""
    path = Path(args.data)
    if not path.is_file():
        raise CLIError(f"{path}: no such file")
    suffix = path.suffix.lower()
    if suffix == ".npz":
        try:
            archive = np.load(path, allow_pickle=False)
        except (ValueError, OSError) as exc:
            raise CLIError(f"{path}: not a readable .npz archive ({exc})") from None
        with archive:
            missing = [k for k in (args.x_name, args.y_name) if k not in archive.files]
            if args.x_name in missing:
                raise CLIError(f"{path}: no array named {args.x_name!r} (has "
                               f"{', '.join(archive.files) or 'none'}); choose it with --x-name")
            try:
                X = archive[args.x_name]
                Y = archive[args.y_name] if args.y_name in archive.files else None
            except ValueError as exc:
                raise CLIError(f"{path}: cannot read without unpickling ({exc})") from None
    elif suffix == ".npy":
        X = _load_array(path, "X")
        Y = _load_array(Path(args.targets), "Y") if args.targets else None
    elif suffix == ".csv":
        try:
            table = np.genfromtxt(path, delimiter=",", names=True, dtype=np.float64)
        except ValueError as exc:
            raise CLIError(f"{path}: not a numeric CSV with a header row ({exc})") from None
        names = list(table.dtype.names or [])
        data = np.column_stack([table[n] for n in names]) if names else np.empty((0, 0))
        if args.n_targets is None or not 0 <= args.n_targets < len(names):
            raise CLIError(f"{path}: say how many of the {len(names)} columns are targets "
                           "with --n-targets K (the last K columns)")
        split = len(names) - args.n_targets
        X, Y = data[:, :split], (data[:, split:] if args.n_targets else None)
    else:
        raise CLIError(f"{path}: unsupported file type {suffix!r}; use .npz, .npy or .csv")
    for name, array in (("X", X), ("Y", Y)):
        if array is not None and array.dtype.kind not in "biuf":
            raise CLIError(f"`{name}` has dtype {array.dtype}; a real numeric array is needed")
    return X, Y


def _stream(estimator, X, Y, chunk_rows):
    """partial_fit over a memory-mapped file, one chunk of rows in memory at a time."""
    if Y is not None and len(Y) != len(X):
        raise CLIError(f"X has {len(X)} samples but Y has {len(Y)}")
    if chunk_rows is None:
        # About 64 MB of float64 per chunk.
        row_values = int(np.prod(X.shape[1:])) + (int(np.prod(Y.shape[1:])) if Y is not None
                                                   else 0)
        chunk_rows = max(1, (64 << 20) // (8 * max(row_values, 1)))
    progress = _Progress("reading")
    for start in range(0, len(X), chunk_rows):
        stop = min(start + chunk_rows, len(X))
        estimator.partial_fit(np.asarray(X[start:stop], dtype=np.float64),
                              None if Y is None else np.asarray(Y[start:stop], dtype=np.float64))
        progress(stop, len(X))


def _estimate(args):
    from . import IntrinsicRankEstimator

    X, Y = _load_data(args)
    estimator = IntrinsicRankEstimator(args.operator, attention=args.attention,
                                       value="identity" if args.value_identity else None,
                                       criterion=args.criterion,
                                       significance=args.significance, tau=args.tau)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if isinstance(X, np.memmap) and args.criterion != "cv":
            _stream(estimator, X, Y, args.chunk_rows)
        else:
            estimator.fit(np.asarray(X, dtype=np.float64),
                          None if Y is None else np.asarray(Y, dtype=np.float64))
        if not hasattr(estimator, "rank_"):
            raise CLIError(f"too few samples ({len(X)}) to read a rank")
    notes = [str(w.message) for w in caught if "sklearn_ebound" in (w.filename or "")
             or w.category.__module__.startswith("sklearn_ebound")]
    payload = {
        "rank": estimator.rank_, "operator": args.operator, "criterion": args.criterion,
        "shape_X": list(np.shape(X)), "shape_Y": None if Y is None else list(np.shape(Y)),
        "singular_values": np.asarray(estimator.singular_values_).tolist(),
        "threshold": estimator.threshold_, "warnings": notes,
    }
    text = [f"Intrinsic rank r* = {estimator.rank_}  (operator={args.operator}, "
            f"criterion={args.criterion}, X {np.shape(X)}"
            + ("" if Y is None else f", Y {np.shape(Y)}") + ")"]
    spectrum = np.asarray(estimator.singular_values_)[:12]
    text.append("Spectrum: " + " ".join(f"{v:.4g}" for v in spectrum)
                + (" ..." if len(estimator.singular_values_) > 12 else ""))
    if estimator.threshold_ is not None:
        text.append(f"Threshold: {estimator.threshold_:.4g}")
    text += [f"Warning: {n}" for n in notes]
    _emit(args, payload, "\n".join(text))
    return 0


# --- experiments -----------------------------------------------------------------------------


def _report_table(args, result, name, title, summary=None, extra_files=()):
    """Write ``NAME.json`` and ``NAME.csv`` under ``--out`` and print the table (or JSON)."""
    out = _out_dir(args)
    files = [out / f"{name}.json", out / f"{name}.csv", *extra_files]
    result.to_json(files[0])
    result.to_csv(files[1])
    lines = [title, result.format()] + ([summary] if summary else [])
    lines.append("Wrote " + ", ".join(str(f) for f in files))
    _emit(args, result.to_dict(), "\n".join(lines))
    return 0


def _sweep(args):
    from . import ReducedRankRegressor
    from .datasets import make_attention_task, make_static_task
    from .experiments import rank_sweep

    if args.kind == "static":
        X, Y, params = make_static_task(args.n_samples, args.n_features, rank=args.rank,
                                        noise=args.noise, decay=0.8, random_state=args.seed,
                                        return_params=True)
        estimator = ReducedRankRegressor()
        ranks = range(0, args.n_features + 1)
        bound = params.singular_values
    else:
        from .nn import LowRankAttentionRegressor

        _set_threads()
        X, Y, params = make_attention_task(args.kind, args.n_samples, args.n_tokens,
                                           args.n_features, rank=args.rank, noise=args.noise,
                                           value="random", random_state=args.seed,
                                           return_params=True)
        estimator = LowRankAttentionRegressor(attention=args.kind, lr=0.05,
                                              max_epochs=args.max_epochs, batch_size=-1,
                                              device=args.device, random_state=args.seed)
        ranks = range(1, args.n_features + 1)
        bound = None
    result = rank_sweep(estimator, X, Y, ranks, cv=args.cv, n_jobs=args.n_jobs,
                        noise_floor=params.noise_floor, singular_values=bound)
    png = _save_sweep_png(result, _out_dir(args) / "sweep.png", f"Rank sweep, {args.kind} task")
    return _report_table(args, result, "sweep",
                         f"Rank sweep on a planted {args.kind} task of rank {args.rank}",
                         f"Knee: rank {result.knee}", [png] if png else [])


def _ladder(args):
    from .experiments import interpolation_ladder

    result = interpolation_ladder(n_samples=args.n_samples, n_tokens=args.n_tokens,
                                  n_features=args.n_features, rank=args.rank,
                                  logit_scales=args.logit_scales, noise=args.noise,
                                  random_state=args.seed)
    return _report_table(args, result, "ladder",
                         f"Interpolation ladder, planted rank {args.rank}")


def _frontier(args):
    from .experiments import predictability_frontier

    result = predictability_frontier(
        logit_scales=args.logit_scales, n_tokens=args.n_tokens, n_samples=args.n_samples,
        n_features=args.n_features, rank=args.rank, n_repeats=args.repeats,
        noises=(args.noise,), random_state=args.seed, progress=_Progress("frontier"))
    return _report_table(args, result, "frontier",
                         "Predictability frontier (recovery rate of the data-only rank)")


# --- parser ----------------------------------------------------------------------------------


def _positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _non_negative_float(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not np.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return value


def _common(parser, json_only=False):
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--out", default="ebound-out", help="output folder (default ebound-out)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    if not json_only:
        parser.add_argument("--device", default="cpu", help="torch device, e.g. cuda")
        parser.add_argument("--n-jobs", type=int, default=None, help="parallel jobs")


def _sizes(parser, n_samples, n_tokens, n_features, rank, noise):
    parser.add_argument("--n-samples", type=_positive_int, default=n_samples)
    parser.add_argument("--n-tokens", type=_positive_int, default=n_tokens)
    parser.add_argument("--n-features", type=_positive_int, default=n_features)
    parser.add_argument("--rank", type=int, default=rank, help="planted rank")
    parser.add_argument("--noise", type=_non_negative_float, default=noise)


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        # One line and exit code 2, as argparse does, but without the usage block.
        self.exit(2, f"{self.prog}: error: {message}\n")


def _parser():
    parser = _Parser(
        prog="ebound",
        description="The Entropic Bound: the smallest rank a model needs to solve a task.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    demo = commands.add_parser(
        "demo", help="the whole argument on a built-in planted softmax-attention task",
        description="Plant a softmax-attention task of known query-key rank; read r* from the "
                    "data before training; show the naive static reading failing; sweep the "
                    "model rank; train at full width and read the learned rank; print a "
                    "verdict. Writes demo.json and deficiency_curve.png to --out.")
    _sizes(demo, 512, 32, 6, 2, 0.1)
    demo.add_argument("--logit-scale", type=_non_negative_float, default=2.0)
    demo.add_argument("--max-epochs", type=_positive_int, default=150)
    _common(demo)
    demo.set_defaults(run=_demo)

    estimate = commands.add_parser(
        "estimate", help="the intrinsic rank of your own data",
        description="Read r* from your data: DATA is an .npz with arrays X and Y (names set by "
                    "--x-name/--y-name), an .npy of X with --targets Y.npy (memory-mapped and "
                    "read in chunks, so files larger than memory work), or a .csv with a "
                    "header whose last --n-targets columns are the targets. 3-D arrays are "
                    "sequences (n_samples, n_tokens, n_channels). Files are read without "
                    "unpickling.")
    estimate.add_argument("data", help="path to .npz, .npy or .csv")
    estimate.add_argument("--targets", help="Y as .npy, when DATA is an .npy of X")
    estimate.add_argument("--x-name", default="X")
    estimate.add_argument("--y-name", default="Y")
    estimate.add_argument("--n-targets", type=int, help="CSV: the last K columns are targets")
    estimate.add_argument("--operator", choices=["static", "attention"], default="static")
    estimate.add_argument("--attention", choices=["softmax", "linear"], default="softmax")
    estimate.add_argument("--value-identity", action="store_true",
                          help="attention: the value map is known to be the identity")
    estimate.add_argument("--criterion", choices=["threshold", "rsc", "cv", "energy"],
                          default="threshold")
    estimate.add_argument("--significance", type=float, default=1e-3,
                          help="threshold: false-positive rate of each test, in [1e-12, 0.5)")
    estimate.add_argument("--tau", type=float, default=0.99, help="energy level")
    estimate.add_argument("--chunk-rows", type=_positive_int, default=None,
                          help=".npy input is memory-mapped and read this many rows at a time "
                               "(default: about 64 MB per chunk)")
    _common(estimate, json_only=True)
    estimate.set_defaults(run=_estimate)

    sweep = commands.add_parser(
        "sweep", help="rank sweep (deficiency curve) on a planted task",
        description="Held-out risk of the best rank-r model for every r, with the knee.")
    sweep.add_argument("--kind", choices=["static", "linear", "softmax"], default="static")
    _sizes(sweep, 2000, 16, 8, 3, 0.3)
    sweep.add_argument("--cv", type=_positive_int, default=3)
    sweep.add_argument("--max-epochs", type=_positive_int, default=150)
    _common(sweep)
    sweep.set_defaults(run=_sweep)

    ladder = commands.add_parser(
        "ladder", help="the interpolation ladder, rung by rung",
        description="From static linear mixing to softmax attention, one property at a time.")
    _sizes(ladder, 2000, 16, 4, 3, 0.05)
    ladder.add_argument("--logit-scales", type=_non_negative_float, nargs="+",
                        default=[0.5, 1.0, 2.0, 4.0])
    _common(ladder, json_only=True)
    ladder.set_defaults(run=_ladder)

    frontier = commands.add_parser(
        "frontier", help="the predictability frontier of the data-only rank",
        description="Recovery rate of the data-only attention-native rank over logit scale, "
                    "sequence length, value-map conditioning and noise.")
    frontier.add_argument("--n-samples", type=_positive_int, default=300)
    frontier.add_argument("--n-tokens", type=_positive_int, nargs="+", default=[16, 64])
    frontier.add_argument("--n-features", type=_positive_int, default=6)
    frontier.add_argument("--rank", type=int, default=2)
    frontier.add_argument("--noise", type=_non_negative_float, default=0.1)
    frontier.add_argument("--logit-scales", type=_non_negative_float, nargs="+",
                          default=[0.5, 1.0, 2.0, 4.0, 8.0])
    frontier.add_argument("--repeats", type=_positive_int, default=5)
    _common(frontier, json_only=True)
    frontier.set_defaults(run=_frontier)

    from .heads._cli import add_heads_parser

    add_heads_parser(commands)
    return parser


def main(argv=None):
    """Entry point of ``ebound``; returns the exit code."""
    args = _parser().parse_args(argv)
    try:
        return args.run(args)
    except (CLIError, ValueError, TypeError) as exc:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"ebound: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ebound: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
