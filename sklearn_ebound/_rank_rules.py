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

import numpy as np

from ._least_squares import (
    canonical_correlations,
    input_spectrum,
    orthonormal_directions,
    solve_static,
)
from ._null_edges import (
    edge_matched_noise_covariance,
    largest_eigenvalue_law,
    null_edge_canonical,
    null_edge_correlated,
    null_edge_ratio,
    null_edge_white,
    optimal_hard_threshold,
    residuals_look_white,
)
from ._reduced_rank import rank_path_scores
from ._spectrum import energy_rank

__all__ = [
    "read_rank",
    "NotEnoughData",
    "RankReading",
    "fitted_spectrum",
    "threshold_rule",
    "rsc_rule",
    "cv_rule",
    "energy_rule",
    "input_rule",
    "kernel_rule",
    "static_rule",
    "cap_by_energy",
    "logit_caveat",
    "whitening_caveat",
    "short_sequence_caveat",
]


def read_rank(name, statistics, criterion, *, significance, tau, attention, cv, fit_intercept,
              cv_data=None, n_tokens=None):
    """Solve the statistics ``name`` (of :mod:`._rank_statistics`) and read their rank.

    Returns the :class:`RankReading`, the spectrum whose energy the components carry, the
    orthonormal input directions of the rank (rows), the input means, and the kernel's least
    squares (``None`` but for ``name="kernel"``). ``cv_data`` is the ``(X, Y)`` of
    ``criterion="cv"``, ``n_tokens`` the sequence length of sequence data.
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
            s = fitted_spectrum(operator)
            reading = static_rule(criterion, statistics, operator, significance, tau, cv_data,
                                  cv, fit_intercept)
            # Input directions of the rank-r operator B V_r, the reduced-rank factors.
            directions = operator.coef @ operator.output_directions[:, : reading.rank]
        components = orthonormal_directions(directions)
    caveats = list(reading.caveats)
    exact = kernel is not None and kernel.get("exact", attention == "linear")
    if kernel is not None and attention == "softmax":
        caveats.append(logit_caveat(kernel.logit_rms, exact))
    if kernel is not None and criterion == "threshold":
        caveats.append(whitening_caveat(kernel))
    # The model is only approximate for an unknown value map and for the linearised softmax:
    # its error is systematic, so the threshold's rank is capped by the energy of what passed.
    approximate = name == "per_token" or (name == "kernel" and not exact)
    if approximate and criterion == "threshold":
        reading = cap_by_energy(reading, s, tau)
        if name == "per_token":
            caveats.append(short_sequence_caveat(n_tokens, tau))
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
    """

    rank: int
    singular_values: np.ndarray
    threshold: float | None = None
    unit: str | None = "y"
    noise_variance: float | None = None
    cv_results: dict | None = None
    caveats: tuple = field(default=())


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


