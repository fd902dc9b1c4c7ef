"""How much power any sequential largest-eigenvalue test has at twice the detection limit.

The power target of the null-calibration benchmark (exact recovery in at least 90% of draws
of a rank-4 signal whose weakest direction is twice ``detection_limit_``) is read against
oracles of the same sequential statistic on white Gaussian noise, where the fitted values in
the column space of the inputs are exactly ``M = A diag(d) Vᵀ + sigma G``: ``G`` a
``rank(X) x q`` standard Gaussian matrix, ``A`` and ``V`` orthonormal, and ``d`` the planted
singular values of the fitted values (``sqrt(N)`` times the population ones), so that twice
the detection limit is ``d = 2 sigma (rank(X) q)^{1/4}``. Every test here is sequential:
the rank is the first ``k`` whose ``(k + 1)``-th squared singular value stays below the
step's cut, at ``significance`` per step. Cuts:

* ``known sigma, exact null``: the ``1 - significance`` quantile of the largest squared
  singular value of a white ``(rank(X) - k) x (q - k)`` matrix, by Monte Carlo (the null the
  estimator's Tracy–Widom edge approximates), with the noise level known;
* ``known sigma and spikes``: the quantile of the ``(k + 1)``-th value under the exact null
  of ``k`` directions planted at their true strengths (an oracle that also knows the
  nuisance directions: no sequential test of this statistic can have more power at the level);
* ``estimated sigma, exact null`` (with ``--dof``): the statistic over ``sigma_hat^2``, an
  independent ``chi2(dof q) / (dof q)`` estimate, against the exact null of that ratio (as
  the estimator's few-dof edge); ``estimated sigma, planted at the estimate``: the same, with
  the signal planted at twice the limit computed from that ``sigma_hat`` (as the
  null-calibration benchmark plants it, from a fit of the same noise);
* ``known sigma, Tracy–Widom``: the estimator's white edge (``null_edge_white``) with the
  noise level known.

Per cut the exact-recovery rate (with two binomial standard errors), and with ``--factors``
the factor of the detection limit at which the best oracle reaches 90%.

    python benchmarks/bench_power_oracle.py [--k-x 20] [--q 60] [--rank 4] [--dof 0]
        [--factors 2 2.5 3] [--spread] [--reps 4000] [--null-draws 200000]
"""

import argparse
import json
import time
from pathlib import Path

import numpy as np

from sklearn_ebound._null_laws import null_edge_white

RESULTS = Path(__file__).resolve().parent / "results" / "power_oracle.json"
TARGET = 0.9


def squared_values(k_x, q, d, draws, rng, chunk=20_000):
    """Squared singular values (descending) of ``diag(d) + G`` over ``draws`` draws, where
    ``G`` is ``k_x x q`` standard Gaussian (by rotation invariance the planted directions are
    the leading coordinates)."""
    out = []
    for start in range(0, draws, chunk):
        m = min(chunk, draws - start)
        M = rng.standard_normal((m, k_x, q))
        for i, value in enumerate(d):
            M[:, i, i] += value
        gram = M @ M.transpose(0, 2, 1) if k_x <= q else M.transpose(0, 2, 1) @ M
        out.append(np.linalg.eigvalsh(gram)[:, ::-1])
    return np.concatenate(out)


