"""What every ``ebound`` command shares: its error, options, progress bar and outputs.

A command reads its parsed options, writes its files under ``--out`` only (:func:`out_dir`),
and prints either a human-readable report or, with ``--json``, one JSON document
(:func:`emit`). A user error is a :class:`CLIError`, which ``main`` prints as one line with
exit code 2.
"""

import argparse
import json
import math
import sys
import textwrap
from pathlib import Path

import numpy as np

__all__ = [
    "CLIError",
    "Parser",
    "Progress",
    "ProgressLines",
    "add_common_options",
    "add_size_options",
    "emit",
    "empty_columns",
    "format_table",
    "non_negative_float",
    "out_dir",
    "positive_int",
    "pyplot",
    "save_figure",
    "set_threads",
    "write_json",
    "write_table",
]


class CLIError(ValueError):
    """A user error: printed as one line, exit code 2.

    A subclass of :class:`ValueError`, so that code calling a command function directly can
    catch it as the value error it is.
    """


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (and exit code 2), without the usage."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


class Progress:
    """A one-line progress bar on stderr, shown only when stderr is a terminal.

    Parameters
    ----------
    label : str
        Text before the bar.
    enabled : bool, default=None
        Draw the bar; ``None`` draws it when stderr is a terminal.
    """

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


class ProgressLines:
    """One flushed line on stderr per finished step, shown only when stderr is *not* a terminal.

    What a log file of a long run needs instead of :class:`Progress`'s bar: it is called
    with the ``info`` dict of a step (``done``, ``total``, ``seconds``; ``layer`` and
    ``resumed`` as :func:`~sklearn_ebound.heads.head_deficiency`'s ``on_layer`` gives them).

    Parameters
    ----------
    label : str
        Text before each line.
    enabled : bool, default=None
        Print the lines; ``None`` prints them when stderr is not a terminal.
    """

    def __init__(self, label, enabled=None):
        self.label = label
        self.enabled = not sys.stderr.isatty() if enabled is None else enabled
        self.elapsed = 0.0

    def __call__(self, info):
        self.elapsed += info["seconds"]
        if not self.enabled:
            return
        step = f"layer {info['layer']}" if "layer" in info else "step"
        how = ("kept from an earlier run" if info.get("resumed")
               else f"done in {info['seconds']:.1f} s")
        sys.stderr.write(f"{self.label}: {step} {how} ({info['done']}/{info['total']}, "
                         f"{self.elapsed:.0f} s in all)\n")
        sys.stderr.flush()


# --- options ---------------------------------------------------------------------------------


def positive_int(text):
    """An argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def non_negative_float(text):
    """An argparse type: a finite number >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not np.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return value


def add_common_options(parser, json_only=False, out="ebound-out", out_help=None):
    """``--seed``, ``--out``, ``--json``; ``--device`` and ``--n-jobs`` unless ``json_only``.

    ``out`` is the default folder (None: write nothing unless ``--out`` is given) and
    ``out_help`` the option's help text, which should quote the default.
    """
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    parser.add_argument("--out", default=out, metavar="DIR",
                        help=out_help or "output folder (default: %(default)s)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON document instead of the report")
    if not json_only:
        parser.add_argument("--device", default="cpu",
                            help="torch device, e.g. cuda (default: %(default)s)")
        parser.add_argument("--n-jobs", type=int, default=None,
                            help="parallel jobs, -1 for every core (default: one)")


def add_size_options(parser, n_samples, n_tokens, n_features, rank, noise):
    """The sizes of a planted task, with their defaults."""
    parser.add_argument("--n-samples", type=positive_int, default=n_samples,
                        help="sequences (samples) of the task (default: %(default)s)")
    parser.add_argument("--n-tokens", type=positive_int, default=n_tokens,
                        help="tokens per sequence (default: %(default)s)")
    parser.add_argument("--n-features", type=positive_int, default=n_features,
                        help="channels (features) per token (default: %(default)s)")
    parser.add_argument("--rank", type=int, default=rank,
                        help="planted rank r* (default: %(default)s)")
    parser.add_argument("--noise", type=non_negative_float, default=noise,
                        help="noise standard deviation (default: %(default)s)")


