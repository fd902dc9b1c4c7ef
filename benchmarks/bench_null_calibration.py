"""False positives of the default rank test on noise alone, and its power above the detection limit.

Null section. Every draw is ``Y = E`` with no signal; any rank above 0 is a false positive. The
default ``threshold`` criterion tests at ``significance=1e-3`` (a union of two such tests for
correlated noise: at most 0.2%); ``--significance`` runs other levels on the same draws
(nominal rate at most twice each). Two families of cells:

* Gaussian rows with a planted covariance, ``X`` standard normal: the shapes where the noise
  covariance is hard to estimate (residual degrees of freedom ``dof = N - 1 - p`` near or below
  the number of targets ``q``) and the covariances that make an edge go wrong (AR(1)
  correlation across targets, one strong noise direction, a few noise factors);
* the data real users have, where the Tracy–Widom edges' assumptions fail (``N=2000, p=20,
  q=60`` unless said): noise sd proportional to ``|x_1|``, to ``x_1**2`` or to ``exp(x_1)``
  (input-dependent noise); rows serially correlated, AR(1) 0.5 or 0.9 along the row order in
  ``X`` and in the noise (time series, tokens of one sequence); Student t inputs *and* noise
  with 2.5 degrees of freedom (heavy tails); and ``N = p + 5`` (``p=20, q=15``: 4 residual
  degrees of freedom).

Per cell and level: the false-positive rate, its sampling error (two binomial standard errors
of a rate at the nominal bound, ``2 sqrt(2a (1 - 2a) / reps)`` for ``significance = a``), the
share of draws in which the estimator warned (a ``RankEstimationWarning``), the calibration
paths taken (``noise_model_``), and whether the cell passes: a false-positive rate at most
``2a`` plus the sampling error, or a warning in every draw where it is not.

Power section (``--power-reps``, 0 to skip). On the same noise kinds (and white Gaussian noise)
a rank-4 signal is planted whose four singular values all equal twice the estimator's
``detection_limit_``, read from a fit of the draw's noise alone. The limit is in the units of
``singular_values_``: singular values of the centred fitted values over ``sqrt(N)`` on the
Tracy–Widom path, of a prewhitened or balanced matrix on a resampled one; it is carried into
the fitted values' units by the ratio of the two top singular values of that noise-only fit
(both noise edges, so the ratio is the noise's scale in the two units). Per cell:
the exact-recovery rate (target at least 90%), how often ``rank_interval_`` holds the true rank
(target at least ``1 - 2a``), its mean width, the warnings and paths, and the share of draws
in which an accepted direction, or a combination of them, was named as carried by a handful of
rows (``diagnostics_["influential_directions"]``). The section needs ``detection_limit_``; without
it, it says so and is skipped. ``--power-factors 2 3 4 5`` plants a spread spectrum instead
(the weakest direction still at twice the limit; equal values are the hardest case for a
sequential test, whose planted values repel each other).

    python benchmarks/bench_null_calibration.py [--reps 400] [--power-reps 200] [--n-jobs 2]
        [--quick] [--significance 1e-3 [1e-2 ...]] [--cells NAME ...] [--power-only]
        [--power-factors 2 2 2 2]
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
from sklearn_ebound.exceptions import RankEstimationWarning

RESULTS = Path(__file__).resolve().parent / "results" / "null_calibration.json"
POWER_RANK = 4
POWER_FACTOR = 2.0  # the planted singular values over the detection limit
POWER_TARGET = 0.9


def spike(q, height):
    """Identity plus ``height`` along the all-ones direction."""
    return np.eye(q) + height * np.full((q, q), 1 / q)


def factors(q, variances, seed=0):
    """Identity plus a few random noise factors with the given variances (per target, summed)."""
    loadings = np.random.default_rng(seed).standard_normal((q, len(variances)))
    return np.eye(q) + (loadings * np.sqrt(variances)) @ loadings.T / q


def _gaussian(name, n, p, q, covariance):
    return dict(name=name, n=n, p=p, q=q, kind="gaussian", covariance=covariance)


def cells():
    """The null cells: dicts with ``name, n, p, q, kind`` (and ``covariance``, ``rho``, ``df``)."""
    return [
        _gaussian("white, dof 49 < q 50", 100, 50, 50, np.eye(50)),
        _gaussian("AR 0.2, dof 49 < q 50", 100, 50, 50, ar1_covariance(50, 0.2)),
        _gaussian("AR 0.3, dof 49 < q 50", 100, 50, 50, ar1_covariance(50, 0.3)),
        _gaussian("AR 0.3, dof 299 > q 100", 400, 100, 100, ar1_covariance(100, 0.3)),
        _gaussian("AR 0.5, dof 49 < q 60", 100, 50, 60, ar1_covariance(60, 0.5)),
        _gaussian("AR 0.7, dof 169 > q 30", 200, 30, 30, ar1_covariance(30, 0.7)),
        _gaussian("spike 10, dof 49 < q 50", 100, 50, 50, np.diag(np.r_[10.0, np.ones(49)])),
        _gaussian("spike 6, dof 49 < q 60", 100, 50, 60, spike(60, 5.0)),
        _gaussian("spike 51, dof 59 > q 50", 120, 60, 50, spike(50, 50.0)),
        _gaussian("3 factors, dof 59 < q 60", 120, 60, 60, factors(60, [30.0, 15.0, 6.0])),
        *assumption_cells(),
    ]


def assumption_cells():
    """The noise kinds where an assumption of the Tracy–Widom edges fails."""
    shape = dict(n=2000, p=20, q=60)
    return [
        dict(name="sd ~ |x1|", kind="scale", scale="abs", **shape),
        dict(name="sd ~ x1^2", kind="scale", scale="square", **shape),
        dict(name="sd ~ exp(x1)", kind="scale", scale="exp", **shape),
        dict(name="AR(1) 0.5 rows", kind="rows", rho=0.5, **shape),
        dict(name="AR(1) 0.9 rows", kind="rows", rho=0.9, **shape),
        dict(name="sequences, no groups", kind="sequences", lengths=(5, 40), share=0.5,
             **shape),
        dict(name="t 2.5 dof X and E", kind="t", df=2.5, **shape),
        dict(name="N = p + 5", n=25, p=20, q=15, kind="gaussian", covariance=np.eye(15)),
    ]


def power_cells():
    """The power cells: white Gaussian noise and the assumption cells' noise kinds."""
    return [dict(name="white", n=2000, p=20, q=60, kind="gaussian", covariance=np.eye(60)),
            *assumption_cells()]


