"""The top of ``rank_interval_``: how many directions could be at least a stated strength.

The sequential test reads ``rank_`` from below: a direction counts once noise alone would not
reach its value. Its interval's top asks the other question, from above: how many directions
could the data hold whose population singular value is at least ``strength`` (a multiple of
the detection limit)? A direction that strong has a sample value whose law is known (below), so
a sample value too small for it rules it out. Directions weaker than ``strength`` may hide
beyond the top; below the detection limit nothing can show them.
"""

from dataclasses import replace
from functools import cache

import numpy as np
from scipy import stats

from .._null_laws import tracy_widom_quantile

# One-sided level of the top: a direction at least ``strength`` is left out of the interval in
# at most this share of draws (the rank's own tests err the other way at ``significance``).
TOP_LEVEL = 0.025

# Below 20 residual degrees of freedom the noise level is itself uncertain (as the rank rules
# say, ``sigma^2 chi2_nu / nu`` with ``nu = dof q``): the top takes the least favourable level
# within its ``TOP_LEVEL`` confidence bounds, and the stated strength at the smallest.
_MIN_CERTAIN_DOF = 20

# Strengths closer to the phase transition than this (in ``t^4 / (m r)``) leave the Gaussian
# law of the spike's sample value (its spread there is of the noise edge's own scale): such a
# step is never ruled out, and the noise-floor top of the sequential test decides.
_MIN_SUPERCRITICAL = 1.25**4


def spike_location(t, m, r):
    """Where the sample singular value of a rank-one signal ``t u vᵀ`` plus an ``m x r``
    matrix of unit Gaussian noise settles as ``m, r`` grow with ``t^4 > m r`` (Benaych-Georges &
    Nadakuditi 2012): ``rho(t) = sqrt((t^2 + m)(t^2 + r)) / t``, above the noise edge
    ``sqrt(m) + sqrt(r)`` that it meets at the detection limit ``t = (m r)^{1/4}``."""
    return float(np.sqrt((t * t + m) * (t * t + r)) / t)


def spike_spread(t, m, r):
    """Standard deviation of that sample singular value: ``sqrt(rho'(t))``, ``rho'(t) = (t -
    m r / t^3) / rho(t)`` (as for the outliers of deformed Wigner and Wishart matrices, whose
    variance is the slope of the location map). Monte Carlo checks at ``m x r`` from ``9 x 9``
    to ``100 x 300`` and ``t`` from 1.25 to 3 times ``(m r)^{1/4}`` agree within 3%; it rises
    from 0 at the transition to 1 (the spread of ``uᵀ E v``) for strong signals."""
    return float(np.sqrt(max(t - m * r / t**3, 0.0) / spike_location(t, m, r)))


@cache
def cluster_minimum_quantile(size, level):
    """Lower ``level`` quantile of the smallest eigenvalue of ``H = (G + Gᵀ) / 2``, ``G`` a
    ``size x size`` unit Gaussian matrix: ``j`` equal directions have sample values ``rho +
    spread * eig(H)``, ``H`` the first-order fluctuation ``Uᵀ E V`` of the signal's singular
    values symmetrised (its diagonal has variance 1, as one direction's alone). Equal
    directions repel, so their weakest sample value lies below a lone direction's.

    At ``size`` 1 the normal quantile. Beyond, ``H`` is a Gaussian orthogonal ensemble whose
    spectrum fills ``[-sqrt(2 j), sqrt(2 j)]``, its extreme eigenvalue ``sqrt(2 j) + j^{-1/6} /
    sqrt(2) TW1`` (Tracy & Widom 1996): the quantile is ``-(sqrt(2 j) + j^{-1/6} / sqrt(2)
    TW1^{-1}(1 - level))``, below the drawn one by 0.06 to 0.4 for ``j`` from 24 down to 2 at
    the levels used here (conservative: the top allows a little more repulsion than there
    is)."""
    if size <= 1:
        return float(stats.norm.ppf(level))
    return float(-(np.sqrt(2.0 * size)
                   + size ** (-1 / 6) / np.sqrt(2.0) * tracy_widom_quantile(1.0 - level)))


