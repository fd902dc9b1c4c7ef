"""The static rank test: ``criterion="threshold"`` on a least-squares operator ``Y ~ X B``.

The fitted values' squared singular values are tested one after the other against the
largest value that noise alone reaches (a null law of :mod:`.._null_laws` per step): the rank
is the number of leading directions that stand above it, at ``significance`` each. The test:

1. :func:`static_rank_test` runs the residual diagnostics (:mod:`.._diagnostics`) on the rows
   it was given and chooses the calibration: the Gaussian test where they pass, else a
   resampled null that drops the failed assumption (:mod:`.._resampled_null`);
2. :func:`gaussian_rank_test`: the Tracy–Widom laws (white, correlated, rotation, canonical
   correlations, no residual degrees of freedom);
3. :func:`resampled_rank_test`: the same sequential test, each step's law resampled;
4. :func:`sequential_p_values` and :func:`rank_interval`: the p-values of every tested
   direction and the interval of ranks they cannot tell apart; :func:`detection_limit`.

Every function is pure: what the estimator should warn about travels in the reading's
caveats.
"""

from dataclasses import replace

import numpy as np

from .._diagnostics import (
    ASSUMPTIONS,
    DIAGNOSTIC_ROWS,
    absorbed_group_contrasts,
    diagnose_residuals,
    failed_assumptions,
    residual_rows,
    residuals_are_spherical,
)
from .._influence import influence_caveat, influential_directions, widened_interval
from .._least_squares import canonical_correlations, solve_static
from .._moments import Moments
from .._null_laws import (
    ROTATION_BUDGET,
    ROTATION_DRAWS,
    CanonicalNull,
    RatioNull,
    RotationNull,
    WhiteNull,
    edge_matched_noise_covariance,
    null_edge_correlated,
    null_edge_white,
)
from .._resampled_null import (
    NOISE_MODELS,
    ResampledNull,
    block_length,
    fitted_noise_autocovariance,
    long_run_factor,
    multiplier_clusters,
)
from .._spectrum import marchenko_pastur_median, optimal_hard_threshold
from .reading import RankReading, fitted_spectrum

__all__ = [
    "static_rank_test",
    "gaussian_rank_test",
    "resampled_rank_test",
    "sequential_count",
    "sequential_p_values",
    "rank_interval",
    "detection_limit",
    "canonical_detection_limit",
]

# The failed assumptions that outliers and leverage points cause, and that send the accepted
# directions to the influence check.
_OUTLIER_SIGNS = {"heteroscedasticity", "heavy_tails"}
# Fewer residual degrees of freedom leave the diagnostics' laws unreliable: none are run, and
# the noise level is itself uncertain (the few-dof laws of :mod:`.._null_laws`).
_MIN_DIAGNOSTIC_DOF = 20
# The wild cluster bootstrap needs some tens of clusters (Cameron, Gelbach & Miller 2008).
_MIN_CLUSTERS = 30
# Residual degrees of freedom beyond the targets' number for the residuals' covariance to
# whiten the directions the influence check reads (fewer leave its inverse too noisy).
_WHITENING_EXTRA_DOF = 30

# --- the calibrated test ----------------------------------------------------------------


