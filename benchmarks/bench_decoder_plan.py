"""What a causal language model loses under each rank plan: uniform, greedy, Fisher, Taylor.

On a causal language model (SmolLM2-135M-Instruct from its GGUF file by default, or any
directory ``AutoModelForCausalLM`` loads), calibrated on ``--n-texts`` standard-library
docstring lines and measured on ``--n-held-out`` sentences used by no step: by default of
``HELD_OUT_MODULES`` (docstrings of another subject); with ``--held-out manual`` every
fourth sentence of the Python reference manual (:func:`manual_sentences`), with
``--held-out readmes`` every third prose sentence of the descriptions of the installed
distributions (their ``METADATA``, in the order of their names: text of another register,
which depends on what is installed):

* the data-aware curves of every head (:func:`head_deficiency`, 3/4 of the lines for the
  metric, 1/4 for the curves) and the Fisher weights of every head's output
  (:func:`head_sensitivity`, on all the calibration lines);
* at each of ``--budgets``: the held-out perplexity as a ratio to the original's and the
  mean next-token KL of the data-aware forms planned ``uniform`` (one rank for every head),
  ``greedy`` (the package's default, by each head's own relative output error) and
  ``fisher`` (by the predicted loss increase) and ``taylor`` (the same with the loss's
  first-order term along each head's truncation, spending the whole budget);
* with ``--peers``, the compressions of the literature at one rank for every head
  (``_decoder_peers.py``): uniform weight-space SVD, ASVD's activation-scaled SVD and
  Palu's low-rank key projection per key group, each at the even rank nearest the budget
  (Palu at the nearest rank); the package's ``uniform`` row is SVD-LLM's truncation-aware
  whitening at one rank;
* with ``--distill-lr``, the Fisher plan at ``--distill-budgets`` distilled on the
  calibration lines with the next-token KL objective (:func:`distill_compressed`,
  ``--distill-epochs``, early stopping on a fifth of the calibration lines, an epoch that
  does not improve on them sending the columns back to the best state at a quarter of the
  rate);
* every model's held-out perplexity ratio also at its own softmax temperature, fitted on
  the calibration lines (the original's too; ``--no-temperature`` skips it): a truncation
  that only makes an overconfident model less sure of itself gains nothing there;
* for every row beside the package's ``uniform`` at the same budget, a 90% bootstrap
  interval (over the held-out sentences, paired) of its perplexity ratio minus uniform's,
  and of the same at the fitted temperatures;
* with ``--correlation``, how well each price predicts what the model loses: every layer
  truncated alone (each head at ``--correlation-rank`` of ``d_h``), its measured next-token
  KL on 16 held-out sentences against the Fisher prediction and the greedy's price
  (Spearman's rank correlation over the layers).

Needs the ``heads`` extra (``transformers``, ``gguf``, ``accelerate``).

    python benchmarks/bench_decoder_plan.py --model-dir DIR [--gguf-file FILE] [--peers]
        [--out FILE] [--plot FILE]
"""

import argparse
import json
import math
import time

from _held_out import KINDS, held_out_sentences


def _next_token_logits(model, texts, tokenizer):
    """Each text's next-token logits and targets, one text at a time (64 tokens at most)."""
    import torch

    with torch.no_grad():
        for text in texts:
            ids = tokenizer(text, return_tensors="pt", truncation=True, max_length=64)
            yield model(**ids).logits[0, :-1], ids["input_ids"][0, 1:]


def _nll(logits, target, temperature=1.0):
    """Summed negative log-likelihood of ``target`` under ``softmax(logits / temperature)``."""
    import torch

    logp = torch.log_softmax(logits.double() / temperature, -1)
    return float(-logp[torch.arange(len(target)), target].sum())


def _sentence_nll(model, texts, tokenizer, temperature=1.0):
    """Each text's summed next-token negative log-likelihood at ``temperature``."""
    return [_nll(z, y, temperature) for z, y in _next_token_logits(model, texts, tokenizer)]


def _fitted_temperature(model, texts, tokenizer):
    """The softmax temperature ``T`` that minimises the next-token loss of ``model`` on
    ``texts`` (the calibration lines): ``argmin_T sum_t -log softmax(z_t / T)[y_t]``, a
    convex function of ``1/T``, found by Brent's method on ``log T`` in [1/4, 4]."""
    import numpy as np
    from scipy.optimize import minimize_scalar

    pairs = list(_next_token_logits(model, texts, tokenizer))
    n = sum(len(y) for _, y in pairs)
    res = minimize_scalar(lambda u: sum(_nll(z, y, np.exp(u)) for z, y in pairs) / n,
                          bounds=(-np.log(4), np.log(4)), method="bounded",
                          options={"xatol": 1e-4})
    return float(np.exp(res.x))


