"""Rank rules: read a rank from solved statistics, as pure functions.

:func:`read_rank` solves the statistics and calls the rule the criterion names. Each rule
takes what the statistics were solved for (the least-squares operator of
:mod:`._least_squares` and its moments, the spectrum of the inputs, the query–key kernel's
least squares) and returns a :class:`RankReading`. No rule sets state or warns: what the
estimator should warn about travels in ``RankReading.caveats``.

Spectra are those of the data as the statistics saw them (scaled by powers of two); a reading
names the unit its spectrum and cut are in, so the estimator can express them in the data's.
"""

from dataclasses import dataclass, field, replace
from numbers import Integral

import numpy as np
from scipy import stats
from sklearn.model_selection import GroupKFold

from ._diagnostics import (
    ASSUMPTIONS,
    DIAGNOSTIC_ROWS,
    absorbed_group_contrasts,
    diagnose_residuals,
    failed_assumptions,
    residual_rows,
)
from ._influence import influence_caveat, influential_directions, widened_interval
from ._least_squares import (
    canonical_correlations,
    input_spectrum,
    orthonormal_directions,
    solve_static,
)
from ._moments import Moments
from ._null_edges import (
    ROTATION_BUDGET,
    ROTATION_DRAWS,
    LargestEigenvalueLaw,
    canonical_edge_law,
    edge_matched_noise_covariance,
    largest_eigenvalue_law,
    marchenko_pastur_median,
    null_edge_canonical,
    null_edge_correlated,
    null_edge_ratio,
    null_edge_white,
    null_ratio_sf,
    optimal_hard_threshold,
    residuals_look_white,
    rotation_null_law,
    tracy_widom_p_value,
    white_edge_law,
)
from ._rank_interval import strength_bounded_reading
from ._reduced_rank import rank_path_scores
from ._resampled_null import (
    NOISE_MODELS,
    ResampledNull,
    block_length,
    fitted_noise_autocovariance,
    long_run_factor,
    multiplier_clusters,
)
from ._spectrum import energy_rank

__all__ = [
    "read_rank",
    "NotEnoughData",
    "RankReading",
    "fitted_spectrum",
    "threshold_rule",
    "calibrated_threshold_rule",
    "resampled_threshold_rule",
    "sequential_p_values",
    "detection_limit",
    "rsc_rule",
    "cv_rule",
    "energy_rule",
    "input_rule",
    "kernel_rule",
    "static_rule",
    "cap_by_energy",
    "logit_caveat",
    "identification_caveat",
    "convergence_caveat",
    "whitening_caveat",
    "short_sequence_caveat",
]


def read_rank(name, statistics, criterion, *, significance, tau, attention, cv, fit_intercept,
              cv_data=None, n_tokens=None, own_energy=None, sample=None, rng=None,
              interval_strength=2.0):
    """Solve the statistics ``name`` (of :mod:`._rank_statistics`) and read their rank.

    Returns the :class:`RankReading`, the spectrum whose energy the components carry, the
    orthonormal input directions of the rank (rows), the input means, and the kernel's least
    squares (``None`` but for ``name="kernel"``). ``cv_data`` is the ``(X, Y)`` of
    ``criterion="cv"``, ``n_tokens`` the sequence length of sequence data (``own_energy``
    the per-token operator's systematic energy under its mask, :func:`short_sequence_caveat`,
    or ``None`` without one), ``sample`` the
    rows kept for the residual diagnostics (:class:`._diagnostics.RowSample`) and ``rng`` the
    generator of their resampling. ``interval_strength`` is the strength, in detection
    limits, of the directions the interval's top counts (:mod:`._rank_interval`).
    """
    kernel = None
    if name == "kernel":
        kernel = statistics.solve()
        U, s, _ = np.linalg.svd(kernel.kernel)
        reading = kernel_rule(kernel, s, criterion, tau)
        components = U[:, : reading.rank].T.copy()
        mean = np.zeros(U.shape[0])
    else:
        if statistics.n < 2:
            raise NotEnoughData("At least 2 samples are needed to read a rank; got "
                                f"{statistics.n} so far.")
        mean = statistics.mean_x.copy()
        if name == "inputs":
            s, directions = input_spectrum(statistics)
            reading = input_rule(s, statistics, criterion, tau)
            directions = directions[:, : reading.rank]
        else:
            operator = solve_static(statistics)
            if criterion == "threshold":
                reading, operator = calibrated_threshold_rule(
                    statistics, operator, significance, sample, rng,
                    expected=EXPECTED_FAILURES.get(name, ()))
                reading = strength_bounded_reading(reading, operator, interval_strength)
            else:
                reading = static_rule(criterion, statistics, operator, significance, tau,
                                      cv_data, cv, fit_intercept)
            s = fitted_spectrum(operator)
            # Input directions of the rank-r operator B V_r, the reduced-rank factors.
            directions = operator.coef @ operator.output_directions[:, : reading.rank]
        components = orthonormal_directions(directions)
    caveats = list(reading.caveats)
    exact = kernel is not None and kernel.get("exact", attention == "linear")
    if kernel is not None:
        caveats.append(identification_caveat(kernel))
    if kernel is not None and attention == "softmax":
        caveats.append(logit_caveat(kernel.logit_rms, exact))
        caveats.append(convergence_caveat(kernel))
    if kernel is not None and criterion == "threshold":
        caveats.append(whitening_caveat(kernel))
    # The model is only approximate for an unknown value map and for the linearised softmax:
    # its error is systematic, so the threshold's rank is capped by the energy of what passed.
    approximate = name == "per_token" or (name == "kernel" and not exact)
    if approximate and criterion == "threshold":
        tested = reading.rank
        reading = cap_by_energy(reading, s, tau)
        if reading.rank < tested and reading.rank_interval is not None:
            # The cap, not the noise test, set the rank: the test's interval does not apply.
            reading = replace(reading, rank_interval=(reading.rank, reading.rank))
        if name == "per_token":
            caveats.append(short_sequence_caveat(n_tokens, tau, own_energy))
    reading = replace(reading, caveats=tuple(c for c in caveats if c))
    return reading, s, components[: reading.rank], mean, kernel


