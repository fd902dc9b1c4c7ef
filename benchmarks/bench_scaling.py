"""Speed and scale of the static estimator: rows streamed out of core, features in memory.

1. Against the number of rows ``N`` (10^4 ... 10^7 at ``p = q = 64``): chunks are generated on
   the fly and fed to ``IntrinsicRankEstimator.partial_fit`` (or, where that does not exist,
   to the :class:`~sklearn_ebound._moments.Moments` accumulator it is built on), so memory
   stays bounded. Reported: seconds of the moment pass plus the final rank read (``fit s``,
   generation excluded), rows per second, the seconds of ``partial_fit`` on the same chunks (it also
   re-reads the rank after each chunk), peak traced memory, the rank read, and the **GEMM
   fraction**: the time of a plain numpy ``Z.T @ Z`` of every chunk ``Z = [X, Y]`` divided by
   the time of the moment pass over the same chunks, measured interleaved in the same run.
   Target: GEMM fraction >= 0.5.
2. Against the number of features ``p = q`` (32 ... 1024, in memory): ``fit`` time against
   scikit-learn's ``LinearRegression().fit`` on the same data (the least-squares fit a user
   runs anyway), and peak traced memory relative to the size of ``X`` and ``Y``.

    python benchmarks/bench_scaling.py [--quick] [--max-rows 10000000] [--features 64]
"""

import argparse
import json
import resource
import time
import tracemalloc
from pathlib import Path

import numpy as np
from _timing import best_time
from sklearn.linear_model import LinearRegression

from sklearn_ebound import IntrinsicRankEstimator
from sklearn_ebound._least_squares import solve_static
from sklearn_ebound._moments import Moments
from sklearn_ebound._rules.static_rank_test import gaussian_rank_test

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "scaling.json"
DOCS = ROOT / "docs" / "performance"
RANK = 8
MIB = 2.0**20


def _operator(p, q, rng):
    """A rank-``RANK`` operator with singular values well above the noise."""
    U = np.linalg.qr(rng.standard_normal((p, RANK)))[0]
    V = np.linalg.qr(rng.standard_normal((q, RANK)))[0]
    return (U * np.linspace(2.0, 1.0, RANK)) @ V.T


def chunks(n_rows, p, q, chunk_rows, seed=0):
    """Yield ``(X, Y)`` chunks of a planted task ``Y = X B + E``, generated on the fly."""
    rng = np.random.default_rng(seed)
    coef = _operator(p, q, rng)
    for start in range(0, n_rows, chunk_rows):
        m = min(chunk_rows, n_rows - start)
        X = rng.standard_normal((m, p))
        yield X, X @ coef + rng.standard_normal((m, q))


def _rank_from_moments(moments):
    """The default criterion's rank read from accumulated moments (the estimator's own rule)."""
    significance = IntrinsicRankEstimator().significance
    return gaussian_rank_test(moments, solve_static(moments), significance).rank


def stream_fit(n_rows, p, q, chunk_rows):
    """Stream the chunks; time, interleaved on each chunk, a plain ``Z.T @ Z``, the moment pass
    (``Moments.update``) and the public streaming API (``partial_fit``, which also re-reads
    the rank after every chunk)."""
    streaming = hasattr(IntrinsicRankEstimator, "partial_fit")
    est = IntrinsicRankEstimator()
    moments = Moments.empty(p, q)
    t_gemm = t_moments = t_api = 0.0
    tracemalloc.start()
    for X, Y in chunks(n_rows, p, q, chunk_rows):
        Z = np.concatenate([X, Y], axis=1)
        start = time.perf_counter()
        Z.T @ Z
        t_gemm += time.perf_counter() - start
        del Z
        start = time.perf_counter()
        moments.update(X, Y)
        t_moments += time.perf_counter() - start
        if streaming:
            start = time.perf_counter()
            est.partial_fit(X, Y)
            t_api += time.perf_counter() - start
    start = time.perf_counter()
    rank = _rank_from_moments(moments)
    t_read = time.perf_counter() - start
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    if streaming:
        assert est.rank_ == rank, (est.rank_, rank)
    chunk_bytes = min(chunk_rows, n_rows) * (p + q) * 8
    flops = 2 * n_rows * (p + q) ** 2
    return {"rows": n_rows, "seconds": t_moments + t_read, "moment_seconds": t_moments,
            "read_seconds": t_read, "gemm_seconds": t_gemm,
            "partial_fit_seconds": t_api if streaming else None,
            "gemm_fraction": t_gemm / t_moments, "rows_per_second": n_rows / (t_moments + t_read),
            "gemm_gflops": flops / t_gemm / 1e9, "fit_gflops": flops / t_moments / 1e9,
            "peak_mib": peak / MIB, "chunk_mib": chunk_bytes / MIB, "rank": rank}


