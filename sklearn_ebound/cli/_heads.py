"""``ebound heads``: per-head ranks of the query-key kernel of a saved Hugging Face model.

``MODEL`` is a directory saved by ``save_pretrained`` or a ``.gguf`` file (read through
transformers' GGUF support, dequantised); a causal LM is loaded as its causal-LM class.

``ebound heads MODEL [--text FILE] [--head LAYER.HEAD] [--out DIR] [--json]`` prints the
per-layer summary, and writes under ``--out`` the table as JSON and CSV, a layers x heads heat
map of every rank column and the spectra of one head (PNG, when matplotlib is installed).

``ebound heads MODEL --text FILE --compress OUT_DIR (--budget F | --eps E)`` also measures
the deficiency curve of every head on the text (half calibration, half evaluation), prints
the per-head eps-ranks and the planned ranks, writes the curves, the plan and their plots
under ``--out`` and the compressed model (a Hugging Face directory of the class it was given,
a causal LM with its head included) to ``OUT_DIR``, and reports, on the evaluation half, the
measure that fits the model and which one it used: for a causal language model the perplexity
(and its ratio to the original's) and the mean KL divergence of the next-token distributions
to the original's; for an encoder the cosine of the sentence embeddings to the original's.
The budget is shared by ``--allocation``: for a causal language model by default
``fisher``, greedy on the next-token loss each head's error is predicted to cost (its Fisher
weight, :func:`~sklearn_ebound.heads.head_sensitivity`, read on the calibration half), for
any other model ``greedy`` on each head's own output error; ``taylor`` (a causal language
model only) adds each head's first-order loss change along its truncation, for a lower
perplexity on text of the calibration's kind at a higher KL to the original, most of it a
lower confidence (on text of another kind it can lose to one uniform rank).
``--train-steps N`` trains the planned pairs (N L-BFGS steps each, on the calibration half)
in a second pass; ``--refine sequential`` re-fits the compressed pairs layer by layer on the
compressed model's own inputs (the calibration half) before saving; ``--refine distill``
trains them end to end against the original's output on the calibration half (the sentence
embedding of a model without a language-model head, the next-token distributions of a causal
language model). ``--refit all`` then fits the written model again the same way on every
line of the text (:func:`~sklearn_ebound.heads.refit_heads`, and the refinement on all
lines), once the split has chosen the plan and measured it: the report's measure, of the
fit on the calibration half, estimates the written model's on new text (``--refit none``
writes the model measured). All three default to ``auto`` (``resolve_auto``): for an
encoder (any model but a causal language model) 15 steps, ``distill`` and ``all``, for a
causal language model no trained step, no refinement and no refit.

The work is :func:`~sklearn_ebound.heads.compress_model`'s. ``--form query`` writes the
compressed model in the original's shapes (a plain ``from_pretrained`` loads it; a rotary
head's rank-r form is a map on its query, so nothing shrinks); ``--form shrunk`` writes
query and key maps of the kept widths (whole rotary planes per key head for a rotary model),
a directory loaded with ``trust_remote_code=True``, and reports the query-key
parameters and key cache it saves. ``--form latent`` (rotary heads) keeps as many key
channels as the planes, but any subspace of the rotated keys (latent keys: the projections
whole, a small map per head after the rotation); ``--form latent-shared`` one latent per
layer that reads every key head (multi-head latent attention). ``--form auto`` (the default) is
``shrunk`` for heads without rotary embeddings (the same model in smaller tensors),
``latent-shared`` for rotary heads with several key heads a layer (SmolLM2-135M at 50%:
next-token KL 0.038 at half the key cache, against 0.051 with ``--form query``, which saves
nothing, and 0.260 with whole planes) and ``latent`` for one (Gemma 3 270M).

The deficiency analysis keeps each finished layer under ``--out`` (``deficiency_layers/``,
``trained_layers/`` for ``--train-steps``): an interrupted run, rerun with the same
arguments, resumes from them (other arguments, model or text start it over). Its progress is
a bar on a terminal and one line per layer otherwise (stderr).
"""

