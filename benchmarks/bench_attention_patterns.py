"""Weighted masks and logit biases: issue 27's table row, and a grid of planted tasks.

1. The table row: causal linear attention weighted ``1/n`` (the unnormalised convention of
   in-context-learning theory), ``d = 12, n = 24, N = 800``, ``||W||_2 = 1`` (rank 3, singular
   values 1), noise sd 0.02, drawn by plain numpy (not the package's generator), read with
   ``attention="linear"`` and ``mask=`` the weights with ``mask_normalization="none"``, and,
   for comparison, with ``mask="causal"`` (the average over the visible keys), value map known
   and unknown.
2. The grid: linear attention with a weighted mask (averaged, as given, the ``1/n`` causal
   weights) and softmax attention with a logit bias (an array, ALiBi slopes, causal ALiBi),
   ``d in {8, 16}``, ``rank in {1, 3}``, ``n = 16``, value map known, planted by
   :func:`~sklearn_ebound.datasets.make_attention_task`: the rate of exact readings, the
   warnings, and the largest relative difference of the dense and matrix-free kernels.

    python benchmarks/bench_attention_patterns.py [--draws 6] [--repeats 2] [--quick]
"""

import argparse
import itertools
import time
import warnings

import numpy as np

from sklearn_ebound import IntrinsicRankEstimator
from sklearn_ebound._kernel_moments import KernelMoments
from sklearn_ebound.datasets import make_attention_task
from sklearn_ebound.exceptions import RankEstimationWarning


def table_row_data(seed, d=12, n=24, n_samples=800, rank=3, noise=0.02):
    """``Y = (1/n) sum_{j <= i} (x_iᵀ W x_j) x_j + E``, drawn without the package."""
    rng = np.random.default_rng(seed)
    U = np.linalg.qr(rng.standard_normal((d, rank)))[0]
    R = np.linalg.qr(rng.standard_normal((d, rank)))[0]
    W = U @ R.T  # rank 3, ||W||_2 = 1
    X = rng.standard_normal((n_samples, n, d))
    weights = np.tril(np.ones((n, n))) / n
    Y = ((X @ W @ X.transpose(0, 2, 1)) * weights) @ X + noise * rng.standard_normal(X.shape)
    return X, Y, weights


def _fit(estimator, X, Y):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rank = estimator.fit(X, Y).rank_
    return rank, any(issubclass(w.category, RankEstimationWarning) for w in caught)


def table_row(draws):
    rows = []
    for value, (how, reading) in itertools.product(
            ("identity", None),
            [("weights 1/n, mask_normalization='none'", "weights"),
             ("mask='causal' (the average)", "causal")]):
        ranks, warned, start = [], 0, time.perf_counter()
        for seed in range(draws):
            X, Y, weights = table_row_data(seed)
            pattern = (dict(mask=weights, mask_normalization="none") if reading == "weights"
                       else dict(mask="causal"))
            rank, warn = _fit(IntrinsicRankEstimator("attention", attention="linear",
                                                     value=value, **pattern), X, Y)
            ranks.append(rank)
            warned += warn
        seconds = time.perf_counter() - start
        rows.append(dict(value=value, reading=how, ranks=ranks, warned=warned))
        print(f"value={value!s:8s}  {how:40s} ranks {ranks}  exact {ranks.count(3)}/{draws}  "
              f"warned {warned}/{draws}  {seconds:.1f} s", flush=True)
    return rows


def patterns(n):
    rng = np.random.RandomState(0)
    weights = rng.uniform(0.2, 2.0, (n, n)) * (rng.uniform(size=(n, n)) < 0.6) + np.eye(n)
    return {
        "linear, weights averaged": ("linear", dict(mask=weights, mask_normalization="mean")),
        "linear, weights as given": ("linear", dict(mask=weights / n, mask_normalization="none")),
        "linear, causal 1/n": ("linear", dict(mask=np.tril(np.ones((n, n))) / n,
                                              mask_normalization="none")),
        "softmax, bias array": ("softmax", dict(logit_bias=0.8 * rng.standard_normal((n, n)))),
        "softmax, ALiBi 0.3": ("softmax", dict(logit_bias=("alibi", 0.3))),
        "softmax, causal ALiBi 0.5": ("softmax", dict(mask="causal",
                                                      logit_bias=("alibi", 0.5))),
    }


def grid(repeats, quick, n=16, n_samples=400):
    hits, worst = [], 0.0
    for name, (attention, pattern) in patterns(n).items():
        for d, rank in itertools.product((8,) if quick else (8, 16), (1, 3)):
            ranks, warned = [], 0
            for seed in range(repeats):
                X, Y, params = make_attention_task(attention, n_samples, n, d, rank=rank,
                                                   value="random", noise=0.1,
                                                   random_state=100 * d + 10 * rank + seed,
                                                   return_params=True, **pattern)
                read, warn = _fit(IntrinsicRankEstimator("attention", attention=attention,
                                                         value=params.V, **pattern), X, Y)
                ranks.append(read)
                warned += warn
                if seed == 0:  # the two solvers on the same statistics
                    dense, free = (KernelMoments(params.V, attention, solver=solver,
                                                 refine=False, **pattern)
                                   .update(X, Y).solve(tol=1e-13)
                                   for solver in ("dense", "cg"))
                    worst = max(worst, float(np.abs(free.kernel - dense.kernel).max()
                                             / np.abs(dense.kernel).max()))
            hits += [r == rank for r in ranks]
            print(f"{name:26s} d={d:2d} rank={rank}  read {ranks}  warned {warned}", flush=True)
    rate = float(np.mean(hits))
    print(f"exact {rate:.3f} over {len(hits)} tasks; dense vs matrix-free kernels differ by at "
          f"most {worst:.1e} (relative)")
    return dict(exact=rate, tasks=len(hits), solver_difference=worst)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=6, help="draws of the table row")
    parser.add_argument("--repeats", type=int, default=2, help="draws per grid cell")
    parser.add_argument("--quick", action="store_true", help="2 draws, d = 8, one repeat")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    rows = table_row(2 if args.quick else args.draws)
    summary = grid(1 if args.quick else args.repeats, args.quick)
    print(f"{time.perf_counter() - start:.0f} s")
    return {"table_row": rows, "grid": summary}


if __name__ == "__main__":
    main()
