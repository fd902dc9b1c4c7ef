"""What every ``ebound`` command shares: its error, options, progress bar and outputs.

A command reads its parsed options, writes its files under ``--out`` only (:func:`out_dir`),
and prints either a human-readable report or, with ``--json``, one JSON document
(:func:`emit`). A user error is a :class:`CLIError`, which ``main`` prints as one line with
exit code 2.
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np

__all__ = [
    "CLIError",
    "Parser",
    "Progress",
    "add_common_options",
    "add_size_options",
    "emit",
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


def add_common_options(parser, json_only=False):
    """``--seed``, ``--out``, ``--json``; ``--device`` and ``--n-jobs`` unless ``json_only``."""
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--out", default="ebound-out", help="output folder (default ebound-out)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    if not json_only:
        parser.add_argument("--device", default="cpu", help="torch device, e.g. cuda")
        parser.add_argument("--n-jobs", type=int, default=None, help="parallel jobs")


def add_size_options(parser, n_samples, n_tokens, n_features, rank, noise):
    """The sizes of a planted task, with their defaults."""
    parser.add_argument("--n-samples", type=positive_int, default=n_samples)
    parser.add_argument("--n-tokens", type=positive_int, default=n_tokens)
    parser.add_argument("--n-features", type=positive_int, default=n_features)
    parser.add_argument("--rank", type=int, default=rank, help="planted rank")
    parser.add_argument("--noise", type=non_negative_float, default=noise)


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
