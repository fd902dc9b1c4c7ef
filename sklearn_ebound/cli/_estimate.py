"""``ebound estimate DATA``: the intrinsic rank of your own data, read without unpickling."""

import textwrap
import warnings
from pathlib import Path

import numpy as np

from ._core import (
    CLIError,
    Progress,
    add_common_options,
    emit,
    out_dir,
    positive_int,
    pyplot,
    save_figure,
    write_json,
)

__all__ = ["add_estimate_parser", "estimate_command", "load_data", "load_groups"]


def add_estimate_parser(commands):
    """Add the ``estimate`` command to the ``ebound`` sub-command parsers; returns its parser."""
    parser = commands.add_parser(
        "estimate", help="the intrinsic rank of your own data",
        description="Read r* from your data: DATA is an .npz with arrays X and Y (names set by "
                    "--x-name/--y-name), an .npy of X with --targets Y.npy (memory-mapped and "
                    "read in chunks, so files larger than memory work), or a .csv with a "
                    "header whose last --n-targets columns are the targets. 3-D arrays are "
                    "sequences (n_samples, n_tokens, n_channels): their rank is read "
                    "attention-natively, the naive static token-mixing rank printed beside. "
                    "Without targets it reads the rank of X alone. Nothing is unpickled.")
    parser.add_argument("data", help="path to .npz, .npy or .csv")
    parser.add_argument("--targets", metavar="Y.npy",
                        help="Y, for an .npy DATA (default: none: the rank of X)")
    parser.add_argument("--x-name", default="X", metavar="NAME",
                        help="X's name in an .npz (default: %(default)s)")
    parser.add_argument("--y-name", default="Y", metavar="NAME",
                        help="Y's name in an .npz (default: %(default)s)")
    parser.add_argument("--n-targets", type=int, metavar="K",
                        help="CSV: the last K columns are targets (default: none: the rank "
                             "of X)")
    parser.add_argument("--groups", metavar="G",
                        help="labels per sample: a .npy/.csv file, an .npz array or a "
                             ".csv column (no default)")
    parser.add_argument("--operator", choices=["auto", "static", "attention"], default="auto",
                        help="auto: static for 2-D data, attention for 3-D sequences "
                             "(default: %(default)s)")
    parser.add_argument("--attention", choices=["softmax", "linear"], default="softmax",
                        help="attention class (default: %(default)s)")
    parser.add_argument("--value-identity", action="store_true",
                        help="attention: the value map is known to be the identity")
    parser.add_argument("--criterion", choices=["threshold", "rsc", "cv", "energy"],
                        default="threshold", help="how r* is read (default: %(default)s)")
    parser.add_argument("--significance", type=float, default=1e-3, metavar="ALPHA",
                        help="threshold: false-positive rate of each test, in [1e-12, 0.5) "
                             "(default: %(default)s)")
    parser.add_argument("--tau", type=float, default=0.99,
                        help="energy level, in (0, 1] (default: %(default)s)")
    parser.add_argument("--chunk-rows", type=positive_int, default=None, metavar="ROWS",
                        help="rows per read of an .npy (default: 64 MB of them)")
    add_common_options(parser, json_only=True, out=None,
                       out_help="write estimate.json, spectrum.png here (default: none)")
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
        if _groups_column(args, names) is not None:
            names.remove(args.groups)  # the groups' column is neither input nor target
        data = np.column_stack([table[n] for n in names]) if names else np.empty((0, 0))
        # Without --n-targets no column is a target, as an .npz without Y or an .npy without
        # --targets: the rank of X alone.
        n_targets = 0 if args.n_targets is None else args.n_targets
        if not 0 <= n_targets < len(names):
            raise CLIError(f"{path}: --n-targets K must be at least 0 and less than the "
                           f"{len(names)} columns, so that at least one input column is left. "
                           f"Got {n_targets}.")
        split = len(names) - n_targets
        X, Y = data[:, :split], (data[:, split:] if n_targets else None)
    else:
        raise CLIError(f"{path}: unsupported file type {suffix!r}; use .npz, .npy or .csv")
    for name, array in (("X", X), ("Y", Y)):
        if array is not None and array.dtype.kind not in "biuf":
            raise CLIError(f"`{name}` has dtype {array.dtype}; a real numeric array is needed")
    return X, Y


