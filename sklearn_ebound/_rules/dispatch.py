"""Read a rank: solve the statistics, then call the rule the criterion names.

:func:`read_rank` is the one entry of the estimator into the rules. Spectra are those of the
data as the statistics saw them (scaled by powers of two); a reading names the unit its
spectrum and cut are in, so the estimator can express them in the data's.
"""

from dataclasses import replace

import numpy as np

from .._least_squares import input_spectrum, orthonormal_directions, solve_static
from .caveats import (
    convergence_caveat,
    identification_caveat,
    logit_caveat,
    short_sequence_caveat,
    whitening_caveat,
)
from .cv import cv_rule
from .energy import cap_by_energy, energy_rule
from .rank_interval import strength_bounded_reading
from .reading import NotEnoughData, fitted_spectrum
from .rsc import rsc_rule
from .static_rank_test import gaussian_rank_test, static_rank_test
from .threshold import input_threshold_rule, kernel_threshold_rule

__all__ = ["read_rank", "static_rule"]


def read_rank(kind, statistics, criterion, *, significance, tau, attention, cv, fit_intercept,
              cv_data=None, n_tokens=None, own_energy=None, sample=None, rng=None,
              interval_strength=2.0):
    """Solve the ``statistics`` of ``kind`` (a :class:`.._rank_statistics.Statistics`) and
    read their rank.

    Returns the :class:`.reading.RankReading`, the spectrum whose energy the components
    carry, the orthonormal input directions of the rank (rows), the input means, and the
    kernel's least squares (``None`` but for the kernel's statistics). ``cv_data`` is the ``(X,
    Y, groups)`` of ``criterion="cv"``, ``n_tokens`` the sequence length of sequence data
    (``own_energy`` the per-token operator's systematic energy under its mask,
    :func:`.caveats.short_sequence_caveat`, or ``None`` without one), ``sample`` the rows
    kept for the residual diagnostics (:class:`.._diagnostics.RowSample`) and ``rng`` the
    generator of their resampling. ``interval_strength`` is the strength, in detection
    limits, of the directions the interval's top counts (:mod:`.rank_interval`).
    """
    kernel = None
    if kind.kernel:
        kernel = statistics.solve()
        U, s, _ = np.linalg.svd(kernel.kernel)
        reading = (energy_rule(s, tau, "kernel", noise_variance=kernel.noise_variance)
                   if criterion == "energy" else kernel_threshold_rule(kernel))
        components = U[:, : reading.rank].T.copy()
        mean = np.zeros(U.shape[0])
    else:
        if statistics.n < 2:
            raise NotEnoughData("At least 2 samples are needed to read a rank; got "
                                f"{statistics.n} so far.")
        mean = statistics.mean_x.copy()
        if not kind.targets:
            s, directions = input_spectrum(statistics)
            reading = (energy_rule(s, tau, "x", s / np.sqrt(statistics.n))
                       if criterion == "energy" else input_threshold_rule(s, statistics))
            directions = directions[:, : reading.rank]
        else:
            operator = solve_static(statistics)
            if criterion == "threshold":
                reading, operator = static_rank_test(
                    statistics, operator, significance, sample, rng,
                    expected=kind.expected_failures)
                reading = strength_bounded_reading(reading, operator, interval_strength)
            else:
                reading = static_rule(criterion, statistics, operator, significance, tau,
                                      cv_data, cv, fit_intercept)
            s = fitted_spectrum(operator)
            # Input directions of the rank-r operator B V_r, the reduced-rank factors.
            directions = operator.coef @ operator.output_directions[:, : reading.rank]
        components = orthonormal_directions(directions)
    reading = _attention_caveats(reading, kind, kernel, s, criterion, attention, tau,
                                 n_tokens, own_energy)
    return reading, s, components[: reading.rank], mean, kernel


def _attention_caveats(reading, kind, kernel, s, criterion, attention, tau, n_tokens,
                       own_energy):
    """The reading with the caveats of the attention models, and capped by the energy of what
    passed where the model is only approximate."""
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
    per_token = kind.attention and not kind.kernel
    approximate = per_token or (kind.kernel and not exact)
    if approximate and criterion == "threshold":
        tested = reading.rank
        reading = cap_by_energy(reading, s, tau)
        if reading.rank < tested and reading.rank_interval is not None:
            # The cap, not the noise test, set the rank: the test's interval does not apply.
            reading = replace(reading, rank_interval=(reading.rank, reading.rank))
        if per_token:
            caveats.append(short_sequence_caveat(n_tokens, tau, own_energy))
    return replace(reading, caveats=tuple(c for c in caveats if c))


def static_rule(criterion, moments, operator, significance, tau, cv_data, cv, fit_intercept):
    """The rank of a static operator (or of the 2-D rows of sequence data) by ``criterion``
    without the diagnostics; ``cv_data`` is the ``(X, Y, groups)`` the moments were taken of,
    for ``"cv"``."""
    if criterion == "threshold":
        return gaussian_rank_test(moments, operator, significance)
    if criterion == "rsc":
        return rsc_rule(moments, operator)
    if criterion == "cv":
        return cv_rule(moments, operator, *cv_data, cv=cv, fit_intercept=fit_intercept)
    s = fitted_spectrum(operator)
    return energy_rule(s, tau, spectrum=s / np.sqrt(moments.n))