class NotEnoughData(ValueError):
    """Too few samples so far to read a rank (``partial_fit`` waits for more)."""


@dataclass(frozen=True)
class RankReading:
    """A rank and the spectrum it was read from.

    Attributes
    ----------
    rank : int
    singular_values : ndarray
        The spectrum the rule compared with its cut.
    threshold : float or None
        The cut, in the units of ``singular_values``; ``None`` for rules without one.
    unit : {"x", "y", "kernel"} or None
        Units of ``singular_values`` and ``threshold``: those of the inputs, of the targets, of
        the query–key kernel (inverse squared inputs), or none (canonical correlations).
    noise_variance : float or None
        Noise variance per target entry, in squared target units, where the rule estimated it.
    cv_results : dict or None
        Per-rank cross-validation scores (``cv_rule``).
    caveats : tuple of str
        Assumptions the data strain, for the estimator to warn about.
    noise_model : str or None
        The calibration of the test (a key of :data:`._resampled_null.NOISE_MODELS`).
    diagnostics : dict or None
        The residual diagnostics (:func:`._diagnostics.diagnose_residuals`).
    p_values : ndarray or None
        P-value of each tested direction (sequential tests only).
    rank_interval : tuple of int or None
        ``(low, high)``, the ranks the tests cannot tell apart.
    detection_limit : float or None
        Smallest detectable population singular value, in the units of ``singular_values``.
    """

    rank: int
    singular_values: np.ndarray
    threshold: float | None = None
    unit: str | None = "y"
    noise_variance: float | None = None
    cv_results: dict | None = None
    caveats: tuple = field(default=())
    noise_model: str | None = None
    diagnostics: dict | None = None
    p_values: np.ndarray | None = None
    rank_interval: tuple | None = None
    detection_limit: float | None = None


def fitted_spectrum(operator):
    """Singular values of the fitted values that can carry signal: ``min(rank(X), q)``."""
    n_targets = operator.output_directions.shape[0]
    return operator.fitted_singular_values[: min(operator.input_rank, n_targets)]


def _sequential_count(values, edge):
    """Number of leading ``values`` (decreasing) above their own ``edge(k)``, stopping at the
    first that is not, and the last edge computed (the cut; ``None`` for no values). The
    edges are computed only as far as the count goes; a missing edge (``None``) stops it."""
    cut = None
    for k, value in enumerate(values):
        cut = edge(k)
        if cut is None or value <= cut:
            return k, cut
    return len(values), cut


def energy_rule(s, tau, unit="y", spectrum=None, noise_variance=None):
    """Energy rank of ``s`` at level ``tau``: a descriptor, not noise-adaptive. ``spectrum``
    (default ``s``) is the spectrum reported beside it."""
    rank = energy_rank(s, tau) if s.size else 0
    return RankReading(int(rank), s if spectrum is None else spectrum, None, unit,
                       noise_variance)


def input_rule(s, moments, criterion, tau):
    """Rank of ``X`` alone from its singular values ``s``: the Gavish–Donoho threshold with
    unknown noise (``"threshold"``) or the energy rank."""
    spectrum = s / np.sqrt(moments.n)
    if criterion == "energy":
        return energy_rule(s, tau, "x", spectrum)
    shape = (max(moments.dof, 1), moments.xx.shape[0])
    threshold = optimal_hard_threshold(s, shape=shape) / np.sqrt(moments.n)
    return RankReading(int(np.sum(spectrum > threshold)), spectrum, threshold, "x")


def _no_residual_noise(operator, criterion):
    if operator.residual_dof < 1:
        raise NotEnoughData(
            f"criterion={criterion!r} estimates the noise from the residuals and needs "
            "n_samples > rank(X) + 1 (with fit_intercept). Got no residual degrees of freedom."
        )


def rsc_rule(moments, operator):
    """Bunea, She & Wegkamp's (2011) rank selection criterion: singular values of the fitted
    values above ``sigma * sqrt(2 (q + rank(X)))`` (their ``mu = 2 S^2 (q + rank(X))``)."""
    _no_residual_noise(operator, "rsc")
    s = fitted_spectrum(operator)
    noise_variance = operator.noise_variance()
    n_targets = operator.output_directions.shape[0]
    cut = np.sqrt(noise_variance) * np.sqrt(2 * (n_targets + operator.input_rank))
    return RankReading(int(np.sum(s > cut)), s / np.sqrt(moments.n), cut / np.sqrt(moments.n),
                       "y", noise_variance)


def _one_standard_error_rank(ranks, scores):
    """Smallest rank whose mean score is within one standard error of the best mean."""
    mean = scores.mean(axis=0)
    sem = scores.std(axis=0, ddof=1) / np.sqrt(scores.shape[0]) if scores.shape[0] > 1 else 0 * mean
    best = int(np.argmax(mean))
    return int(ranks[np.flatnonzero(mean >= mean[best] - sem[best])[0]])


def cv_rule(moments, operator, X, Y, groups=None, *, cv, fit_intercept):
    """K-fold cross-validation over the reduced-rank path of ``(X, Y)`` (the data the moments
    were taken of), smallest rank within one standard error of the best. With ``groups`` an
    integer ``cv`` is :class:`~sklearn.model_selection.GroupKFold` (no group on both sides of
    a split), and a splitter gets them."""
    n_features, n_targets = moments.xy.shape
    ranks = np.arange(min(n_features, n_targets) + 1)
    if groups is not None and isinstance(cv, Integral):
        cv = GroupKFold(n_splits=cv)
    scores = rank_path_scores(X, Y, ranks, cv=cv, scoring="neg_mean_squared_error",
                              fit_intercept=fit_intercept, groups=groups)
    cv_results = {"rank": ranks, "mean_test_score": scores.mean(axis=0),
                  "std_test_score": scores.std(axis=0)}
    return RankReading(_one_standard_error_rank(ranks, scores),
                       fitted_spectrum(operator) / np.sqrt(moments.n), cv_results=cv_results)


