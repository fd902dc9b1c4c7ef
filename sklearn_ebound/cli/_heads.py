"""``ebound heads``: per-head ranks of the query-key kernel of a saved Hugging Face model.

``ebound heads MODEL_DIR [--text FILE] [--head LAYER.HEAD] [--out DIR] [--json]`` prints the
per-layer summary, and writes under ``--out`` the table as JSON and CSV, a layers x heads heat
map of every rank column and the spectra of one head (PNG, when matplotlib is installed).
"""

import argparse
import warnings
from contextlib import contextmanager
from pathlib import Path

from ._core import CLIError, add_common_options, emit, out_dir, pyplot, save_figure, write_table

__all__ = ["add_heads_parser", "heads_command"]


def _layer_head(text):
    """``"LAYER.HEAD"`` to a pair of non-negative ints (an argparse type)."""
    try:
        layer, head = (int(part) for part in text.split("."))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected LAYER.HEAD such as 3.7, got {text!r}") from None
    if layer < 0 or head < 0:
        raise argparse.ArgumentTypeError(f"LAYER and HEAD must be non-negative, got {text!r}")
    return layer, head


def add_heads_parser(commands):
    """Add the ``heads`` command to the ``ebound`` sub-command parsers; returns its parser."""
    parser = commands.add_parser(
        "heads", help="attention-native rank of every head of a pretrained transformer",
        description="Read the query-key kernel W_Q W_K^T of every head of a Hugging Face model "
                    "saved in MODEL_DIR (config and weights, loaded offline): energy ranks at "
                    "90% and 99%, entropy and stable rank; with --text, the same for the "
                    "logit field the head produces on that text. Writes heads.json, heads.csv, "
                    "one heat map per rank and the spectra of --head to --out.")
    parser.add_argument("model_dir", help="directory of a saved Hugging Face model")
    parser.add_argument("--text", metavar="FILE",
                        help="UTF-8 text file, one sentence or passage per line (default: none, "
                             "the kernels only)")
    parser.add_argument("--head", type=_layer_head, default=(0, 0), metavar="LAYER.HEAD",
                        help="the head whose spectra are plotted (default: 0.0)")
    parser.add_argument("--max-length", type=int, default=128,
                        help="tokens per line at most (default: %(default)s)")
    add_common_options(parser, json_only=True)
    parser.set_defaults(run=heads_command)
    return parser


def _read_text(path):
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise CLIError(f"{path}: cannot read the text file ({exc})") from None
    texts = [line.strip() for line in lines if line.strip()]
    if not texts:
        raise CLIError(f"{path}: the text file has no non-empty line")
    return texts


def _save_pngs(result, out, layer, head):
    """Heat maps of every rank column and the spectra of one head; [] without matplotlib."""
    plt = pyplot()
    if plt is None:
        return []
    from ..display import HeadRankDisplay, HeadSpectrumDisplay

    paths = []
    for column in [c for c in result.columns if c not in ("layer", "head", "kv_head")]:
        fig, ax = plt.subplots(figsize=(1.2 + 0.45 * result.n_heads, 1.2 + 0.4 * result.n_layers))
        HeadRankDisplay.from_result(result, column, ax=ax)
        paths.append(save_figure(fig, out / f"heatmap_{column}.png", dpi=100))
    display = HeadSpectrumDisplay.from_result(result, layer, head)
    paths.append(save_figure(display.figure_, out / f"spectrum_layer{layer}_head{head}.png",
                             dpi=100))
    return paths


@contextmanager
def _quiet_transformers():
    """Silence transformers' progress bars and log messages, restoring them afterwards.

    The command's output is its own report; "Loading weights" bars and loading notes would
    interleave with it. The settings are put back on exit, so that code calling
    :func:`heads_command` keeps its own.
    """
    import huggingface_hub.utils as hub
    from transformers.utils import logging as hf_logging

    bars, verbosity = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    hub_bars_off = hub.are_progress_bars_disabled()
    hf_logging.disable_progress_bar()  # transformers' bars and the hub's
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        with warnings.catch_warnings():
            # The hub warns when its environment variable keeps the bars off; so they stay.
            warnings.simplefilter("ignore")
            if bars:
                hf_logging.enable_progress_bar()
            if hub_bars_off:
                hub.disable_progress_bars()


def heads_command(args):
    """Run ``ebound heads`` on parsed arguments; returns the exit code."""
    from ..heads import head_ranks

    model_dir = Path(args.model_dir)
    if not (model_dir / "config.json").is_file():
        raise CLIError(f"{args.model_dir}: not a directory with a Hugging Face config.json")
    texts = _read_text(args.text) if args.text else None
    if args.max_length < 1:
        raise CLIError(f"--max-length must be positive. Got {args.max_length}.")
    with _quiet_transformers():
        result = head_ranks(model_dir, inputs=texts, max_length=args.max_length)
    layer, head = args.head
    row = next((r for r in result.rows if r["layer"] == layer and r["head"] == head), None)
    if row is None:
        raise CLIError(f"--head {layer}.{head} is outside the model's {result.n_layers} "
                       f"layers x {result.n_heads} heads")

    out = out_dir(args)
    tables = write_table(result, out, "heads")
    pngs = _save_pngs(result, out, layer, head)
    written = tables + pngs
    summary = result.summary(0.9)

    lines = [f"{model_dir.name}: {result.naming}-style attention, {result.n_layers} layers x "
             f"{result.n_heads} heads ({result.n_kv_heads} key heads), d = {result.d_model}, "
             f"d_h = {result.head_dim}" + (", rotary embeddings (kernel at offset 0)"
                                         if result.rotary else "")]
    if texts is not None:
        lines.append(f"Logit field on {result.n_sequences} lines, {result.n_tokens} tokens.")
    lines.append("Energy rank at 90% per layer, min / median / max over heads "
                 "(kernel W_Q W_K^T" + (" vs logit field):" if texts else "):"))
    lines.append(summary.format())
    lines.append(f"Head {layer}.{head}: " + ", ".join(
        f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
        for k, v in row.items() if k not in ("layer", "head")))
    lines.append(f"Wrote {len(written)} files to {out}"
                 + ("" if pngs else " (install matplotlib for the PNGs)"))
    payload = {"summary": summary.to_dict(), "result": result.to_dict(),
               "files": [str(p) for p in written]}
    emit(args, payload, "\n".join(lines))
    return 0
