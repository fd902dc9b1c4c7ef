"""Null edges: how large a singular value noise alone reaches, by random-matrix laws.

Every rule that reads a rank from noisy data compares a spectrum with one of these edges:

* Tracy–Widom TW1 (exact quantile, Chiani's gamma form for the tail) and the largest-eigenvalue
  laws built on it: Johnstone (2001) for white noise, El Karoui (2007) for a noise covariance,
  with a detached spike's own law (Baik, Ben Arous & Péché 2005), and the ratio of two largest
  eigenvalues;
* the Jacobi ensemble's edge for canonical correlations (Johnstone 2008);
* John's and the largest root's sphericity tests, which say whether the residuals may be
  treated as white, and the shrinkage of the residual covariance matched to its largest
  eigenvalue;
* Marchenko–Pastur's median and the Gavish–Donoho (2014) optimal hard threshold.
"""

from dataclasses import dataclass
from functools import cached_property, lru_cache
from numbers import Integral, Real

import numpy as np
from scipy import integrate, special, stats
from scipy.integrate import trapezoid
from scipy.optimize import brentq
from scipy.special import airy

from ._validation import check_spectra, spectrum_output

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
    "residuals_look_white",
    "marchenko_pastur_median",
    "optimal_hard_threshold",
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


# Levels of the two sphericity tests: John's (its standard normal quantile) and the largest
# root's.
_Z_JOHN = 1.6449  # 5%
_LARGEST_ROOT_LEVEL = 0.025


def residuals_look_white(residual, dof, eigenvalues=None):
    """Whether residual cross-products are consistent with white noise ``sigma^2 I``.

    White is kept unless one of two tests of sphericity rejects it:

    - John's statistic ``U = q tr(S^2) / tr(S)^2 - 1`` of the residual covariance ``S``, at the
      5% level; under sphericity ``dof U - q`` tends to ``N(1, 4)`` as ``dof`` and ``q`` grow
      in any proportion (Ledoit & Wolf 2002), so ``q > dof`` is allowed. It sees correlation
      spread over many directions (AR(1) noise across the targets);
    - the largest root (Roy's test), ``l_1 q / tr(S)`` against Johnstone's (2001) Tracy–Widom
      law of the largest eigenvalue of a white ``dof x q`` Wishart matrix, at the 2.5% level:
      the powerful test against one strong noise direction (Onatski, Moreira & Hallin 2013),
      which John's test misses when the spike's own sample eigenvalue comes out low (a spike
      of 6 at ``dof = 49, q = 60``: John's test kept white in 2 of 400 draws, the two tests
      together in none). Dividing by the trace instead of a known ``sigma^2`` narrows its
      law (Nadler 2011), so the test is conservative: 1.5-2.7% of white draws at ``dof``
      20-2000, far fewer with a handful of targets or degrees of freedom.

    White draws leave the white path in 5-6% of cases by John's test alone and 6-7.5% by
    either (4000 draws at ``dof, q`` from ``49, 50`` to ``1979, 60``). Rejecting white noise
    only sends it to the test for correlated noise, which holds its level for any covariance
    at a little power, while keeping correlated noise as white puts the edge too low: John's
    test keeps its 5% (AR(1) 0.2 noise at ``rank(X) = 50, dof = 49``, 300 draws: 3.7% false
    positives when sphericity was kept at the 0.1% level, 1.3% at 5%; 400 draws: 0.75% with
    John's test at 2.5%, 0.25% at 5%). ``eigenvalues``, where given, are those of
    ``residual / dof`` (computed before).
    """
    q = residual.shape[0]
    trace = np.trace(residual)
    if q < 2 or dof < 2 or trace <= 0:
        return True
    unit = residual / trace  # tr = 1: no under- or overflow in tr(S^2) / tr(S)^2
    u = q * np.sum(unit * unit) - 1
    if (dof * u - q - 1) / 2 > _Z_JOHN:
        return False
    largest = (np.linalg.eigvalsh(unit)[-1] if eigenvalues is None
               else max(float(eigenvalues[-1]), 0.0) * dof / trace)
    mu, scale = white_edge_law(dof, q)
    return tracy_widom_p_value((largest * q * dof - mu) / scale) >= _LARGEST_ROOT_LEVEL


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
    return stats.gamma.sf(np.asarray(x, dtype=np.float64) + _TW1_GAMMA_SHIFT,
                          _TW1_GAMMA_SHAPE, scale=_TW1_GAMMA_SCALE)


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

    def sf(self, x):
        """``P(largest > x)``."""
        x = np.asarray(x, dtype=np.float64)
        below = 1.0 - self._tracy_widom_sf(x)
        if self.spike_sd > 0:
            below = below * self._spike().cdf(x)
        return 1.0 - below

    def _spike(self):
        shape = (self.spike_mean / self.spike_sd) ** 2
        return stats.gamma(shape, scale=self.spike_sd**2 / self.spike_mean)

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
            parts.append(self._spike().ppf(_SPIKE_GRID))
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
        return stats.pearson3(self.skew, loc=self.mean, scale=self.sd)

    def sf(self, x):
        """``P(largest >= x)``, the p-value of ``x`` (``P(largest > x)`` but at a point mass)."""
        if self.sd <= 0:
            return float(x <= self.mean)
        return float(self._law().sf(x))

    def quantile(self, level):
        """The ``level`` quantile."""
        if self.sd <= 0:
            return self.mean
        return float(self._law().ppf(level))


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
    # lambda(gram^{-1} inner) = lambda(L^{-1} inner L^{-T}), gram = L Lᵀ.
    inverse = np.linalg.inv(np.linalg.cholesky(gram))
    return np.linalg.eigvalsh(inverse @ inner @ inverse.transpose(0, 2, 1))[:, -1]


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