def static_rank_test(moments, operator, significance, sample=None, rng=None, expected=()):
    """:func:`gaussian_rank_test` where the residual rows of ``sample``
    (:class:`.._diagnostics.RowSample`) pass the diagnostics, else the resampled test of
    :func:`resampled_rank_test` with the calibration that drops the failed assumption:

    - dependence within groups, or along the rows where groups are known: signs per group
      (``"group-bootstrap"``);
    - dependence along the rows: the rows prewhitened by the AR(1) filter of the residuals'
      pooled lag-one autocorrelation (Andrews & Monahan 1992; it keeps the operator ``B``, so
      its rank), then one normal multiplier per block of contiguous rows
      (``"block-bootstrap"``);
    - input-dependent variance or heavy tails alone: signs per row (``"wild-bootstrap"``).

    Returns the reading and the operator it was read from (the prewhitened one after a
    prewhitening). Without a sample, or without residual degrees of freedom, the Gaussian test.
    The reading's caveat names the failed assumptions unless all of them are ``expected``
    (keys of :data:`.._diagnostics.ASSUMPTIONS` the rows fail by construction, as the
    ``expected_failures`` of :data:`.._rank_statistics.STATISTICS`): ``noise_model`` and
    ``diagnostics`` say it either way.
    """
    gaussian = gaussian_rank_test(moments, operator, significance)
    if (sample is None or operator.residual_dof < _MIN_DIAGNOSTIC_DOF
            or operator.input_basis is None or _rounding_residuals(operator)):
        return gaussian, operator
    # The diagnostics read the first rows only: a violation that strains the edges is one of
    # fixed size, plain in a thousand rows, and more would cost more than the rank itself.
    groups = sample.group_codes()
    head = slice(0, DIAGNOSTIC_ROWS)
    diagnostics = diagnose_residuals(residual_rows(
        sample.X[head], sample.Y[head], moments, operator,
        None if groups is None else groups[head]))
    failed = failed_assumptions(diagnostics)
    diagnostics["failed"] = failed
    absorbed = None if groups is None else _absorbed_groups_caveat(sample, moments, operator,
                                                                   diagnostics)
    if not failed:
        caveats = (*gaussian.caveats, absorbed) if absorbed else gaussian.caveats
        reading = replace(gaussian, diagnostics=diagnostics, caveats=caveats)
        # Signs of outliers too weak to change the path, at the test's own level, still send
        # the accepted directions to the influence check (clean data rarely pay for it).
        hinted = min(diagnostics.get(name, {}).get("p_value", 1.0)
                     for name in _OUTLIER_SIGNS) <= significance
        if hinted and not expected:
            reading = _checked_for_influence(reading, sample, moments, operator,
                                             significance, rng)
        return reading, operator
    return _resampled_calibration(moments, operator, significance, sample, rng, expected,
                                  gaussian, diagnostics, absorbed)


def _resampled_calibration(moments, operator, significance, sample, rng, expected, gaussian,
                           diagnostics, absorbed):
    """The resampled test of :func:`static_rank_test` once the diagnostics failed."""
    failed = diagnostics["failed"]
    groups = sample.group_codes()
    dependent = {"serial_dependence", "group_dependence"} & set(failed)
    weight = np.sqrt(moments.n / sample.n_rows)
    short = None
    block = 1
    rows = None
    if groups is not None and dependent:
        noise_model = "group-bootstrap"
    elif dependent:
        noise_model = "block-bootstrap"
        rows = residual_rows(sample.X, sample.Y, moments, operator, with_residual=True)
        if sample.complete:
            phi = _pooled_lag_one(rows.residual)
            diagnostics["prewhitening_coefficient"] = phi
            filtered = _prewhitened(sample, moments, phi)
            if filtered[1].residual_dof < 1:
                return replace(gaussian, diagnostics=diagnostics), operator
            moments, operator, rows = filtered
        block, factor, short = _blocks(rows, diagnostics)
        weight *= factor
    else:
        noise_model = "wild-bootstrap"
    if rows is None:
        rows = residual_rows(sample.X, sample.Y, moments, operator, groups, with_residual=True)
    clusters = multiplier_clusters(rows.n_rows, noise_model, rows.groups, block)
    # Heavy tails or input-dependent variance that the rows do not have by construction may
    # come from outliers and leverage points: the accepted directions are checked for being
    # carried by a handful of rows (clean data never come here, so they never pay for it).
    influence = bool(_OUTLIER_SIGNS & (set(failed) - set(expected)))
    reading = resampled_rank_test(moments, operator, significance, rows, noise_model,
                                  clusters, rng, weight=weight, balance=sample.complete,
                                  influence=influence)
    diagnostics.update(reading.diagnostics or {})
    extra = tuple(c for c in (short, absorbed) if c)
    if extra:
        reading = replace(reading, caveats=(*reading.caveats, *extra))
    if expected:
        diagnostics["expected"] = tuple(name for name in ASSUMPTIONS if name in expected)
    if set(failed) <= set(expected):
        return replace(reading, diagnostics=diagnostics), operator
    p_text = ", ".join(f"{ASSUMPTIONS[name]} (p = {diagnostics[name]['p_value']:.2g})"
                       for name in failed)
    caveat = (f"The residuals fail what the Tracy–Widom edges assume: {p_text}. The rank is "
              f"read with {NOISE_MODELS[noise_model]} instead (noise_model_={noise_model!r}; "
              "diagnostics_ holds the tests).")
    return replace(reading, diagnostics=diagnostics,
                   caveats=(caveat, *reading.caveats)), operator