def _measure(model, compressed, held, tokenizer, p0, cal=None, original=None):
    """The held-out perplexity ratio and mean next-token KL of ``compressed``; with ``cal``,
    also at the temperature fitted to each model on the calibration lines
    (``original``: the original's ``(temperature, sentence NLLs)`` at its own)."""
    from sklearn_ebound.heads import next_token_kl, perplexity

    p = perplexity(compressed, held, tokenizer, max_length=64)
    row = {"perplexity_ratio": p / p0,
           "kl": next_token_kl(model, compressed, held, tokenizer, max_length=64).mean_kl,
           "sentence_nll": _sentence_nll(compressed, held, tokenizer)}
    if cal is not None:
        t = _fitted_temperature(compressed, cal, tokenizer)
        row["temperature"] = t
        row["sentence_nll_matched"] = _sentence_nll(compressed, held, tokenizer, t)
        gain = sum(row["sentence_nll_matched"]) - sum(original[1])
        row["perplexity_ratio_matched"] = math.exp(gain / sum(_n_tokens(held, tokenizer)))
    return row


def _row_line(row):
    line = (f"{row['budget']:.0%} {row['plan']:14s} {row['perplexity_ratio']:.3f}x  "
            f"KL {row['kl']:.4f}")
    if "temperature" in row:
        line += f"  (at T = {row['temperature']:.3f}: {row['perplexity_ratio_matched']:.3f}x)"
    return line


def _n_tokens(texts, tokenizer):
    """Each text's number of predicted tokens (64 tokens at most)."""
    return [len(tokenizer(t, truncation=True, max_length=64)["input_ids"]) - 1 for t in texts]


def _paired_intervals(out, n_tokens, reference="uniform", n_boot=5000, seed=0, matched=False):
    """90% bootstrap intervals (over held-out sentences) of each row's perplexity ratio minus
    the ``reference`` row's at the same budget; ``matched``: of the ratios at the fitted
    temperatures (``minus_{reference}_90_matched``)."""
    import numpy as np

    suffix = "_matched" if matched else ""
    rng = np.random.default_rng(seed)
    base = np.asarray(out["sentence_nll_original" + suffix])
    draws = rng.integers(0, len(base), (n_boot, len(base)))
    tokens = np.asarray(n_tokens)[draws].sum(1)

    def ratios(nll):
        return np.exp((np.asarray(nll)[draws].sum(1) - base[draws].sum(1)) / tokens)

    refs = {r["budget"]: ratios(r["sentence_nll" + suffix]) for r in out["rows"]
            if r["plan"] == reference}
    for row in out["rows"]:
        if row["plan"] != reference and row["budget"] in refs:
            diff = ratios(row["sentence_nll" + suffix]) - refs[row["budget"]]
            row[f"minus_{reference}_90{suffix}"] = [float(np.quantile(diff, q))
                                                   for q in (0.05, 0.95)]


def _peer_rows(model, cal, tokenizer, measure, budgets, head_dim):
    """The peers of ``_decoder_peers`` at every budget (their statistics on ``cal``), each
    row by ``measure(compressed)``."""
    from _decoder_peers import PEERS, activation_statistics

    stats = activation_statistics(model, cal, tokenizer, max_length=64)
    for budget in budgets:
        for name, peer in PEERS.items():
            step = 1 if name.startswith("Palu") else 2
            rank = int(step * round(budget * head_dim / step))
            row = {"budget": budget, "plan": name, "budget_used": rank / head_dim,
                   **measure(peer(model, rank, stats))}
            print(_row_line(row), flush=True)
            yield row


LABELS = {"uniform": "data-aware, one rank (SVD-LLM-style)", "greedy": "greedy on head errors",
          "fisher": "Fisher", "taylor": "Taylor (Fisher + first order)",
          "fisher+distill": "Fisher, distilled"}


HELD_OUT_TITLES = {"modules": "docstrings of another subject",
                   "manual": "the Python reference manual",
                   "readmes": "package descriptions"}


