"""Null laws: how large a singular value noise alone reaches, by random-matrix laws.

Every test that reads a rank from noisy data compares a spectrum with one of these laws. Each
law is one object with ``sf(x)`` (the p-value of an observed ``x``) and ``isf(q)`` (the value
noise alone exceeds with probability ``q``: the edge at level ``1 - q``), as scipy.stats
distributions have them:

* Tracy–Widom TW1 (exact quantile, Chiani's gamma form for the tail) and the largest-eigenvalue
  laws built on it: Johnstone (2001) for white noise (:class:`WhiteEdgeLaw`), El Karoui (2007)
  for a noise covariance, with a detached spike's own law (Baik, Ben Arous & Péché 2005;
  :class:`LargestEigenvalueLaw`), and the ratio of two largest eigenvalues
  (:class:`RatioLaw`);
* the Jacobi ensemble's edge for canonical correlations (Johnstone 2008,
  :class:`CanonicalEdgeLaw`);
* the rotation test's law given the targets' Gram (Langsrud 2005, :class:`RotationLaw`) and a
  resampled law (:class:`ShiftedGammaLaw`, drawn by :mod:`._resampled_null`);
* the lower-tail bound of the interval's top (:class:`WhiteFloorLaw`);
* the shrinkage of the residual covariance matched to its largest eigenvalue.

A sequential test reads one law per step: once ``k`` directions are accepted, the law of the
next value. The families of :class:`SequentialNull` give them, step by step.
"""

from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np
from scipy import special, stats
from scipy.integrate import trapezoid
from scipy.linalg.lapack import dsygvx as _pencil_eigenvalues
from scipy.optimize import brentq
from scipy.special import airy

__all__ = [
    "DEFAULT_LEVEL",
    "tracy_widom_quantile",
    "tracy_widom_sf",
    "tracy_widom_p_value",
    "white_edge_law",
    "canonical_edge_law",
    "null_ratio_sf",
    "RotationLaw",
    "rotation_null_law",
    "null_edge_white",
    "null_edge_canonical",
    "null_edge_correlated",
    "null_edge_ratio",
    "LargestEigenvalueLaw",
    "largest_eigenvalue_law",
    "edge_matched_noise_covariance",
    "PointMass",
    "WhiteEdgeLaw",
    "WhiteFloorLaw",
    "CanonicalEdgeLaw",
    "RatioLaw",
    "ShiftedGammaLaw",
    "SequentialNull",
    "WhiteNull",
    "RatioNull",
    "RotationNull",
    "CanonicalNull",
]

# The default level of every edge: 99.9%, a false-positive rate of 0.1% per test.
DEFAULT_LEVEL = 0.999
# Gauss–Legendre nodes and the length of (s, s + L) standing for (s, inf) in TW1's Fredholm
# determinant: beyond it the Airy kernel is below 1e-19, and 40 nodes resolve it to rounding
# (within 6e-15 of 100 nodes on (s, s + 30), checked for s from -1.3 to 8).
_TW1_NODES = np.polynomial.legendre.leggauss(40)
_TW1_SPAN = 16.0


def _tracy_widom_cdf(s):
    """``P(TW1 <= s)``, exactly: Bornemann's (2010) Fredholm determinant
    ``det(I - K)`` on ``L2(s, inf)`` with ``K(x, y) = Ai((x + y) / 2) / 2`` (Ferrari & Spohn
    2005), by Gauss–Legendre quadrature (exponential convergence)."""
    nodes, weights = _TW1_NODES
    span = _TW1_SPAN + max(0.0, -s)  # Ai oscillates, slowly decaying, left of 0
    x = s + (nodes + 1) * span / 2
    root_w = np.sqrt(weights * span / 2)
    kernel = 0.5 * airy((x[:, None] + x[None, :]) / 2)[0]
    return float(np.linalg.det(np.eye(x.size) - root_w[:, None] * kernel * root_w[None, :]))


@lru_cache(maxsize=64)
def tracy_widom_quantile(level):
    """The ``level`` quantile of the Tracy–Widom law TW1 (real case), for ``level`` in
    ``[0.5, 1)``: 0.9793 at 95%, 2.0234 at 99%, 3.2724 at 99.9% (Bejan 2005's tables)."""
    level = float(level)
    if not 0.5 <= level < 1:
        raise ValueError(f"level must lie in [0.5, 1); got {level!r}.")
    # TW1's median is -1.27; its upper tail falls like exp(-2/3 s^{3/2}), below 1e-300 at 90.
    return brentq(lambda s: _tracy_widom_cdf(s) - level, -1.3, 90.0, xtol=1e-10)


def null_edge_canonical(n_inputs, n_outputs, dof, level=DEFAULT_LEVEL):
    """Largest squared canonical correlation expected from pure noise, at ``level``.

    Under independence of ``X`` (rank ``n_inputs``) and ``Y`` (rank ``n_outputs``) with ``dof``
    degrees of freedom, the squared canonical correlations follow a Jacobi (double Wishart)
    ensemble. Johnstone (2008) shows that ``logit(theta_1)`` is approximately
    ``mu + sigma * TW1``; the threshold is that approximation's quantile. Returns ``None``
    when the residual degrees of freedom cannot estimate the noise (``dof <= n_inputs +
    n_outputs``, where every canonical correlation is forced towards 1).
    """
    law = canonical_edge_law(n_inputs, n_outputs, dof)
    if law is None:
        return None
    mu, sigma = law
    logit = mu + tracy_widom_quantile(level) * sigma
    return 1 / (1 + np.exp(-logit))


def canonical_edge_law(n_inputs, n_outputs, dof):
    """Centring and scale ``(mu, sigma)`` of the logit of the largest squared canonical
    correlation of pure noise (Johnstone 2008, see :func:`null_edge_canonical`): it is about
    ``mu + sigma TW1``. ``None`` where the residual degrees of freedom are too few."""
    p = n_outputs
    n_h = n_inputs
    m = dof - n_inputs  # error degrees of freedom
    if m <= p or n_h < 1 or p < 1:
        return None
    total = m + n_h - 1
    # Johnstone (2008), Theorem 1: angles from the dimensions, then centring and scaling of
    # the logit of the largest root.
    gamma = 2 * np.arcsin(np.sqrt((min(p, n_h) - 0.5) / total))
    phi = 2 * np.arcsin(np.sqrt((max(p, n_h) - 0.5) / total))
    if gamma + phi >= np.pi:
        return None
    mu = 2 * np.log(np.tan((phi + gamma) / 2))
    sigma = (16 / total**2 / (np.sin(phi + gamma) ** 2 * np.sin(phi) * np.sin(gamma))) ** (1 / 3)
    return mu, sigma