SCALES = {"abs": np.abs, "square": np.square, "exp": np.exp}


def _ar_rows(innovations, rho):
    """A stationary AR(1) process with unit variance along the rows of ``innovations``."""
    out = np.empty_like(innovations)
    out[0] = innovations[0]
    c = np.sqrt(1 - rho**2)
    for t in range(1, len(out)):
        out[t] = rho * out[t - 1] + c * innovations[t]
    return out


def _sequence_codes(n, cell, rng):
    """Sequence ids of ``n`` rows in consecutive sequences of random lengths (uniform over
    ``cell["lengths"]``)."""
    low, high = cell["lengths"]
    return np.repeat(np.arange(n), rng.integers(low, high + 1, size=n))[:n]


def _sequence_effects(values, codes, share, rng):
    """``values`` plus an effect of variance ``share`` shared by the rows of each sequence."""
    return values + np.sqrt(share) * rng.standard_normal((codes[-1] + 1, values.shape[1]))[codes]


def draw_noise(cell, rng):
    """Inputs ``X`` (n, p) and noise ``E`` (n, q) of one draw of a cell."""
    n, p, q = cell["n"], cell["p"], cell["q"]
    kind = cell["kind"]
    if kind == "t":
        return rng.standard_t(cell["df"], (n, p)), rng.standard_t(cell["df"], (n, q))
    X = rng.standard_normal((n, p))
    Z = rng.standard_normal((n, q))
    if kind == "gaussian":
        return X, Z @ np.linalg.cholesky(cell["covariance"]).T
    if kind == "scale":
        return X, SCALES[cell["scale"]](X[:, :1]) * Z
    if kind == "rows":
        return _ar_rows(X, cell["rho"]), _ar_rows(Z, cell["rho"])
    if kind == "sequences":  # tokens of one text: inputs and noise share the sequences
        codes = _sequence_codes(n, cell, rng)
        return (_sequence_effects(X, codes, cell["share"], rng),
                _sequence_effects(Z, codes, cell["share"], rng))
    raise ValueError(f"unknown noise kind {kind!r}")


