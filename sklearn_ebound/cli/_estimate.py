"""``ebound estimate DATA``: the intrinsic rank of your own data, read without unpickling."""

import warnings
from pathlib import Path

import numpy as np

from ._core import CLIError, Progress, add_common_options, emit, positive_int

__all__ = ["add_estimate_parser", "estimate_command", "load_data"]


def add_estimate_parser(commands):
    """Add the ``estimate`` command to the ``ebound`` sub-command parsers; returns its parser."""
    parser = commands.add_parser(
        "estimate", help="the intrinsic rank of your own data",
        description="Read r* from your data: DATA is an .npz with arrays X and Y (names set by "
                    "--x-name/--y-name), an .npy of X with --targets Y.npy (memory-mapped and "
                    "read in chunks, so files larger than memory work), or a .csv with a "
                    "header whose last --n-targets columns are the targets. 3-D arrays are "
                    "sequences (n_samples, n_tokens, n_channels). Files are read without "
                    "unpickling.")
    parser.add_argument("data", help="path to .npz, .npy or .csv")
    parser.add_argument("--targets", help="Y as .npy, when DATA is an .npy of X")
    parser.add_argument("--x-name", default="X")
    parser.add_argument("--y-name", default="Y")
    parser.add_argument("--n-targets", type=int, help="CSV: the last K columns are targets")
    parser.add_argument("--operator", choices=["static", "attention"], default="static")
    parser.add_argument("--attention", choices=["softmax", "linear"], default="softmax")
    parser.add_argument("--value-identity", action="store_true",
                        help="attention: the value map is known to be the identity")
    parser.add_argument("--criterion", choices=["threshold", "rsc", "cv", "energy"],
                        default="threshold")
    parser.add_argument("--significance", type=float, default=1e-3,
                        help="threshold: false-positive rate of each test, in [1e-12, 0.5)")
    parser.add_argument("--tau", type=float, default=0.99, help="energy level")
    parser.add_argument("--chunk-rows", type=positive_int, default=None,
                        help=".npy input is memory-mapped and read this many rows at a time "
                             "(default: about 64 MB per chunk)")
    add_common_options(parser, json_only=True)
    parser.set_defaults(run=estimate_command)
    return parser


def _load_array(path, name):
    try:
        array = np.load(path, allow_pickle=False, mmap_mode="r")
    except ValueError as exc:
        raise CLIError(f"{path}: cannot read `{name}` without unpickling ({exc}); save it as a "
                       "plain numeric array") from None
    except OSError as exc:
        raise CLIError(f"{path}: not a readable .npy file ({exc})") from None
    return array


def load_data(args):
    """``(X, Y)`` from an .npz, a pair of .npy files (memory-mapped) or a .csv (2-D data)."""
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
    progress = Progress("reading")
    for start in range(0, len(X), chunk_rows):
        stop = min(start + chunk_rows, len(X))
        estimator.partial_fit(np.asarray(X[start:stop], dtype=np.float64),
                              None if Y is None else np.asarray(Y[start:stop], dtype=np.float64))
        progress(stop, len(X))


def estimate_command(args):
    """Run ``ebound estimate`` on parsed arguments; returns the exit code."""
    from .. import IntrinsicRankEstimator

    X, Y = load_data(args)
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
    emit(args, payload, "\n".join(text))
    return 0