def _blocks(rows, diagnostics):
    """Rows per block of the block bootstrap, the factor that restores what the blocks cut of
    the long-run variance, and a caveat where the dependence outreaches the blocks.

    Dependence the AR(1) filter leaves (blocks of rows sharing effects, longer memory) sets
    the blocks too."""
    autocovariance, reach = fitted_noise_autocovariance(rows.basis, rows.residual)
    block = block_length(rows.n_rows, _pooled_lag_one(rows.residual), reach)
    factor = long_run_factor(autocovariance, block)
    diagnostics.update(block_length=block, dependence_range=reach, long_run_factor=factor)
    short = None
    if 2 * reach > block:
        short = (f"The rows are dependent over about {reach} rows, longer than the "
                 f"blocks of {block} rows that {rows.n_rows} rows allow (at least 20 "
                 "blocks): the level of the test is not kept. Pass the sequence or "
                 "subject ids as `groups`.")
    return block, factor, short


def _rounding_residuals(operator):
    """Whether the residuals are rounding error (a noise-free fit): ``trace(residual)`` within
    ``1000 eps`` of ``trace(Cyy)``. Rounding error grows with the inputs and is not Gaussian,
    so the diagnostics would flag it; its level is what the Gaussian test's floor assumes."""
    return np.trace(operator.residual) <= 1e3 * np.finfo(float).eps * operator.target_energy


def _checked_for_influence(reading, sample, moments, operator, significance, rng):
    """``reading`` of the Gaussian test with its accepted directions checked for being
    carried by a handful of rows that the other rows contradict
    (:func:`.._influence.influential_directions`), on the rows the diagnostics read: outliers
    that are leverage points can leave residuals that pass the diagnostics at their strict
    level (the rows' own fit absorbs their shift) and still give the fitted values a
    direction of their own."""
    if reading.rank == 0:
        return reading
    head = slice(0, DIAGNOSTIC_ROWS)
    rows = residual_rows(sample.X[head], sample.Y[head], moments, operator, with_residual=True)
    raw = operator.input_basis.T @ moments.xy
    # The directions in the metric of the noise (whitened by the residuals' covariance where
    # the residual degrees of freedom allow it), where a shifted cluster of rows stands apart
    # from the signal the others carry instead of mixing with it.
    values, vectors = operator.residual_covariance_eigh
    metric = np.eye(raw.shape[1])
    if operator.residual_dof > raw.shape[1] + _WHITENING_EXTRA_DOF:
        floor = max(values.max(), 0) * 1e-12
        metric = (vectors / np.sqrt(np.maximum(values, floor))) @ vectors.T
    directions = metric @ np.linalg.svd(raw @ metric, full_matrices=False)[2][: reading.rank].T
    result = influential_directions(rows.basis, rows.basis @ raw, rows.residual, directions,
                                    significance, rng or np.random.default_rng(0))
    diagnostics = {**reading.diagnostics, "influential_directions": result}
    return replace(reading, diagnostics=diagnostics,
                   rank_interval=widened_interval(reading.rank_interval, reading.rank, result),
                   caveats=tuple(filter(None, (*reading.caveats, influence_caveat(result)))))


def _absorbed_groups_caveat(sample, moments, operator, diagnostics):
    """A caveat where the inputs span most of the directions that separate the groups
    (:func:`.._diagnostics.absorbed_group_contrasts`): noise shared within a group then sits
    in the fitted values, not in the residuals the diagnostics and the resampling read, and
    too few contrasts are left outside to show it (fewer than the absorbed ones, and than
    30)."""
    if operator.input_basis is None:
        return None
    basis = (sample.X / moments.scale_x - moments.mean_x) @ operator.input_basis
    absorbed, contrasts = absorbed_group_contrasts(basis, sample.group_codes())
    diagnostics["absorbed_group_contrasts"] = {"absorbed": absorbed, "contrasts": contrasts}
    left = contrasts - absorbed
    if not (absorbed > left and left < _MIN_CLUSTERS):
        return None
    return (f"The inputs span about {absorbed:.0f} of the {contrasts} directions that separate "
            f"the {contrasts + 1} groups: noise shared within a group along them goes into the "
            "fitted values, where the residuals cannot show it, and the level of the test is "
            "not kept. More groups, or inputs that vary within the groups, are needed.")