def sequential_rank(values, cuts):
    """First ``k`` whose ``values[:, k]`` does not exceed ``cuts[k]`` (per draw)."""
    above = values[:, : len(cuts)] > np.asarray(cuts)[None, :]
    stops = ~above
    return np.where(stops.any(axis=1), stops.argmax(axis=1), len(cuts))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k-x", type=int, default=20, help="rank of the inputs")
    parser.add_argument("--q", type=int, default=60, help="number of targets")
    parser.add_argument("--rank", type=int, default=4)
    parser.add_argument("--dof", type=int, default=0,
                        help="residual degrees of freedom of an estimated sigma (0: none)")
    parser.add_argument("--factors", type=float, nargs="+", default=[2.0],
                        help="planted values over the detection limit (equal spikes)")
    parser.add_argument("--spread", action="store_true",
                        help="plant factor * (1, 1.5, 2, 2.5) instead of equal spikes")
    parser.add_argument("--significance", type=float, default=1e-3)
    parser.add_argument("--reps", type=int, default=4000, help="planted draws per factor")
    parser.add_argument("--null-draws", type=int, default=200_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    k_x, q, r, a = args.k_x, args.q, args.rank, args.significance
    limit = (k_x * q) ** 0.25  # detection limit of the fitted values at sigma = 1
    quantile = 1.0 - a
    start = time.perf_counter()
    steps = range(r + 1)
    # Exact nulls of the deflated white matrices (known sigma).
    null_known = [np.quantile(squared_values(k_x - k, q - k, [], args.null_draws, rng)[:, 0],
                              quantile) for k in steps]
    tracy_widom = [null_edge_white(k_x - k, q - k, quantile) for k in steps]
    if args.dof:
        nu = args.dof * q
        null_ratio = []
        for k in steps:
            top = squared_values(k_x - k, q - k, [], args.null_draws, rng)[:, 0]
            null_ratio.append(np.quantile(top / (rng.chisquare(nu, top.size) / nu), quantile))
    report = {"k_x": k_x, "q": q, "rank": r, "dof": args.dof, "significance": a,
              "reps": args.reps, "null_draws": args.null_draws, "spread": args.spread,
              "rows": []}
    print(f"k_x={k_x} q={q} rank {r} significance {a:g} dof {args.dof or 'known sigma'}; "
          f"{args.reps} planted draws, {args.null_draws} null draws per step")
    print(f"{'factor':>7} {'cut':<42} {'exact':>6} {'2 se':>6} {'mean rank':>9}")
    for factor in args.factors:
        shape = np.array([1.0, 1.5, 2.0, 2.5][:r]) if args.spread else np.ones(r)
        shape = shape / shape.min()
        d = factor * limit * shape
        values = squared_values(k_x, q, d, args.reps, rng)
        # Nulls that know the nuisance: k directions at their true strengths.
        null_spikes = [np.quantile(squared_values(k_x, q, d[:k], args.null_draws // 4, rng)[:, k],
                                   quantile) for k in steps]
        cuts = {"known sigma, exact null": (values, null_known),
                "known sigma and spikes": (values, null_spikes),
                "known sigma, Tracy-Widom": (values, tracy_widom)}
        if args.dof:
            nu = args.dof * q
            estimate = rng.chisquare(nu, args.reps) / nu
            cuts["estimated sigma, exact null"] = (values / estimate[:, None], null_ratio)
            # The planted values scale with sigma_hat: diag(d sigma_hat) + G, one draw each.
            at_estimate = np.concatenate([
                squared_values(k_x, q, d * np.sqrt(e), 1, rng) for e in estimate])
            cuts["estimated sigma, planted at the estimate"] = (
                at_estimate / estimate[:, None], null_ratio)
        for name, (stat, cut) in cuts.items():
            ranks = sequential_rank(stat, cut)
            exact = float(np.mean(ranks == r))
            se = 2 * np.sqrt(exact * (1 - exact) / args.reps)
            print(f"{factor:7.2f} {name:<42} {exact:6.3f} {se:6.3f} {ranks.mean():9.2f}")
            report["rows"].append({"factor": factor, "cut": name, "exact": exact,
                                   "two_se": se, "mean_rank": float(ranks.mean()),
                                   "cuts": [float(c) for c in cut],
                                   "planted": [float(x) for x in d]})
    report["seconds"] = time.perf_counter() - start
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=1))
    print(f"({report['seconds']:.0f} s; saved {args.output.name})")
    return report


if __name__ == "__main__":
    main()
