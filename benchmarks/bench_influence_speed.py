"""Time of the influential-direction check on rows whose noise depends on the inputs, this tree
against an earlier commit, and the ranks and intervals of both.

Noise whose scale follows an input sends the rank to the wild bootstrap and its accepted
directions to the influence check (``_influence.py``). There the deletion test of the rows
that carry the accepted directions' most concentrated combination rejects (their noise is
larger), so the check draws the combination's concentration null and may run the anisotropy
test: the check's costly path. This benchmark fits ``IntrinsicRankEstimator()`` on the same
data (Gaussian inputs, a planted rank 4, noise of standard deviation ``|x_1|``) with the
package of this tree and with that of an earlier commit (``--baseline``, exported by ``git
archive`` and imported from there). Each version runs in its own process. It prints, per
shape, the CPU seconds of a fit in each version, their ratio, and whether ``rank_`` and
``rank_interval_`` agree (each difference is listed: the anisotropy test, new since the
baseline, may name a combination and widen the interval).

Run from a git checkout::

    OPENBLAS_NUM_THREADS=1 python benchmarks/bench_influence_speed.py [--baseline 4189639]
        [--seeds 2] [--quick]

``--quick`` fits one seed of the smallest shape.
"""

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
from _timing import agreement, exported, print_totals, run_worker

# (n_samples, n_features, n_targets)
SHAPES = [(2000, 20, 60), (5000, 20, 60), (20000, 20, 60)]
RANK = 4
# The last commit before the staged concentration null and the Woodbury deletion test.
BASELINE = "4189639"
ROOT = Path(__file__).resolve().parent.parent


def cases(n_seeds, shapes):
    return [(shape, seed) for shape in shapes for seed in range(n_seeds)]


def write_data(folder, n_seeds, shapes):
    for (n, p, q), seed in cases(n_seeds, shapes):
        rng = np.random.default_rng(seed)
        X = rng.standard_normal((n, p))
        B = rng.standard_normal((p, RANK)) @ rng.standard_normal((RANK, q)) * 0.3
        Y = X @ B + np.abs(X[:, :1]) * rng.standard_normal((n, q))
        np.savez(folder / f"{n}-{p}-{q}-{seed}.npz", X=X, Y=Y)


def worker(folder, n_seeds, shapes):
    """Fit every case with the ``sklearn_ebound`` first on the path; print JSON."""
    import warnings

    from sklearn_ebound import IntrinsicRankEstimator

    out = []
    for (n, p, q), seed in cases(n_seeds, shapes):
        data = np.load(folder / f"{n}-{p}-{q}-{seed}.npz")
        start = time.process_time()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est = IntrinsicRankEstimator(random_state=0).fit(data["X"], data["Y"])
        check = (est.diagnostics_ or {}).get("influential_directions") or {}
        out.append({"case": [n, p, q, seed], "cpu": time.process_time() - start,
                    "rank": int(est.rank_), "interval": [int(v) for v in est.rank_interval_],
                    "noise_model": est.noise_model_, "checked": bool(check)})
    print(json.dumps(out))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default=BASELINE, help="git revision to compare with")
    parser.add_argument("--seeds", type=int, default=2, help="seeds per shape")
    parser.add_argument("--quick", action="store_true", help="one seed of the smallest shape")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    shapes = SHAPES[:1] if args.quick else SHAPES
    if args.quick:
        args.seeds = 1
    if args.worker:
        return worker(Path(args.worker), args.seeds, shapes)
    script = Path(__file__).resolve()
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        (scratch / "baseline").mkdir()
        (scratch / "data").mkdir()
        baseline = exported(args.baseline, ROOT, scratch / "baseline")
        write_data(scratch / "data", args.seeds, shapes)
        arguments = [str(scratch / "data"), "--seeds", str(args.seeds)] + ["--quick"] * args.quick
        old = run_worker(script, baseline, arguments)
        new = run_worker(script, ROOT, arguments)
    print(f"baseline {args.baseline} against this tree; CPU seconds per fit, mean over "
          f"{args.seeds} seeds; noise sd |x_1|, rank {RANK}")
    print(f"{'n, p, q':>16} {'old s':>7} {'new s':>7} {'ratio':>6} {'checked':>8} "
          f"{'same rank':>9} {'same interval':>13}")
    rows, differences = [], []
    for shape in shapes:
        index = [i for i, r in enumerate(old) if tuple(r["case"][:3]) == shape]
        t_old = float(np.mean([old[i]["cpu"] for i in index]))
        t_new = float(np.mean([new[i]["cpu"] for i in index]))
        checked = sum(new[i]["checked"] for i in index)
        same_rank, same_interval, differing = agreement(old, new, index)
        differences += differing
        rows.append({"shape": shape, "old": t_old, "new": t_new, "fits": len(index),
                     "checked": checked, "same_rank": same_rank,
                     "same_interval": same_interval})
        print(f"{str(shape):>16} {t_old:7.2f} {t_new:7.2f} {t_old / t_new:6.2f} "
              f"{checked:>4} / {len(index):<2} {same_rank:>4} / {len(index):<2} "
              f"{same_interval:>8} / {len(index):<2}")
    total_old = sum(r["cpu"] for r in old)
    total_new = sum(r["cpu"] for r in new)
    ratio = print_totals(total_old, total_new, differences, "n, p, q, seed")
    return {"rows": rows, "ratio": ratio}


if __name__ == "__main__":
    main()