def threshold_rule(moments, operator, significance):
    """Count the directions that stand above what noise alone reaches (at ``significance``).

    The noise part of the fitted values' Gram is a Wishart matrix with ``rank(X)`` degrees
    of freedom and the noise covariance ``Sigma``, independent of the residuals' (``dof``
    degrees of freedom, same ``Sigma``). Every test is sequential: once ``k`` directions
    are accepted, the next is compared with the edge of the noise left in the remaining
    ``rank(X) - k`` by ``q - k`` dimensions.

    White residuals (neither John's nor the largest root's sphericity test rejects
    ``sigma^2 I``, :func:`residuals_look_white`): the fitted values'
    largest eigenvalue has a Tracy–Widom law around ``sigma^2 (sqrt(rank X) + sqrt(q))^2``
    (Johnstone 2001), an edge widened by the ratio of El Karoui's edge for the shape
    matched to the residuals (:func:`edge_matched_noise_covariance`) to the white one, for
    correlation too mild for the sphericity test. Correlated residuals: two tests, each at
    ``significance``, and the larger rank (a Bonferroni union: a false-positive rate of at
    most ``2 significance``):

    - the fitted values against the residuals: both noises have the covariance ``Sigma``, so the
      ratio of their largest eigenvalues in the directions left is nearly free of it (exactly so
      at ``rank(X) = dof``). The edge is the observed largest residual eigenvalue times the
      ratio's ``1 - significance`` quantile (:func:`null_edge_ratio`, the two Tracy–Widom laws
      of El Karoui 2007), ``Sigma``'s shape in that ratio coming from
      :func:`edge_matched_noise_covariance`. It keeps its power when ``q / dof`` is not small,
      where whitening with the sample covariance costs much, and works for ``dof <= q``;
    - the canonical correlations (the spectrum whitened by the sample noise covariance)
      against the Jacobi ensemble's edge (Johnstone 2008), exact for any ``Sigma`` and
      powerful when the signal lies where the noise is weak; it needs
      ``dof > n_targets``.

    Where the canonical test cannot run (``dof <= n_targets``), the ratio test alone would
    carry the spread of one residual eigenvalue in its edge (about 4% at ``dof = 99, q =
    100``), a loss of power that no single-eigenvalue estimate of ``Sigma`` avoids without
    losing the level. The fitted values are instead tested against their law given the
    targets' Gram, the rotation test (Langsrud 2005, :func:`_rotation_edge`): under no
    signal that law is free of ``Sigma``, so the first test has exactly its level whatever
    the noise covariance, and no estimate of ``Sigma`` enters the edge. It is a Monte Carlo
    law; beyond its budget of multiply-adds (``rank(X)^2 (n - 1)`` per draw) the ratio test
    again, with a caveat that its level is approximate.

    The reading carries the p-value of each tested direction under the test whose spectrum
    it reports, the interval of ranks they cannot tell apart (:func:`rank_interval`) and the
    detection limit (:func:`detection_limit`).

    Without residual degrees of freedom the Gavish–Donoho threshold with unknown noise.
    """
    s = fitted_spectrum(operator)
    n_targets = operator.output_directions.shape[0]
    spectrum = s / np.sqrt(moments.n)
    level = 1.0 - significance
    dof = operator.residual_dof
    k_x = max(operator.input_rank, 1)
    if dof < 1:
        return _no_residual_rule(s, k_x, n_targets, moments.n, significance)
    noise_variance = operator.noise_variance()
    limit = detection_limit(noise_variance, k_x, n_targets, moments.n)
    reading = RankReading(0, spectrum, noise_variance=noise_variance, noise_model="gaussian",
                          detection_limit=limit)
    white = residuals_look_white(operator.residual, dof,
                                 operator.residual_covariance_eigh[0])
    if white:
        edge, p_value, floor, floor_level = _white_edge(operator, np.sqrt(noise_variance), k_x,
                                                        n_targets, level)
    else:
        # The canonical test needs more residual degrees of freedom than targets; where it
        # cannot run, the rotation test alone, exact at its first step for any covariance.
        whitened = _canonical_rank(moments, level)
        rotation = whitened is None and _rotation_affordable(moments, k_x)
        edge, p_value, floor, floor_level = (
            _rotation_edge(moments, operator, k_x, level, s**2) if rotation
            else _correlated_edge(operator, k_x, level))
    rank, cut = _sequential_count(s**2, edge)
    if not white:
        if whitened is None and not rotation:
            caveat = ("The residuals are not white and fewer residual degrees of freedom than "
                      "targets remain (n_samples <= n_features + n_targets + 1): the noise "
                      "covariance is a shrinkage estimate and the test's level is approximate.")
            reading = replace(reading, caveats=(caveat,))
        elif whitened is not None and whitened[0] > rank:
            rank, rho, cut, rho_p_value = whitened
            p_values, interval = sequential_p_values(rho**2, rho_p_value, rank, significance)
            # Canonical correlations have no unit.
            return replace(reading, rank=rank, singular_values=rho, unit=None,
                           threshold=float(np.sqrt(cut)) if cut is not None else None,
                           p_values=p_values, rank_interval=interval,
                           detection_limit=canonical_detection_limit(k_x, n_targets, moments.dof))
    threshold = float(np.sqrt(cut / moments.n)) if cut is not None else 0.0
    p_values, interval = sequential_p_values(s**2, p_value, rank, significance, floor,
                                             floor_level)
    return replace(reading, rank=rank, threshold=threshold, p_values=p_values,
                   rank_interval=interval)


