"""Whether the package's head model reproduces a model's real head outputs (Gemma 3 first).

Loads a model (a ``.gguf`` file or a saved directory, :func:`load_pretrained`), runs it on
``--n-lines`` held-out lines (``benchmarks/_held_out.py``, of another subject than any
calibration text: ``--held-out``, default the Python reference manual) and compares, for
every head of every layer, what the model feeds its output projection with what
:class:`~sklearn_ebound.heads._head_forms.HeadModel` computes from the captured inputs of
the query projection, as the model's family declares its attention (for Gemma 3: each query
and key head RMS-normalised with its gains ``1 + w`` before the rotation, the logit scale
``query_pre_attn_scalar ** -0.5``, sliding-window and global layers with their own rotary
bases). The error of a head is ``||O_model - O_head_model|| / ||O_model||`` over the real
tokens; the median and the maximum over heads are printed with the family read.

The head model computes in float64. ``--dtype float64`` (the default) runs the model in
float64 too, one line at a time (``--batch-size 1``: Hugging Face's float64 attention turns
a left-padded row's pad positions into NaN, which the next layer's values carry), so that
the error measures the head model rather than float32 rounding; ``--dtype float32`` runs
the model as loaded (a GGUF file is dequantised to float32), batched and padded as its
tokenizer pads.

Usage::

    python benchmarks/bench_gemma_head_model.py MODEL.gguf [--n-lines 30] [--dtype float32]
"""

import argparse
import json
import time
from pathlib import Path

import numpy as np


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a .gguf file or a saved model directory")
    parser.add_argument("--n-lines", type=int, default=30)
    parser.add_argument("--held-out", default="manual", choices=("modules", "manual",
                                                                  "readmes"))
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--dtype", default="float64", choices=("float64", "float32"))
    parser.add_argument("--batch-size", type=int, default=None,
                        help="lines per forward pass (default: 1 in float64, 8 in float32)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None, help="JSON of the per-head errors")
    args = parser.parse_args(argv)

    import torch
    from _held_out import held_out_sentences

    from sklearn_ebound.heads._head_forms import head_model_errors
    from sklearn_ebound.heads._inputs import load_pretrained

    torch.set_num_threads(args.threads)
    model, tokenizer = load_pretrained(args.model)
    model.eval()
    if args.dtype == "float64":
        model = model.double()
    batch_size = args.batch_size or (1 if args.dtype == "float64" else 8)
    lines = held_out_sentences(args.held_out)[:args.n_lines]
    start = time.perf_counter()
    errors, family = head_model_errors(model, lines, tokenizer, max_length=args.max_length,
                                       batch_size=batch_size)
    seconds = time.perf_counter() - start
    dtype = str(next(model.parameters()).dtype)
    print(f"family {family.name} ({type(model).__name__}, {dtype}, {batch_size} lines per "
          f"pass, padding {getattr(tokenizer, 'padding_side', '?')}); {errors.shape[0]} layers x "
          f"{errors.shape[1]} heads on {len(lines)} held-out lines ({args.held_out})")
    print(f"relative error of the head model: median {np.median(errors):.3g}, max "
          f"{errors.max():.3g} ({seconds:.1f} s)")
    out = {"model": Path(args.model).name, "family": family.name, "dtype": dtype,
           "batch_size": batch_size, "n_lines": len(lines), "held_out": args.held_out,
           "median": float(np.median(errors)), "max": float(errors.max()),
           "errors": errors.tolist()}
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(out, fh, indent=2)
    return out


if __name__ == "__main__":
    main()