import argparse
import copy
import functools
import importlib.util
import sys
import warnings
from contextlib import contextmanager
from pathlib import Path

from .._compress_defaults import ENCODER_AUTO, LANGUAGE_MODEL_AUTO
from ._core import (
    CLIError,
    Progress,
    ProgressLines,
    add_common_options,
    emit,
    non_negative_float,
    out_dir,
    pyplot,
    save_figure,
    write_table,
)

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


def _steps(text):
    """``--train-steps``: ``"auto"`` or an integer (an argparse type)."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or auto, got {text!r}") from None


def resolve_auto(args, language_model):
    """``args`` with ``--train-steps``, ``--refine`` and ``--refit`` left at ``auto`` made
    concrete.

    For an encoder, :data:`ENCODER_AUTO`; for a causal language model,
    :data:`LANGUAGE_MODEL_AUTO` (no trained step, no refinement, no refit: its long step is
    the curves, and a refit would read every layer's inputs again). An explicit value is
    kept. Returns a copy; ``args`` is not changed.
    """
    auto = LANGUAGE_MODEL_AUTO if language_model else ENCODER_AUTO
    resolved = copy.copy(args)
    for name, value in auto.items():
        if getattr(resolved, name) == "auto":
            setattr(resolved, name, value)
    return resolved


def add_heads_parser(commands):
    """Add the ``heads`` command to the ``ebound`` sub-command parsers; returns its parser."""
    parser = commands.add_parser(
        "heads", help="attention-native rank of every head of a pretrained transformer",
        description="Read the query-key kernel W_Q W_K^T of every head of a Hugging Face model "
                    "in MODEL (a saved directory or a .gguf file, loaded offline): energy "
                    "ranks at 90% and 99%, entropy and stable rank; with --text, the same for the "
                    "logit field the head produces on that text. Writes heads.json, heads.csv, "
                    "one heat map per rank and the spectra of --head to --out.")
    parser.add_argument("model_dir", metavar="MODEL", help="model directory or .gguf file")
    parser.add_argument("--text", metavar="FILE",
                        help="text file, one sentence per line (default: none)")
    parser.add_argument("--head", type=_layer_head, default=(0, 0), metavar="LAYER.HEAD",
                        help="the head whose spectra are plotted (default: 0.0)")
    parser.add_argument("--max-length", type=int, default=128, metavar="N",
                        help="tokens per line at most (default: %(default)s)")
    compress = parser.add_argument_group(
        "compression", "measure the query-key rank each head needs on --text and save a "
                       "compressed model; a rerun resumes from the layers under --out")
    compress.add_argument("--compress", metavar="OUT_DIR",
                          help="write the compressed model here (no default)")
    which = compress.add_mutually_exclusive_group()
    which.add_argument("--budget", type=non_negative_float, metavar="F",
                       help="query-key rank kept, a fraction in (0, 1] (no default)")
    which.add_argument("--eps", type=non_negative_float, metavar="E",
                       help="tolerance in (0, 1): each head's smallest rank of relative "
                            "output error <= E (no default)")
    compress.add_argument("--train-steps", type=_steps, default="auto", metavar="N",
                          help="L-BFGS steps training the planned pairs; auto: "
                               f"{ENCODER_AUTO['train_steps']}, 0 for LMs (default: %(default)s)")
    compress.add_argument("--refine", choices=("auto", "none", "sequential", "distill"),
                          default="auto", metavar="MODE",
                          help=f"none, sequential or distill; auto: {ENCODER_AUTO['refine']}, "
                               "none for LMs (default: %(default)s)")
    compress.add_argument("--refit", choices=("auto", "all", "none"), default="auto",
                          metavar="MODE",
                          help="all: refit on every line once measured, or none; auto: "
                               f"{ENCODER_AUTO['refit']}, none for LMs (default: %(default)s)")
    compress.add_argument("--allocation",
                          choices=("auto", "greedy", "fisher", "taylor", "uniform"),
                          default="auto", metavar="RULE",
                          help="greedy, fisher or taylor (next-token loss), uniform; auto: "
                               "fisher for LMs (default: %(default)s)")
    compress.add_argument("--form", choices=("auto", "query", "shrunk", "latent",
                                             "latent-shared"),
                          default="auto", metavar="FORM",
                          help="query (original shapes), shrunk, latent(-shared); auto: "
                               "latent(-shared) if rotary, else shrunk (default: "
                               "%(default)s)")
    compress.add_argument("--calibration", type=float, default=0.5, metavar="F",
                          help="fraction of the text used to calibrate (default: %(default)s)")
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
    # The GGUF reader draws its own tqdm bar, which those settings do not reach.
    gguf_reader = sys.modules.get("transformers.modeling_gguf_pytorch_utils")
    if gguf_reader is None and importlib.util.find_spec("gguf") is not None:
        import transformers.modeling_gguf_pytorch_utils as gguf_reader
    gguf_bar = getattr(gguf_reader, "tqdm", None)
    if gguf_bar is not None:
        gguf_reader.tqdm = functools.partial(gguf_bar, disable=True)
    try:
        yield
    finally:
        if gguf_bar is not None:
            gguf_reader.tqdm = gguf_bar
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
    from ..heads import head_ranks, load_pretrained

    model_dir = Path(args.model_dir)
    if model_dir.suffix.lower() == ".gguf":
        if not model_dir.is_file():
            raise CLIError(f"{args.model_dir}: no such GGUF file")
        missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
        if missing:
            raise CLIError(f"{args.model_dir}: reading a GGUF file needs "
                           f"{' and '.join(missing)} (pip install {' '.join(missing)})")
    elif not (model_dir / "config.json").is_file():
        raise CLIError(f"{args.model_dir}: not a directory with a Hugging Face config.json "
                       "nor a .gguf file")
    texts = _read_text(args.text) if args.text else None
    if args.max_length < 1:
        raise CLIError(f"--max-length must be positive. Got {args.max_length}.")
    compressing = _check_compress(args, texts)
    with _quiet_transformers():  # loaded once: the kernels and the compression share it
        model, tokenizer = load_pretrained(model_dir)
        result = head_ranks(model, inputs=texts, tokenizer=tokenizer,
                            max_length=args.max_length)
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
    if compressing:
        report, extra = _compress(args, model, tokenizer, model_dir, texts, out,
                                  (layer, head))
        lines[-1:-1] = report
        payload.update(extra)
        payload["files"] += extra["files"]
        lines[-1] = (f"Wrote {len(payload['files'])} files to {out}; the compressed model to "
                     f"{args.compress}")
    emit(args, payload, "\n".join(lines))
    return 0


def _check_compress(args, texts):
    """Validate the compression options; True when compressing."""
    if args.compress is None:
        if args.budget is not None or args.eps is not None:
            raise CLIError("--budget and --eps need --compress OUT_DIR")
        return False
    if texts is None:
        raise CLIError("--compress needs --text FILE (the text the heads are measured on)")
    if args.budget is None and args.eps is None:
        raise CLIError("--compress needs --budget F or --eps E")
    if args.budget is not None and not 0 < args.budget <= 1:
        raise CLIError(f"--budget must be in (0, 1]. Got {args.budget}.")
    if args.eps is not None and not 0 < args.eps < 1:
        raise CLIError(f"--eps must be in (0, 1). Got {args.eps}.")
    if args.train_steps != "auto" and args.train_steps < 0:
        raise CLIError(f"--train-steps must be >= 0. Got {args.train_steps}.")
    if not 0 < args.calibration < 1:
        raise CLIError(f"--calibration must be in (0, 1). Got {args.calibration}.")
    if len(texts) < 4:
        raise CLIError(f"--compress needs at least 4 lines of text. Got {len(texts)}.")
    return True


def _compress(args, model, tokenizer, model_dir, texts, out, focus):
    """Deficiency curves, plan, compressed model and its fidelity; ``(report lines, payload)``.

    The work is :func:`~sklearn_ebound.heads.compress_model`'s; this reports it.
    """
    from .._utils.results import ResultTable
    from ..heads import is_language_model

    if tokenizer is None:
        raise CLIError(f"{model_dir}: --compress needs the model's tokenizer in its directory")
    language_model = is_language_model(model)
    args = resolve_auto(args, language_model)
    if args.allocation in ("fisher", "taylor") and not language_model:
        raise CLIError(f"--allocation {args.allocation} prices the heads by a next-token loss: "
                       "it needs a causal language model with its head (use greedy or uniform)")
    report = _run_compress_model(args, model, tokenizer, texts, out)
    result, plan, fidelity = report.deficiency, report.plan, report.fidelity
    heads_table = ResultTable(report.rows, head_dim=result.head_dim)
    files = (write_table(result, out, "deficiency") + write_table(heads_table, out, "eps_ranks")
             + write_table(plan, out, "plan") + _deficiency_pngs(result, out, focus))
    lines = [
        _curves_words(args, report, len(heads_table.rows), out),
        "Per head: smallest rank with relative output error <= eps, and the planned rank:",
        heads_table.format(),
        "eps-ranks over heads (median, min, max):",
        result.summary().format(),
        _plan_words(args, report),
        *_refit_lines(args, report, len(texts)),
        _form_words(report),
    ]
    payload = {"train_steps": args.train_steps, "refine": args.refine, "refit": args.refit,
               "form": report.form, "deficiency_summary": result.summary().to_dict(),
               "eps_ranks": heads_table.to_dict(), "plan": plan.to_dict(), "fidelity": fidelity,
               "qk_parameters": report.qk_parameters,
               "key_cache_channels": report.key_cache_channels,
               "compressed_model": str(args.compress), "files": [str(p) for p in files]}
    return lines, payload


def _run_compress_model(args, model, tokenizer, texts, out):
    """:func:`~sklearn_ebound.heads.compress_model` with the command's options; its report.

    Interrupted, it says where the finished layers are kept; a shrunk form that cannot be
    written is a :class:`CLIError` naming the command's option.
    """
    from ..heads import compress_model

    try:
        _, report = compress_model(
            model, texts, tokenizer=tokenizer, budget=args.budget, eps=args.eps,
            allocation=args.allocation, train_steps=args.train_steps, refine=args.refine,
            refit=args.refit, form=args.form, calibration=args.calibration,
            max_length=args.max_length, random_state=args.seed, checkpoint=out,
            out=args.compress, progress=Progress, on_layer=ProgressLines)
    except KeyboardInterrupt:
        sys.stderr.write(f"\nThe finished layers are kept in {out}; the same command "
                         "resumes from them.\n")
        raise
    except ValueError as exc:
        if "shrunk form" in str(exc) or "No shrunk form" in str(exc):
            raise CLIError(str(exc).replace("`form='query'`", "--form query")) from None
        raise
    return report


def _curves_words(args, report, n_heads, out):
    """The report's line on the deficiency curves: how many heads, lines, seconds, and the
    layers kept from an earlier run under ``out``."""
    result, kept = report.deficiency, report.kept
    return (
        ("Data-aware deficiency curves" if report.methods == ("data",) else "Deficiency curves")
        + f" of {n_heads} heads at every rank on "
        f"{result.n_evaluation} evaluation lines (calibrated on {result.n_calibration}); "
        f"{result.seconds:.1f} s" + (f", trained step {result.train_seconds:.1f} s"
                                     if args.train_steps else "")
        + ("; kept from an earlier run under " + str(out) + ": " + ", ".join(
            f"the {what} of {n} of the {result.n_layers} layers" for what, n in kept.items())
           if any(kept.values()) else "") + ".")


def _plan_words(args, report):
    """The report's line on the plan: its rule and goal, the rank it keeps, its fidelity."""
    import numpy as np

    result, plan = report.deficiency, report.plan
    goal = (f"budget {args.budget:g}" if args.eps is None else f"tolerance eps = {args.eps:g}")
    rule = ("each head at its eps-rank" if args.eps is not None
            else _ALLOCATION_WORDS[plan.allocation])
    return (f"Plan ({rule}, {goal}"
            + (f", the planned ranks trained ({args.train_steps} L-BFGS steps)"
               if args.train_steps else "")
            + _refine_words(args.refine, report.measured_distillation)
            + f"): {plan.budget_used:.1%} of the full query-key rank "
            f"(median rank {np.median(plan.column('rank')):g} of {result.head_dim}); "
            f"{_fidelity_words(report.fidelity)}.")


def _refit_lines(args, report, n_lines):
    """The report's line on the written model when it was fitted again on every line."""
    if args.refit != "all":
        return []
    return [f"Written model: the plan's heads fitted again on all {n_lines} lines"
            + (f" ({args.train_steps} L-BFGS steps)" if args.train_steps else "")
            + _refine_words(args.refine, report.written_distillation)
            + "; the measure above, of the same fit on the calibration half, "
            "estimates its fidelity on new text (--refit none writes the model "
            "measured)."]


def _form_words(report):
    """The report's line on what the written form saves."""
    params, cache = report.qk_parameters, report.key_cache_channels
    if report.form == "query":
        return ("Written in the original shapes (--form query): query-key parameters and the "
                "key cache unchanged.")
    how = ("latent keys after the rotation" if report.form == "latent" else
           "one latent per layer after the rotation" if report.form == "latent-shared" else
           "whole rotary planes per key head" if report.deficiency.rotary
           else "query and key maps of the planned widths")
    return (f"Written shrunk ({how}; load with trust_remote_code=True): query-key parameters "
            f"{params['compressed'] / params['original']:.3f}x, key cache "
            f"{cache['compressed'] / cache['original']:.3f}x the original's.")


def _refine_words(refine, history):
    """The plan report's phrase for ``--refine``: what it did to the saved model (``history``:
    the distillation's, ``None`` without one)."""
    if refine == "sequential":
        return ", refined layer by layer"
    if refine != "distill":
        return ""
    if history["best_epoch"] == 0:
        return (", distillation tried (no epoch improved its validation loss: the pairs are "
                "kept as they were)")
    return (f", distilled end to end (best epoch {history['best_epoch']} of "
            f"{len(history['validation_loss']) - 1})")


_ALLOCATION_WORDS = {
    "greedy": "greedy on the data-aware curves",
    "fisher": "greedy on the next-token loss predicted from the data-aware curves and each "
              "head's Fisher weight",
    "taylor": "the whole budget spent on the next-token loss predicted to second order (each "
              "head's Fisher weight) and to first order (the loss's gradient along each "
              "head's truncation)",
    "uniform": "one rank for every head",
    "tolerance": "one tolerance for every head",
}


def _fidelity_words(fidelity):
    """The report's phrase for the end-to-end measure of :func:`compress_model`."""
    if "mean_kl" in fidelity:
        value, original = fidelity["compressed"], fidelity["original"]
        return (f"measure: next-token prediction (a causal language model) on the evaluation "
                f"half, perplexity {value:.4g} against the original's {original:.4g} "
                f"({value / original:.3f}x), mean KL to the original {fidelity['mean_kl']:.4g} "
                f"nats per token (worst line {fidelity['max_kl']:.4g})")
    return (f"measure: sentence-embedding cosine to the original (a model without a causal "
            f"language-model head) on the evaluation half, mean {fidelity['mean']:.4f}, "
            f"min {fidelity['min']:.4f}")


def _deficiency_pngs(result, out, focus):
    """Curves of all heads and of the focus head; [] without matplotlib."""
    plt = pyplot()
    if plt is None:
        return []
    from ..display import HeadDeficiencyDisplay

    paths = [save_figure(HeadDeficiencyDisplay.from_result(result).figure_,
                         out / "deficiency_all_heads.png", dpi=100)]
    layer, head = focus
    if layer in result.layer_indices and head in result.heads:
        display = HeadDeficiencyDisplay.from_result(result, result.layer_indices.index(layer),
                                                    result.heads.index(head))
        paths.append(save_figure(display.figure_, out / f"deficiency_layer{layer}_head{head}.png",
                                 dpi=100))
    return paths