def _no_residual_rule(s, k_x, n_targets, n_samples, significance):
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
    level = 1.0 - significance

    def edge(k):
        return sigma**2 * null_edge_white(k_x - k, n_targets - k, level)

    def p_value(k, value, exact=False):
        mu, scale = white_edge_law(k_x - k, n_targets - k)
        if scale <= 0:
            return float(value <= 0)
        return tracy_widom_p_value((value / sigma**2 - mu) / scale, exact)

    def floor(k, value, exact=False):
        return white_floor_p_value(value / sigma**2, k_x - k, n_targets - k, exact)

    rank, cut = _sequential_count(s**2, edge)
    p_values, interval = sequential_p_values(s**2, p_value, rank, significance, floor)
    threshold = float(np.sqrt(cut / n_samples)) if cut is not None else 0.0
    return RankReading(rank, spectrum, threshold, noise_variance=float(sigma**2),
                       caveats=(caveat,), noise_model="gaussian", p_values=p_values,
                       rank_interval=interval,
                       detection_limit=detection_limit(sigma**2, k_x, n_targets, n_samples))


def sequential_p_values(values, p_value, rank, significance, floor_p_value=None,
                        floor_level=None):
    """P-values ``p_value(k, values[k])`` of the sequential tests, and the interval of ranks
    they cannot tell apart at ``significance`` (:func:`rank_interval`). ``p_value(k, value,
    exact=True)`` is asked for where the fast one disagrees with ``rank`` (read from the
    edges at ``significance``) or would end the interval.

    The tests run past ``rank`` until a direction's value is one that noise alone would exceed
    in all but ``significance`` of draws: its ``floor_p_value`` (default ``p_value``; the
    p-value under the weakest noise the data allow, without the widening that makes the
    rank's own tests conservative) reaches ``floor_level`` (default ``1 - significance``), a
    number or ``floor_level(k)`` where it depends on the step.
    """
    floor_p_value = p_value if floor_p_value is None else floor_p_value
    if floor_level is None:
        floor_level = 1 - significance
    p_values, floors, levels = [], [], []
    for k, value in enumerate(values):
        levels.append(floor_level(k) if callable(floor_level) else floor_level)
        p_values.append(p_value(k, value))
        if (k < rank) != (p_values[-1] <= significance):
            # Near the level an approximate p-value may disagree with the edge: the exact one.
            p_values[-1] = p_value(k, value, exact=True)
        if k < rank:
            floors.append(0.0)
            continue
        floors.append(p_values[-1] if floor_p_value is p_value else floor_p_value(k, value))
        if floors[-1] >= levels[-1]:
            # The gamma form's lower tail is too thin: the exact p-value decides the end.
            floors[-1] = floor_p_value(k, value, exact=True)
            if floors[-1] >= levels[-1]:
                break
    p_values = np.asarray(p_values, dtype=np.float64)
    return p_values, rank_interval(floors, rank, np.asarray(levels, dtype=np.float64))