def _fit(X, Y, significance):
    """Fit the default at ``significance``; what it read and said. The resampled paths are
    seeded (the draws differ, so one seed for all keeps them independent), so that a rerun
    gives the same table."""
    with threadpool_limits(1), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        est = IntrinsicRankEstimator(significance=significance, random_state=0).fit(X, Y)
    messages = sorted({str(w.message)[:80] for w in caught
                       if issubclass(w.category, RankEstimationWarning)})
    interval = getattr(est, "rank_interval_", None)
    limit = getattr(est, "detection_limit_", None)
    influence = getattr(est, "diagnostics_", None) or {}
    influence = influence.get("influential_directions")
    # The top singular value of the centred fitted values over sqrt(n), and of the spectrum
    # the estimator read (a resampled path reads a prewhitened or balanced one).
    Xc, Yc = X - X.mean(axis=0), Y - Y.mean(axis=0)
    fitted = Xc @ np.linalg.lstsq(Xc, Yc, rcond=None)[0]
    values = np.asarray(est.singular_values_)
    return {"rank": int(est.rank_), "warned": bool(messages), "messages": messages,
            "top_fitted": float(np.linalg.norm(fitted, 2) / np.sqrt(len(X))),
            "top_read": float(values[0]) if values.size else None,
            "noise_model": getattr(est, "noise_model_", None),
            "interval": None if interval is None else [int(interval[0]), int(interval[1])],
            # the directions named, or the combination of them (one) where none is
            "influential": None if influence is None else (
                len(influence["flagged"])
                or int(bool((influence.get("combination") or {}).get("flagged")))),
            "detection_limit": None if limit is None else float(limit)}


def null_draw(cell, seed, levels):
    """The readings at each significance level from one draw of noise alone."""
    X, E = draw_noise(cell, np.random.default_rng(seed))
    return [_fit(X, E, level) for level in levels]


def planted_signal(X, limit, rng, factors=(POWER_FACTOR,) * POWER_RANK):
    """A signal ``U diag(s) V^T`` in the column space of the centred ``X`` whose singular
    values over ``sqrt(n)`` are ``factors * limit`` (one direction per factor)."""
    Xc = X - X.mean(axis=0)
    U = np.linalg.svd(Xc @ rng.standard_normal((X.shape[1], len(factors))),
                      full_matrices=False)[0]
    return U, np.asarray(factors, dtype=float) * limit * np.sqrt(len(X))


def power_draw(cell, seed, significance, factors=(POWER_FACTOR,) * POWER_RANK):
    """Pilot fit on the noise alone for ``detection_limit_``; then the planted draw's reading."""
    rng = np.random.default_rng(seed)
    X, E = draw_noise(cell, rng)
    pilot = _fit(X, E, significance)
    limit = pilot["detection_limit"]
    if (limit is None or not np.isfinite(limit) or limit <= 0 or not pilot["top_read"]
            or not pilot["top_fitted"]):
        return None
    # The limit is in the units of the spectrum read, which a resampled path prewhitens or
    # balances: into the fitted values' units by the ratio of the two noise-only top values.
    ratio = pilot["top_read"] / pilot["top_fitted"]
    U, strength = planted_signal(X, limit / ratio, rng, factors)
    V = np.linalg.qr(rng.standard_normal((cell["q"], len(factors))))[0]
    reading = _fit(X, (U * strength) @ V.T + E, significance)
    reading["pilot_limit"] = limit
    reading["unit_ratio"] = ratio
    return reading


