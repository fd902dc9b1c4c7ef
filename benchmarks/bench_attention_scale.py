"""Time and memory of the attention data-only estimator at model widths.

``IntrinsicRankEstimator("attention", attention="linear", value="identity")`` reads the rank of
the query–key kernel ``W`` (``d x d``) from sequences ``X (N, n, d) -> Y (N, n, d)`` of a linear
attention task with planted ``rank(W)``. Its least squares has ``d^2`` unknowns: up to ``d = 48``
the compressed normal matrix (``d^4 / 4`` floats) is accumulated and factorised; beyond, the
matrix-free conjugate-gradient solver applies the normal operator through per-sequence
products and keeps ``O(d^2)`` floats besides the sequences (or their ``d x d`` moments when
``d < n``). The sequences are generated on the fly, chunk by chunk, and fed to ``partial_fit``,
each with ``solve=False``; ``partial_fit()`` without data then solves once.

Reported for each configuration (each in a fresh process, at one BLAS thread): wall and CPU
seconds of the estimator (generation excluded), the peak memory traced while it runs (numpy's
allocations, the kept sequences included) and the process's maximum resident memory, the rank
read, and the ratio of its time to the floor measured in the same run: one pass of the
per-sequence products ``X_s^T X_s`` that any estimator of the kernel has to compute. The floor
is timed twice, chunk by chunk between the estimator's own chunks and again after the solve
(on fresh chunks of the same shape), so that it shares the machine's load with the
estimator; the ratio is that of CPU times to the mean of the two floors (CPU time leaves out
the time other processes take the core), with the range against either floor and the wall
ratio beside it.

Targets (issue 15): ``d = 384``, ``n = 128``, ``N = 2000``, rank 8: the right rank, peak under
2 GB, under 10 minutes on two cores; ``d = 768``, ``n = 128``, ``N = 1000``: under 6 GB;
``d = 128``, ``n = 256``, ``N = 10^4``: at most 10 times the floor; time linear in ``N n``.

    python benchmarks/bench_attention_scale.py                    # the whole suite
    python benchmarks/bench_attention_scale.py --n-features 384 --n-tokens 128 \\
        --n-samples 2000 --rank 8                                 # one configuration
    python benchmarks/bench_attention_scale.py --quick            # a smoke run (d = 8)
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time
import tracemalloc
import warnings
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from sklearn_ebound import IntrinsicRankEstimator

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "attention_scale.json"
DOCS = ROOT / "docs" / "performance"
MIB = 2.0**20

# (d, n, N, rank, group): the widths at n = 128, the d = 128 target, and N n over 10x.
SUITE = [(384, 128, 2000, 8, "width"), (768, 128, 1000, 8, "width"),
         (128, 256, 10_000, 4, "target"), (64, 128, 2000, 8, "width"),
         (128, 128, 2000, 8, "width"), (128, 128, 200, 8, "linearity"),
         (128, 128, 632, 8, "linearity")]


def chunks(n_samples, n_tokens, d, rank, chunk, noise=0.1, seed=0):
    """Linear attention ``Y_s = (1/n) X_s W X_s^T X_s + E_s`` with ``rank(W) = rank``, ``V = I``.

    The task of ``make_attention_task(attention="linear", value="identity")``, drawn chunk by chunk
    with one fixed kernel ``W``.
    """
    rng = np.random.default_rng(seed)
    U = np.linalg.qr(rng.standard_normal((d, rank)))[0]
    R = np.linalg.qr(rng.standard_normal((d, rank)))[0]
    W = U @ R.T
    for start in range(0, n_samples, chunk):
        m = min(chunk, n_samples - start)
        X = rng.standard_normal((m, n_tokens, d))
        mixing = (X @ W) @ X.transpose(0, 2, 1) / n_tokens
        yield X, mixing @ X + noise * rng.standard_normal((m, n_tokens, d))


def _floor_pass(X, clocks):
    """One floor pass ``X_s^T X_s`` over a chunk, added to ``clocks`` (wall, CPU)."""
    wall, cpu = time.perf_counter(), time.process_time()
    X.transpose(0, 2, 1) @ X
    clocks[0] += time.perf_counter() - wall
    clocks[1] += time.process_time() - cpu


def run(n_samples, n_tokens, d, rank, chunk, verbose=False):
    """One configuration at one BLAS thread: the estimator's wall and CPU seconds, and the floor
    twice, interleaved with the accumulation (chunk by chunk) and again after the solve (on
    fresh chunks of the same shape), so that both see the machine as the estimator did."""
    with threadpool_limits(limits=1):
        return _run(n_samples, n_tokens, d, rank, chunk, verbose)


def _run(n_samples, n_tokens, d, rank, chunk, verbose):
    est = IntrinsicRankEstimator("attention", attention="linear", value="identity")
    accumulate, during, after = [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]
    tracemalloc.start()
    for X, Y in chunks(n_samples, n_tokens, d, rank, chunk):
        _floor_pass(X, during)
        wall, cpu = time.perf_counter(), time.process_time()
        est.partial_fit(X, Y, solve=False)  # accumulate only
        accumulate[0] += time.perf_counter() - wall
        accumulate[1] += time.process_time() - cpu
        chunk_mib = (X.nbytes + Y.nbytes) / MIB
        del X, Y
    wall, cpu = time.perf_counter(), time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rank_read = int(est.partial_fit().rank_)  # the one solve
    solve = [time.perf_counter() - wall, time.process_time() - cpu]
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    rng = np.random.default_rng(1)
    for start in range(0, n_samples, chunk):
        _floor_pass(rng.standard_normal((min(chunk, n_samples - start), n_tokens, d)), after)
    total = [a + s for a, s in zip(accumulate, solve, strict=True)]
    floor = [(x + y) / 2 for x, y in zip(during, after, strict=True)]
    solver = "dense" if est._statistics.C is not None else "cg"
    if verbose:
        print(f"  accumulated in {accumulate[0]:.1f} s (CPU {accumulate[1]:.1f} s), solved in "
              f"{solve[0]:.1f} s (CPU {solve[1]:.1f} s)", flush=True)
    return {"n_features": d, "n_tokens": n_tokens, "n_samples": n_samples, "rank": rank,
            "chunk": chunk, "solver": solver, "seconds": total[0], "solve_seconds": solve[0],
            "cpu_seconds": total[1], "solve_cpu_seconds": solve[1],
            "floor_seconds": floor[0], "floor_cpu_seconds": floor[1],
            "floor_during_cpu_seconds": during[1], "floor_after_cpu_seconds": after[1],
            "floor_during_seconds": during[0], "floor_after_seconds": after[0],
            "ratio_to_floor": total[1] / floor[1], "wall_ratio_to_floor": total[0] / floor[0],
            "ratio_range": [total[1] / max(during[1], after[1]),
                            total[1] / min(during[1], after[1])],
            "peak_traced_mib": peak / MIB, "chunk_mib": chunk_mib,
            "dense_normal_mib": d**4 * 8 / MIB, "rank_read": rank_read,
            "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "load_average": os.getloadavg()[0]}


def report(r):
    print(f"d={r['n_features']} n={r['n_tokens']} N={r['n_samples']} planted rank {r['rank']}, "
          f"partial_fit in chunks of {r['chunk']}, solver {r['solver']}")
    print(f"  estimator            {r['seconds']:9.2f} s   (solve {r['solve_seconds']:.2f} s)"
          f"   rank_={r['rank_read']}")
    print(f"  estimator CPU        {r['cpu_seconds']:9.2f} s   (solve {r['solve_cpu_seconds']:.2f}"
          f" s)")
    print(f"  floor X_s^T X_s CPU  {r['floor_cpu_seconds']:9.2f} s   (during the accumulation "
          f"{r['floor_during_cpu_seconds']:.2f} s, after the solve "
          f"{r['floor_after_cpu_seconds']:.2f} s; wall {r['floor_seconds']:.2f} s)")
    low, high = r["ratio_range"]
    print(f"  ratio to floor (CPU) {r['ratio_to_floor']:9.1f}   ({low:.1f}-{high:.1f} against "
          f"either floor; wall {r['wall_ratio_to_floor']:.1f})")
    print(f"  peak traced {r['peak_traced_mib']:.0f} MiB (chunk {r['chunk_mib']:.0f} MiB; dense "
          f"d^2 x d^2 normal matrix {r['dense_normal_mib']:.0f} MiB); max RSS "
          f"{r['max_rss_mib']:.0f} MiB; load average {r['load_average']:.1f}", flush=True)


def suite(chunk):
    """Every configuration of :data:`SUITE`, each in a fresh process (its own max RSS)."""
    runs = []
    for d, n, N, rank, group in SUITE:
        out = subprocess.run(
            [sys.executable, __file__, "--n-features", str(d), "--n-tokens", str(n),
             "--n-samples", str(N), "--rank", str(rank), "--chunk", str(chunk), "--json"],
            check=True, capture_output=True, text=True).stdout
        r = dict(json.loads(out.strip().splitlines()[-1]), group=group)
        report(r)
        runs.append(r)
    lin = [r for r in runs if r["n_features"] == 128 and r["n_tokens"] == 128]
    lin.sort(key=lambda r: r["n_samples"])
    per_token = [r["cpu_seconds"] / (r["n_samples"] * r["n_tokens"]) * 1e6 for r in lin]
    print("CPU time per token (microseconds) at d=128, n=128 for N = "
          + ", ".join(f"{r['n_samples']}: {p:.1f}" for r, p in zip(lin, per_token, strict=True)))
    return runs


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-features", type=int, default=None, help="d (default: the suite)")
    parser.add_argument("--n-tokens", type=int, default=128, help="n")
    parser.add_argument("--n-samples", type=int, default=2000, help="N sequences")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--chunk", type=int, default=500, help="sequences per partial_fit")
    parser.add_argument("--quick", action="store_true", help="d=8, n=16, N=400, a smoke run")
    parser.add_argument("--json", action="store_true", help="print the run as one JSON line")
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.quick:
        args.n_features, args.n_tokens, args.n_samples, args.chunk = 8, 16, 400, 100
        args.rank = min(args.rank, 2)
    if args.n_features is None:
        runs = suite(args.chunk)
    else:
        r = run(args.n_samples, args.n_tokens, args.n_features, args.rank, args.chunk,
                verbose=not (args.quick or args.json))
        if args.json:
            print(json.dumps(r))
            return r
        report(r)
        runs = [r]
    if not args.quick or args.output != RESULTS:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps({"runs": runs}, indent=1))
        if args.write_docs:
            write_docs(runs)
    return runs[0] if args.n_features is not None else runs


def write_docs(runs):
    DOCS.mkdir(parents=True, exist_ok=True)
    lines = ['"d","n","N","solver","seconds","CPU seconds","ratio to floor (CPU)",'
             '"against either floor","wall ratio","peak traced MiB","max RSS MiB",'
             '"dense normal MiB","rank read / planted"']
    for r in runs:
        low, high = r["ratio_range"]
        lines.append(f'{r["n_features"]},{r["n_tokens"]},{r["n_samples"]},"{r["solver"]}",'
                     f'{r["seconds"]:.1f},{r["cpu_seconds"]:.1f},{r["ratio_to_floor"]:.1f},'
                     f'"{low:.1f}-{high:.1f}",{r["wall_ratio_to_floor"]:.1f},'
                     f'{r["peak_traced_mib"]:.0f},{r["max_rss_mib"]:.0f},'
                     f'{r["dense_normal_mib"]:.0f},"{r["rank_read"]} / {r["rank"]}"')
    (DOCS / "attention_scale.csv").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