def rank_interval(floors, rank, floor_level):
    """Ranks the sequential tests cannot tell apart: from ``rank`` (the directions significant
    at the level) to the number of leading directions whose ``floors`` (p-values) are below
    ``floor_level`` (one per direction, or one for all): ``1 - significance``, but for the
    few residual degrees of freedom of :func:`_white_edge` and :func:`_correlated_edge`.

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


def white_floor_p_value(value, n_rows, n_cols, exact=False):
    """``P(largest > value)`` for the largest eigenvalue of ``WᵀW``, ``W`` an ``n_rows x
    n_cols`` unit Gaussian matrix, for the interval's top (:func:`rank_interval`): the
    Tracy–Widom p-value, or where larger the bound from the rows and columns.

    The largest eigenvalue is at least every row's and every column's squared norm, so
    ``P(largest <= x) <= F(x; n_cols)^n_rows`` and ``F(x; n_rows)^n_cols`` (``F`` the
    chi-square distribution function): a p-value at least ``1 - F^m`` for both. Johnstone's
    law, built for the upper tail, has a lower tail far too heavy for a matrix a few rows
    thin (at one row the law is exactly the chi-square's), which the bound corrects.
    """
    mu, scale = white_edge_law(n_rows, n_cols)
    if scale <= 0:
        return float(value <= 0)
    p = tracy_widom_p_value((value - mu) / scale, exact)
    for rows, cols in ((n_rows, n_cols), (n_cols, n_rows)):
        log_cdf = stats.chi2.logcdf(value, cols)
        p = max(p, float(-np.expm1(rows * log_cdf)))
    return p


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


def _white_edge(operator, sigma, k_x, n_targets, level):
    """Edge ``edge(k)`` of the squared singular values for white residuals of level ``sigma``,
    the p-value ``p_value(k, value)`` of a squared singular value at step ``k``, and the
    floor of :func:`sequential_p_values` and its level: that p-value without the widening
    (which only raises the edge) and ``level``, or, with few residual degrees of
    freedom, the p-value and that of the edge's centre at the smallest noise level the
    residuals allow at the level."""
    # Sphericity kept does not make the noise exactly white: mild correlation widens the
    # edge. The shape matched to the largest residual eigenvalue says by how much (1 when
    # white noise of the same level explains it).
    dof = operator.residual_dof
    shape, _ = edge_matched_noise_covariance(operator.residual, dof,
                                             operator.residual_covariance_eigh)
    white_edge = sigma**2 * null_edge_white(k_x, n_targets, level)
    widening = (max(1.0, null_edge_correlated(shape, k_x, level) / white_edge)
                if white_edge > 0 else 1.0)

    if dof < _MIN_DIAGNOSTIC_DOF:
        # Few residual degrees of freedom: sigma^2 is itself uncertain, sigma^2 chi2_nu / nu
        # with nu = dof q, independent of the fitted values; the edge is that of the ratio.
        variance = LargestEigenvalueLaw(0.0, 0.0, 1.0, np.sqrt(2.0 / (dof * n_targets)))

        def numerator(k):
            return LargestEigenvalueLaw(*white_edge_law(k_x - k, n_targets - k))

        def edge(k):
            law = numerator(k)
            if law.sigma <= 0:
                return 0.0
            return widening * sigma**2 * null_edge_ratio(law, variance, level)

        def p_value(k, value, exact=False):
            law, unit = numerator(k), widening * sigma**2
            if law.sigma <= 0 or unit <= 0:
                return float(value <= 0)
            return null_ratio_sf(law, variance, value / unit)

        # sigma_hat's spread is shared by every step, so the ratio's lower tail would let the
        # interval's top pass every noise value (a lower-tail test at the level has no power
        # at 4 residual degrees of freedom). sigma^2 can be as small as sigma_hat^2 / high at
        # the level: the top counts the directions above the centre of the edge at that noise
        # level (the widening, which only raises the centre, left out too).
        high = stats.chi2.ppf(level, dof * n_targets) / (dof * n_targets)

        def floor_level(k):
            law = numerator(k)
            if law.sigma <= 0:
                return level
            return null_ratio_sf(law, variance, law.mu / (high * widening))

        return edge, p_value, p_value, floor_level

    def edge(k):
        return widening * sigma**2 * null_edge_white(k_x - k, n_targets - k, level)

    def p_value(k, value, exact=False):
        mu, scale = white_edge_law(k_x - k, n_targets - k)
        unit = widening * sigma**2
        if scale <= 0 or unit <= 0:
            return float(value <= 0)
        return tracy_widom_p_value((value / unit - mu) / scale, exact)

    def floor(k, value, exact=False):
        return white_floor_p_value(value / sigma**2 if sigma > 0 else np.inf, k_x - k,
                                   n_targets - k, exact)

    return edge, p_value, floor, level


def _ratio_laws(operator, k_x):
    """``step(k)``: the largest residual eigenvalue in the directions left after ``k``
    accepted ones, and the laws of the fitted values' and the residuals' largest eigenvalues
    there for the noise covariance matched to the residuals, with the fitted values' law
    whose spike is detached (the floor of :func:`_correlated_edge`)."""
    dof = operator.residual_dof
    values, vectors = edge_matched_noise_covariance(operator.residual, dof,
                                                    operator.residual_covariance_eigh)
    # Noise covariance and residual cross-products in the basis of the output directions:
    # after k accepted directions the noise left is in the trailing (q - k) x (q - k) blocks.
    directions = operator.output_directions
    basis = vectors.T @ directions
    noise = (basis.T * values) @ basis
    residual = directions.T @ operator.residual @ directions
    laws = {}

    def step(k):
        if k not in laws:
            shape = np.linalg.eigvalsh(noise[k:, k:])
            observed = np.linalg.eigvalsh(residual[k:, k:])[-1]
            # A noise spike's eigenvalue fluctuates more than TW1: its own law for the observed
            # one, whose low draws would otherwise pass for signal; El Karoui's law over all
            # eigenvalues (conservative above) for the fitted values.
            fitted_law = largest_eigenvalue_law(shape, k_x - k, detach_spike=False)
            residual_law = largest_eigenvalue_law(shape, dof)
            floor_law = largest_eigenvalue_law(shape, k_x - k)
            laws[k] = observed, fitted_law, residual_law, floor_law
        return laws[k]

    return step


def _correlated_edge(operator, k_x, level):
    """Edge ``edge(k)`` of the squared singular values relative to the residuals', the
    p-value ``p_value(k, value)`` of a squared singular value at step ``k``, and the floor of
    :func:`sequential_p_values` and its level: the p-value under the fitted values' own law
    for the noise covariance matched to the residuals, its spike detached (El Karoui's law
    over every eigenvalue, conservative above, has a lower tail far too thin near a spike,
    and would make a real direction look weaker than noise), and ``level``; with few
    residual degrees of freedom, as in :func:`_white_edge`."""
    dof = operator.residual_dof
    step = _ratio_laws(operator, k_x)

    def edge(k):
        observed, fitted_law, residual_law, _ = step(k)
        if observed <= 0 or residual_law.mean <= 0:
            return 0.0  # no noise left in these directions
        return observed * null_edge_ratio(fitted_law, residual_law, level)

    def p_value(k, value, exact=False):  # consistent with the edge as it is
        observed, fitted_law, residual_law, _ = step(k)
        if observed <= 0 or residual_law.mean <= 0:
            return float(value <= 0)
        return null_ratio_sf(fitted_law, residual_law, value / observed)

    if dof < _MIN_DIAGNOSTIC_DOF:
        return edge, p_value, p_value, _few_dof_floor_level(step, p_value, level)

    def floor(k, value, exact=False):
        # Enough residual degrees of freedom fix the noise covariance's top: its own law (the
        # ratio to one observed eigenvalue would spread the lower tail with that eigenvalue's).
        observed, _, residual_law, floor_law = step(k)
        if observed <= 0 or residual_law.mean <= 0:
            return float(value <= 0)
        return float(floor_law.sf(value))

    return edge, p_value, floor, level


def _rotation_affordable(moments, k_x):
    """Whether the rotation test's Monte Carlo law fits its budget of multiply-adds."""
    return k_x**2 * moments.dof * ROTATION_DRAWS <= ROTATION_BUDGET


def _rotation_edge(moments, operator, k_x, level, values):
    """Edge ``edge(k)``, p-value ``p_value(k, value)``, and floor of
    :func:`sequential_p_values` and its level (see :func:`_white_edge`) of the rotation
    test: the fitted values' largest eigenvalue against its law given the targets' Gram
    (:func:`rotation_null_law`).

    Under no signal the centred targets' Gram ``Cyy`` is that of ``n - 1`` i.i.d. rows
    ``N(0, Sigma)`` (an orthonormal basis of the centred rows), of which the fitted values
    take ``rank(X)``: given ``Cyy``, their largest eigenvalue has a law free of ``Sigma``,
    so the first test has exactly its level for any noise covariance and any ``q``, and the
    edge carries no estimate of ``Sigma`` at all. After ``k`` accepted directions the
    same holds in the directions left (``Vᵀ Cyy V`` over the trailing ``q - k`` output
    directions ``V``), with ``rank(X) - k`` of ``n - 1 - k`` rows, as the other sequential
    tests take it. A direction not yet accepted also sits in ``Cyy``, and raises the law by
    about ``rank(X) / (n - 1)`` of its energy: a little power lost, no level.

    Each step's law is drawn to decide its own value, ``values[k]`` (the squared singular
    values the sequential test and its interval read): the draws stop once that value is
    clearly on one side of both tails the test reads at ``1 - level`` (sequential Monte
    Carlo, :func:`rotation_null_law`), which most steps of the interval's top are.
    """
    directions = operator.output_directions
    n_total = moments.dof
    laws = {}

    def law(k):
        if k not in laws:
            rest = directions[:, k:]
            total = np.linalg.eigvalsh(rest.T @ moments.yy @ rest)
            laws[k] = rotation_null_law(total, k_x - k, n_total - k, seed=k,
                                        value=values[k], significance=1.0 - level)
        return laws[k]

    def edge(k):
        if k_x - k < 1:
            return None
        return law(k).quantile(level)

    def p_value(k, value, exact=False):
        if k_x - k < 1:
            return float(value <= 0)
        return law(k).sf(value)

    if operator.residual_dof >= _MIN_DIAGNOSTIC_DOF:
        # The law is exact for any covariance: its own lower tail is the floor.
        return edge, p_value, p_value, level
    # Few residual degrees of freedom: as for the ratio test (for the matched covariance).
    return edge, p_value, p_value, _few_dof_floor_level(_ratio_laws(operator, k_x), p_value,
                                                        level)


def _few_dof_floor_level(step, p_value, level):
    """``floor_level(k)`` of :func:`sequential_p_values` below 20 residual degrees of freedom
    (see :func:`_white_edge`): the p-value, under ``p_value``, of the centre of the fitted
    values' edge at the smallest noise scale the observed residual eigenvalue allows at the
    level (``step`` from :func:`_ratio_laws`), so that the interval's top counts the
    directions above it."""
    def floor_level(k):
        observed, fitted_law, residual_law, _ = step(k)
        if observed <= 0 or residual_law.mean <= 0:
            return level
        return p_value(k, observed * fitted_law.mu / residual_law.quantile(level))

    return floor_level


def _canonical_rank(moments, level):
    """Sequential test of the canonical correlations against the Jacobi edge: the rank,
    the correlations, the squared cut and the p-value ``p_value(k, rho^2)``; ``None`` where
    the residual degrees of freedom cannot estimate the noise covariance."""
    rho, x_rank, y_rank = canonical_correlations(moments)
    if rho.size == 0 or null_edge_canonical(x_rank, y_rank, moments.dof, level) is None:
        return None

    def edge(k):  # removing k roots leaves k fewer dimensions on each side
        return null_edge_canonical(x_rank - k, y_rank - k, moments.dof - k, level)

    def p_value(k, value, exact=False):
        law = canonical_edge_law(x_rank - k, y_rank - k, moments.dof - k)
        if law is None or not 0 < value < 1:
            return float(value <= 0) if law is not None else 1.0
        mu, scale = law
        return tracy_widom_p_value((np.log(value / (1 - value)) - mu) / scale, exact)

    rank, cut = _sequential_count(rho**2, edge)
    return rank, rho, cut, p_value


def resampled_threshold_rule(moments, operator, significance, rows, noise_model, clusters,
                             rng, weight=1.0, balance=True, influence=False):
    """The sequential test of :func:`threshold_rule` on the fitted values' spectrum, each
    step's null law resampled (:class:`._resampled_null.ResampledNull`) from the residual
    rows ``rows`` with signs shared within ``clusters``, instead of the Tracy–Widom edges.

    With ``balance`` the fitted values are first weighted on the input side so that the
    resampled noise is equally strong in every input direction
    (:meth:`ResampledNull.balance_inputs`; no change for noise that does not depend on the
    inputs): the reading's spectrum is that of the balanced fitted values, in the units of the
    targets. Rows that are only some of those of the moments (``weight`` > 1) estimate the
    weight from other noise than the fitted values hold, so they are not balanced.

    With ``influence`` the accepted directions are tested for being carried by a handful of
    rows (:func:`._influence.influential_directions`, at ``significance``): the reading's
    ``diagnostics`` holds the result under ``"influential_directions"``, its caveats name the
    flagged directions, and its interval starts below them (the rank is left as read)."""
    n_targets = operator.output_directions.shape[0]
    k_x = max(operator.input_rank, 1)
    level = 1.0 - significance
    # Clusters of dependent rows (groups, blocks) get normal multipliers: a sign keeps each
    # cluster's own product fixed, and the null is too narrow where they are few or uneven.
    null = ResampledNull(rows, clusters, rng, weight=weight,
                         gaussian=noise_model in ("group-bootstrap", "block-bootstrap"))
    raw = fitted = operator.input_basis.T @ moments.xy
    if balance:
        fitted = null.balance_inputs(fitted)
    _, s, Vt = np.linalg.svd(fitted, full_matrices=False)
    s = s[: len(fitted_spectrum(operator))]
    laws = {}

    def law(k):
        if k not in laws:
            laws[k] = null.law(fitted, k)
        return laws[k]

    rank, cut = _sequential_count(s**2, lambda k: ResampledNull.edge(law(k), level))
    p_values, interval = sequential_p_values(
        s**2, lambda k, value, exact=False: ResampledNull.p_value(law(k), value), rank,
        significance)
    caveats = ()
    if noise_model != "wild-bootstrap" and null.n_clusters < _MIN_CLUSTERS:
        caveats = (f"Only {null.n_clusters} groups or blocks of rows share a resampled "
                   f"multiplier (fewer than {_MIN_CLUSTERS}): the level of the test is "
                   "approximate.",)
    diagnostics = None
    if influence:
        # The rows' fitted values along each accepted direction of the matrix the rule read.
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
        detection_limit=detection_limit(_edge_noise_variance(law(0), k_x, n_targets), k_x,
                                        n_targets, moments.n))