def null_edge_white(n_rows, n_cols, level=DEFAULT_LEVEL):
    """Largest squared singular value of an ``n_rows x n_cols`` matrix of i.i.d. unit Gaussian
    noise, at ``level`` (99.9%: exceeded by noise alone once in a thousand).

    Johnstone (2001): the largest eigenvalue of ``WᵀW`` is approximately
    ``mu + sigma * TW1`` with ``mu = (sqrt(n - 1/2) + sqrt(p - 1/2))^2`` and
    ``sigma = sqrt(mu) (1/sqrt(n - 1/2) + 1/sqrt(p - 1/2))^{1/3}`` (``n >= p`` the two sides).
    """
    mu, sigma = white_edge_law(n_rows, n_cols)
    if sigma == 0:
        return 0.0
    return mu + tracy_widom_quantile(level) * sigma


def white_edge_law(n_rows, n_cols):
    """Johnstone's (2001) centring and scale ``(mu, sigma)`` of the largest squared singular
    value of an ``n_rows x n_cols`` unit Gaussian matrix (see :func:`null_edge_white`);
    ``(0, 0)`` for an empty matrix."""
    n, p = max(n_rows, n_cols) - 0.5, min(n_rows, n_cols) - 0.5
    if p <= 0:
        return 0.0, 0.0
    root_mu = np.sqrt(n) + np.sqrt(p)
    sigma = root_mu * (1 / np.sqrt(n) + 1 / np.sqrt(p)) ** (1 / 3)
    return root_mu**2, sigma


def tracy_widom_p_value(x, exact=False):
    """``P(TW1 > x)``: Chiani's gamma form, or with ``exact`` (and between 1e-10 and 0.05, or
    between 0.95 and ``1 - 1e-10``) the exact distribution function of
    :func:`tracy_widom_quantile`, so that a p-value and an edge at the same level agree (the
    two differ by about 1e-4 in the upper tail, and by a fifth of ``P(TW1 <= x)`` at 1e-3 in
    the lower one, where the gamma form's tail is too thin)."""
    approximate = float(special.gammaincc(_TW1_GAMMA_SHAPE, max(0.0, (float(x) + _TW1_GAMMA_SHIFT)
                                                                 / _TW1_GAMMA_SCALE)))
    if not (exact and (1e-10 < approximate < 0.05 or 0.95 < approximate < 1 - 1e-10)):
        return approximate
    return 1.0 - _tracy_widom_cdf(float(x))


def _tracy_widom_law(t, n_rows):
    """El Karoui's (2007) centring and scale of the largest eigenvalue (see
    :func:`largest_eigenvalue_law`)."""
    n = n_rows - 0.5
    weight = (t.size - 0.5) / t.size
    top = (1 - 1e-12) / t.max()

    def excess(c):
        ratio = t * c / (1 - t * c)
        return weight * np.sum(ratio**2) - n

    c = brentq(excess, 0.0, top) if excess(top) > 0 else top
    ratio = t * c / (1 - t * c)
    mu = (1 + weight * np.sum(ratio) / n) / c
    sigma = (1 + weight * np.sum(ratio**3) / n) ** (1 / 3) / (n ** (2 / 3) * c)
    return n * mu, n * sigma


# The Tracy–Widom law TW1 as a shifted gamma law, Gamma(46.446, scale 0.186054) - 9.84801
# (Chiani 2014): its first four moments are TW1's. Its mean is TW1's, -1.2065.
_TW1_GAMMA_SHAPE, _TW1_GAMMA_SCALE, _TW1_GAMMA_SHIFT = 46.446, 0.186054, 9.84801
_TW1_MEAN = -1.2065
# Where the gamma form of TW1 has its mass (below: none; above: under 1e-15), and the
# probabilities at which a spike's law is resolved.
_TW1_GRID = np.linspace(-_TW1_GAMMA_SHIFT, 12.0, 1201)[1:]
_SPIKE_GRID = stats.norm.cdf(np.linspace(-8.0, 8.0, 1201))


def tracy_widom_sf(x):
    """Survival function ``P(TW1 > x)`` of the Tracy–Widom law (real case), from Chiani's
    (2014) shifted-gamma form."""
    # scipy's gamma.sf, without its per-call argument handling (most of a law's cost): the
    # regularised upper incomplete gamma function on the support, 1 below it, nan at nan.
    y = (np.asarray(x, dtype=np.float64) + _TW1_GAMMA_SHIFT) / _TW1_GAMMA_SCALE
    return special.gammaincc(_TW1_GAMMA_SHAPE, np.maximum(y, 0.0))


