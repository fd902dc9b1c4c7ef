"""False positives of the default rank test on noise alone, for white and correlated noise.

Every draw is ``Y = E`` with no signal, ``X`` standard normal, and the rows of ``E`` Gaussian with
a planted covariance; any rank above 0 is a false positive. The default ``threshold`` criterion
tests at ``significance=1e-3`` (a union of two such tests for correlated noise: at most 0.2%);
``--significance`` runs other levels on the same draws (nominal rate at most twice each). The
cells cover
the shapes where the noise covariance is hard to estimate (residual degrees of freedom
``dof = N - 1 - p`` near or below the number of targets ``q``) and the covariances that make an
edge go wrong: AR(1) correlation, one strong noise direction (a spike), a few noise factors.

    python benchmarks/bench_null_calibration.py [--reps 400] [--n-jobs 2] [--quick]
        [--significance 1e-3 [1e-2 ...]]
"""

import argparse
import json
import time
import warnings
from pathlib import Path

import numpy as np
from joblib import Parallel, delayed
from threadpoolctl import threadpool_limits

from sklearn_ebound import IntrinsicRankEstimator
from sklearn_ebound.datasets._static import ar1_covariance

RESULTS = Path(__file__).resolve().parent / "results" / "null_calibration.json"


def spike(q, height):
    """Identity plus ``height`` along the all-ones direction."""
    return np.eye(q) + height * np.full((q, q), 1 / q)


def factors(q, variances, seed=0):
    """Identity plus a few random noise factors with the given variances (per target, summed)."""
    loadings = np.random.default_rng(seed).standard_normal((q, len(variances)))
    return np.eye(q) + (loadings * np.sqrt(variances)) @ loadings.T / q


def cells():
    """(name, N, p, q, noise covariance)."""
    return [
        ("white, dof 49 < q 50", 100, 50, 50, np.eye(50)),
        ("AR 0.2, dof 49 < q 50", 100, 50, 50, ar1_covariance(50, 0.2)),
        ("AR 0.3, dof 49 < q 50", 100, 50, 50, ar1_covariance(50, 0.3)),
        ("AR 0.3, dof 299 > q 100", 400, 100, 100, ar1_covariance(100, 0.3)),
        ("AR 0.5, dof 49 < q 60", 100, 50, 60, ar1_covariance(60, 0.5)),
        ("AR 0.7, dof 169 > q 30", 200, 30, 30, ar1_covariance(30, 0.7)),
        ("spike 10, dof 49 < q 50", 100, 50, 50, np.diag(np.r_[10.0, np.ones(49)])),
        ("spike 6, dof 49 < q 60", 100, 50, 60, spike(60, 5.0)),
        ("spike 51, dof 59 > q 50", 120, 60, 50, spike(50, 50.0)),
        ("3 factors, dof 59 < q 60", 120, 60, 60, factors(60, [30.0, 15.0, 6.0])),
    ]


def draw_ranks(n, p, covariance, seed, levels):
    """The rank read at each significance level from one draw of noise alone."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, p))
    Y = rng.standard_normal((n, len(covariance))) @ np.linalg.cholesky(covariance).T
    with threadpool_limits(1), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the dof <= q warning is expected
        return [IntrinsicRankEstimator(significance=level).fit(X, Y).rank_ for level in levels]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=400, help="draws per cell")
    parser.add_argument("--n-jobs", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="two cells, 4 draws each")
    parser.add_argument("--significance", type=float, nargs="+", default=[1e-3],
                        help="levels of the test (each run on the same draws)")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    levels = args.significance
    grid = cells()[:2] if args.quick else cells()
    reps = 4 if args.quick else args.reps
    start = time.perf_counter()
    rows = []
    print(f"{'cell':<28} false positives out of {reps} at significance "
          + ", ".join(f"{level:g} (nominal at most {200 * level:g}%)" for level in levels))
    for name, n, p, q, covariance in grid:
        ranks = np.array(Parallel(n_jobs=args.n_jobs)(
            delayed(draw_ranks)(n, p, covariance, seed, levels) for seed in range(reps)))
        counts = np.sum(ranks > 0, axis=0)
        for level, count in zip(levels, counts, strict=True):
            rows.append({"cell": name, "n": n, "p": p, "q": q, "reps": reps,
                         "significance": level, "false_positives": int(count),
                         "rate": float(count / reps)})
        print(f"{name:<28} " + "  ".join(f"{count:4d} ({100 * count / reps:5.2f}%)"
                                          for count in counts), flush=True)
    print(f"\n{time.perf_counter() - start:.0f} s")
    if not args.quick or args.output != RESULTS:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps({"cells": rows, "quick": args.quick}, indent=1))
    return rows


if __name__ == "__main__":
    main()