def _pooled_lag_one(residual):
    """Lag-one autocorrelation of the residual rows, pooled over the targets."""
    total = float(np.einsum("ij,ij->", residual, residual))
    if total <= 0 or residual.shape[0] < 2:
        return 0.0
    return float(np.einsum("ij,ij->", residual[1:], residual[:-1]) / total)


def _prewhitened(sample, moments, phi):
    """Moments, operator and residual rows of the rows filtered by ``x_t - phi x_{t-1}``."""
    X = sample.X[1:] - phi * sample.X[:-1]
    Y = sample.Y[1:] - phi * sample.Y[:-1]
    filtered = Moments.empty(X.shape[1], Y.shape[1], center=moments.center,
                             scale_x=moments.scale_x, scale_y=moments.scale_y).update(X, Y)
    operator = solve_static(filtered)
    return filtered, operator, residual_rows(X, Y, filtered, operator, with_residual=True)


# --- the Gaussian test -------------------------------------------------------------------


def gaussian_rank_test(moments, operator, significance):
    """Count the directions that stand above what noise alone reaches (at ``significance``).

    The noise part of the fitted values' Gram is a Wishart matrix with ``rank(X)`` degrees
    of freedom and the noise covariance ``Sigma``, independent of the residuals' (``dof``
    degrees of freedom, same ``Sigma``). Every test is sequential: once ``k`` directions
    are accepted, the next is compared with the edge of the noise left in the remaining
    ``rank(X) - k`` by ``q - k`` dimensions.

    White residuals (neither John's nor the largest root's sphericity test rejects
    ``sigma^2 I``, :func:`.._diagnostics.residuals_are_spherical`): the fitted values'
    largest eigenvalue has a Tracy–Widom law around ``sigma^2 (sqrt(rank X) + sqrt(q))^2``
    (Johnstone 2001), an edge widened by the ratio of El Karoui's edge for the shape
    matched to the residuals (:func:`.._null_laws.edge_matched_noise_covariance`) to the
    white one, for correlation too mild for the sphericity test
    (:class:`.._null_laws.WhiteNull`). Correlated residuals: two tests, each at
    ``significance``, and the larger rank (a Bonferroni union: a false-positive rate of at
    most ``2 significance``):

    - the fitted values against the residuals: both noises have the covariance ``Sigma``, so the
      ratio of their largest eigenvalues in the directions left is nearly free of it (exactly so
      at ``rank(X) = dof``). The edge is the observed largest residual eigenvalue times the
      ratio's ``1 - significance`` quantile (:class:`.._null_laws.RatioNull`, the two
      Tracy–Widom laws of El Karoui 2007). It keeps its power when ``q / dof`` is not small,
      where whitening with the sample covariance costs much, and works for ``dof <= q``;
    - the canonical correlations (the spectrum whitened by the sample noise covariance)
      against the Jacobi ensemble's edge (Johnstone 2008, :class:`.._null_laws.CanonicalNull`),
      exact for any ``Sigma`` and powerful when the signal lies where the noise is weak; it
      needs ``dof > n_targets``.

    Where the canonical test cannot run (``dof <= n_targets``), the ratio test alone would
    carry the spread of one residual eigenvalue in its edge (about 4% at ``dof = 99, q =
    100``), a loss of power that no single-eigenvalue estimate of ``Sigma`` avoids without
    losing the level. The fitted values are instead tested against their law given the
    targets' Gram, the rotation test (Langsrud 2005, :class:`.._null_laws.RotationNull`):
    under no signal that law is free of ``Sigma``, so the first test has exactly its level
    whatever the noise covariance, and no estimate of ``Sigma`` enters the edge. It is a Monte
    Carlo law; beyond its budget of multiply-adds (``rank(X)^2 (n - 1)`` per draw) the ratio
    test again, with a caveat that its level is approximate.

    The reading carries the p-value of each tested direction under the test whose spectrum
    it reports, the interval of ranks they cannot tell apart (:func:`rank_interval`) and the
    detection limit (:func:`detection_limit`).

    Without residual degrees of freedom, :func:`_no_residual_test`.
    """
    s = fitted_spectrum(operator)
    n_targets = operator.output_directions.shape[0]
    level = 1.0 - significance
    dof = operator.residual_dof
    k_x = max(operator.input_rank, 1)
    if dof < 1:
        return _no_residual_test(s, k_x, n_targets, moments.n, significance)
    noise_variance = operator.noise_variance()
    reading = RankReading(0, s / np.sqrt(moments.n), noise_variance=noise_variance,
                          noise_model="gaussian",
                          detection_limit=detection_limit(noise_variance, k_x, n_targets,
                                                          moments.n))
    white = residuals_are_spherical(operator.residual, dof, operator.residual_covariance_eigh[0])
    canonical = rotation = None
    if white:
        null = _white_null(operator, np.sqrt(noise_variance), k_x, n_targets, level)
    else:
        # The canonical test needs more residual degrees of freedom than targets; where it
        # cannot run, the rotation test alone, exact at its first step for any covariance.
        canonical = _canonical_test(moments, significance)
        rotation = canonical is None and _rotation_affordable(moments, k_x)
        null = (_rotation_null(moments, operator, k_x, level, s**2) if rotation
                else _ratio_null(operator, k_x, level))
    rank, cut = sequential_count(s**2, null, significance)
    if not white:
        if canonical is None and not rotation:
            caveat = ("The residuals are not white and fewer residual degrees of freedom than "
                      "targets remain (n_samples <= n_features + n_targets + 1): the noise "
                      "covariance is a shrinkage estimate and the test's level is approximate.")
            reading = replace(reading, caveats=(caveat,))
        elif canonical is not None and canonical[0] > rank:
            rank, rho, cut, canonical_null = canonical
            p_values, interval = sequential_p_values(rho**2, canonical_null, rank, significance)
            # Canonical correlations have no unit.
            return replace(reading, rank=rank, singular_values=rho, unit=None,
                           threshold=float(np.sqrt(cut)) if cut is not None else None,
                           p_values=p_values, rank_interval=interval,
                           detection_limit=canonical_detection_limit(k_x, n_targets, moments.dof))
    threshold = float(np.sqrt(cut / moments.n)) if cut is not None else 0.0
    p_values, interval = sequential_p_values(s**2, null, rank, significance)
    return replace(reading, rank=rank, threshold=threshold, p_values=p_values,
                   rank_interval=interval)