def cv_rule(moments, operator, X, Y, cv, fit_intercept):
    """K-fold cross-validation over the reduced-rank path of ``(X, Y)`` (the data the moments
    were taken of), smallest rank within one standard error of the best."""
    n_features, n_targets = moments.xy.shape
    ranks = np.arange(min(n_features, n_targets) + 1)
    scores = rank_path_scores(X, Y, ranks, cv=cv, scoring="neg_mean_squared_error",
                              fit_intercept=fit_intercept)
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

    White residuals (John's sphericity test keeps ``sigma^2 I``): the fitted values'
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

    Without residual degrees of freedom the Gavish–Donoho threshold with unknown noise.
    """
    s = fitted_spectrum(operator)
    n_targets = operator.output_directions.shape[0]
    spectrum = s / np.sqrt(moments.n)
    level = 1.0 - significance
    dof = operator.residual_dof
    k_x = max(operator.input_rank, 1)
    if dof < 1:
        cut = optimal_hard_threshold(s, shape=(k_x, n_targets)) if s.size else 0.0
        caveat = ("No residual degrees of freedom: the noise level is estimated from the median "
                  "singular value, which assumes the rank is small.")
        return RankReading(int(np.sum(s > cut)), spectrum, cut / np.sqrt(moments.n),
                           caveats=(caveat,))
    noise_variance = operator.noise_variance()
    reading = RankReading(0, spectrum, noise_variance=noise_variance)
    white = residuals_look_white(operator.residual, dof)
    if white:
        edge = _white_edge(operator, np.sqrt(noise_variance), k_x, n_targets, level)
    else:
        edge = _correlated_edge(operator, k_x, level)
    rank, cut = _sequential_count(s**2, edge)
    if not white:
        whitened = _canonical_rank(moments, level)
        if whitened is None:
            caveat = ("The residuals are not white and fewer residual degrees of freedom than "
                      "targets remain (n_samples <= n_features + n_targets + 1): the noise "
                      "covariance is a shrinkage estimate and the test's level is approximate.")
            reading = replace(reading, caveats=(caveat,))
        elif whitened[0] > rank:
            rank, rho, cut = whitened
            # Canonical correlations have no unit.
            return replace(reading, rank=rank, singular_values=rho, unit=None,
                           threshold=float(np.sqrt(cut)) if cut is not None else None)
    threshold = float(np.sqrt(cut / moments.n)) if cut is not None else 0.0
    return replace(reading, rank=rank, threshold=threshold)


def _white_edge(operator, sigma, k_x, n_targets, level):
    """Edge ``edge(k)`` of the squared singular values for white residuals of level ``sigma``."""
    # Sphericity kept does not make the noise exactly white: mild correlation widens the
    # edge. The shape matched to the largest residual eigenvalue says by how much (1 when
    # white noise of the same level explains it).
    dof = operator.residual_dof
    shape, _ = edge_matched_noise_covariance(operator.residual, dof)
    white_edge = sigma**2 * null_edge_white(k_x, n_targets, level)
    widening = (max(1.0, null_edge_correlated(shape, k_x, level) / white_edge)
                if white_edge > 0 else 1.0)

    def edge(k):
        return widening * sigma**2 * null_edge_white(k_x - k, n_targets - k, level)

    return edge


def _correlated_edge(operator, k_x, level):
    """Edge ``edge(k)`` of the squared singular values relative to the residuals'."""
    dof = operator.residual_dof
    values, vectors = edge_matched_noise_covariance(operator.residual, dof)
    # Noise covariance and residual cross-products in the basis of the output directions:
    # after k accepted directions the noise left is in the trailing (q - k) x (q - k) blocks.
    directions = operator.output_directions
    basis = vectors.T @ directions
    noise = (basis.T * values) @ basis
    residual = directions.T @ operator.residual @ directions

    def edge(k):
        shape = np.linalg.eigvalsh(noise[k:, k:])
        observed = np.linalg.eigvalsh(residual[k:, k:])[-1]
        # A noise spike's eigenvalue fluctuates more than TW1: its own law for the observed
        # one, whose low draws would otherwise pass for signal; El Karoui's law over all
        # eigenvalues (conservative above) for the fitted values.
        fitted_law = largest_eigenvalue_law(shape, k_x - k, detach_spike=False)
        residual_law = largest_eigenvalue_law(shape, dof)
        if observed <= 0 or residual_law.mean <= 0:
            return 0.0  # no noise left in these directions
        return observed * null_edge_ratio(fitted_law, residual_law, level)

    return edge


def _canonical_rank(moments, level):
    """Sequential test of the canonical correlations against the Jacobi edge: the rank,
    the correlations and the squared cut; ``None`` where the residual degrees of freedom
    cannot estimate the noise covariance."""
    rho, x_rank, y_rank = canonical_correlations(moments)
    if rho.size == 0 or null_edge_canonical(x_rank, y_rank, moments.dof, level) is None:
        return None

    def edge(k):  # removing k roots leaves k fewer dimensions on each side
        return null_edge_canonical(x_rank - k, y_rank - k, moments.dof - k, level)

    rank, cut = _sequential_count(rho**2, edge)
    return rank, rho, cut


def kernel_rule(fit, s, criterion, tau):
    """Rank of the query–key kernel's least squares ``fit`` (:meth:`KernelMoments.solve`):
    the Gavish–Donoho threshold of the noise-whitened kernel, or the energy rank of the
    kernel's singular values ``s``."""
    if criterion == "energy":
        return energy_rule(s, tau, "kernel", noise_variance=fit.noise_variance)
    return RankReading(int(fit.rank), fit.singular_values, float(fit.threshold), "y",
                       fit.noise_variance)


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


def short_sequence_caveat(n_tokens, tau):
    """Where the per-token operator's systematic term may pass the energy cap, a caveat.

    A token's own share ``x_i x_iᵀ / n`` of its sequence's moment adds ``V (W + tr(W) I) / n``
    to the operator ``V Wᵀ`` (Gaussian tokens): a full-rank term of relative energy up to
    about ``2 / n^2`` (0.3-1.7 / n^2 measured beyond the planted directions, d = 8, n = 4-32).
    """
    if 2 / n_tokens**2 <= 1 - tau:
        return None
    return (f"With an unknown value map and {n_tokens} tokens per sequence, the per-token "
            f"operator carries a full-rank systematic term of relative energy up to about "
            f"2 / n_tokens^2 = {2 / n_tokens**2:.3g}, more than 1 - tau = {1 - tau:.3g}: "
            "the rank may be overestimated. Pass the value map, use longer sequences, or "
            "lower tau.")


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


def logit_caveat(logit_rms, exact=False):
    """Where the fitted softmax logits are too large for its linearisation, a caveat; none
    where the kernel is the converged least squares of the softmax model itself (``exact``)."""
    if exact or logit_rms <= 1:
        return None
    return (f"The fitted attention logits have root-mean-square {logit_rms:.2f} > 1: the "
            "linearisation of the softmax is strained and the rank may be wrong.")