def _edge_noise_variance(law, n_inputs, n_targets):
    """The white noise variance whose edge ``sigma^2 (sqrt(rank X) + sqrt(q))^2`` is the mean
    of the resampled largest eigenvalue: noise that depends on the inputs puts its edge
    higher than white noise of the same average variance, and the edge decides what shows."""
    shape, scale, shift = law
    mean = shift if shape is None else shift + shape * scale
    return max(mean, 0.0) / (np.sqrt(n_inputs) + np.sqrt(n_targets)) ** 2


# The failed assumptions that outliers and leverage points cause, and that send the accepted
# directions to the influence check.
_OUTLIER_SIGNS = {"heteroscedasticity", "heavy_tails"}
# Fewer residual degrees of freedom leave the diagnostics' laws unreliable: none are run.
_MIN_DIAGNOSTIC_DOF = 20
# The wild cluster bootstrap needs some tens of clusters (Cameron, Gelbach & Miller 2008).
_MIN_CLUSTERS = 30


def kernel_rule(fit, s, criterion, tau):
    """Rank of the query–key kernel's least squares ``fit`` (:meth:`KernelMoments.solve`):
    the Gavish–Donoho threshold of the noise-whitened kernel, or the energy rank of the
    kernel's singular values ``s``."""
    if criterion == "energy":
        return energy_rule(s, tau, "kernel", noise_variance=fit.noise_variance)
    return RankReading(int(fit.rank), fit.singular_values, float(fit.threshold), "y",
                       fit.noise_variance)


