"""Train LowRankAttentionRegressor on CUDA: agreement with the CPU, and throughput.

Fits the same softmax-attention task with the same seed on the CPU and on CUDA, checks that
the learned kernels, the predictions and the recovered rank agree, then times training epochs
at a larger size on CUDA. Runs in well under five minutes on one GPU; without CUDA it says so
and exits with status 0.

    python benchmarks/bench_attention_gpu.py [--n-samples 16384] [--n-tokens 128]
"""

import argparse
import sys
import time

import numpy as np
import torch

from sklearn_ebound.datasets import make_attention_task
from sklearn_ebound.nn import LowRankAttentionRegressor


def epoch_time(net, X, Y, epochs):
    """Seconds per epoch of ``partial_fit`` on an initialised net, synchronised on CUDA."""
    net.set_params(max_epochs=1).partial_fit(X, Y)  # warm-up: kernels, allocator
    torch.cuda.synchronize()
    start = time.perf_counter()
    net.set_params(max_epochs=epochs).partial_fit(X, Y)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / epochs


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-samples", type=int, default=16384)
    parser.add_argument("--n-tokens", type=int, default=128)
    parser.add_argument("--n-features", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("CUDA is not available (torch.cuda.is_available() is False): nothing to benchmark.")
        return 0
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")

    # 1. Agreement: a small task trained full-batch with the same seed on both devices.
    rank = 3
    X, Y = make_attention_task("softmax", 512, 16, 8, rank=rank, logit_scale=2.0,
                               value="random", random_state=0)
    params = dict(attention="softmax", lr=0.05, max_epochs=150, batch_size=-1, random_state=0)
    t0 = time.perf_counter()
    cpu = LowRankAttentionRegressor(device="cpu", **params).fit(X, Y)
    t_cpu = time.perf_counter() - t0
    t0 = time.perf_counter()
    gpu = LowRankAttentionRegressor(device="cuda", **params).fit(X, Y)
    t_gpu = time.perf_counter() - t0
    kernel_gap = np.abs(gpu.qk_kernel_ - cpu.qk_kernel_).max() / np.abs(cpu.qk_kernel_).max()
    pred_gap = np.abs(gpu.predict(X) - cpu.predict(X)).max()
    print(f"agreement: relative kernel gap {kernel_gap:.2e}, prediction gap {pred_gap:.2e}, "
          f"effective rank cpu {cpu.effective_rank_} / cuda {gpu.effective_rank_} "
          f"(planted {rank}); fit {t_cpu:.2f} s cpu, {t_gpu:.2f} s cuda")
    ok = kernel_gap < 1e-2 and pred_gap < 1e-2 and cpu.effective_rank_ == gpu.effective_rank_

    # 2. Throughput at a larger size.
    X, Y = make_attention_task("softmax", args.n_samples, args.n_tokens, args.n_features,
                               rank=8, logit_scale=2.0, value="random", random_state=0)
    X, Y = X.astype(np.float32), Y.astype(np.float32)
    for attention in ("softmax", "linear"):
        net = LowRankAttentionRegressor(
            attention=attention, device="cuda", max_epochs=1, batch_size=args.batch_size,
            lr=1e-3, random_state=0,
        ).fit(X, Y)
        seconds = epoch_time(net, X, Y, args.epochs)
        tokens = args.n_samples * args.n_tokens
        print(f"{attention:7s} attention: {seconds * 1e3:8.1f} ms/epoch, "
              f"{args.n_samples / seconds:10.0f} sequences/s, {tokens / seconds:12.0f} tokens/s "
              f"({args.n_samples} x {args.n_tokens} x {args.n_features}, batch "
              f"{args.batch_size})")
    print("CPU/CUDA agreement:", "OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