def _no_residual_test(s, k_x, n_targets, n_samples, significance):
    """The sequential white test where no residual degrees of freedom are left (``rank(X) =
    n - 1``, as with more inputs than samples): the fitted values are the centred targets
    themselves, and the noise level is that which puts the median singular value at the
    Marchenko–Pastur median of a ``rank(X) x q`` noise matrix (Gavish & Donoho's estimate).
    Each test then has about the level ``significance`` as long as the rank is small beside
    ``min(rank(X), q)`` (the median is then a noise value); beyond that the estimate grows,
    and the test becomes conservative."""
    spectrum = s / np.sqrt(n_samples)
    caveat = ("No residual degrees of freedom: the noise level is estimated from the median "
              "singular value, which assumes the rank is small.")
    m, n = sorted((k_x, n_targets))
    if s.size < m or not np.median(s) > 0:
        cut = optimal_hard_threshold(s, shape=(k_x, n_targets)) if s.size else 0.0
        return RankReading(int(np.sum(s > cut)), spectrum, cut / np.sqrt(n_samples),
                           caveats=(caveat,))
    sigma = np.median(s[:m]) / np.sqrt(n * marchenko_pastur_median(m / n))
    null = WhiteNull(sigma, k_x, n_targets, 1.0 - significance)
    rank, cut = sequential_count(s**2, null, significance)
    p_values, interval = sequential_p_values(s**2, null, rank, significance)
    threshold = float(np.sqrt(cut / n_samples)) if cut is not None else 0.0
    return RankReading(rank, spectrum, threshold, noise_variance=float(sigma**2),
                       caveats=(caveat,), noise_model="gaussian", p_values=p_values,
                       rank_interval=interval,
                       detection_limit=detection_limit(sigma**2, k_x, n_targets, n_samples))