def strength_top(spectrum, noise_scales, n_inputs, n_targets, strength, level=TOP_LEVEL):
    """Number of leading directions of ``spectrum`` that could each have a population singular
    value of at least ``strength``, at one-sided level about ``level``.

    ``spectrum`` holds the sample singular values (decreasing) of the ``rank(X) x q`` fitted
    matrix ``S + E`` in some unit, ``noise_scales`` the plausible sizes of one entry of ``E`` in
    that unit (white Gaussian noise: one scale, or the ends of its confidence interval where
    the noise level is itself uncertain) and ``strength`` a singular value of ``S`` in it.

    Step ``k`` (``k`` directions counted) tests "the first ``k + 1`` directions are all at
    least ``strength``". In noise units ``t = strength / scale``, the ``k`` directions before
    leave an ``m x r = (rank(X) - k - 1) x (q - k - 1)`` noise beside direction ``k + 1`` (one
    dimension fewer than the step's own, for the finite-size shift of a signal's mean), in
    which its sample value is about normal around :func:`spike_location` with
    :func:`spike_spread`. A stronger signal only raises the value (for one direction in Gaussian
    noise that is Anderson's theorem); equal ones repel, and ``j`` equal directions have sample
    values ``rho + spread * eig(H)``, ``H`` the ``j x j`` symmetrised Gaussian matrix of
    :func:`cluster_minimum_quantile`. ``j`` counts direction ``k + 1`` and the directions before
    it whose values a cluster of ``k + 1`` at ``strength`` could reach (its largest value's
    ``1 - level`` quantile); directions above that are separated, and their deflation is exact.
    The step rules the hypothesis out where, for ``j`` directions at exactly ``strength``,

    - the weakest value is below ``rho + spread q_j`` (``q_j`` the smallest eigenvalue's
      ``level / 2`` quantile), or
    - the mean of the ``j`` values is below ``rho - spread z / sqrt(j)`` (the mean of the
      eigenvalues is ``tr(H) / j``, normal with variance ``1 / j``; ``z`` the normal
      ``1 - level / 2`` quantile), which keeps a cluster of noise values from passing as one
      of directions at ``strength`` however many there are;

    (one test at ``level`` where ``j = 1``), at every strength at least ``strength``
    (:func:`_ruled_out`) and every scale of ``noise_scales``. The top is the first step ruled
    out.

    So a direction at least ``strength`` is left out with probability at most about ``level``,
    while a value of the noise is ruled out once ``strength``'s law is clear of the noise's
    edge: at twice the detection limit its location is a quarter above the edge of a square
    noise matrix (``(c + 1/c) / 2`` at ``c`` times the limit), about two spreads at ``12 x
    12``, a margin that grows as ``(m r)^{1/4}``.
    """
    spectrum = np.asarray(spectrum, dtype=np.float64)
    scales = [float(s) for s in np.atleast_1d(noise_scales) if s > 0]
    if not scales or not strength > 0:
        return int(spectrum.size)
    for k in range(spectrum.size):
        m, r = n_inputs - k - 1, n_targets - k - 1
        if min(m, r) < 1:
            return int(spectrum.size)  # too few dimensions left for the law: not ruled out
        if all(_ruled_out(spectrum[: k + 1] / scale, strength / scale, m, r, level)
               for scale in scales):
            return k
    return int(spectrum.size)


def _ruled_out(values, t, m, r, level):
    """Whether the last of ``values`` (noise units) rules out that all of them are at least
    ``t``, by the tests of :func:`strength_top`. The hypothesis "at least ``t``" holds every
    strength from ``t`` up: the exact law rises with the strength, its normal approximation's
    lower quantile not quite (the spread grows fast near the transition), so it is ruled out
    only where it is at every strength of a grid up to ``3 t`` (past where the quantile rises
    again). Never near the transition, where the law is not normal: there the sequential
    test's own top decides."""
    if t**4 <= _MIN_SUPERCRITICAL * m * r:
        return False
    before, value = values[:-1], values[-1]
    for strength in t * np.linspace(1.0, 3.0, 41):
        rho, spread = spike_location(strength, m, r), spike_spread(strength, m, r)
        reach = rho - spread * cluster_minimum_quantile(values.size, level)
        cluster = 1 + int(np.sum(before <= reach))
        if cluster == 1:
            ruled_out = value < rho + spread * stats.norm.ppf(level)
        else:
            weakest = rho + spread * cluster_minimum_quantile(cluster, level / 2)
            mean = rho + spread * stats.norm.ppf(level / 2) / np.sqrt(cluster)
            ruled_out = value < weakest or np.mean(values[-cluster:]) < mean
        if not ruled_out:
            return False
    return True


def strength_bounded_reading(reading, operator, strength_factor, level=TOP_LEVEL):
    """``reading`` (a rank rule's) whose interval's top counts only the directions that could
    be at least ``strength_factor`` times its detection limit (:func:`strength_top`, never
    above the sequential test's own top, which holds directions of any strength), its
    p-values up to that top.

    The detection limit is ``sigma (rank(X) q)^{1/4} / sqrt(n)`` in the spectrum's units, so the
    noise's scale there is ``sigma / sqrt(n) = limit / (rank(X) q)^{1/4}`` (for a resampled
    null, the white noise with the same edge). Below 20 residual degrees of freedom the noise
    level is uncertain: the top takes the least favourable of the levels its ``level``
    interval allows, and the strength at the smallest (a limit known to that precision).
    Canonical correlations (no unit) keep the sequential test's top."""
    if (reading.rank_interval is None or reading.detection_limit is None
            or reading.unit is None or not reading.detection_limit > 0):
        return reading
    n_inputs = max(int(operator.input_rank), 1)
    n_targets = int(operator.output_directions.shape[0])
    scale = reading.detection_limit / (n_inputs * n_targets) ** 0.25
    scales = [scale]
    strength = strength_factor * reading.detection_limit
    dof = operator.residual_dof
    if 1 <= dof < _MIN_CERTAIN_DOF:
        # sigma-hat^2 is sigma^2 chi2_nu / nu: the noise levels its two-sided interval allows,
        # and the limit itself at the smallest of them (the stated strength is the limit's
        # multiple, and the limit is only known to that precision).
        nu = dof * n_targets
        scales = [scale * np.sqrt(nu / stats.chi2.ppf(1 - level, nu)), scale,
                  scale * np.sqrt(nu / stats.chi2.ppf(level, nu))]
        strength *= scales[0] / scale
    low, high = reading.rank_interval
    top = strength_top(reading.singular_values, scales, n_inputs, n_targets, strength, level)
    high = max(reading.rank, min(high, top))
    p_values = reading.p_values
    if p_values is not None and p_values.size > high + 1:
        p_values = p_values[: high + 1]
    return replace(reading, rank_interval=(int(low), int(high)), p_values=p_values)
