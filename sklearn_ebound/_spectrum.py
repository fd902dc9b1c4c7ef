"""Ranks read from a spectrum of singular values: energy, entropy and stable ranks, the tail
energy, and the Gavish–Donoho (2014) optimal hard threshold with the Marchenko–Pastur median it
needs. Pure spectrum arithmetic: the statistics' layer, below the null laws and the rules.

Every function takes either singular values or matrices:

* a 1-D array is a spectrum ``s`` (any order, non-negative);
* an array with two or more axes is a stack of matrices over its leading axes (all heads of a
  model at once, say); its singular values are taken first.

``is_spectrum=True`` forces the last axis of an n-D array to be read as a stack of spectra.
A single spectrum or matrix gives a Python scalar; a stack gives an array of its leading shape.
"""

from functools import lru_cache
from numbers import Integral, Real

import numpy as np
from scipy import integrate
from scipy.optimize import brentq

from ._utils.validation import check_spectra, spectrum_output

__all__ = [
    "energy_rank",
    "entropy_rank",
    "stable_rank",
    "threshold_rank",
    "optimal_hard_threshold",
    "tail_energy",
]


def _check_tau(tau):
    if isinstance(tau, bool) or not isinstance(tau, Real) or not 0 < tau <= 1:
        raise ValueError(f"`tau` must be a real number in (0, 1]. Got {tau!r} instead.")


def energy_rank(A, tau=0.99, *, is_spectrum=None):
    """Energy rank: the fewest singular values holding a fraction ``tau`` of the energy.

    ``r_tau = min{k : sum_{i<=k} s_i^2 >= tau * sum_i s_i^2}``; a zero spectrum has rank 0.

    Parameters
    ----------
    A : array-like
        A spectrum (1-D) or a stack of matrices; see the module docstring.
    tau : float, default=0.99
        Fraction of the energy to keep, in ``(0, 1]``.
    is_spectrum : bool, default=None
        Read the last axis as singular values even when ``A`` has several axes.

    Returns
    -------
    rank : int or ndarray of int
    """
    _check_tau(tau)
    s, _, scalar = check_spectra(A, is_spectrum)
    energy = np.cumsum(s**2, axis=-1)
    total = energy[..., -1:] if s.shape[-1] else np.zeros(s.shape[:-1] + (1,))
    # A relative slack of a few ulps so that tau=1 reaches the last non-zero value.
    reached = energy >= tau * total * (1 - 8 * np.finfo(float).eps)
    rank = np.where(total[..., 0] > 0, np.argmax(reached, axis=-1) + 1, 0)
    return spectrum_output(rank, scalar, np.intp)


def entropy_rank(A, *, is_spectrum=None):
    """Entropy effective rank of Roy & Vetterli (2007): ``exp(H(p))`` with ``p_i = s_i / sum s``.

    Note the normalisation by the sum of singular values (not of their squares). A zero
    spectrum has effective rank 0.
    """
    s, _, scalar = check_spectra(A, is_spectrum)
    total = s.sum(axis=-1, keepdims=True)
    p = np.divide(s, total, out=np.zeros_like(s), where=total > 0)
    plogp = np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0)
    erank = np.where(total[..., 0] > 0, np.exp(-plogp.sum(axis=-1)), 0.0)
    return spectrum_output(erank, scalar, np.float64)


def stable_rank(A, *, is_spectrum=None):
    """Stable rank ``||A||_F^2 / ||A||_2^2 = sum s_i^2 / s_1^2``; 0 for a zero spectrum."""
    s, _, scalar = check_spectra(A, is_spectrum)
    if s.shape[-1] == 0:
        return spectrum_output(np.zeros(s.shape[:-1]), scalar, np.float64)
    top = s[..., 0] ** 2
    srank = np.divide((s**2).sum(axis=-1), top, out=np.zeros_like(top), where=top > 0)
    return spectrum_output(srank, scalar, np.float64)


def tail_energy(A, rank, *, is_spectrum=None):
    """Tail energy ``T(r) = sum_{k>r} s_k^2``: the Eckart–Young–Mirsky deficiency bound.

    The best rank-``r`` approximation of a matrix with singular values ``s`` misses exactly
    ``T(r)`` in squared Frobenius norm. ``rank`` may be an int or an array of ints; ranks past
    the length of the spectrum give 0.
    """
    s, _, scalar = check_spectra(A, is_spectrum)
    rank_arr = np.asarray(rank)
    if rank_arr.dtype.kind not in "iu" or np.any(rank_arr < 0):
        raise ValueError(f"`rank` must be a non-negative integer or array of them. Got {rank!r}.")
    # tails[..., r] = sum_{k>r} s_k^2 for r = 0..m
    energy = s**2
    tails = np.concatenate(
        [np.cumsum(energy[..., ::-1], axis=-1)[..., ::-1], np.zeros(s.shape[:-1] + (1,))], axis=-1
    )
    idx = np.minimum(rank_arr, s.shape[-1])
    if scalar:
        return spectrum_output(tails[idx], rank_arr.ndim == 0, np.float64)
    return np.take(tails, idx, axis=-1)


def threshold_rank(A, sigma=None, *, shape=None, is_spectrum=None):
    """Number of singular values above the Gavish–Donoho optimal hard threshold.

    Pure noise gives rank 0 (up to a vanishing probability). See
    :func:`optimal_hard_threshold` for the parameters.
    """
    s, matrix_shape, scalar = check_spectra(A, is_spectrum)
    tau = optimal_hard_threshold(
        s, sigma, shape=matrix_shape if matrix_shape is not None else shape, is_spectrum=True
    )
    rank = (s > np.asarray(tau)[..., None]).sum(axis=-1)
    return spectrum_output(rank, scalar, np.intp)


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