def _mp_density(x, beta):
    """Marchenko–Pastur density of the eigenvalues of ``X X^T / n`` for unit-variance entries."""
    lo, hi = (1 - np.sqrt(beta)) ** 2, (1 + np.sqrt(beta)) ** 2
    return np.sqrt(np.maximum((hi - x) * (x - lo), 0.0)) / (2 * np.pi * beta * x)


@lru_cache(maxsize=256)
def marchenko_pastur_median(beta):
    """Median of the Marchenko–Pastur law with aspect ratio ``beta = m / n`` in ``(0, 1]``."""
    if not 0 < beta <= 1:
        raise ValueError(f"`beta` must lie in (0, 1]. Got {beta!r} instead.")
    lo, hi = (1 - np.sqrt(beta)) ** 2, (1 + np.sqrt(beta)) ** 2

    def mass_below(mu):
        return integrate.quad(_mp_density, lo, mu, args=(beta,), limit=200)[0] - 0.5

    return brentq(mass_below, lo, hi, xtol=1e-12)


def _lambda_star(beta):
    # Gavish & Donoho (2014), eq. (11): threshold coefficient for known noise level.
    return np.sqrt(2 * (beta + 1) + 8 * beta / (beta + 1 + np.sqrt(beta**2 + 14 * beta + 1)))


def _matrix_shape(shape, s):
    if shape is None:
        return (s.shape[-1], s.shape[-1])
    if (
        len(shape) != 2
        or not all(isinstance(v, Integral) and v > 0 for v in shape)
        or min(shape) < s.shape[-1]
    ):
        raise ValueError(
            "`shape` must be a pair of positive integers (m, n) with min(m, n) >= the number "
            f"of singular values ({s.shape[-1]}). Got {shape!r} instead."
        )
    return tuple(int(v) for v in shape)


def optimal_hard_threshold(A, sigma=None, *, shape=None, is_spectrum=None):
    """Gavish–Donoho optimal hard threshold for the singular values of a noisy matrix.

    For an ``m x n`` matrix, ``beta = min(m, n) / max(m, n)`` and ``n`` the larger side:

    * noise level ``sigma`` known: ``lambda(beta) * sqrt(n) * sigma`` (``lambda(1) = 4/sqrt(3)``);
    * unknown: ``omega(beta) * median(s)`` with ``omega(beta) = lambda(beta) / sqrt(mu_beta)``,
      ``mu_beta`` the Marchenko–Pastur median (``omega(1) ~ 2.858``).

    Parameters
    ----------
    A : array-like
        A spectrum or a stack of matrices (see the module docstring).
    sigma : float, default=None
        Standard deviation of the i.i.d. noise entries; ``None`` estimates it from the median.
    shape : tuple of int, default=None
        ``(m, n)`` of the matrix a spectrum came from. Ignored for matrices; for a spectrum of
        length ``k`` it defaults to ``(k, k)``. The unknown-noise rule needs the full spectrum
        (``min(m, n)`` values).

    Returns
    -------
    threshold : float or ndarray
    """
    s, matrix_shape, scalar = check_spectra(A, is_spectrum)
    m, n = sorted(matrix_shape if matrix_shape is not None else _matrix_shape(shape, s))
    beta = m / n
    if sigma is not None:
        if isinstance(sigma, bool) or not isinstance(sigma, Real) or not sigma >= 0:
            raise ValueError(f"`sigma` must be a non-negative real number. Got {sigma!r}.")
        tau = np.full(s.shape[:-1], _lambda_star(beta) * np.sqrt(n) * sigma)
    else:
        if s.shape[-1] != m:
            raise ValueError(
                f"The unknown-noise threshold needs all min(m, n) = {m} singular values; got "
                f"{s.shape[-1]}. Pass `sigma` or the full spectrum."
            )
        omega = _lambda_star(beta) / np.sqrt(marchenko_pastur_median(beta))
        tau = omega * np.median(s, axis=-1)
    return spectrum_output(tau, scalar, np.float64)
