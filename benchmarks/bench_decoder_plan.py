"""What a causal language model loses under each rank plan: uniform, greedy and Fisher.

On a causal language model (SmolLM2-135M-Instruct from its GGUF file by default, or any
directory ``AutoModelForCausalLM`` loads), calibrated on ``--n-texts`` standard-library
docstring lines and measured on ``--n-held-out`` sentences of ``HELD_OUT_MODULES`` (another
subject, used by no step):

* the data-aware curves of every head (:func:`head_deficiency`, 3/4 of the lines for the
  metric, 1/4 for the curves) and the Fisher weights of every head's output
  (:func:`head_sensitivity`, on all the calibration lines);
* at each of ``--budgets``: the held-out perplexity as a ratio to the original's and the
  mean next-token KL of the data-aware forms planned ``uniform`` (one rank for every head),
  ``greedy`` (the package's default, by each head's own relative output error) and
  ``fisher`` (by the predicted loss increase);
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
import time


def _measure(model, compressed, held, tokenizer, p0):
    from sklearn_ebound.heads import next_token_kl, perplexity

    p = perplexity(compressed, held, tokenizer, max_length=64)
    return {"perplexity_ratio": p / p0,
            "kl": next_token_kl(model, compressed, held, tokenizer, max_length=64).mean_kl}


def _peer_rows(model, cal, held, tokenizer, p0, budgets, head_dim):
    """The peers of ``_decoder_peers`` at every budget (their statistics on ``cal``)."""
    from _decoder_peers import PEERS, activation_statistics

    stats = activation_statistics(model, cal, tokenizer, max_length=64)
    for budget in budgets:
        for name, peer in PEERS.items():
            step = 1 if name.startswith("Palu") else 2
            rank = int(step * round(budget * head_dim / step))
            row = {"budget": budget, "plan": name, "budget_used": rank / head_dim,
                   **_measure(model, peer(model, rank, stats), held, tokenizer, p0)}
            print(f"{budget:.0%} {name:14s} {row['perplexity_ratio']:.3f}x  KL "
                  f"{row['kl']:.4f}", flush=True)
            yield row


def _plot(out, path):
    """The budget-perplexity frontier of every row name, on a log scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    names = list(dict.fromkeys(row["plan"] for row in out["rows"]))
    for name in names:
        rows = sorted((r for r in out["rows"] if r["plan"] == name),
                      key=lambda r: r["budget_used"])
        ax.plot([100 * r["budget_used"] for r in rows], [r["perplexity_ratio"] for r in rows],
                marker="o", ms=4, label=name)
    ax.set_yscale("log")
    ax.set_xlabel("query-key rank kept (% of the full rank)")
    ax.set_ylabel("held-out perplexity / original's")
    ax.set_title(f"{out['model']}: {out['n_texts']} calibration lines, "
                 f"{out['n_held_out']} held-out sentences", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
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


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--gguf-file", default=None)
    parser.add_argument("--n-texts", type=int, default=40)
    parser.add_argument("--n-held-out", type=int, default=40)
    parser.add_argument("--budgets", default="0.4,0.6,0.8")
    parser.add_argument("--distill-lr", type=float, default=None,
                        help="the distillation's learning rate; none: no distillation")
    parser.add_argument("--distill-epochs", type=int, default=6)
    parser.add_argument("--distill-budgets", default="0.4,0.6,0.8")
    parser.add_argument("--peers", action="store_true",
                        help="also the literature's compressions at one rank")
    parser.add_argument("--correlation", action="store_true")
    parser.add_argument("--correlation-rank", type=float, default=0.4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None)
    parser.add_argument("--plot", default=None, help="PNG of the frontier (needs matplotlib)")
    args = parser.parse_args(argv)

    import torch
    import transformers

    from sklearn_ebound.heads import (
        HELD_OUT_MODULES,
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
    held = docstring_sentences(HELD_OUT_MODULES)[:args.n_held_out]
    result = head_deficiency(model, cal, tokenizer=tokenizer, methods=("data",),
                             calibration=0.75, max_length=64)
    t_curves = time.perf_counter() - start
    sens = head_sensitivity(model, cal, tokenizer=tokenizer)
    t_sens = time.perf_counter() - start - t_curves
    p0 = perplexity(model, held, tokenizer, max_length=64)
    out = {"model": type(model).__name__, "n_texts": len(cal), "n_held_out": len(held),
           "perplexity_original": p0, "seconds_curves": t_curves,
           "seconds_sensitivity": t_sens, "rows": []}
    print(f"{out['model']}: curves {t_curves:.0f} s, Fisher weights {t_sens:.0f} s, "
          f"original perplexity {p0:.2f}", flush=True)
    distilled_at = {float(b) for b in args.distill_budgets.split(",")}
    budgets = [float(b) for b in args.budgets.split(",")]
    if args.peers:
        out["rows"] += _peer_rows(model, cal, held, tokenizer, p0, budgets, result.head_dim)
    for budget in budgets:
        for name, kw in (("uniform", {"allocation": "uniform"}),
                         ("greedy", {"allocation": "greedy"}),
                         ("fisher", {"allocation": "fisher", "sensitivity": sens})):
            plan = plan_ranks(result, budget=budget, method="data", **kw)
            compressed = compress_heads(model, result, plan, method="data")
            row = {"budget": budget, "plan": name, "budget_used": plan.budget_used,
                   **_measure(model, compressed, held, tokenizer, p0)}
            out["rows"].append(row)
            print(f"{budget:.0%} {name:14s} {row['perplexity_ratio']:.3f}x  KL "
                  f"{row['kl']:.4f}", flush=True)
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
                   **_measure(model, distilled, held, tokenizer, p0)}
            out["rows"].append(row)
            print(f"{budget:.0%} fisher+distill {row['perplexity_ratio']:.3f}x  KL "
                  f"{row['kl']:.4f}  ({row['seconds']:.0f} s)", flush=True)
    if args.correlation:
        out["correlation"] = _correlation(model, result, sens, held[:16], tokenizer,
                                          args.correlation_rank)
        print(f"single-layer truncations: Spearman {out['correlation']['spearman_fisher']:.2f} "
              f"(Fisher), {out['correlation']['spearman_greedy']:.2f} (greedy's price)")
    out["seconds"] = time.perf_counter() - start
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(out, fh, indent=2)
    if args.plot:
        _plot(out, args.plot)


if __name__ == "__main__":
    main()