def _groups_column(args, names):
    """The ``--groups`` column among a CSV's column ``names`` (``None`` when it is a file)."""
    groups = getattr(args, "groups", None)
    if groups is None or groups not in names or Path(groups).suffix.lower() in (".npy", ".csv"):
        return None
    return groups


def _labels(array, source):
    """Group labels as a 1-D array (numbers or strings), or a one-line error."""
    array = np.asarray(array)
    if array.ndim == 2 and array.shape[1] == 1:
        array = array[:, 0]
    if array.ndim != 1 or array.dtype.kind not in "biufUS":
        raise CLIError(f"{source}: group labels must be one number or string per sample; got "
                       f"an array of shape {array.shape} and dtype {array.dtype}")
    return array


def load_groups(args, n_samples):
    """The ``--groups`` labels, one per sample (``None`` without the option).

    A path ending in .npy (read without unpickling) or .csv (one column, with a header) is
    read from that file; otherwise ``--groups`` names an array of the .npz DATA or a column
    of the .csv DATA.
    """
    source = getattr(args, "groups", None)
    if source is None:
        return None
    data, path = Path(args.data), Path(source)
    suffix = path.suffix.lower()
    if suffix in (".npy", ".csv"):
        if not path.is_file():
            raise CLIError(f"{path}: no such file (--groups)")
        if suffix == ".npy":
            groups = _load_array(path, "groups")
        else:
            try:
                table = np.genfromtxt(path, delimiter=",", names=True, dtype=None,
                                      encoding="utf-8")
            except ValueError as exc:
                raise CLIError(f"{path}: not a CSV of group labels with a header row "
                               f"({exc})") from None
            names = table.dtype.names or ()
            if len(names) != 1:
                raise CLIError(f"{path}: a groups CSV has one column of labels; got "
                               f"{len(names)} columns")
            groups = np.atleast_1d(table[names[0]])
    elif data.suffix.lower() == ".npz":
        with np.load(data, allow_pickle=False) as archive:
            if source not in archive.files:
                raise CLIError(f"{data}: no array named {source!r} for --groups (has "
                               f"{', '.join(archive.files)}); or give a .npy or .csv file")
            try:
                groups = archive[source]
            except ValueError as exc:
                raise CLIError(f"{data}: cannot read without unpickling ({exc})") from None
    elif data.suffix.lower() == ".csv":
        table = np.genfromtxt(data, delimiter=",", names=True, dtype=None, encoding="utf-8")
        if source not in (table.dtype.names or ()):
            raise CLIError(f"{data}: no column named {source!r} for --groups; or give a .npy "
                           "or .csv file")
        groups = table[source]
    else:
        raise CLIError(f"--groups {source!r}: give a .npy or .csv file of group labels")
    groups = _labels(groups, path if suffix in (".npy", ".csv") else data)
    if len(groups) != n_samples:
        raise CLIError(f"--groups has {len(groups)} labels but X has {n_samples} samples; "
                       "one label per sample is needed")
    return np.asarray(groups)


