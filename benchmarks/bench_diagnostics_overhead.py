"""Extra time of the residual diagnostics on clean Gaussian data (target: at most 20%).

``IntrinsicRankEstimator().fit`` on clean Gaussian data at several shapes, with the residual
diagnostics of the threshold test on, against the same fit with them off (the calibrated rule
called without the kept rows, so that it reads the Tracy–Widom edges directly, as it does
when the diagnostics pass). Both are measured in the same run, alternating, and the minimum
over repeats is kept; the ratio per shape is printed, in wall-clock time and in the process's
CPU time (which leaves out the time other processes hold the cores: on a shared machine the
wall-clock minimum still carries some of it).

Run::

    OPENBLAS_NUM_THREADS=1 python benchmarks/bench_diagnostics_overhead.py [--repeats 9]
"""

import argparse
import time
from contextlib import contextmanager

import numpy as np

import sklearn_ebound._rules.dispatch as dispatch
from sklearn_ebound import IntrinsicRankEstimator

# (n_samples, n_features, n_targets, rank)
SHAPES = [(500, 10, 10, 2), (2000, 20, 60, 0), (2000, 20, 60, 4), (20000, 50, 50, 3)]
TARGET = 1.2


@contextmanager
def diagnostics_off():
    """The static rank test without rows to diagnose: the Tracy–Widom reading."""
    calibrated = dispatch.static_rank_test

    def without_rows(moments, operator, significance, sample=None, rng=None, **kwargs):
        return calibrated(moments, operator, significance, None, rng, **kwargs)

    dispatch.static_rank_test = without_rows
    try:
        yield
    finally:
        dispatch.static_rank_test = calibrated


def clean_task(n, p, q, rank, rng):
    X = rng.standard_normal((n, p))
    B = rng.standard_normal((p, rank)) @ rng.standard_normal((rank, q)) * 0.3
    return X, X @ B + rng.standard_normal((n, q))


def time_fit(X, Y, n_fits):
    """Wall-clock and CPU seconds per fit, and the estimator."""
    estimator = IntrinsicRankEstimator()
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(n_fits):
        estimator.fit(X, Y)
    return ((time.perf_counter() - start) / n_fits, (time.process_time() - cpu) / n_fits,
            estimator)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9, help="alternating repeats per shape")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    print(f"{'n, p, q, rank':>20} {'off ms':>8} {'on ms':>8} {'ratio':>6} "
          f"{'cpu off':>8} {'cpu on':>8} {'ratio':>6} {'same rank':>9}")
    worst = worst_cpu = 0.0
    for shape in SHAPES:
        X, Y = clean_task(*shape, rng)
        n_fits = max(2, int(20_000 / shape[0]))
        best = {"on": [np.inf, np.inf], "off": [np.inf, np.inf]}
        time_fit(X, Y, 1)  # warm up
        for _ in range(args.repeats):
            with diagnostics_off():
                *off, plain = time_fit(X, Y, n_fits)
            *on, diagnosed = time_fit(X, Y, n_fits)
            for key, times in (("off", off), ("on", on)):
                best[key] = [min(b, t) for b, t in zip(best[key], times, strict=True)]
        ratio, cpu_ratio = (best["on"][i] / best["off"][i] for i in range(2))
        worst, worst_cpu = max(worst, ratio), max(worst_cpu, cpu_ratio)
        same = plain.rank_ == diagnosed.rank_ and diagnosed.noise_model_ == "gaussian"
        print(f"{str(shape):>20} {best['off'][0] * 1e3:8.2f} {best['on'][0] * 1e3:8.2f} "
              f"{ratio:6.3f} {best['off'][1] * 1e3:8.2f} {best['on'][1] * 1e3:8.2f} "
              f"{cpu_ratio:6.3f} {str(same):>9}")
    print(f"worst ratio {worst:.3f} wall-clock, {worst_cpu:.3f} CPU (target <= {TARGET})")


if __name__ == "__main__":
    main()
