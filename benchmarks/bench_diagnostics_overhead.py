"""Extra time of the residual diagnostics on clean Gaussian data (target: at most 20%).

``IntrinsicRankEstimator().fit`` on clean Gaussian data at several shapes, with the residual
diagnostics of the threshold test on, against the same fit with them off (the calibrated rule
called without the kept rows, so that it reads the Tracy–Widom edges directly, as it does
when the diagnostics pass). Both are measured in the same run, alternating, and the minimum
over repeats is kept; the ratio per shape is printed.

Run::

    OPENBLAS_NUM_THREADS=1 python benchmarks/bench_diagnostics_overhead.py [--repeats 9]
"""

import argparse
import time
from contextlib import contextmanager

import numpy as np

import sklearn_ebound._rank_rules as rank_rules
from sklearn_ebound import IntrinsicRankEstimator

# (n_samples, n_features, n_targets, rank)
SHAPES = [(500, 10, 10, 2), (2000, 20, 60, 0), (2000, 20, 60, 4), (20000, 50, 50, 3)]
TARGET = 1.2


@contextmanager
def diagnostics_off():
    """The calibrated threshold rule without rows to diagnose: the Tracy–Widom reading."""
    calibrated = rank_rules.calibrated_threshold_rule

    def without_rows(moments, operator, significance, sample=None, rng=None, **kwargs):
        return calibrated(moments, operator, significance, None, rng, **kwargs)

    rank_rules.calibrated_threshold_rule = without_rows
    try:
        yield
    finally:
        rank_rules.calibrated_threshold_rule = calibrated


def clean_task(n, p, q, rank, rng):
    X = rng.standard_normal((n, p))
    B = rng.standard_normal((p, rank)) @ rng.standard_normal((rank, q)) * 0.3
    return X, X @ B + rng.standard_normal((n, q))


def time_fit(X, Y, n_fits):
    estimator = IntrinsicRankEstimator()
    start = time.perf_counter()
    for _ in range(n_fits):
        estimator.fit(X, Y)
    return (time.perf_counter() - start) / n_fits, estimator


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9, help="alternating repeats per shape")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    print(f"{'n, p, q, rank':>20} {'off ms':>8} {'on ms':>8} {'ratio':>6} {'same rank':>9}")
    worst = 0.0
    for shape in SHAPES:
        X, Y = clean_task(*shape, rng)
        n_fits = max(2, int(20_000 / shape[0]))
        best_on = best_off = np.inf
        time_fit(X, Y, 1)  # warm up
        for _ in range(args.repeats):
            with diagnostics_off():
                off, plain = time_fit(X, Y, n_fits)
            on, diagnosed = time_fit(X, Y, n_fits)
            best_off, best_on = min(best_off, off), min(best_on, on)
        ratio = best_on / best_off
        worst = max(worst, ratio)
        same = plain.rank_ == diagnosed.rank_ and diagnosed.noise_model_ == "gaussian"
        print(f"{str(shape):>20} {best_off * 1e3:8.2f} {best_on * 1e3:8.2f} {ratio:6.3f} "
              f"{str(same):>9}")
    print(f"worst ratio {worst:.3f} (target <= {TARGET})")


if __name__ == "__main__":
    main()