def set_threads():
    """One torch intra-op thread: small torch problems run fastest so on a shared CPU."""
    import torch

    torch.set_num_threads(1)


# --- outputs ---------------------------------------------------------------------------------


def out_dir(args):
    """The ``--out`` folder, created if needed."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    return out


def write_json(path, payload):
    """Write ``payload`` to ``path`` as indented JSON."""
    path.write_text(json.dumps(payload, indent=2))


def write_table(result, out, name):
    """Write a result table as ``NAME.json`` and ``NAME.csv`` under ``out``; returns the paths."""
    paths = [out / f"{name}.json", out / f"{name}.csv"]
    result.to_json(paths[0])
    result.to_csv(paths[1])
    return paths


def emit(args, payload, text):
    """Print ``payload`` as JSON with ``--json``, else the report ``text``."""
    print(json.dumps(payload, indent=2) if args.json else text)


def _cell(value, floatfmt):
    """One table cell as text: ``-`` for a missing value (None or NaN)."""
    if isinstance(value, (list, tuple, np.ndarray)):
        values = [format(float(v), ".3g") for v in np.ravel(value)]
        return " ".join(values[:4]) + (" ..." if len(values) > 4 else "")
    if value is None or (isinstance(value, (float, np.floating)) and math.isnan(value)):
        return "-"
    if isinstance(value, (float, np.floating)) and not math.isinf(value):
        return format(float(value), floatfmt)
    return str(value)


def empty_columns(rows):
    """The columns of ``rows`` (dicts) that are missing (None or NaN) in every row."""
    columns = list(rows[0]) if rows else []
    return [c for c in columns if all(_cell(row[c], "g") == "-" for row in rows)]


def format_table(rows, columns=None, *, headers=None, wrap=None, floatfmt=".4g"):
    """The ``columns`` of ``rows`` (dicts) as a fixed-width text table for a terminal.

    Parameters
    ----------
    rows : list of dict
        The table, one dict per row.
    columns : list of str, default=None
        The columns shown, in order; ``None`` shows every column of the first row.
    headers : dict, default=None
        ``{column: header}`` for shorter headers than the column names.
    wrap : dict, default=None
        ``{column: width}``: text longer than ``width`` is wrapped onto further lines.
    floatfmt : str, default=".4g"
        Format of the numbers.
    """
    columns = list(rows[0]) if columns is None and rows else list(columns or [])
    headers, wrap = headers or {}, wrap or {}
    names = [headers.get(c, c) for c in columns]
    # Text columns are aligned left, numbers right.
    text = [all(isinstance(row[c], str) for row in rows) for c in columns]
    cells = [[(textwrap.wrap(_cell(row[c], floatfmt), wrap[c]) or ["-"]) if c in wrap
              else [_cell(row[c], floatfmt)] for c in columns] for row in rows]
    widths = [max([len(n)] + [len(line) for r in cells for line in r[i]])
              for i, n in enumerate(names)]

    def line(values):
        return "  ".join(v.ljust(w) if left else v.rjust(w)
                         for v, w, left in zip(values, widths, text, strict=True)).rstrip()

    lines = [line(names)]
    for r in cells:
        for k in range(max(len(c) for c in r)):
            lines.append(line([c[k] if k < len(c) else "" for c in r]))
    return "\n".join(lines)


def pyplot():
    """``matplotlib.pyplot`` on the file-only Agg backend, or None without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(figure, path, dpi=120):
    """Save ``figure`` to ``path`` (tight bounding box) and close it; returns ``path``."""
    import matplotlib.pyplot as plt

    figure.savefig(path, dpi=dpi, bbox_inches="tight")
    plt.close(figure)
    return path