def sampling_error(level, reps):
    """Two binomial standard errors of a false-positive rate at its bound ``2 level``."""
    bound = min(2 * level, 1.0)
    return 2 * np.sqrt(bound * (1 - bound) / reps)


def _paths(readings):
    paths = {}
    for r in readings:
        paths[str(r["noise_model"])] = paths.get(str(r["noise_model"]), 0) + 1
    return paths


def null_rows(cell, readings, levels, reps):
    rows = []
    for j, level in enumerate(levels):
        at = [draw[j] for draw in readings]
        count = sum(r["rank"] > 0 for r in at)
        rate = count / reps
        error = sampling_error(level, reps)
        warned = float(np.mean([r["warned"] for r in at]))
        level_kept = rate <= 2 * level + error
        messages = sorted({m for r in at for m in r["messages"]})
        rows.append({"cell": cell["name"], "n": cell["n"], "p": cell["p"], "q": cell["q"],
                     "reps": reps, "significance": level, "false_positives": int(count),
                     "rate": float(rate), "sampling_error": float(error),
                     "warned": warned,
                     "warned_when_false_positive": (
                         float(np.mean([r["warned"] for r in at if r["rank"] > 0]))
                         if count else None),
                     "level_kept": bool(level_kept),
                     "passes": bool(level_kept or warned == 1.0),
                     "noise_models": _paths(at), "warnings": messages[:5]})
    return rows


def power_row(cell, readings, significance, reps, factors=(POWER_FACTOR,) * POWER_RANK):
    planted = [r for r in readings if r is not None]
    if not planted:
        return {"cell": cell["name"], "reps": reps, "available": False}
    skipped, readings = len(readings) - len(planted), planted
    rank = len(factors)
    exact = np.mean([r["rank"] == rank for r in readings])
    row = {"cell": cell["name"], "n": cell["n"], "p": cell["p"], "q": cell["q"],
           "reps": len(readings), "skipped": skipped, "available": True,
           "significance": significance,
           "rank": rank, "factors": list(factors), "exact": float(exact),
           "exact_ok": bool(exact >= POWER_TARGET),
           "mean_rank": float(np.mean([r["rank"] for r in readings])),
           "mean_detection_limit": float(np.mean([r["pilot_limit"] for r in readings])),
           "mean_unit_ratio": float(np.mean([r["unit_ratio"] for r in readings])),
           "warned": float(np.mean([r["warned"] for r in readings])),
           # Draws where an accepted direction was named as carried by a handful of rows.
           "influential": float(np.mean([bool(r.get("influential")) for r in readings])),
           "noise_models": _paths(readings)}
    with_interval = [r for r in readings if r["interval"] is not None]
    if with_interval:
        cover = np.mean([r["interval"][0] <= rank <= r["interval"][1]
                         for r in with_interval])
        row.update(coverage=float(cover), coverage_ok=bool(cover >= 1 - 2 * significance),
                   mean_width=float(np.mean([r["interval"][1] - r["interval"][0]
                                             for r in with_interval])))
    else:
        row.update(coverage=None, coverage_ok=None, mean_width=None)
    return row


