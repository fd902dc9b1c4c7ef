"""What the shrunk form of a causal language model saves and what it costs, at a few budgets.

For SmolLM2-135M-Instruct (its GGUF file, dequantised to float32) or any directory
``AutoModelForCausalLM`` loads: :func:`compress_model` on ``--n-texts`` standard-library
docstring lines (the default Fisher plan; the curves computed once, kept in a checkpoint
folder and read back at the next budget), each budget written as a shrunk directory, loaded
back with ``trust_remote_code=True``, and measured against the original:

* the key cache after a ``--context``-token prompt (held-out text run together), in bytes,
  read off the cache tensors of both models, and its ratio;
* the query-key parameters' ratio;
* the held-out perplexity ratio, one sentence at a time (no padding counted), and the mean
  next-token KL to the original, on ``--n-held-out`` sentences of ``HELD_OUT_MODULES``
  (another subject; none is a calibration line);
* beside it the query-side form of :func:`compress_heads` at the same plan (``form="query"``,
  the original shapes: its key cache is the original's), measured the same way in memory.

    python benchmarks/bench_shrunk_decoder.py MODEL.gguf [--budgets 0.5,0.3] [--no-fit-planes]
"""

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from _held_out import held_out_sentences


def cache_bytes(model, ids):
    """Bytes of the keys and of the values a forward pass over ``ids`` caches."""
    import torch

    with torch.no_grad():
        cache = model(ids, use_cache=True).past_key_values
    return (sum(layer.keys.numel() * layer.keys.element_size() for layer in cache.layers),
            sum(layer.values.numel() * layer.values.element_size() for layer in cache.layers))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a .gguf file or a model directory")
    parser.add_argument("--n-texts", type=int, default=150)
    parser.add_argument("--n-held-out", type=int, default=120)
    parser.add_argument("--budgets", default="0.5,0.3")
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--checkpoint", default=None,
                        help="folder keeping the curves between runs (default: a temporary one)")
    parser.add_argument("--no-fit-planes", action="store_true",
                        help="keep the rotary planes as they are (no fitted scaled rotation)")
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
    texts = docstring_sentences()[:args.n_texts]
    held = held_out_sentences("modules", texts)[:args.n_held_out]
    ids = tokenizer(" ".join(held * 8), return_tensors="pt")["input_ids"][:, :args.context]
    keys0, values0 = cache_bytes(model, ids)
    p0 = perplexity(model, held, tokenizer, max_length=128, batch_size=1)
    figures = {"model": type(model).__name__, "n_texts": len(texts), "n_held_out": len(held),
               "context": int(ids.shape[1]), "fit_planes": not args.no_fit_planes,
               "key_cache_bytes_original": keys0,
               "value_cache_bytes_original": values0, "perplexity_original": p0, "rows": []}
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = Path(args.checkpoint or Path(tmp) / "checkpoint")
        for budget in (float(b) for b in args.budgets.split(",")):
            start = time.perf_counter()
            _, report = compress_model(model, texts, tokenizer=tokenizer, budget=budget,
                                       max_length=64, checkpoint=checkpoint,
                                       fit_planes=not args.no_fit_planes, form="shrunk",
                                       out=Path(tmp) / f"shrunk-{budget:g}")
            seconds = time.perf_counter() - start
            shrunk = transformers.AutoModelForCausalLM.from_pretrained(
                Path(tmp) / f"shrunk-{budget:g}", trust_remote_code=True).eval()
            keys, values = cache_bytes(shrunk, ids)
            p1 = perplexity(shrunk, held, tokenizer, max_length=128, batch_size=1)
            kl = next_token_kl(model, shrunk, held, tokenizer, max_length=128, batch_size=1)
            query, _ = compress_model(model, texts, tokenizer=tokenizer, budget=budget,
                                      max_length=64, checkpoint=checkpoint, form="query")
            pq = perplexity(query, held, tokenizer, max_length=128, batch_size=1)
            klq = next_token_kl(model, query, held, tokenizer, max_length=128, batch_size=1)
            params = report.qk_parameters
            row = {"budget": budget, "plan_budget_used": report.plan.budget_used,
                   "kept_rank_share": report.key_cache_channels["compressed"]
                   / report.key_cache_channels["original"],
                   "key_cache_bytes": keys, "key_cache_ratio": keys / keys0,
                   "value_cache_ratio": values / values0,
                   "qk_parameter_ratio": params["compressed"] / params["original"],
                   "perplexity": p1, "perplexity_ratio": p1 / p0, "mean_kl": kl.mean_kl,
                   "max_kl": kl.max_kl, "query_form_perplexity_ratio": pq / p0,
                   "query_form_mean_kl": klq.mean_kl, "seconds_compress": seconds,
                   "fidelity_evaluation_half": report.fidelity}
            figures["rows"].append(row)
            print(f"budget {budget:g} (plan {report.plan.budget_used:.3f}): key cache after "
                  f"{ids.shape[1]} tokens {keys} bytes, {keys / keys0:.3f}x the original's "
                  f"({keys0}); query-key parameters {row['qk_parameter_ratio']:.3f}x; held-out "
                  f"perplexity {p1 / p0:.3f}x, mean KL {kl.mean_kl:.4f} (query-side form, "
                  f"key cache 1.000x: {pq / p0:.3f}x, KL {klq.mean_kl:.4f}); "
                  f"compress_model {seconds:.0f} s", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=2, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