def in_memory_fit(n_rows, p, repeats):
    """``fit`` against ``LinearRegression().fit`` at ``p = q`` features, in memory."""
    X, Y = next(chunks(n_rows, p, p, n_rows, seed=1))
    t_ols, _ = best_time(lambda: LinearRegression().fit(X, Y), repeats)
    t_fit, est = best_time(lambda: IntrinsicRankEstimator().fit(X, Y), repeats)
    tracemalloc.start()
    IntrinsicRankEstimator().fit(X, Y)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    data = (X.nbytes + Y.nbytes) / MIB
    return {"p": p, "rows": n_rows, "seconds": t_fit, "ols_seconds": t_ols,
            "ratio_to_ols": t_fit / t_ols, "peak_mib": peak / MIB, "data_mib": data,
            "peak_over_data": peak / MIB / data, "rank": est.rank_}


def write_docs(report):
    DOCS.mkdir(parents=True, exist_ok=True)
    lines = ['"rows N","fit s","rows/s","GEMM fraction","partial_fit s","peak MiB","rank"']
    for r in report["rows"]:
        api = r["partial_fit_seconds"]
        lines.append(f'"{r["rows"]:.0e}",{r["seconds"]:.2f},{r["rows_per_second"]:.3g},'
                     f'{r["gemm_fraction"]:.2f},{"n/a" if api is None else f"{api:.2f}"},'
                     f'{r["peak_mib"]:.1f},{r["rank"]}')
    (DOCS / "scaling_rows.csv").write_text("\n".join(lines) + "\n")
    lines = ['"p = q","fit s","LinearRegression s","ratio","peak / data","rank"']
    for r in report["features"]:
        lines.append(f'{r["p"]},{r["seconds"]:.3f},{r["ols_seconds"]:.3f},'
                     f'{r["ratio_to_ols"]:.2f},{r["peak_over_data"]:.2f},{r["rank"]}')
    (DOCS / "scaling_features.csv").write_text("\n".join(lines) + "\n")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, a smoke run")
    parser.add_argument("--max-rows", type=int, default=10_000_000)
    parser.add_argument("--features", type=int, default=64, help="p = q of the row scaling")
    parser.add_argument("--chunk-rows", type=int, default=1 << 15)
    parser.add_argument("--feature-rows", type=int, default=20_000,
                        help="rows of the feature scaling")
    parser.add_argument("--max-features", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.quick:
        args.max_rows, args.features, args.chunk_rows = 100_000, 16, 1 << 13
        args.feature_rows, args.max_features, args.repeats = 2_000, 64, 1
    row_counts = [10**k for k in range(4, 8) if 10**k <= args.max_rows]
    p = args.features
    print(f"rows streamed in chunks of {args.chunk_rows}, p = q = {p}, planted rank {RANK}")
    print(f"{'N':>9} {'fit s':>9} {'rows/s':>9} {'GEMM frac':>9} {'mom GF/s':>8} "
          f"{'GEMM GF/s':>9} {'partial_fit s':>13} {'peak MiB':>8} {'chunk MiB':>9} {'rank':>4}")
    rows = []
    for n in row_counts:
        r = stream_fit(n, p, p, args.chunk_rows)
        rows.append(r)
        api = "n/a" if r["partial_fit_seconds"] is None else f"{r['partial_fit_seconds']:.3f}"
        print(f"{n:>9.0e} {r['seconds']:9.3f} {r['rows_per_second']:9.3g} "
              f"{r['gemm_fraction']:9.2f} {r['fit_gflops']:8.1f} {r['gemm_gflops']:9.1f} "
              f"{api:>13} {r['peak_mib']:8.1f} {r['chunk_mib']:9.1f} {r['rank']:>4}")
    fraction = sum(r["gemm_seconds"] for r in rows) / sum(r["moment_seconds"] for r in rows)
    print(f"GEMM fraction of the moment pass over all rows {fraction:.2f}  (target >= 0.5)  "
          f"{'ok' if fraction >= 0.5 else 'MISSED'}")
    if rows[-1]["partial_fit_seconds"] is not None:
        overhead = rows[-1]["partial_fit_seconds"] / rows[-1]["seconds"]
        print(f"partial_fit / moment pass at N={rows[-1]['rows']:.0e}: {overhead:.2f}")

    print(f"\nin memory, N = {args.feature_rows}, p = q")
    print(f"{'p':>5} {'fit s':>8} {'OLS s':>8} {'fit/OLS':>7} {'peak MiB':>8} {'data MiB':>8} "
          f"{'peak/data':>9} {'rank':>4}")
    features = []
    p = 32
    while p <= args.max_features:
        r = in_memory_fit(args.feature_rows, p, args.repeats)
        features.append(r)
        print(f"{p:>5} {r['seconds']:8.3f} {r['ols_seconds']:8.3f} {r['ratio_to_ols']:7.2f} "
              f"{r['peak_mib']:8.1f} {r['data_mib']:8.1f} {r['peak_over_data']:9.2f} "
              f"{r['rank']:>4}")
        p *= 2
    max_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"\nprocess max RSS {max_rss:.0f} MiB")
    report = {"rows": rows, "gemm_fraction": fraction, "features": features,
              "max_rss_mib": max_rss, "quick": args.quick}
    if not args.quick or args.output != RESULTS:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(report, indent=1))
    if args.write_docs:
        write_docs(report)
    return report


if __name__ == "__main__":
    main()