def _commit():
    import subprocess

    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              cwd=RESULTS.parent, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=400, help="draws per null cell")
    parser.add_argument("--power-reps", type=int, default=200,
                        help="draws per power cell (0: no power section)")
    parser.add_argument("--n-jobs", type=int, default=2)
    parser.add_argument("--quick", action="store_true",
                        help="two Gaussian cells and two assumption cells, 4 draws each")
    parser.add_argument("--significance", type=float, nargs="+", default=[1e-3],
                        help="levels of the test (each run on the same draws)")
    parser.add_argument("--cells", nargs="+", default=None, help="run only these cells (names)")
    parser.add_argument("--power-only", action="store_true", help="only the power section")
    parser.add_argument("--power-factors", type=float, nargs="+",
                        default=[POWER_FACTOR] * POWER_RANK,
                        help="planted singular values over the detection limit, one per "
                             "direction (default: rank 4, all at twice the limit)")
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--commit", default=None,
                        help="the commit measured (default: git rev-parse HEAD of the checkout)")
    args = parser.parse_args(argv)
    levels = args.significance
    grid, power_grid = cells(), power_cells()
    reps, power_reps = args.reps, args.power_reps
    if args.quick:
        grid = grid[:2] + [c for c in grid if c["name"] in ("sd ~ |x1|", "N = p + 5")]
        power_grid = [c for c in power_grid if c["name"] in ("white", "sd ~ |x1|")]
        reps, power_reps = 4, min(power_reps, 4)
    if args.power_only:
        grid = []
    if args.cells:
        grid = [c for c in grid if c["name"] in args.cells]
        power_grid = [c for c in power_grid if c["name"] in args.cells]
    start = time.perf_counter()
    report = {"commit": args.commit or _commit(), "quick": args.quick, "complete": False,
              "significance": levels, "cells": [], "power": []}
    save = not args.quick or args.output != RESULTS

    def checkpoint():
        if save:  # after every cell, so that an interrupted run leaves what it measured
            args.output.parent.mkdir(parents=True, exist_ok=True)
            args.output.write_text(json.dumps(report, indent=1))

    print(f"{'cell':<26} false positives out of {reps} (rate, + sampling error, warned share, "
          "pass) at significance " + ", ".join(f"{a:g} (nominal at most {200 * a:g}%)"
                                               for a in levels))
    for cell in grid:
        t0 = time.perf_counter()
        readings = Parallel(n_jobs=args.n_jobs)(
            delayed(null_draw)(cell, seed, levels) for seed in range(reps))
        rows = null_rows(cell, readings, levels, reps)
        for row in rows:
            row["seconds"] = time.perf_counter() - t0
        report["cells"].extend(rows)
        print(f"{cell['name']:<26} " + "  ".join(
            f"{r['false_positives']:4d} ({100 * r['rate']:5.2f}% +{100 * r['sampling_error']:.2f},"
            f" warned {r['warned']:4.2f}, {'ok' if r['passes'] else 'FAIL'})" for r in rows)
            + f"  {rows[0]['noise_models']}  [{time.perf_counter() - t0:.0f} s]", flush=True)
        checkpoint()
    if power_reps:
        significance = levels[0]
        factors = tuple(args.power_factors)
        print(f"\npower: rank {len(factors)} planted at "
              f"{', '.join(f'{f:g}' for f in factors)} x detection_limit_, "
              f"significance {significance:g} (targets: exact >= {POWER_TARGET:.0%}, "
              f"rank_interval_ coverage >= {1 - 2 * significance:g})")
        for cell in power_grid:
            t0 = time.perf_counter()
            readings = Parallel(n_jobs=args.n_jobs)(
                delayed(power_draw)(cell, 10_000_000 + seed, significance, factors)
                for seed in range(power_reps))
            row = power_row(cell, readings, significance, power_reps, factors)
            row["seconds"] = time.perf_counter() - t0
            report["power"].append(row)
            if not row["available"]:
                print(f"{cell['name']:<26} detection_limit_ not available: skipped")
            else:
                fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
                print(f"{cell['name']:<26} exact {row['exact']:.3f} "
                      f"({'ok' if row['exact_ok'] else 'MISS'}), mean rank "
                      f"{row['mean_rank']:.2f}, coverage {fmt(row['coverage'], '.3f')}, width "
                      f"{fmt(row['mean_width'], '.2f')}, warned {row['warned']:.2f}, "
                      f"influential {row['influential']:.2f}, {row['noise_models']}  "
                      f"[{row['seconds']:.0f} s]", flush=True)
            checkpoint()
    report["complete"] = True
    report["seconds"] = time.perf_counter() - start
    print(f"\n{report['seconds']:.0f} s")
    checkpoint()
    return report


if __name__ == "__main__":
    main()