@dataclass(frozen=True)
class LargestEigenvalueLaw:
    """Law of the largest eigenvalue of a Wishart matrix: the larger of the bulk's edge,
    ``mu + sigma TW1``, and, when the covariance has a detached spike, that spike's sample
    eigenvalue (taken independent), a gamma law of mean ``spike_mean`` and standard deviation
    ``spike_sd`` (with no bulk around it, ``a chi2_n``)."""

    mu: float
    sigma: float
    spike_mean: float = 0.0
    spike_sd: float = 0.0

    def scaled(self, factor):
        """The law of ``factor`` times the largest eigenvalue."""
        return LargestEigenvalueLaw(factor * self.mu, factor * self.sigma,
                                    factor * self.spike_mean, factor * self.spike_sd)

    def sf(self, x, exact=False):
        """``P(largest > x)`` (``exact`` is accepted for a common call: the law is as is)."""
        x = np.asarray(x, dtype=np.float64)
        below = 1.0 - self._tracy_widom_sf(x)
        if self.spike_sd > 0:
            shape, scale = self._spike()
            below = below * stats.gamma.cdf(x, shape, scale=scale)
        return 1.0 - below

    def _spike(self):
        """Shape and scale of the spike's gamma law (scipy's gamma called with them, not
        frozen: freezing builds a distribution object and its docstring each time)."""
        return (self.spike_mean / self.spike_sd) ** 2, self.spike_sd**2 / self.spike_mean

    def _tracy_widom_sf(self, x):
        if self.sigma <= 0:
            return (x < self.mu).astype(np.float64)
        return tracy_widom_sf((x - self.mu) / self.sigma)

    @cached_property
    def mean(self):
        """Mean of the largest eigenvalue (of the larger of the two parts)."""
        if self.spike_sd <= 0:
            return self.mu + _TW1_MEAN * self.sigma
        x, density = self.support()
        return trapezoid(x * density, x)

    def support(self):
        """Points covering the law's mass and its density there."""
        return self._support

    @cached_property
    def _support(self):
        if self.sigma <= 0 and self.spike_sd <= 0:
            return np.array([self.mu]), np.array([1.0])
        parts = []
        if self.sigma > 0:
            parts.append(self.mu + self.sigma * _TW1_GRID)
        if self.spike_sd > 0:
            shape, scale = self._spike()
            parts.append(stats.gamma.ppf(_SPIKE_GRID, shape, scale=scale))
        x = np.unique(np.concatenate(parts))
        density = np.gradient(1.0 - self.sf(x), x)
        x.flags.writeable = density.flags.writeable = False  # cached: shared by every caller
        return x, density

    def quantile(self, level):
        """The ``level`` quantile."""
        if self.sigma <= 0 and self.spike_sd <= 0:
            return self.mu
        high = max(self.mu + 20 * self.sigma, self.spike_mean + 9 * self.spike_sd)
        return brentq(lambda x: self.sf(x) - (1 - level), 0.0, high, xtol=1e-12 * high)

    def isf(self, q):
        """The value exceeded with probability ``q``."""
        return self.quantile(1 - q)


# Eigenvalues below this fraction of the largest are rounding of a symmetric eigensolver.
_EIGENVALUE_RTOL = 64 * np.finfo(np.float64).eps


def largest_eigenvalue_law(noise_eigenvalues, n_rows, detach_spike=True):
    """Law of the largest eigenvalue of ``ZᵀZ``, ``Z`` an ``n_rows x q`` Gaussian matrix whose
    rows have a covariance with eigenvalues ``noise_eigenvalues``.

    Bulk: El Karoui (2007), real case Lee & Schnelli (2016). With ``t_j`` the eigenvalues and
    ``c in (0, 1 / max t)`` the root of ``sum_j (t_j c / (1 - t_j c))^2 = n``, the bulk's
    largest eigenvalue is about ``mu + sigma TW1``, ``mu = n (1 + sum_j t_j c / (1 - t_j c) /
    n) / c`` and ``sigma = n (1 + sum_j (t_j c / (1 - t_j c))^3 / n)^{1/3} / (n^{2/3} c)``.
    Johnstone's half-integer corrections (``n - 1/2`` rows, ``q - 1/2`` columns) make it
    Johnstone's (2001) law when every ``t_j`` is 1.

    Spike: a largest ``t_1 = a`` far enough from the others,
    ``psi'(a) = 1 - sum_{j > 1} t_j^2 / (a - t_j)^2 / n > 0``, has a sample eigenvalue of its
    own, asymptotically normal with mean ``n psi(a)``,
    ``psi(a) = a (1 + sum_{j > 1} t_j / (a - t_j) / n)``, and variance ``2 n a^2 psi'(a)``
    (Baik, Ben Arous & Péché 2005; Bai & Yao 2008), which fluctuates far more than TW1 says;
    a gamma law with these two moments keeps the right skew of ``a chi2_n`` at finite ``n``.
    The bulk is then that of the others. With ``detach_spike=False`` the bulk law covers every
    eigenvalue: near a spike its upper tail is then conservative but its lower tail far too
    thin.
    """
    t = np.sort(np.asarray(noise_eigenvalues, dtype=np.float64))
    t = t[t > 0]
    if t.size == 0 or n_rows < 1:
        return LargestEigenvalueLaw(0.0, 0.0)
    # Every law scales with the eigenvalues: solve for the largest at 1 (no over- or
    # underflow at extreme scales), dropping eigenvalues at its rounding level.
    scale = t[-1]
    t = t / scale
    t = t[t > _EIGENVALUE_RTOL]
    if detach_spike and t.size > 1 and t[-1] > t[-2]:
        a, rest = t[-1], t[:-1]
        slope = 1 - np.sum(rest**2 / (a - rest) ** 2) / n_rows
        if slope > 0:
            psi = a * (1 + np.sum(rest / (a - rest)) / n_rows)
            mu, sigma = _tracy_widom_law(rest, n_rows) if rest.size else (0.0, 0.0)
            return LargestEigenvalueLaw(scale * mu, scale * sigma,
                                        spike_mean=scale * n_rows * psi,
                                        spike_sd=scale * np.sqrt(2 * n_rows * a**2 * slope))
    mu, sigma = _tracy_widom_law(t, n_rows)
    return LargestEigenvalueLaw(scale * mu, scale * sigma)


def null_edge_correlated(noise_eigenvalues, n_rows, level=DEFAULT_LEVEL):
    """Largest squared singular value of an ``n_rows x q`` Gaussian matrix whose rows have a
    covariance with eigenvalues ``noise_eigenvalues``, at ``level``: the quantile of
    El Karoui's law over every eigenvalue (:func:`largest_eigenvalue_law` with
    ``detach_spike=False``), conservative near a spike. It equals :func:`null_edge_white` when
    every eigenvalue is 1.
    """
    law = largest_eigenvalue_law(noise_eigenvalues, n_rows, detach_spike=False)
    return law.mu + tracy_widom_quantile(level) * law.sigma


