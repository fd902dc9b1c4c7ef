"""Time and memory of the attention data-only estimator at model scale.

``IntrinsicRankEstimator("attention", attention="linear", value="identity")`` reads the rank of
the query–key kernel ``W`` (``d x d``) from sequences ``X (N, n, d) -> Y (N, n, d)`` of a linear
attention task with planted ``rank(W)``. Its least squares has ``d^2`` unknowns, so its normal
equations are ``d^2 x d^2`` (2 GiB dense at ``d = 128``). The sequences are generated on the
fly, chunk by chunk, and fed to ``partial_fit`` (one ``fit`` on all the data where
``partial_fit`` does not exist). Reported: seconds of the estimator (generation excluded),
the peak memory it traces beyond its input chunk, the rank read, and the ratio of its time to
the floor measured in the same run: the per-sequence second moments ``X_s^T X_s`` that any
estimator of the kernel has to compute.

Target (issue 5): ``d = 128``, ``n = 256``, ``N = 10^4`` runs on a laptop-class machine: memory
well below the dense normal matrix, time within minutes.

    python benchmarks/bench_attention_scale.py [--n-features 128] [--n-tokens 256]
        [--n-samples 10000] [--chunk 1000] [--quick]
"""

import argparse
import json
import resource
import time
import tracemalloc
import warnings
from pathlib import Path

import numpy as np

from sklearn_ebound import IntrinsicRankEstimator

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "attention_scale.json"
DOCS = ROOT / "docs" / "performance"
MIB = 2.0**20


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


def run(n_samples, n_tokens, d, rank, chunk, verbose=False):
    streaming = hasattr(IntrinsicRankEstimator, "partial_fit")
    est = IntrinsicRankEstimator("attention", attention="linear", value="identity")
    t_est = t_floor = t_last = 0.0
    extra = 0
    tracemalloc.start()
    for X, Y in chunks(n_samples, n_tokens, d, rank, chunk if streaming else n_samples):
        start = time.perf_counter()
        X.transpose(0, 2, 1) @ X
        t_floor += time.perf_counter() - start
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est.partial_fit(X, Y) if streaming else est.fit(X, Y)
        t_last = time.perf_counter() - start
        t_est += t_last
        if verbose:
            print(f"  {len(X)} sequences in {t_last:.1f} s", flush=True)
        extra = max(extra, tracemalloc.get_traced_memory()[1] - before)
        chunk_mib = (X.nbytes + Y.nbytes) / MIB
        del X, Y
    tracemalloc.stop()
    return {"n_features": d, "n_tokens": n_tokens, "n_samples": n_samples, "rank": rank,
            "api": "partial_fit" if streaming else "fit", "chunk": chunk if streaming else None,
            "seconds": t_est, "last_call_seconds": t_last, "floor_seconds": t_floor,
            "ratio_to_floor": t_est / t_floor, "peak_extra_mib": extra / MIB,
            "chunk_mib": chunk_mib, "dense_normal_mib": d**4 * 8 / MIB,
            "rank_read": int(est.rank_),
            "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-features", type=int, default=128, help="d")
    parser.add_argument("--n-tokens", type=int, default=256, help="n")
    parser.add_argument("--n-samples", type=int, default=10_000, help="N sequences")
    parser.add_argument("--rank", type=int, default=4)
    parser.add_argument("--chunk", type=int, default=1000, help="sequences per partial_fit")
    parser.add_argument("--quick", action="store_true", help="d=8, n=16, N=400, a smoke run")
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.quick:
        args.n_features, args.n_tokens, args.n_samples, args.chunk = 8, 16, 400, 100
        args.rank = min(args.rank, 2)
    r = run(args.n_samples, args.n_tokens, args.n_features, args.rank, args.chunk,
            verbose=not args.quick)
    print(f"d={r['n_features']} n={r['n_tokens']} N={r['n_samples']} planted rank {r['rank']}, "
          f"{r['api']}" + (f" in chunks of {r['chunk']} sequences" if r["chunk"] else ""))
    print(f"  estimator            {r['seconds']:9.2f} s   (last call {r['last_call_seconds']:.2f}"
          f" s)   rank_={r['rank_read']}")
    print(f"  floor X_s^T X_s      {r['floor_seconds']:9.2f} s")
    print(f"  ratio to floor       {r['ratio_to_floor']:9.1f}")
    print(f"  peak memory beyond the input chunk {r['peak_extra_mib']:.0f} MiB (chunk "
          f"{r['chunk_mib']:.0f} MiB; dense d^2 x d^2 normal matrix {r['dense_normal_mib']:.0f} "
          f"MiB); process max RSS {r['max_rss_mib']:.0f} MiB")
    if not args.quick or args.output != RESULTS:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        runs = json.loads(args.output.read_text())["runs"] if args.output.exists() else []
        runs = [x for x in runs if x["n_features"] != r["n_features"]] + [r]
        args.output.write_text(json.dumps({"runs": sorted(runs, key=lambda x: x["n_features"])},
                                          indent=1))
        if args.write_docs:
            write_docs(sorted(runs, key=lambda x: x["n_features"]))
    return r


def write_docs(runs):
    DOCS.mkdir(parents=True, exist_ok=True)
    lines = ['"d","n","N","API","seconds","ratio to floor","peak beyond chunk MiB",'
             '"dense normal MiB","rank read / planted"']
    for r in runs:
        lines.append(f'{r["n_features"]},{r["n_tokens"]},{r["n_samples"]},"{r["api"]}",'
                     f'{r["seconds"]:.1f},{r["ratio_to_floor"]:.1f},{r["peak_extra_mib"]:.0f},'
                     f'{r["dense_normal_mib"]:.0f},"{r["rank_read"]} / {r["rank"]}"')
    (DOCS / "attention_scale.csv").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