def _plot(out, path, clip=1.3):
    """The frontier of every row name: perplexity ratio (ratios above ``clip`` are named in
    the legend, off the scale) and mean next-token KL on a log scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_p, ax_k) = plt.subplots(1, 2, figsize=(10, 4.2))
    for name in dict.fromkeys(row["plan"] for row in out["rows"]):
        rows = sorted((r for r in out["rows"] if r["plan"] == name),
                      key=lambda r: r["budget_used"])
        x = [100 * r["budget_used"] for r in rows]
        ratio = [r["perplexity_ratio"] for r in rows]
        label = LABELS.get(name, name)
        if max(ratio) > clip:
            label += f" ({min(ratio):.1f}-{max(ratio):.1f}x: off the left scale)"
        style = dict(marker="o", ms=4, lw=2.2 if name in ("fisher", "taylor") else 1.2)
        line, = ax_k.plot(x, [r["kl"] for r in rows], label=label, **style)
        ax_p.plot(x, ratio, color=line.get_color(), **style)
    # from just below the lowest ratio (a plan can fit the held-out text better than the original)
    floor = min(r["perplexity_ratio"] for r in out["rows"])
    ax_p.set_ylim(min(0.99, floor - 0.005), clip)
    ax_p.set_ylabel("held-out perplexity / original's")
    ax_k.set_yscale("log")
    ax_k.set_ylabel("mean next-token KL to the original (nats per token)")
    for ax in (ax_p, ax_k):
        ax.set_xlabel("query-key rank kept (% of the full rank)")
        ax.grid(True, which="both", alpha=0.3)
    ax_k.legend(fontsize=7)
    fig.suptitle(f"{out['model']}: {out['n_texts']} calibration lines, "
                 f"{out['n_held_out']} held-out sentences "
                 f"({HELD_OUT_TITLES[out.get('held_out', 'modules')]})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _correlation(model, result, sens, held, tokenizer, fraction):
    from scipy.stats import spearmanr

    from sklearn_ebound.heads import compress_heads, next_token_kl

    curves, weights = result.curves("data"), sens.weights(result)
    r = int(fraction * result.head_dim) // 2 * 2 if result.rotary else int(
        fraction * result.head_dim)
    measured, fisher, greedy = [], [], []
    for li, layer in enumerate(result.layer_indices):
        c = compress_heads(model, result, {(layer, h): r for h in result.heads}, method="data")
        measured.append(next_token_kl(model, c, held, tokenizer, max_length=64).mean_kl)
        fisher.append(float((weights[li] * curves[li, :, r]).sum()))
        greedy.append(float((result.output_share[li] * curves[li, :, r]).sum()))
    return {"rank": r, "measured_kl": measured, "fisher": fisher, "greedy": greedy,
            "spearman_fisher": float(spearmanr(measured, fisher).correlation),
            "spearman_greedy": float(spearmanr(measured, greedy).correlation)}


def _save(out, path):
    """Write what is measured so far: an interrupted run keeps its finished rows."""
    if path:
        with open(path, "w") as fh:
            json.dump(out, fh, indent=2)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--gguf-file", default=None)
    parser.add_argument("--n-texts", type=int, default=40)
    parser.add_argument("--n-held-out", type=int, default=40)
    parser.add_argument("--budgets", default="0.4,0.6,0.8")
    parser.add_argument("--held-out", choices=KINDS,
                        default="modules", help="the held-out text (default: %(default)s)")
    parser.add_argument("--distill-lr", type=float, default=None,
                        help="the distillation's learning rate; none: no distillation")
    parser.add_argument("--distill-epochs", type=int, default=6)
    parser.add_argument("--distill-budgets", default="0.4,0.6,0.8")
    parser.add_argument("--plans", default="uniform,greedy,fisher,taylor",
                        help="the package's plans to run")
    parser.add_argument("--peers", action="store_true",
                        help="also the literature's compressions at one rank")
    parser.add_argument("--correlation", action="store_true")
    parser.add_argument("--correlation-rank", type=float, default=0.4)
    parser.add_argument("--no-temperature", action="store_true",
                        help="skip the ratios at each model's temperature fitted on the "
                             "calibration lines")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None)
    parser.add_argument("--plot", default=None, help="PNG of the frontier (needs matplotlib)")
    args = parser.parse_args(argv)

    import torch
    import transformers

    from sklearn_ebound.heads import (
        compress_heads,
        distill_compressed,
        docstring_sentences,
        head_deficiency,
        head_sensitivity,
        perplexity,
        plan_ranks,
    )

    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    extra = {} if args.gguf_file is None else {"gguf_file": args.gguf_file}
    tokenizer = transformers.AutoTokenizer.from_pretrained(args.model_dir, **extra)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        args.model_dir, dtype=torch.float32, **extra).eval()
    cal = docstring_sentences()[:args.n_texts]
    held = held_out_sentences(args.held_out, cal)[:args.n_held_out]
    result = head_deficiency(model, cal, tokenizer=tokenizer, methods=("data",),
                             calibration=0.75, max_length=64)
    t_curves = time.perf_counter() - start
    sens = head_sensitivity(model, cal, tokenizer=tokenizer)
    t_sens = time.perf_counter() - start - t_curves
    p0 = perplexity(model, held, tokenizer, max_length=64)
    n_tokens = _n_tokens(held, tokenizer)
    out = {"model": type(model).__name__, "n_texts": len(cal), "n_held_out": len(held),
           "held_out": args.held_out,
           "perplexity_original": p0, "seconds_curves": t_curves,
           "seconds_sensitivity": t_sens, "rows": [],
           "sentence_nll_original": _sentence_nll(model, held, tokenizer)}
    original = None
    if not args.no_temperature:  # the original at its own temperature fitted on `cal`
        t0 = _fitted_temperature(model, cal, tokenizer)
        original = (t0, _sentence_nll(model, held, tokenizer, t0))
        out["temperature_original"], out["sentence_nll_original_matched"] = original

    def measure(compressed):
        return _measure(model, compressed, held, tokenizer, p0,
                        None if original is None else cal, original)

    print(f"{out['model']}: curves {t_curves:.0f} s, Fisher weights {t_sens:.0f} s, "
          f"original perplexity {p0:.2f}"
          + ("" if original is None else f", fitted temperature {original[0]:.3f}"), flush=True)
    distilled_at = {float(b) for b in args.distill_budgets.split(",")}
    budgets = [float(b) for b in args.budgets.split(",")]
    if args.peers:
        out["rows"] += _peer_rows(model, cal, tokenizer, measure, budgets, result.head_dim)
        _save(out, args.out)
    for budget in budgets:
        for name, kw in (("uniform", {"allocation": "uniform"}),
                         ("greedy", {"allocation": "greedy"}),
                         ("fisher", {"allocation": "fisher", "sensitivity": sens}),
                         ("taylor", {"allocation": "taylor", "sensitivity": sens})):
            if name not in args.plans.split(","):
                continue
            plan = plan_ranks(result, budget=budget, method="data", **kw)
            compressed = compress_heads(model, result, plan, method="data")
            row = {"budget": budget, "plan": name, "budget_used": plan.budget_used,
                   **measure(compressed)}
            if name == "taylor":
                row["first_order_reliability"] = plan.first_order_reliability
            out["rows"].append(row)
            _save(out, args.out)
            print(_row_line(row), flush=True)
            if name != "fisher" or args.distill_lr is None or budget not in distilled_at:
                continue
            t0 = time.perf_counter()
            distilled = distill_compressed(
                model, compressed, plan, cal, tokenizer=tokenizer, objective="next_token",
                learning_rate=args.distill_lr, lr_backoff=0.25, patience=3,
                max_epochs=args.distill_epochs, batch_size=8)
            row = {"budget": budget, "plan": "fisher+distill", "budget_used": plan.budget_used,
                   "seconds": time.perf_counter() - t0,
                   "best_epoch": distilled.distillation_["best_epoch"],
                   **measure(distilled)}
            out["rows"].append(row)
            _save(out, args.out)
            print(f"{_row_line(row)}  ({row['seconds']:.0f} s)", flush=True)
    _paired_intervals(out, n_tokens)
    if original is not None:
        _paired_intervals(out, n_tokens, matched=True)
    for row in out["rows"]:
        if "minus_uniform_90" in row:
            lo, hi = row["minus_uniform_90"]
            line = (f"{row['budget']:.0%} {row['plan']:14s} minus uniform: 90% interval "
                    f"[{lo:+.4f}, {hi:+.4f}]")
            if "minus_uniform_90_matched" in row:
                lo, hi = row["minus_uniform_90_matched"]
                line += f"; at the fitted temperatures [{lo:+.4f}, {hi:+.4f}]"
            print(line)
    if args.correlation:
        out["correlation"] = _correlation(model, result, sens, held[:16], tokenizer,
                                          args.correlation_rank)
        print(f"single-layer truncations: Spearman {out['correlation']['spearman_fisher']:.2f} "
              f"(Fisher), {out['correlation']['spearman_greedy']:.2f} (greedy's price)")
    out["seconds"] = time.perf_counter() - start
    _save(out, args.out)
    if args.plot:
        _plot(out, args.plot)
    return out


if __name__ == "__main__":
    main()