def _white_null(operator, sigma, k_x, n_targets, level):
    """The null of white residuals of level ``sigma`` (:class:`.._null_laws.WhiteNull`).

    Sphericity kept does not make the noise exactly white: mild correlation widens the edge.
    The shape matched to the largest residual eigenvalue says by how much (1 when white noise
    of the same level explains it)."""
    dof = operator.residual_dof
    shape, _ = edge_matched_noise_covariance(operator.residual, dof,
                                             operator.residual_covariance_eigh)
    white_edge = sigma**2 * null_edge_white(k_x, n_targets, level)
    widening = (max(1.0, null_edge_correlated(shape, k_x, level) / white_edge)
                if white_edge > 0 else 1.0)
    return WhiteNull(sigma, k_x, n_targets, level, widening=widening, dof=dof,
                     few_dof=dof < _MIN_DIAGNOSTIC_DOF)


def _ratio_null(operator, k_x, level):
    """The null of the fitted values relative to the residuals
    (:class:`.._null_laws.RatioNull`)."""
    dof = operator.residual_dof
    return RatioNull(operator.residual, dof, operator.residual_covariance_eigh,
                     operator.output_directions, k_x, level,
                     few_dof=dof < _MIN_DIAGNOSTIC_DOF)


def _rotation_affordable(moments, k_x):
    """Whether the rotation test's Monte Carlo law fits its budget of multiply-adds."""
    return k_x**2 * moments.dof * ROTATION_DRAWS <= ROTATION_BUDGET


def _rotation_null(moments, operator, k_x, level, values):
    """The rotation test's null (:class:`.._null_laws.RotationNull`), each step's law drawn to
    decide ``values[k]`` (the squared singular values the sequential test and its interval
    read); with few residual degrees of freedom its floor level is the ratio test's."""
    few_dof = operator.residual_dof < _MIN_DIAGNOSTIC_DOF
    return RotationNull(moments.yy, operator.output_directions, k_x, moments.dof, values,
                        level, ratio=_ratio_null(operator, k_x, level) if few_dof else None)


def _canonical_test(moments, significance):
    """Sequential test of the canonical correlations against the Jacobi edge: the rank,
    the correlations, the squared cut and the null; ``None`` where the residual degrees of
    freedom cannot estimate the noise covariance."""
    rho, x_rank, y_rank = canonical_correlations(moments)
    null = CanonicalNull(x_rank, y_rank, moments.dof, 1 - significance)
    if rho.size == 0 or null.law(0).isf(significance) is None:
        return None
    rank, cut = sequential_count(rho**2, null, significance)
    return rank, rho, cut, null


# --- the resampled test ------------------------------------------------------------------


