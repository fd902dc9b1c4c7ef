"""Overhead of LowRankAttentionRegressor over a hand-written torch training loop.

Both train the same module for one epoch (Adam, mean squared error) on mini-batches taken in
order (then the two take the very same steps, which is checked) or shuffled (each draws its
own permutation and gathers the batches); the wrapper adds input validation, skorch's data
loading, callbacks and history. Target: the wrapper takes at most 1.15x the time of the plain
loop.

    python benchmarks/bench_attention_wrapper.py [--n-samples 4096] [--n-tokens 32]
"""

import argparse
import copy

import numpy as np
import torch
from _timing import best_time

from sklearn_ebound.datasets import make_attention_task
from sklearn_ebound.nn import LowRankAttentionRegressor


def plain_epoch(module, X, Y, batch_size, lr, shuffle=False):
    """One epoch of a hand-written loop: tensors sliced in order or gathered, Adam, MSE."""
    X, Y = torch.as_tensor(X, dtype=torch.float32), torch.as_tensor(Y, dtype=torch.float32)
    optimizer = torch.optim.Adam(module.parameters(), lr=lr)
    module.train()
    order = torch.randperm(len(X)) if shuffle else None
    for start in range(0, len(X), batch_size):
        if shuffle:
            batch = order[start : start + batch_size]
            X_batch, Y_batch = X[batch], Y[batch]
        else:
            X_batch, Y_batch = X[start : start + batch_size], Y[start : start + batch_size]
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(module(X_batch), Y_batch)
        loss.backward()
        optimizer.step()
    return module


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-samples", type=int, default=4096)
    parser.add_argument("--n-tokens", type=int, default=32)
    parser.add_argument("--n-features", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--attention", default="softmax", choices=["softmax", "linear"])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    X, Y = make_attention_task(
        args.attention, args.n_samples, args.n_tokens, args.n_features, rank=4,
        logit_scale=2.0, value="random", random_state=0,
    )
    X, Y = X.astype(np.float32), Y.astype(np.float32)
    lr = 1e-3

    def make_net(shuffle):
        return LowRankAttentionRegressor(
            attention=args.attention, lr=lr, max_epochs=1, batch_size=args.batch_size,
            iterator_train__shuffle=shuffle, random_state=0,
        ).fit(X, Y)

    # fit: validation, a fresh module and optimizer, one epoch; partial_fit: the epoch alone.
    times = {}
    for shuffle in (False, True):
        net = make_net(shuffle)
        module = copy.deepcopy(net.module_)
        times["fit", shuffle], _ = best_time(lambda net=net: net.fit(X, Y), args.repeats)
        times["epoch", shuffle], _ = best_time(
            lambda net=net: net.partial_fit(X, Y), args.repeats
        )
        times["plain", shuffle], _ = best_time(
            lambda module=module, shuffle=shuffle: plain_epoch(
                module, X, Y, args.batch_size, lr, shuffle
            ),
            args.repeats,
        )

    # Same start, same batches in order: the two loops take the same steps.
    net = make_net(False)
    start = copy.deepcopy(net.module_)
    net.initialize()
    net.module_.load_state_dict(start.state_dict())
    net.optimizer_ = torch.optim.Adam(net.module_.parameters(), lr=lr)
    net.partial_fit(X, Y)
    reference = plain_epoch(start, X, Y, args.batch_size, lr)
    gap = max((a - b).abs().max().item() for a, b in zip(
        net.module_.parameters(), reference.parameters(), strict=True))

    n_batches = -(-args.n_samples // args.batch_size)
    print(f"{args.attention} attention, {args.n_samples} sequences x {args.n_tokens} tokens x "
          f"{args.n_features} channels, {n_batches} batches of {args.batch_size}, "
          f"{torch.get_num_threads()} torch threads")
    for shuffle, order in ((False, "in order"), (True, "shuffled")):
        plain = times["plain", shuffle]
        print(f"batches {order}:")
        print(f"  plain torch loop, one epoch      : {plain * 1e3:8.1f} ms")
        print(f"  regressor partial_fit, one epoch : {times['epoch', shuffle] * 1e3:8.1f} ms  "
              f"ratio {times['epoch', shuffle] / plain:.3f}x (target <= 1.15x)")
        print(f"  regressor fit, one epoch         : {times['fit', shuffle] * 1e3:8.1f} ms  "
              f"ratio {times['fit', shuffle] / plain:.3f}x")
    print(f"largest parameter gap after one epoch from the same start: {gap:.2e}")


if __name__ == "__main__":
    main()