# Assumptions that the rows of sequence data fail by construction, so that the calibration
# that drops them is taken without a warning: the tokens (or channels) of one sequence are
# dependent, and are grouped by sequence; with an unknown value map the residuals also carry
# the per-token operator's systematic error, which depends on the inputs and has heavy tails.
EXPECTED_FAILURES = {
    "token_mixing": ("serial_dependence", "group_dependence"),
    "per_token": ("heteroscedasticity", "serial_dependence", "group_dependence",
                  "heavy_tails"),
}


def _rounding_residuals(operator):
    """Whether the residuals are rounding error (a noise-free fit): ``trace(residual)`` within
    ``1000 eps`` of ``trace(Cyy)``. Rounding error grows with the inputs and is not Gaussian,
    so the diagnostics would flag it; its level is what the Gaussian rule's floor assumes."""
    return np.trace(operator.residual) <= 1e3 * np.finfo(float).eps * operator.target_energy


def calibrated_threshold_rule(moments, operator, significance, sample=None, rng=None,
                              expected=()):
    """:func:`threshold_rule` where the residual rows of ``sample``
    (:class:`._diagnostics.RowSample`) pass the diagnostics, else the resampled test of
    :func:`resampled_threshold_rule` with the calibration that drops the failed assumption:

    - dependence within groups, or along the rows where groups are known: signs per group
      (``"group-bootstrap"``);
    - dependence along the rows: the rows prewhitened by the AR(1) filter of the residuals'
      pooled lag-one autocorrelation (Andrews & Monahan 1992; it keeps the operator ``B``, so
      its rank), then one normal multiplier per block of contiguous rows
      (``"block-bootstrap"``);
    - input-dependent variance or heavy tails alone: signs per row (``"wild-bootstrap"``).

    Returns the reading and the operator it was read from (the prewhitened one after a
    prewhitening). Without a sample, or without residual degrees of freedom, the Gaussian rule.
    The reading's caveat names the failed assumptions unless all of them are ``expected``
    (keys of :data:`._diagnostics.ASSUMPTIONS` the rows fail by construction, as those of
    :data:`EXPECTED_FAILURES`): ``noise_model`` and ``diagnostics`` say it either way.
    """
    gaussian = threshold_rule(moments, operator, significance)
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
        # Dependence the AR(1) filter leaves (blocks of rows sharing effects, longer memory)
        # sets the blocks too; what they still cut of the long-run variance is restored.
        autocovariance, reach = fitted_noise_autocovariance(rows.basis, rows.residual)
        block = block_length(rows.n_rows, _pooled_lag_one(rows.residual), reach)
        factor = long_run_factor(autocovariance, block)
        weight *= factor
        diagnostics.update(block_length=block, dependence_range=reach,
                           long_run_factor=factor)
        if 2 * reach > block:
            short = (f"The rows are dependent over about {reach} rows, longer than the "
                     f"blocks of {block} rows that {rows.n_rows} rows allow (at least 20 "
                     "blocks): the level of the test is not kept. Pass the sequence or "
                     "subject ids as `groups`.")
    else:
        noise_model = "wild-bootstrap"
    if rows is None:
        rows = residual_rows(sample.X, sample.Y, moments, operator, groups, with_residual=True)
    clusters = multiplier_clusters(rows.n_rows, noise_model, rows.groups, block)
    # Heavy tails or input-dependent variance that the rows do not have by construction may
    # come from outliers and leverage points: the accepted directions are checked for being
    # carried by a handful of rows (clean data never come here, so they never pay for it).
    influence = bool(_OUTLIER_SIGNS & (set(failed) - set(expected)))
    reading = resampled_threshold_rule(moments, operator, significance, rows, noise_model,
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


# Residual degrees of freedom beyond the targets' number for the residuals' covariance to
# whiten the directions the influence check reads (fewer leave its inverse too noisy).
_WHITENING_EXTRA_DOF = 30


def _checked_for_influence(reading, sample, moments, operator, significance, rng):
    """``reading`` of the Gaussian rule with its accepted directions checked for being
    carried by a handful of rows that the other rows contradict
    (:func:`._influence.influential_directions`), on the rows the diagnostics read: outliers
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
    (:func:`._diagnostics.absorbed_group_contrasts`): noise shared within a group then sits in
    the fitted values, not in the residuals the diagnostics and the resampling read, and too
    few contrasts are left outside to show it (fewer than the absorbed ones, and than 30)."""
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


def static_rule(criterion, moments, operator, significance, tau, cv_data, cv, fit_intercept):
    """The rank of a static operator (or of the 2-D rows of sequence data) by ``criterion``;
    ``cv_data`` is the ``(X, Y)`` the moments were taken of, for ``"cv"``."""
    if criterion == "threshold":
        return threshold_rule(moments, operator, significance)
    if criterion == "rsc":
        return rsc_rule(moments, operator)
    if criterion == "cv":
        return cv_rule(moments, operator, *cv_data, cv=cv, fit_intercept=fit_intercept)
    s = fitted_spectrum(operator)
    return energy_rule(s, tau, spectrum=s / np.sqrt(moments.n))


def cap_by_energy(reading, s, tau):
    """Cap the rank by the energy rank, at ``tau``, of the directions that passed.

    Where the model is only approximate (softmax, or an unknown value map at finite ``n``)
    its error is a systematic, signal-proportional term rather than noise. The energy of the
    directions that passed the noise test is used: the noise's own energy in the other
    directions would otherwise loosen the cap as the noise grows.
    """
    signal = s[: reading.rank]
    if not (signal.size and signal[0] > 0):
        return reading
    return replace(reading, rank=int(min(reading.rank, energy_rank(signal, tau))))


def short_sequence_caveat(n_tokens, tau, own_energy=None):
    """Where the per-token operator's systematic term may pass the energy cap, a caveat.

    A token's own share ``x_i x_iᵀ / n`` of its sequence's moment adds ``V (W + tr(W) I) / n``
    to the operator ``V Wᵀ`` (Gaussian tokens): a full-rank term of relative energy up to
    about ``2 / n^2`` (0.3-1.7 / n^2 measured beyond the planted directions, d = 8, n = 4-32).
    With a mask or weights the share is ``a_ii``, and ``own_energy`` is ``2 E[a_ii^2]``
    (:func:`._attention_operators.own_share_energy`): under a causal mask the first queries
    see few keys, and the term is far larger than ``2 / n^2``.
    """
    energy = 2 / n_tokens**2 if own_energy is None else own_energy
    if energy <= 1 - tau:
        return None
    what = (f"{n_tokens} tokens per sequence" if own_energy is None else
            f"{n_tokens} tokens per sequence and this mask (queries that see few keys)")
    return (f"With an unknown value map and {what}, the per-token operator carries a "
            f"full-rank systematic term of relative energy up to about 2 E[a_ii^2] = "
            f"{energy:.3g} (a_ii: a token's own share of its attention), more than 1 - tau = "
            f"{1 - tau:.3g}: the rank may be overestimated. Pass the value map, use longer "
            "sequences, or lower tau.")


def whitening_caveat(fit):
    """Where the noise whitening of the kernel alone would have read another rank, a caveat.

    The whitening takes the least squares' normal matrix for a Kronecker product; near the cut
    :meth:`KernelMoments.solve` scales the cut by the noise variance computed from the normal
    matrix itself along each singular direction. Where that correction changes the count the
    rank rests on it, and the caveat says so."""
    kronecker = fit.get("kronecker_rank", fit.rank)
    if kronecker == fit.rank:
        return None
    ratios = ", ".join(f"{v:.2f}" for v in fit.local_noise.values())
    return (f"Near the threshold the noise of the query-key kernel is not what its Kronecker "
            f"whitening assumes (variance ratios {ratios} along the singular directions "
            f"there, as with large logits or few keys per query): corrected, the rank is "
            f"{fit.rank}; uncorrected it would be {kronecker}. Values this close to the cut "
            "make the rank uncertain.")


def identification_caveat(fit):
    """Where the data give fewer equations on the query–key kernel than it has entries, a
    caveat: the least squares is one exact fit among many, and its rank not the kernel's."""
    if fit.get("identified", True):
        return None
    return (f"The sequences give at most {fit.n_equations} equations on the query-key kernel, "
            f"fewer than its {fit.n_unknowns} entries on the span of the tokens (each query "
            "constrains only min(rank of the value map, keys it attends to) numbers): the "
            "kernel is not identified and the rank read from its minimum-norm least squares "
            "may be wrong. Add sequences, use longer ones, or pass a value map of higher rank.")


def convergence_caveat(fit):
    """Where the Gauss–Newton fit of the softmax model stopped before converging, a caveat."""
    if fit.get("converged", True):
        return None
    return (f"The least-squares fit of the softmax model stopped after "
            f"{fit.get('gauss_newton_steps', 0)} Gauss-Newton steps "
            f"({fit.get('n_products', 0)} products of the normal operator) before converging: "
            "the kernel is not the softmax's least squares and the rank may be wrong.")


def logit_caveat(logit_rms, exact=False):
    """Where the fitted softmax logits are too large for its linearisation, a caveat; none
    where the kernel is the converged least squares of the softmax model itself (``exact``)."""
    if exact or logit_rms <= 1:
        return None
    return (f"The fitted attention logits have root-mean-square {logit_rms:.2f} > 1: the "
            "linearisation of the softmax is strained and the rank may be wrong.")
