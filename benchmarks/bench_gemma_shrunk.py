"""Gemma 3's shrunk form: the package's plan against a uniform one, at a few budgets.

For Gemma 3 270M (its GGUF file, dequantised to float32) or any Gemma 3 directory
``AutoModelForCausalLM`` loads: :func:`compress_model` on ``--n-texts`` standard-library
docstring lines (the curves computed once, kept in a checkpoint folder and read back), at
each budget (a fraction of the total query-key rank) twice, in the same shrunk form (whole
rotary planes per key head of the normalised queries and keys, the planes' scaled rotations
fitted): with the package's plan (``allocation="auto"``: Fisher-weighted) and with the same
rank for every head (``allocation="uniform"``). Each is written, loaded back with
``trust_remote_code=True`` and measured against the original:

* the held-out perplexity ratio, one sentence at a time (no padding counted), and the mean
  next-token KL to the original, on ``--n-held-out`` sentences of ``--held-out`` (default
  ``modules``: docstrings of ``HELD_OUT_MODULES``, another subject; none is a calibration
  line);
* the key cache after a ``--context``-token prompt (held-out text run together), in bytes,
  read off the cache tensors of both models (a sliding layer caches its window only), and
  its ratio; the key channels cached per token, and the query-key parameters' ratio.

    python benchmarks/bench_gemma_shrunk.py MODEL.gguf [--budgets 0.3,0.6]
        [--out benchmarks/results/gemma_shrunk.json]
"""

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from _held_out import KINDS, held_out_sentences
from bench_shrunk_decoder import cache_bytes


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a .gguf file or a model directory")
    parser.add_argument("--n-texts", type=int, default=80)
    parser.add_argument("--n-held-out", type=int, default=60)
    parser.add_argument("--held-out", default="modules", choices=KINDS)
    parser.add_argument("--budgets", default="0.3,0.6")
    parser.add_argument("--allocations", default="auto,uniform")
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--checkpoint", default=None,
                        help="folder keeping the curves between runs (default: a temporary one)")
    parser.add_argument("--out", default=None, help="JSON of the figures")
    args = parser.parse_args(argv)

    import torch
    import transformers

    from sklearn_ebound.heads import (
        compress_model,
        docstring_sentences,
        load_pretrained,
        next_token_kl,
        perplexity,
    )

    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    model, tokenizer = load_pretrained(args.model)
    model.eval()
    texts = docstring_sentences()[:args.n_texts]
    held = held_out_sentences(args.held_out, texts)[:args.n_held_out]
    ids = tokenizer(" ".join(held * 8), return_tensors="pt")["input_ids"][:, :args.context]
    keys0 = cache_bytes(model, ids)[0]
    p0 = perplexity(model, held, tokenizer, max_length=128, batch_size=1)
    figures = {"model": Path(args.model).name, "class": type(model).__name__,
               "n_texts": len(texts), "held_out": args.held_out, "n_held_out": len(held),
               "context": int(ids.shape[1]), "max_length": args.max_length,
               "key_cache_bytes_original": keys0, "perplexity_original": p0, "rows": []}
    print(f"original: held-out perplexity {p0:.3f}, key cache after {ids.shape[1]} tokens "
          f"{keys0} bytes", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = Path(args.checkpoint or Path(tmp) / "checkpoint")
        for budget in (float(b) for b in args.budgets.split(",")):
            for allocation in args.allocations.split(","):
                start = time.perf_counter()
                folder = Path(tmp) / f"shrunk-{allocation}-{budget:g}"
                compressed, report = compress_model(
                    model, texts, tokenizer=tokenizer, budget=budget, allocation=allocation,
                    max_length=args.max_length, checkpoint=checkpoint, form="shrunk",
                    out=folder)
                seconds = time.perf_counter() - start
                del compressed
                shrunk = transformers.AutoModelForCausalLM.from_pretrained(
                    folder, trust_remote_code=True).eval()
                keys = cache_bytes(shrunk, ids)[0]
                p1 = perplexity(shrunk, held, tokenizer, max_length=128, batch_size=1)
                kl = next_token_kl(model, shrunk, held, tokenizer, max_length=128,
                                   batch_size=1)
                del shrunk
                channels = report.key_cache_channels
                row = {"budget": budget, "allocation": report.allocation,
                       "plan_budget_used": report.plan.budget_used,
                       "key_channels_per_token_ratio": channels["compressed"]
                       / channels["original"],
                       "key_cache_bytes": keys, "key_cache_ratio": keys / keys0,
                       "qk_parameter_ratio": report.qk_parameters["compressed"]
                       / report.qk_parameters["original"],
                       "perplexity": p1, "perplexity_ratio": p1 / p0, "mean_kl": kl.mean_kl,
                       "max_kl": kl.max_kl, "seconds_compress": seconds,
                       "fidelity_evaluation_half": report.fidelity}
                figures["rows"].append(row)
                print(f"budget {budget:g} {report.allocation} (plan {report.plan.budget_used:.3f}):"
                      f" held-out perplexity {p1 / p0:.4f}x, mean KL {kl.mean_kl:.4f}; key cache "
                      f"{keys / keys0:.3f}x ({channels['compressed']}/{channels['original']} "
                      f"channels per token); compress_model {seconds:.0f} s", flush=True)
                if args.out:  # after every row: a long run keeps what it measured
                    Path(args.out).write_text(json.dumps(figures, indent=2, default=float))
    return figures


if __name__ == "__main__":
    main()
    sys.exit(0)
