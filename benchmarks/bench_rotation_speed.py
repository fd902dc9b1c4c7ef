"""Time of a fit on the rotation-test path, this tree against an earlier commit, and their ranks.

At ``dof <= q`` with residuals that are not white the static rank is read by the rotation
test, a Monte Carlo law per sequential step (and per step of the interval's top). This
benchmark fits ``IntrinsicRankEstimator()`` on the same data (AR(1) 0.5 noise across the
targets, planted ranks 0 and 3, a few seeds) with the package of this tree and with that of
an earlier commit (``--baseline``, exported by ``git archive`` into a scratch folder and
imported from there). Each version runs in its own process, alternating, ``--repeats`` times;
the fastest time of each fit is kept. It prints, per shape, the mean time a fit takes in each
version, their ratio, the number of rotation laws drawn, and whether ``rank_`` and
``rank_interval_`` are the same in every fit (each difference is listed). The interval is the
sequential test's own top (``interval_strength=0`` where the parameter exists), the one the
rotation laws decide and that earlier versions report.

Run from a git checkout::

    OPENBLAS_NUM_THREADS=1 python benchmarks/bench_rotation_speed.py [--baseline fec7ced]
        [--repeats 2] [--seeds 4] [--quick]

``--quick`` fits one seed of the shape ``N = 120, p = 20, q = 100`` once in each version.
"""

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
from _timing import agreement, exported, print_totals, run_worker

# (n_samples, n_features, n_targets): dof = n - p - 1 <= q in each.
SHAPES = [(100, 50, 50), (100, 50, 60), (120, 20, 100), (60, 40, 80)]
RANKS = (0, 3)
SINGULAR_VALUES = (3.0, 2.5, 2.0)
# The commit before the sequential Monte Carlo law.
BASELINE = "fec7ced"
ROOT = Path(__file__).resolve().parent.parent


def cases(n_seeds, shapes):
    """The fits: shape, planted rank and seed."""
    return [(shape, rank, seed) for shape in shapes for rank in RANKS
            for seed in range(n_seeds)]


def write_data(folder, n_seeds, shapes):
    from sklearn_ebound.datasets import make_static_task

    for (n, p, q), rank, seed in cases(n_seeds, shapes):
        X, Y = make_static_task(n, p, q, rank=rank, singular_values=SINGULAR_VALUES[:rank],
                                noise=1.0, noise_correlation=0.5, random_state=seed)
        np.savez(folder / f"{n}-{p}-{q}-{rank}-{seed}.npz", X=X, Y=Y)


def worker(folder, n_seeds, shapes):
    """Fit every case with the ``sklearn_ebound`` first on the path; print JSON."""
    import importlib

    import sklearn_ebound
    from sklearn_ebound import IntrinsicRankEstimator

    # Where the rotation test draws its laws (an older checkout: the rules module). Asked of
    # the checkout's own folder: an editable install would serve this tree's modules to an
    # older checkout that lacks them.
    here = Path(sklearn_ebound.__file__).parent
    laws = importlib.import_module("sklearn_ebound._null_laws" if (here / "_null_laws.py").exists()
                                   else "sklearn_ebound._rank_rules")

    drawn = []
    law = laws.rotation_null_law

    def counted(*args, **kwargs):
        drawn.append(1)
        return law(*args, **kwargs)

    laws.rotation_null_law = counted
    # The interval compared is the sequential test's own top (directions of any strength),
    # which versions before ``interval_strength`` report and the rotation laws decide.
    params = ({"interval_strength": 0.0}
              if "interval_strength" in IntrinsicRankEstimator().get_params() else {})
    out = []
    for (n, p, q), rank, seed in cases(n_seeds, shapes):
        data = np.load(folder / f"{n}-{p}-{q}-{rank}-{seed}.npz")
        drawn.clear()
        start = time.process_time()
        est = IntrinsicRankEstimator(**params).fit(data["X"], data["Y"])
        out.append({"case": [n, p, q, rank, seed], "cpu": time.process_time() - start,
                    "rank": int(est.rank_), "interval": [int(v) for v in est.rank_interval_],
                    "laws": len(drawn)})
    print(json.dumps(out))


def run_version(package_root, folder, n_seeds, quick):
    return run_worker(Path(__file__).resolve(), package_root,
                      [str(folder), "--seeds", str(n_seeds)] + ["--quick"] * quick)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default=BASELINE, help="git revision to compare with")
    parser.add_argument("--repeats", type=int, default=2, help="alternating runs per version")
    parser.add_argument("--seeds", type=int, default=4, help="seeds per shape and rank")
    parser.add_argument("--quick", action="store_true", help="one shape, one seed, one run")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    shapes = [(120, 20, 100)] if args.quick else SHAPES
    if args.quick:
        args.seeds, args.repeats = 1, 1
    if args.worker:
        return worker(Path(args.worker), args.seeds, shapes)
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        baseline, data = scratch / "baseline", scratch / "data"
        baseline.mkdir()
        data.mkdir()
        exported(args.baseline, ROOT, baseline)
        write_data(data, args.seeds, shapes)
        runs = {"old": [], "new": []}
        for _ in range(args.repeats):
            runs["old"].append(run_version(baseline, data, args.seeds, args.quick))
            runs["new"].append(run_version(ROOT, data, args.seeds, args.quick))
    best = {key: [min(r[i]["cpu"] for r in rs) for i in range(len(rs[0]))]
            for key, rs in runs.items()}
    old, new = runs["old"][0], runs["new"][0]
    print(f"baseline {args.baseline} against this tree; CPU seconds per fit, fastest of "
          f"{args.repeats}, mean over ranks {RANKS} x {args.seeds} seeds")
    print(f"{'n, p, q':>14} {'old s':>7} {'new s':>7} {'ratio':>6} {'old laws':>8} "
          f"{'new laws':>8} {'same rank':>9} {'same interval':>13}")
    differences, rows = [], []
    for shape in shapes:
        index = [i for i, r in enumerate(old) if tuple(r["case"][:3]) == shape]
        t_old = np.mean([best["old"][i] for i in index])
        t_new = np.mean([best["new"][i] for i in index])
        same_rank, same_interval, differing = agreement(old, new, index)
        differences += differing
        rows.append({"shape": shape, "old": t_old, "new": t_new, "fits": len(index),
                     "same_rank": same_rank, "same_interval": same_interval,
                     "laws": [sum(run[i]["laws"] for i in index) for run in (old, new)]})
        print(f"{str(shape):>14} {t_old:7.3f} {t_new:7.3f} {t_old / t_new:6.2f} "
              f"{np.mean([old[i]['laws'] for i in index]):8.1f} "
              f"{np.mean([new[i]['laws'] for i in index]):8.1f} "
              f"{same_rank:>4} / {len(index):<2} {same_interval:>8} / {len(index):<2}")
    total_old, total_new = sum(best["old"]), sum(best["new"])
    ratio = print_totals(total_old, total_new, differences, "n, p, q, rank, seed")
    return {"rows": rows, "ratio": ratio}


if __name__ == "__main__":
    main()