def resampled_rank_test(moments, operator, significance, rows, noise_model, clusters, rng,
                        weight=1.0, balance=True, influence=False):
    """The sequential test of :func:`gaussian_rank_test` on the fitted values' spectrum, each
    step's null law resampled (:class:`.._resampled_null.ResampledNull`) from the residual
    rows ``rows`` with signs shared within ``clusters``, instead of the Tracy–Widom laws.

    With ``balance`` the fitted values are first weighted on the input side so that the
    resampled noise is equally strong in every input direction
    (:meth:`ResampledNull.balance_inputs`; no change for noise that does not depend on the
    inputs): the reading's spectrum is that of the balanced fitted values, in the units of the
    targets. Rows that are only some of those of the moments (``weight`` > 1) estimate the
    weight from other noise than the fitted values hold, so they are not balanced.

    With ``influence`` the accepted directions are tested for being carried by a handful of
    rows (:func:`.._influence.influential_directions`, at ``significance``): the reading's
    ``diagnostics`` holds the result under ``"influential_directions"``, its caveats name the
    flagged directions, and its interval starts below them (the rank is left as read)."""
    n_targets = operator.output_directions.shape[0]
    k_x = max(operator.input_rank, 1)
    # Clusters of dependent rows (groups, blocks) get normal multipliers: a sign keeps each
    # cluster's own product fixed, and the null is too narrow where they are few or uneven.
    resampler = ResampledNull(rows, clusters, rng, weight=weight,
                              gaussian=noise_model in ("group-bootstrap", "block-bootstrap"))
    raw = fitted = operator.input_basis.T @ moments.xy
    if balance:
        fitted = resampler.balance_inputs(fitted)
    _, s, Vt = np.linalg.svd(fitted, full_matrices=False)
    s = s[: len(fitted_spectrum(operator))]
    null = resampler.sequential(fitted, 1.0 - significance)
    rank, cut = sequential_count(s**2, null, significance)
    p_values, interval = sequential_p_values(s**2, null, rank, significance)
    caveats = ()
    if noise_model != "wild-bootstrap" and resampler.n_clusters < _MIN_CLUSTERS:
        caveats = (f"Only {resampler.n_clusters} groups or blocks of rows share a resampled "
                   f"multiplier (fewer than {_MIN_CLUSTERS}): the level of the test is "
                   "approximate.",)
    diagnostics = None
    if influence:
        # The rows' fitted values along each accepted direction of the matrix the test read.
        result = influential_directions(rows.basis, rows.basis @ raw, rows.residual,
                                        Vt[:rank].T, significance, rng)
        diagnostics = {"influential_directions": result}
        interval = widened_interval(interval, rank, result)
        caveats = (*caveats, influence_caveat(result))
    return RankReading(
        rank, s / np.sqrt(moments.n),
        threshold=float(np.sqrt(cut / moments.n)) if cut is not None else 0.0,
        noise_variance=operator.noise_variance(), noise_model=noise_model,
        p_values=p_values, rank_interval=interval, caveats=tuple(filter(None, caveats)),
        diagnostics=diagnostics,
        detection_limit=detection_limit(_edge_noise_variance(null.law(0), k_x, n_targets),
                                        k_x, n_targets, moments.n))


def _edge_noise_variance(law, n_inputs, n_targets):
    """The white noise variance whose edge ``sigma^2 (sqrt(rank X) + sqrt(q))^2`` is the mean
    of the resampled largest eigenvalue: noise that depends on the inputs puts its edge
    higher than white noise of the same average variance, and the edge decides what shows."""
    return max(law.mean, 0.0) / (np.sqrt(n_inputs) + np.sqrt(n_targets)) ** 2


# --- the sequential test, its p-values and its interval ----------------------------------


def sequential_count(values, null, significance):
    """Number of leading ``values`` (decreasing) above their own edge, the ``1 -
    significance`` quantile of step ``k``'s law (``null.law(k).isf(significance)``), stopping
    at the first that is not, and the last edge computed (the cut; ``None`` for no values).
    The edges are computed only as far as the count goes; a missing edge (``None``) stops
    it."""
    cut = None
    for k, value in enumerate(values):
        cut = null.law(k).isf(significance)
        if cut is None or value <= cut:
            return k, cut
    return len(values), cut


def sequential_p_values(values, null, rank, significance):
    """P-values ``null.law(k).sf(values[k])`` of the sequential tests, and the interval of
    ranks they cannot tell apart at ``significance`` (:func:`rank_interval`). The law's
    ``sf(value, exact=True)`` is asked for where the fast one disagrees with ``rank`` (read
    from the edges at ``significance``) or would end the interval.

    The tests run past ``rank`` until a direction's value is one that noise alone would exceed
    in all but ``significance`` of draws: its p-value under ``null.floor(k)`` (the step's own
    law where ``None``; the law under the weakest noise the data allow, without the widening
    that makes the rank's own tests conservative) reaches ``null.floor_level(k)`` (``1 -
    significance`` but with few residual degrees of freedom).
    """
    p_values, floors, levels = [], [], []
    for k, value in enumerate(values):
        law = null.law(k)
        levels.append(null.floor_level(k))
        p_values.append(law.sf(value))
        if (k < rank) != (p_values[-1] <= significance):
            # Near the level an approximate p-value may disagree with the edge: the exact one.
            p_values[-1] = law.sf(value, exact=True)
        if k < rank:
            floors.append(0.0)
            continue
        floor = null.floor(k)
        floors.append(p_values[-1] if floor is None else floor.sf(value))
        if floors[-1] >= levels[-1]:
            # The gamma form's lower tail is too thin: the exact p-value decides the end.
            floors[-1] = (law if floor is None else floor).sf(value, exact=True)
            if floors[-1] >= levels[-1]:
                break
    p_values = np.asarray(p_values, dtype=np.float64)
    return p_values, rank_interval(floors, rank, np.asarray(levels, dtype=np.float64))