def null_edge_ratio(numerator, denominator, level=DEFAULT_LEVEL):
    """Quantile at ``level`` of ``A / B`` for independent largest eigenvalues ``A`` and ``B``
    with the laws ``numerator`` and ``denominator`` (:class:`LargestEigenvalueLaw`): the
    edge of one largest eigenvalue relative to another one observed. Solves
    ``E_B[P(A > t B)] = 1 - level``.
    """
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1); got {level!r}.")
    mean = denominator.mean
    if mean <= 0:
        raise ValueError("The denominator's law must have a positive mean.")
    if numerator.sigma <= 0 and numerator.spike_sd <= 0:  # no rows: the edge is 0
        return numerator.mu / mean
    # The quantile scales with the numerator and inversely with the denominator: solve it
    # for both near 1 (no overflow at extreme scales).
    scale = max(numerator.mu, numerator.spike_mean)
    x, density = denominator.support()
    return scale / mean * _ratio_quantile(numerator.scaled(1 / scale), x / mean,
                                          density * mean, level)


def _ratio_quantile(numerator, x, density, level):
    """The quantile of ``A / B`` with ``B`` of mean 1 given by its ``density`` at ``x``."""
    if x.size == 1:
        return numerator.quantile(level) / x[0]
    # A largest eigenvalue is positive: the approximate laws' mass at or below 0 (far in the
    # lower tail, and only for a handful of rows or columns) is cut off.
    positive = x > 0
    x, density = x[positive], density[positive]
    density = density / trapezoid(density, x)

    def excess(t):
        return trapezoid(numerator.sf(t * x) * density, x) - (1 - level)

    high = 2 * numerator.quantile(level)
    while excess(high) > 0:
        high *= 2
    return brentq(excess, 0.0, high, xtol=1e-10 * high)


def null_ratio_sf(numerator, denominator, ratio):
    """``P(A / B > ratio)`` for independent largest eigenvalues ``A`` and ``B`` with the laws
    ``numerator`` and ``denominator``: the p-value of an observed ratio, the converse of
    :func:`null_edge_ratio`."""
    mean = denominator.mean
    if mean <= 0:
        raise ValueError("The denominator's law must have a positive mean.")
    if numerator.sigma <= 0 and numerator.spike_sd <= 0:
        return float(ratio * mean < numerator.mu)
    scale = max(numerator.mu, numerator.spike_mean)
    law = numerator.scaled(1 / scale)
    x, density = denominator.support()
    x, density = x / mean, density * mean
    t = ratio * mean / scale
    if x.size == 1:
        return float(law.sf(t * x[0]))
    positive = x > 0
    x, density = x[positive], density[positive]
    density = density / trapezoid(density, x)
    return float(np.clip(trapezoid(law.sf(t * x) * density, x), 0.0, 1.0))


@dataclass(frozen=True)
class RotationLaw:
    """A law given by its mean, standard deviation and skewness: Pearson's type III (a shifted
    gamma law of that skewness, the normal law at skewness 0, a reflected gamma below 0), as
    Chiani (2014) approximates TW1 itself. ``sd = 0`` is the point mass at ``mean``."""

    mean: float
    sd: float
    skew: float = 0.0

    def _law(self):
        # The arguments of scipy's pearson3 (not a frozen law: freezing builds a distribution
        # object and its docstring each time).
        return dict(skew=self.skew, loc=self.mean, scale=self.sd)

    def sf(self, x, exact=False):
        """``P(largest >= x)``, the p-value of ``x`` (``P(largest > x)`` but at a point mass;
        ``exact`` is accepted for a common call)."""
        if self.sd <= 0:
            return float(x <= self.mean)
        return float(stats.pearson3.sf(x, **self._law()))

    def quantile(self, level):
        """The ``level`` quantile."""
        if self.sd <= 0:
            return self.mean
        return float(stats.pearson3.ppf(level, **self._law()))

    def isf(self, q):
        """The value exceeded with probability ``q``."""
        return self.quantile(1 - q)


# Draws of the rotation test's conditional law (its edge at 99.9% is resolved to about 0.1-0.2
# of the law's standard deviation), the Gaussian values per chunk of draws, and the most
# multiply-adds one law may cost (n_rows^2 n_total per draw, times the draws) before the
# caller falls back.
ROTATION_DRAWS = 1000
_ROTATION_CHUNK = 1 << 21
ROTATION_BUDGET = 1e9
# Sequential Monte Carlo for a law drawn to decide one value: the draws come in stages of
# these fractions of ``n_draws`` (then all of them), and stop once the value lies more than
# _ROTATION_MARGIN bootstrap standard errors (of _ROTATION_BOOTSTRAP resamples of the draws)
# from each quantile the test reads; only for laws whose draws cost at least
# _ROTATION_STAGED_COST multiply-adds (n_rows^2 n_total per draw), about what a check costs.
_ROTATION_STAGES = (1 / 8, 1 / 4, 1 / 2)
_ROTATION_MARGIN = 4.0
_ROTATION_BOOTSTRAP = 200
_ROTATION_STAGED_COST = 1e7
# From this many rows a draw's largest root is found by LAPACK per draw; below, the Python
# loop costs more than the batched inverse and spectrum it saves.
_ROTATION_PENCIL_ROWS = 16