def _chunk_rows(X, Y, chunk_rows):
    """Rows per chunk: ``chunk_rows``, or about 64 MB of float64."""
    if chunk_rows is not None:
        return chunk_rows
    row_values = int(np.prod(X.shape[1:])) + (int(np.prod(Y.shape[1:])) if Y is not None else 0)
    return max(1, (64 << 20) // (8 * max(row_values, 1)))


def _fit(estimators, X, Y, stream, chunk_rows, groups=None):
    """Fit every estimator on ``(X, Y)`` (with the samples' ``groups``), in one pass over the
    data.

    ``stream``: partial_fit over a memory-mapped file, one chunk of rows in memory at a time,
    each chunk given to every estimator in turn. Returns, per estimator, the warnings it
    raised and the error that stopped it (None when it was fitted); the first estimator's
    error is raised.
    """
    caught = [[] for _ in estimators]
    errors = [None for _ in estimators]

    def feed(i, method, *data, **kwargs):
        if errors[i] is not None:
            return
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            try:
                method(*data, **kwargs)
            except ValueError as exc:
                if i == 0:
                    raise
                errors[i] = exc
        caught[i] += seen

    if not stream:
        X = np.asarray(X, dtype=np.float64)
        Y = None if Y is None else np.asarray(Y, dtype=np.float64)
        for i, estimator in enumerate(estimators):
            feed(i, estimator.fit, X, Y, groups=groups)
        return caught, errors
    if Y is not None and len(Y) != len(X):
        raise CLIError(f"X has {len(X)} samples but Y has {len(Y)}")
    rows = _chunk_rows(X, Y, chunk_rows)
    progress = Progress("reading")
    for start in range(0, len(X), rows):
        stop = min(start + rows, len(X))
        X_chunk = np.asarray(X[start:stop], dtype=np.float64)
        Y_chunk = None if Y is None else np.asarray(Y[start:stop], dtype=np.float64)
        groups_chunk = None if groups is None else groups[start:stop]
        for i, estimator in enumerate(estimators):
            feed(i, estimator.partial_fit, X_chunk, Y_chunk, groups=groups_chunk)
        progress(stop, len(X))
    for i, estimator in enumerate(estimators):
        # partial_fit solves when a fitted attribute is first read: read it here, so that the
        # reading's warnings are caught with the estimator's others.
        feed(i, getattr, estimator, "rank_", None)
    return caught, errors


def _own_warnings(caught):
    """The package's own warning messages among ``caught``, each once, in order."""
    notes = [str(w.message) for w in caught if "sklearn_ebound" in (w.filename or "")
             or w.category.__module__.startswith("sklearn_ebound")]
    return list(dict.fromkeys(notes))


def _headline(args, operator, X, Y, rank):
    """The first lines of the report: what was read, from what."""
    data = (f"Data: X {np.shape(X)}" + ("" if Y is None else f", Y {np.shape(Y)}")
            + f"; criterion {args.criterion}")
    if Y is None:
        return [f"Rank of X alone r* = {rank}  (no targets given)", data,
                "No targets given: this is the rank of X alone (the spectrum of X), not the "
                "rank of a task. Give the targets with --targets Y.npy, as Y in the .npz, or "
                "with --n-targets K for a .csv."]
    if np.ndim(X) != 3:
        return [f"Intrinsic rank r* = {rank}  (static operator Y ~ X B)", data]
    if operator == "static":
        return [f"Naive static token-mixing rank = {rank}  (operator static on sequences)", data,
                "On sequences the static reading is the naive static transfer, one "
                "token-mixing matrix for all sequences, whose rank does not describe "
                "attention; --operator auto reads the attention-native rank."]
    value = "identity value map" if args.value_identity else "value map unknown"
    return [f"Intrinsic rank r* = {rank}  (attention-native: {args.attention} attention, "
            f"{value})", data]


def _how_sure(estimator):
    """How sure the rank is, for the JSON: the calibration, the interval of ranks consistent
    with the data (among directions at least ``interval_strength`` times the detection limit),
    the p-values and the detection limit (where the estimator has them)."""
    if not hasattr(estimator, "rank_interval_"):
        return {}
    return {"noise_model": estimator.noise_model_,
            "rank_interval": list(estimator.rank_interval_),
            "p_values": np.asarray(estimator.p_values_).tolist(),
            "detection_limit": estimator.detection_limit_,
            "failed_assumptions": list(getattr(estimator, "diagnostics_", {}).get("failed", ()))}


def _how_sure_lines(estimator, significance):
    if not hasattr(estimator, "rank_interval_"):
        return []
    low, high = estimator.rank_interval_
    told = (f"{low}" if low == high else f"{low}..{high}")
    strength = getattr(estimator, "interval_strength", 0)
    return [f"Ranks consistent with the data among directions at least {strength:g} times the "
            f"detection limit (significance {significance:g}): {told}",
            f"Detection limit: {estimator.detection_limit_:.4g} (a direction weaker than this "
            "is invisible in these data)",
            f"Noise model: {estimator.noise_model_}"]


def _save(args, payload, estimator):
    """``estimate.json`` and, with matplotlib, ``spectrum.png`` under ``--out``; the paths."""
    out = out_dir(args)
    paths = [out / "estimate.json"]
    if pyplot() is not None:
        from ..display import SpectrumDisplay

        display = SpectrumDisplay.from_estimator(estimator)
        display.ax_.set_title(f"Spectrum of {Path(args.data).name}: r* = {estimator.rank_}")
        paths.append(save_figure(display.figure_, out / "spectrum.png"))
    payload["files"] = [str(p) for p in paths]
    write_json(paths[0], payload)
    return paths


def _estimators(args, operator, sequences):
    """The estimator of the reading asked for and, on sequences read by attention, the naive
    static transfer beside it."""
    from .. import IntrinsicRankEstimator

    settings = {"criterion": args.criterion, "significance": args.significance,
                "tau": args.tau}
    estimators = [IntrinsicRankEstimator(args.operator, attention=args.attention,
                                         value="identity" if args.value_identity else None,
                                         **settings)]
    if sequences and operator == "attention":
        # Beside the attention-native rank, the naive static transfer's (the failing reading).
        estimators.append(IntrinsicRankEstimator("static", **settings))
    return estimators


def _naive_static_line(naive, error, X):
    """The report's line on the naive static transfer fitted beside attention (``error``: what
    its fit raised, or None)."""
    if error is None and hasattr(naive, "rank_"):
        return (f"Naive static token-mixing rank: {naive.rank_} of {np.shape(X)[1]} "
                "(the naive static transfer, one token-mixing matrix for all "
                "sequences, shown for comparison: it does not describe attention)")
    reason = str(error) if error is not None else "too few samples"
    return f"Naive static token-mixing rank: not read ({reason})"


def _spectrum_lines(estimator):
    """The leading singular values and the threshold the rank was read against."""
    spectrum = np.asarray(estimator.singular_values_)[:12]
    lines = ["Spectrum: " + " ".join(f"{v:.4g}" for v in spectrum)
             + (" ..." if len(estimator.singular_values_) > 12 else "")]
    if estimator.threshold_ is not None:
        lines.append(f"Threshold: {estimator.threshold_:.4g}")
    return lines


def estimate_command(args):
    """Run ``ebound estimate`` on parsed arguments; returns the exit code."""
    X, Y = load_data(args)
    groups = load_groups(args, len(X))
    sequences = np.ndim(X) == 3
    if sequences and Y is None:
        raise CLIError("3-D X holds sequences, whose rank is read with the target sequences Y: "
                       "give them with --targets Y.npy, or as Y in the .npz")
    operator = args.operator
    if operator == "auto":  # as the estimator resolves it
        operator = "attention" if sequences else "static"
    estimators = _estimators(args, operator, sequences)
    stream = isinstance(X, np.memmap) and args.criterion != "cv"
    caught, errors = _fit(estimators, X, Y, stream, args.chunk_rows, groups)
    estimator = estimators[0]
    if not hasattr(estimator, "rank_"):
        raise CLIError(f"too few samples ({len(X)}) to read a rank")
    notes = _own_warnings(caught[0])
    payload = {
        "rank": estimator.rank_, "operator": operator, "criterion": args.criterion,
        "targets": Y is not None,
        "shape_X": list(np.shape(X)), "shape_Y": None if Y is None else list(np.shape(Y)),
        "singular_values": np.asarray(estimator.singular_values_).tolist(),
        "threshold": estimator.threshold_, "warnings": notes,
        "n_groups": None if groups is None else int(np.unique(groups).size),
        **_how_sure(estimator),
    }
    text = _headline(args, operator, X, Y, estimator.rank_)
    if groups is not None:
        text.append(f"Groups: {payload['n_groups']} (--groups {args.groups}; the residual "
                    "diagnostics test the dependence within them)")
    if len(estimators) > 1:
        payload["naive_static_rank"] = getattr(estimators[1], "rank_", None)
        text.append(_naive_static_line(estimators[1], errors[1], X))
    text = [line for paragraph in text for line in textwrap.wrap(paragraph, 100)]
    text += _spectrum_lines(estimator)
    text += _how_sure_lines(estimator, args.significance)
    text += [f"Warning: {n}" for n in notes]
    if args.out is not None:
        paths = _save(args, payload, estimator)
        text.append("Wrote " + ", ".join(str(p) for p in paths)
                    + ("" if len(paths) > 1 else " (install matplotlib for the PNG)"))
    emit(args, payload, "\n".join(text))
    return 0