def rank_interval(floors, rank, floor_level):
    """Ranks the sequential tests cannot tell apart: from ``rank`` (the directions significant
    at the level) to the number of leading directions whose ``floors`` (p-values) are below
    ``floor_level`` (one per direction, or one for all): ``1 - significance``, but for the
    few residual degrees of freedom of :class:`.._null_laws.WhiteNull` and
    :class:`.._null_laws.RatioNull`.

    Each p-value is ``P(noise's value > observed)`` under the step's null law, the largest
    eigenvalue of the noise left once the directions before it are taken out. Planting a
    direction of any strength in Gaussian noise makes that largest value stochastically larger
    (Anderson's (1955) theorem: for a centred Gaussian and a convex symmetric set, here
    ``{E : ||E||_2 <= t}``, the probability of the shifted set falls with the shift), so a real
    direction has a p-value of at least ``1 - significance`` with probability at most
    ``significance`` whatever its population value. At the detection limit a direction's
    sample value sits at the edge's centre, with fluctuations of the edge's own Tracy–Widom
    scale (Baik, Ben Arous & Péché 2005; its own law there is not in closed form), so no
    cut much above noise's own lower quantile holds it at that level. The upper end is thus a
    lower-tail test at the level of the rank's upper-tail tests: a rank ``k`` above it needs a
    ``k``-th direction with a value that noise alone would exceed in all but ``significance``
    of draws. The bound is exact for the weakest direction when the stronger ones are well
    separated (their deflation is then exact); several equal directions near the limit push
    the weakest one lower, which it does not cover.

    Noise does not carry the top far: each further noise value is compared with the largest of
    a smaller noise matrix, which the ``m``-th largest value of the noise undershoots by a
    margin that grows with ``m`` (about ``m^{2/3}`` of the edge's scale), so the top passes a
    few noise values, more the smaller ``significance`` (about 4 in a white ``30 x 30`` noise
    matrix at ``1e-3``) and as many as the ``min(rank(X), q)`` there are only where the
    noise level is uncertain."""
    floors = np.asarray(floors)
    below = floors >= np.broadcast_to(floor_level, floors.shape)
    high = int(np.argmax(below)) if np.any(below) else len(floors)
    return int(rank), int(max(rank, high))


def detection_limit(noise_variance, n_inputs, n_targets, n_samples):
    """Smallest population singular value (in the units of ``fitted / sqrt(n)``) that noise of
    variance ``noise_variance`` per entry lets the fitted values show: the phase transition
    ``sigma (rank(X) q)^{1/4} / sqrt(n)`` of a rank-one signal in a ``rank(X) x q`` noise
    matrix (Baik, Ben Arous & Péché 2005; Benaych-Georges & Nadakuditi 2012). Below it a
    direction's sample value sinks into the noise's bulk whatever the level."""
    return float(np.sqrt(noise_variance) * (n_inputs * n_targets) ** 0.25 / np.sqrt(n_samples))


def canonical_detection_limit(n_inputs, n_outputs, dof):
    """The detection limit in canonical correlations: a population correlation ``rho`` shows
    in the sample ones when ``rho^2 > sqrt(c1 c2 / ((1 - c1) (1 - c2)))``, ``c1, c2`` the two
    dimensions over the degrees of freedom (Bao, Hu, Pan & Zhou 2019)."""
    c1, c2 = n_inputs / dof, n_outputs / dof
    if c1 >= 1 or c2 >= 1:
        return 1.0
    return float(min(1.0, (c1 * c2 / ((1 - c1) * (1 - c2))) ** 0.25))