def rotation_null_law(total_eigenvalues, n_rows, n_total, n_draws=ROTATION_DRAWS, seed=0, *,
                      value=None, significance=None):
    """Law of the largest eigenvalue of ``W_1ᵀ W_1``, ``W_1`` the first ``n_rows`` rows of an
    ``n_total x q`` Gaussian matrix ``W`` of i.i.d. rows ``N(0, Sigma)``, given ``WᵀW``, whose
    non-zero eigenvalues are ``total_eigenvalues``: the null law of the rotation test
    (Langsrud 2005).

    The law of ``W`` is invariant under ``W -> H W`` for an orthogonal ``H``, which keeps
    ``WᵀW``; so given ``WᵀW = V D Vᵀ`` (``D`` the eigenvalues ``d_j``), the rows ``W_1`` are
    those of ``H W`` for a Haar ``H``, and the non-zero eigenvalues of ``W_1ᵀ W_1`` are those
    of ``Qᵀ D Q``, ``Q`` the first ``len(d)`` rows of a uniformly random ``n_total x n_rows``
    frame. This law is free of ``Sigma``: whatever the noise covariance (any shape, spikes,
    ``q`` above ``n_total`` or not), a test of the fitted values' largest eigenvalue against
    it, given the Gram of the targets, has exactly its level under no signal. With the frame
    ``F (F Fᵀ)^{-1/2}``, ``F`` Gaussian, the eigenvalue is the largest root of
    ``det(F D Fᵀ - lambda F Fᵀ) = 0``.

    The law is drawn ``n_draws`` times (from a fixed ``seed``: a function of its arguments)
    and returned as the Pearson type III law of the draws' mean, standard deviation and
    skewness (:class:`RotationLaw`). The skewness matters: over 40000 draws of the law at
    ``n_rows`` 20-60 and ``n_total`` 24-199 (white, AR(1) 0.2-0.7, spiked and factor
    covariances), the Pearson law's 99.9% quantile was exceeded by 0-0.1% of them, that of a
    Tracy–Widom law of the same mean and standard deviation by 0.15-0.19% at the skewness
    0.42-0.55 of AR(1) noise and by only 0.02% at a spike's 0. At 2000 draws the quantile's
    own Monte Carlo spread was 0.08-0.15 of the law's standard deviation (about 1.4 times that
    at the default 1000).

    With ``value`` and ``significance`` the law is drawn to decide where ``value`` lies
    against its ``significance`` and ``1 - significance`` quantiles (the two tails a
    sequential test and its interval read), by sequential Monte Carlo (as Besag & Clifford
    1991 stop a simulation once its p-value is clearly on one side): the draws come in
    stages of an eighth, a quarter, a half and all of ``n_draws``, the first ones of the
    same stream, and stop after a stage once ``value`` lies more than four bootstrap
    standard errors of each quantile away from it. A value that is not clear at either
    level gets the law of all the draws, the same law as without ``value``; one that is
    clear gets the same decision at both levels (no decision differed in 10000 values
    spread over both tails of four laws, 100 seeds each) and a p-value of fewer draws. A law
    that costs less to draw than the checks (``n_rows^2 n_total n_draws`` below 1e7
    multiply-adds) is drawn whole.
    """
    d = np.sort(np.asarray(total_eigenvalues, dtype=np.float64))[::-1]
    d = d[d > 0][:n_total]
    if d.size == 0 or n_rows < 1:
        return RotationLaw(0.0, 0.0)
    if n_rows >= n_total:  # all the rows: the Gram itself
        return RotationLaw(float(d[0]), 0.0)
    if d.size == n_total and d[-1] >= d[0] * (1 - 1e-12):
        # A Gram proportional to the identity on every direction the rows span: any part of
        # it has that one eigenvalue, with no spread (draws would show rounding error only).
        return RotationLaw(float(d[0]), 0.0)
    scale = d[0]
    d = d / scale
    rng = np.random.default_rng(seed)
    chunk = max(1, _ROTATION_CHUNK // (n_rows * n_total))
    staged = value is not None and n_rows**2 * n_total * n_draws >= _ROTATION_STAGED_COST
    stages = [int(n_draws * f) for f in _ROTATION_STAGES] if staged else []
    stages = [n for n in stages if n >= 50] + [n_draws]
    tops, drawn = [], 0
    for stop in stages:
        while drawn < stop:
            size = min(chunk, stop - drawn)
            tops.append(_rotated_tops(rng.standard_normal((size, n_rows, n_total)), d))
            drawn += size
        if stop < n_draws and _decided(np.concatenate(tops), value / scale, significance,
                                       seed):
            break
    tops = np.concatenate(tops)
    sd = float(tops.std(ddof=1))
    if not sd > 1e-12 * abs(tops.mean()):  # no spread beyond rounding error
        return RotationLaw(float(scale * tops.mean()), 0.0)
    return RotationLaw(float(scale * tops.mean()), float(scale * sd), float(stats.skew(tops)))


def _rotated_tops(F, d):
    """Largest roots of ``det(F_1 D F_1ᵀ - lambda F Fᵀ) = 0`` for a stack of Gaussian ``F``,
    ``F_1`` its first ``len(d)`` columns."""
    gram = np.matmul(F, F.transpose(0, 2, 1))
    part = F[:, :, : d.size]
    inner = np.matmul(part * d, part.transpose(0, 2, 1))
    n = gram.shape[1]
    if n < _ROTATION_PENCIL_ROWS:
        # lambda(gram^{-1} inner) = lambda(L^{-1} inner L^{-T}), gram = L Lᵀ.
        inverse = np.linalg.inv(np.linalg.cholesky(gram))
        return np.linalg.eigvalsh(inverse @ inner @ inverse.transpose(0, 2, 1))[:, -1]
    # The same symmetric-definite pencil (inner, gram), one draw at a time: LAPACK's dsygvx
    # reduces it to L^{-1} inner L^{-T} and finds its largest eigenvalue alone (bisection on
    # the tridiagonal form), 1.5-2.5 times as fast from 20 rows on as inverting L and finding
    # all of the spectrum (equal to about 1e-14 relative). The matrices are symmetric, so
    # each one's transpose is the Fortran-ordered copy LAPACK reads.
    tops = np.empty(len(F))
    for i, (a, b) in enumerate(zip(inner, gram, strict=True)):
        top, _, _, _, info = _pencil_eigenvalues(a.T, b.T, jobz="N", range="I", il=n, iu=n,
                                                 overwrite_a=1, overwrite_b=1)
        if info:
            raise np.linalg.LinAlgError(f"dsygvx failed on a rotation draw (info {info}).")
        tops[i] = top[0]
    return tops


def _decided(tops, value, significance, seed):
    """Whether ``value`` lies more than ``_ROTATION_MARGIN`` standard errors from both the
    ``significance`` and the ``1 - significance`` quantile of the Pearson law of ``tops``.

    The standard error of each quantile is the larger of two bootstraps (fixed streams: the
    decision is a function of the draws): resampling the draws, and drawing as many from the
    fitted law itself. The first follows a law the Pearson form misses; the second keeps the
    spread of the skewness where the draws so far show none of the tail that sets it (a
    sample's skewness is biased low and its own resamples understate how much)."""
    n = tops.size
    sd = tops.std(ddof=1)
    if not sd > 0:
        return False
    skew, mean = stats.skew(tops), tops.mean()
    rng = np.random.default_rng([seed, n])
    shape = (_ROTATION_BOOTSTRAP, n)
    # The fitted law's draws as scipy's pearson3 makes them, a standardised gamma (numpy's
    # generator directly: scipy's per-call overhead is most of the cost at this size).
    if skew != 0:
        alpha = 4.0 / skew**2
        fitted = np.sign(skew) * (rng.standard_gamma(alpha, shape) - alpha) / np.sqrt(alpha)
    else:
        fitted = rng.standard_normal(shape)
    draws = np.concatenate([tops[rng.integers(0, n, shape)], mean + sd * fitted])
    # The moments of the resamples (stats.skew's biased skewness, the ddof=1 deviation).
    centre = draws.mean(axis=1, keepdims=True)
    deviation = draws - centre
    square = deviation * deviation  # not ** 3 below: a float power is some 20 times slower
    m2, m3 = square.mean(axis=1), (square * deviation).mean(axis=1)
    levels = np.array([[significance], [1.0 - significance]])
    with np.errstate(all="ignore"):
        boot = stats.pearson3.ppf(levels, m3 / m2**1.5, loc=centre[:, 0],
                                  scale=np.sqrt(m2 * n / (n - 1)))
        quantiles = stats.pearson3.ppf(levels[:, 0], skew, loc=mean, scale=sd)
    errors = np.maximum(boot[:, :_ROTATION_BOOTSTRAP].std(axis=1, ddof=1),
                        boot[:, _ROTATION_BOOTSTRAP:].std(axis=1, ddof=1))
    return bool(np.all(np.abs(value - quantiles) > _ROTATION_MARGIN * errors))


def edge_matched_noise_covariance(residual, dof, eigh=None):
    """Noise covariance from residual cross-products with ``dof`` degrees of freedom, as
    eigenvalues and eigenvectors, shaped for the edge of the noise in the fitted values.

    The sample covariance ``S = residual / dof`` spreads its eigenvalues (Marchenko–Pastur),
    so an edge computed from it is far too high when ``q / dof`` is not small; shrinkage for
    a small Frobenius error (Ledoit–Wolf, OAS) narrows them too much, so an edge from it is
    too low. The edge depends on the upper end of the spectrum, so the shrinkage
    ``S_theta = (1 - theta) S + theta tr(S) / q I`` takes the ``theta`` in ``[0, 1]`` under
    which the residuals' own largest eigenvalue is as expected: the mean of
    :func:`largest_eigenvalue_law` for ``S_theta`` and ``dof`` rows equals the observed one.
    The trace is kept. Only the moments are needed, so streaming and dask still work.
    ``eigh``, where given, is ``np.linalg.eigh(residual / dof)`` computed before.
    """
    q = residual.shape[0]
    sample, vectors = np.linalg.eigh(residual / dof) if eigh is None else eigh
    sample = np.clip(sample, 0.0, None)
    mean = sample.mean()
    if mean <= 0 or q < 2:
        return sample, vectors
    observed = sample[-1] * dof

    def excess(theta):
        return largest_eigenvalue_law((1 - theta) * sample + theta * mean, dof).mean - observed

    if excess(1.0) >= 0:  # white noise of the same trace explains the largest eigenvalue
        theta = 1.0
    elif excess(0.0) <= 0:
        theta = 0.0
    else:
        theta = brentq(excess, 0.0, 1.0, xtol=1e-6)
    return (1 - theta) * sample + theta * mean, vectors


# --- the laws a sequential test reads: each an object with sf and isf ----------------------


@dataclass(frozen=True)
class PointMass:
    """The constant ``at``: no noise left to test. ``sf(x) = P(value >= x)``, the p-value
    convention at a point mass (1 at ``at`` itself)."""

    at: float = 0.0

    @property
    def mean(self):
        return self.at

    def sf(self, x, exact=False):
        return float(x <= self.at)

    def isf(self, q):
        return self.at


@dataclass(frozen=True)
class WhiteEdgeLaw:
    """``unit`` times the largest eigenvalue of ``WᵀW``, ``W`` an ``n_rows x n_cols`` unit
    Gaussian matrix: ``unit (mu + sigma TW1)`` with Johnstone's (2001) centring and scale
    (:func:`white_edge_law`)."""

    n_rows: int
    n_cols: int
    unit: float = 1.0

    def sf(self, x, exact=False):
        """``P(value > x)``: Chiani's gamma form of TW1, or with ``exact`` near the tails the
        exact distribution function (:func:`tracy_widom_p_value`)."""
        mu, scale = white_edge_law(self.n_rows, self.n_cols)
        if scale <= 0 or self.unit <= 0:
            return float(x <= 0)
        return tracy_widom_p_value((x / self.unit - mu) / scale, exact)

    def isf(self, q):
        return self.unit * null_edge_white(self.n_rows, self.n_cols, 1 - q)


@dataclass(frozen=True)
class WhiteFloorLaw:
    """The largest eigenvalue of ``unit WᵀW`` as the interval's top reads it (its lower tail):
    ``P(largest > x)`` is the Tracy–Widom p-value, or where larger the bound from the rows
    and columns.

    The largest eigenvalue is at least every row's and every column's squared norm, so
    ``P(largest <= x) <= F(x; n_cols)^n_rows`` and ``F(x; n_rows)^n_cols`` (``F`` the
    chi-square distribution function): a p-value at least ``1 - F^m`` for both. Johnstone's
    law, built for the upper tail, has a lower tail far too heavy for a matrix a few rows
    thin (at one row the law is exactly the chi-square's), which the bound corrects.
    """

    n_rows: int
    n_cols: int
    unit: float = 1.0

    def sf(self, x, exact=False):
        value = x / self.unit if self.unit > 0 else np.inf
        mu, scale = white_edge_law(self.n_rows, self.n_cols)
        if scale <= 0:
            return float(value <= 0)
        p = tracy_widom_p_value((value - mu) / scale, exact)
        for rows, cols in ((self.n_rows, self.n_cols), (self.n_cols, self.n_rows)):
            log_cdf = stats.chi2.logcdf(value, cols)
            p = max(p, float(-np.expm1(rows * log_cdf)))
        return p

    def isf(self, q):
        return _inverted_sf(self, q)


@dataclass(frozen=True)
class CanonicalEdgeLaw:
    """The largest squared canonical correlation of pure noise: its logit is about ``mu +
    sigma TW1`` (Johnstone 2008, :func:`canonical_edge_law`). Where the degrees of freedom
    are too few for the law, ``sf`` is 1 and ``isf`` ``None`` (no test)."""

    n_inputs: int
    n_outputs: int
    dof: int

    def sf(self, x, exact=False):
        law = canonical_edge_law(self.n_inputs, self.n_outputs, self.dof)
        if law is None or not 0 < x < 1:
            return float(x <= 0) if law is not None else 1.0
        mu, scale = law
        return tracy_widom_p_value((np.log(x / (1 - x)) - mu) / scale, exact)

    def isf(self, q):
        return null_edge_canonical(self.n_inputs, self.n_outputs, self.dof, 1 - q)


@dataclass(frozen=True)
class RatioLaw:
    """``unit`` times the ratio ``A / B`` of independent largest eigenvalues of the laws
    ``numerator`` and ``denominator`` (:class:`LargestEigenvalueLaw`): the law of a value
    relative to another one observed (``unit``). A point mass at 0 where ``unit`` or the
    denominator's mean is not positive (no noise left in these directions)."""

    numerator: LargestEigenvalueLaw
    denominator: LargestEigenvalueLaw
    unit: float = 1.0

    def _empty(self):
        return self.unit <= 0 or self.denominator.mean <= 0

    def sf(self, x, exact=False):
        if self._empty():
            return float(x <= 0)
        return null_ratio_sf(self.numerator, self.denominator, x / self.unit)

    def isf(self, q):
        if self._empty():
            return 0.0
        return self.unit * null_edge_ratio(self.numerator, self.denominator, 1 - q)


# TW1's skewness: the least a resampled law's is taken to be.
TW1_SKEWNESS = 0.2935


@dataclass(frozen=True)
class ShiftedGammaLaw:
    """``shift + Gamma(shape, scale)``: a resampled law summarised by its mean, variance and
    skewness (as Chiani 2014 approximates TW1 itself), which resolves the tail at small levels
    from a few hundred draws."""

    shape: float
    scale: float
    shift: float

    @classmethod
    def from_draws(cls, values):
        """The law of ``values``' mean, standard deviation and skewness (at least TW1's); a
        :class:`PointMass` where they do not spread."""
        mean, sd = values.mean(), values.std(ddof=1)
        if not sd > 0:
            return PointMass(float(mean))
        skewness = max(TW1_SKEWNESS, float(stats.skew(values)))
        shape = 4 / skewness**2
        scale = sd * skewness / 2
        return cls(shape, scale, float(mean - shape * scale))

    @property
    def mean(self):
        return self.shift + self.shape * self.scale

    def sf(self, x, exact=False):
        return float(stats.gamma.sf(x - self.shift, self.shape, scale=self.scale))

    def isf(self, q):
        return float(self.shift + stats.gamma.ppf(1 - q, self.shape, scale=self.scale))


def _inverted_sf(law, q):
    """The ``x`` with ``law.sf(x, exact=True) = q``, by bisection (for laws without a closed
    form)."""
    high = 1.0
    while law.sf(high, exact=True) > q:
        high *= 2
    return brentq(lambda x: law.sf(x, exact=True) - q, 0.0, high, xtol=1e-12 * high)


# --- sequential nulls: the law of each step of a sequential test ---------------------------


class SequentialNull:
    """The null laws of a sequential test of decreasing values, step by step.

    Once ``k`` directions are accepted, :meth:`law` is the law of the next value under noise
    alone (``sf``: its p-value, ``isf(significance)``: its edge). The interval of ranks the
    tests cannot tell apart ends at the first value whose p-value under :meth:`floor` (the
    step's own law where ``None``) reaches :meth:`floor_level` (``level`` unless the noise
    level itself is uncertain).
    """

    def __init__(self, level):
        self.level = level

    def law(self, k):
        raise NotImplementedError

    def floor(self, k):
        return None

    def floor_level(self, k):
        return self.level


def _few_dof_floor_level(law, observed, fitted_law, residual_law, level):
    """The floor level below 20 residual degrees of freedom (see :class:`WhiteNull`): the
    p-value under ``law`` of the centre of the fitted values' edge at the smallest noise scale
    the ``observed`` residual eigenvalue allows at ``level``, so that the interval's top counts
    the directions above it."""
    if observed <= 0 or residual_law.mean <= 0:
        return level
    return law.sf(observed * fitted_law.mu / residual_law.quantile(level))


class WhiteNull(SequentialNull):
    """White noise of level ``sigma`` in an ``n_inputs x n_targets`` fitted matrix: step
    ``k`` has Johnstone's law of ``n_inputs - k`` by ``n_targets - k`` dimensions, times
    ``widening sigma^2`` (a widening for mild correlation, which only raises the edge); the
    interval's floor is that law without the widening (:class:`WhiteFloorLaw`).

    With ``dof`` below 20 residual degrees of freedom (``few_dof``) ``sigma^2`` is itself
    uncertain, ``sigma^2 chi2_nu / nu`` with ``nu = dof q``, independent of the fitted values:
    each step's law is that of the ratio (:class:`RatioLaw`). Its spread is shared by every
    step, so the ratio's lower tail would let the interval's top pass every noise value (a
    lower-tail test at the level has no power at 4 residual degrees of freedom). ``sigma^2``
    can be as small as ``sigma_hat^2 / high`` at the level: the top counts the directions above
    the centre of the edge at that noise level (the widening, which only raises the centre,
    left out too).
    """

    def __init__(self, sigma, n_inputs, n_targets, level, widening=1.0, dof=None,
                 few_dof=False):
        super().__init__(level)
        self.sigma, self.widening = sigma, widening
        self.n_inputs, self.n_targets = n_inputs, n_targets
        self.few_dof = few_dof
        if few_dof:
            self.variance = LargestEigenvalueLaw(0.0, 0.0, 1.0, np.sqrt(2.0 / (dof * n_targets)))
            self.high = stats.chi2.ppf(level, dof * n_targets) / (dof * n_targets)

    def _numerator(self, k):
        return LargestEigenvalueLaw(*white_edge_law(self.n_inputs - k, self.n_targets - k))

    def law(self, k):
        unit = self.widening * self.sigma**2
        if not self.few_dof:
            return WhiteEdgeLaw(self.n_inputs - k, self.n_targets - k, unit)
        numerator = self._numerator(k)
        if numerator.sigma <= 0:
            return PointMass(0.0)
        return RatioLaw(numerator, self.variance, unit)

    def floor(self, k):
        if self.few_dof:
            return None
        return WhiteFloorLaw(self.n_inputs - k, self.n_targets - k,
                             self.sigma**2 if self.sigma > 0 else 0.0)

    def floor_level(self, k):
        if not self.few_dof:
            return self.level
        numerator = self._numerator(k)
        if numerator.sigma <= 0:
            return self.level
        return null_ratio_sf(numerator, self.variance, numerator.mu / (self.high * self.widening))


class RatioNull(SequentialNull):
    """The fitted values' largest eigenvalue relative to the residuals' (correlated noise).

    Step ``k``'s law is that of the ratio of the two largest eigenvalues in the directions
    left after ``k`` accepted ones, for the noise covariance matched to the residuals
    (:func:`edge_matched_noise_covariance`, ``eigh`` its eigendecomposition of ``residual /
    dof``), times the observed largest residual eigenvalue there. A noise spike's eigenvalue
    fluctuates more than TW1: the residuals' law detaches it, whose low draws would
    otherwise pass for signal; the fitted values' law is El Karoui's over all eigenvalues
    (conservative above). Enough residual degrees of freedom fix the noise covariance's top:
    the interval's floor is then the fitted values' own law with the spike detached (the
    ratio to one observed eigenvalue would spread the lower tail with that eigenvalue's);
    with ``few_dof`` as in :class:`WhiteNull`.
    """

    def __init__(self, residual, dof, eigh, output_directions, n_inputs, level, few_dof=False):
        super().__init__(level)
        values, vectors = edge_matched_noise_covariance(residual, dof, eigh)
        # Noise covariance and residual cross-products in the basis of the output directions:
        # after k accepted directions the noise left is in the trailing (q - k) x (q - k)
        # blocks.
        basis = vectors.T @ output_directions
        self._noise = (basis.T * values) @ basis
        self._residual = output_directions.T @ residual @ output_directions
        self.dof, self.n_inputs, self.few_dof = dof, n_inputs, few_dof
        self._steps = {}

    def step(self, k):
        """The largest residual eigenvalue left after ``k`` accepted directions, and the laws
        of the fitted values', the residuals' and the floor's largest eigenvalue there."""
        if k not in self._steps:
            shape = np.linalg.eigvalsh(self._noise[k:, k:])
            observed = np.linalg.eigvalsh(self._residual[k:, k:])[-1]
            fitted_law = largest_eigenvalue_law(shape, self.n_inputs - k, detach_spike=False)
            residual_law = largest_eigenvalue_law(shape, self.dof)
            floor_law = largest_eigenvalue_law(shape, self.n_inputs - k)
            self._steps[k] = observed, fitted_law, residual_law, floor_law
        return self._steps[k]

    def law(self, k):
        observed, fitted_law, residual_law, _ = self.step(k)
        return RatioLaw(fitted_law, residual_law, observed)

    def floor(self, k):
        if self.few_dof:
            return None
        observed, _, residual_law, floor_law = self.step(k)
        if observed <= 0 or residual_law.mean <= 0:
            return PointMass(0.0)
        return floor_law

    def floor_level(self, k):
        if not self.few_dof:
            return self.level
        observed, fitted_law, residual_law, _ = self.step(k)
        return _few_dof_floor_level(self.law(k), observed, fitted_law, residual_law,
                                    self.level)


class RotationNull(SequentialNull):
    """The rotation test's laws (Langsrud 2005): the fitted values' largest eigenvalue given
    the targets' Gram ``yy`` (:func:`rotation_null_law`).

    Under no signal the centred targets' Gram is that of ``n_total`` i.i.d. rows ``N(0,
    Sigma)``, of which the fitted values take ``n_inputs``: given it, their largest eigenvalue
    has a law free of ``Sigma``, so the first test has exactly its level for any noise
    covariance, and the edge carries no estimate of ``Sigma`` at all. After ``k`` accepted
    directions the same holds in the directions left (``Vᵀ yy V`` over the trailing ``q - k``
    ``output_directions``), with ``n_inputs - k`` of ``n_total - k`` rows. A direction not
    yet accepted also sits in the Gram, and raises the law by about ``n_inputs / n_total`` of
    its energy: a little power lost, no level.

    Each step's law is drawn to decide its own value, ``values[k]`` (sequential Monte Carlo,
    :func:`rotation_null_law`). The law is exact for any covariance: its own lower tail is
    the floor; with fewer than 20 residual degrees of freedom the floor level is that of
    :class:`RatioNull` (``ratio``) for the matched covariance.
    """

    def __init__(self, yy, output_directions, n_inputs, n_total, values, level, ratio=None):
        super().__init__(level)
        self.yy, self.directions = yy, output_directions
        self.n_inputs, self.n_total, self.values = n_inputs, n_total, values
        self.ratio = ratio
        self._laws = {}

    def law(self, k):
        # Every step has rows: k < len(values) <= n_inputs.
        if k not in self._laws:
            rest = self.directions[:, k:]
            total = np.linalg.eigvalsh(rest.T @ self.yy @ rest)
            self._laws[k] = rotation_null_law(total, self.n_inputs - k, self.n_total - k,
                                              seed=k, value=self.values[k],
                                              significance=1.0 - self.level)
        return self._laws[k]

    def floor_level(self, k):
        if self.ratio is None:
            return self.level
        observed, fitted_law, residual_law, _ = self.ratio.step(k)
        return _few_dof_floor_level(self.law(k), observed, fitted_law, residual_law,
                                    self.level)


class CanonicalNull(SequentialNull):
    """The canonical correlations' laws: removing ``k`` roots leaves ``k`` fewer dimensions on
    each side (:class:`CanonicalEdgeLaw`)."""

    def __init__(self, n_inputs, n_outputs, dof, level):
        super().__init__(level)
        self.n_inputs, self.n_outputs, self.dof = n_inputs, n_outputs, dof

    def law(self, k):
        return CanonicalEdgeLaw(self.n_inputs - k, self.n_outputs - k, self.dof - k)

