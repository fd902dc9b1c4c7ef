"""Resampled null laws of the sequential rank statistics: the wild (multiplier) bootstrap.

Where the residual diagnostics (:mod:`._diagnostics`) reject what the Tracy–Widom edges
assume, the law of the noise in the fitted values is resampled instead. With ``Q`` orthonormal
columns spanning the centred inputs, the fitted values are ``Q Qᵀ Y`` and their noise part is
``Z = Qᵀ E = sum_i Q_iᵀ e_i``. The wild bootstrap multiplies every residual row by a Rademacher
sign, ``Z* = sum_i w_i Q_iᵀ r_i / sqrt(1 - h_i)`` (Wu 1986; Liu 1988; the ``1 / sqrt(1 - h_i)``
of MacKinnon & White's HC2), which keeps each row's own noise covariance — however it depends
on the inputs — and the correlation across targets; signs constant within groups or within
contiguous blocks of rows keep the dependence inside them (the wild cluster bootstrap,
Cameron, Gelbach & Miller 2008). Under ``rank = k`` the statistic of the next direction is the
``(k+1)``-th squared singular value of ``S_k + Z*``, ``S_k`` the rank-``k`` truncation of
``Qᵀ Y``; its law is summarised by a shifted gamma law with the resampled mean, variance and
skewness (the skewness at least TW1's), which resolves the tail at small levels from a few
hundred resamples (Chiani 2014's form of TW1 is such a law).
"""

import numpy as np
from scipy import stats

__all__ = [
    "NOISE_MODELS",
    "N_RESAMPLES",
    "multiplier_clusters",
    "block_length",
    "ResampledNull",
]

# The calibrations a rank can be read with, by the assumption they drop.
NOISE_MODELS = {
    "gaussian": "Tracy–Widom edges (independent, homoscedastic Gaussian noise)",
    "wild-bootstrap": "a wild bootstrap, one sign per row",
    "block-bootstrap": "a wild bootstrap with one sign per block of contiguous rows, after "
                       "an AR(1) prewhitening of the rows",
    "group-bootstrap": "a wild cluster bootstrap, one sign per group",
}
N_RESAMPLES = 299
# TW1's skewness: the least the fitted law's is taken to be.
_TW1_SKEWNESS = 0.2935
# Most values of the per-row outer products held at once (32 MB of float64).
_MAX_VALUES = 1 << 22


def block_length(n_rows, lag1_autocorrelation):
    """Rows per block of the block bootstrap: ``n^(1/3)`` times the integrated
    autocorrelation time ``(1 + |rho|) / (1 - |rho|)`` of an AR(1) of lag-one autocorrelation
    ``rho``, at most ``n / 20`` (20 blocks)."""
    rho = min(abs(float(lag1_autocorrelation)), 0.99)
    length = int(np.ceil(n_rows ** (1 / 3) * (1 + rho) / (1 - rho)))
    return max(1, min(length, n_rows // 20))


def multiplier_clusters(n_rows, noise_model, groups=None, block=1):
    """Codes ``0 .. G - 1`` of the rows that share a sign in ``noise_model``."""
    if noise_model == "group-bootstrap":
        return np.unique(groups, return_inverse=True)[1].ravel()
    if noise_model == "block-bootstrap":
        return np.arange(n_rows) // block
    return np.arange(n_rows)


class ResampledNull:
    """Resampled noise ``Z*`` of the fitted values and the sequential laws it gives.

    Parameters
    ----------
    rows : ResidualRows
        Residual rows of the least-squares fit, with the residuals
        (:func:`._diagnostics.residual_rows` with ``with_residual=True``).
    clusters : ndarray of shape (n_rows,) of int
        Rows sharing a sign (:func:`multiplier_clusters`).
    rng : numpy Generator
    n_resamples : int, default=N_RESAMPLES
    weight : float, default=1.0
        Factor on ``Z*``: ``sqrt(n / m)`` where the rows are ``m`` of the ``n`` the fit saw.
    """

    def __init__(self, rows, clusters, rng, n_resamples=N_RESAMPLES, weight=1.0):
        residual = rows.residual / np.sqrt(np.clip(1 - rows.leverage, 1e-12, None))[:, None]
        basis = rows.basis
        n, k = basis.shape
        q = residual.shape[1]
        n_clusters = int(clusters.max()) + 1 if clusters.size else 0
        signs = rng.choice(np.array([-1.0, 1.0]), size=(n_resamples, n_clusters))
        if n * k * q <= _MAX_VALUES:
            outer = (basis[:, :, None] * residual[:, None, :]).reshape(n, k * q)
            if n_clusters < n:
                order = np.argsort(clusters, kind="stable")
                starts = np.flatnonzero(np.r_[True, np.diff(clusters[order]) != 0])
                outer = np.add.reduceat(outer[order], starts, axis=0)
                signs = signs[:, np.unique(clusters[order])]
            noise = (signs @ outer).reshape(n_resamples, k, q)
        else:
            noise = np.empty((n_resamples, k, q))
            for b in range(n_resamples):
                noise[b] = (basis * signs[b, clusters][:, None]).T @ residual
        self.noise = noise * weight
        self.n_clusters = n_clusters

    def balance_inputs(self, fitted):
        """Weight the input side so that the resampled noise is equally strong in every input
        direction; returns ``fitted`` weighted alike (``Qᵀ Y`` of shape ``(k, q)``).

        Noise whose variance depends on the inputs is stronger in some input directions: in
        the fitted values it is a spike of its own, which a weak signal direction can fall
        below and which the rank-``k`` truncation of the null then takes for signal. With
        ``Omega = E[Z* Z*ᵀ] / q`` (the sandwich "meat" of the heteroscedasticity-consistent
        covariance), ``Omega^{-1/2}`` times its mean eigenvalue's root equalises it (the
        identity for noise that does not depend on the inputs) and keeps the rank of every
        operator.
        """
        n_resamples, k, q = self.noise.shape
        if k == 0 or q == 0:
            return fitted
        omega = np.einsum("bij,bkj->ik", self.noise, self.noise) / (n_resamples * q)
        values, vectors = np.linalg.eigh((omega + omega.T) / 2)
        if not values[-1] > 0:
            return fitted
        values = np.clip(values, 1e-12 * values[-1], None)
        weight = (vectors / np.sqrt(values)) @ vectors.T * np.sqrt(values.mean())
        self.noise = np.einsum("ij,bjk->bik", weight, self.noise)
        return weight @ fitted

    @property
    def noise_variance(self):
        """Resampled variance per entry of the fitted values' noise, ``E ||Z*||_F^2 / (k q)``."""
        return float(np.mean(self.noise**2)) if self.noise.size else 0.0

    def law(self, fitted, k):
        """Shifted gamma law ``(shape, scale, shift)`` of the ``(k+1)``-th squared singular
        value of ``S_k + Z*``, ``S_k`` the rank-``k`` truncation of ``fitted = Qᵀ Y``."""
        U, s, Vt = np.linalg.svd(fitted, full_matrices=False)
        signal = (U[:, :k] * s[:k]) @ Vt[:k]
        values = np.linalg.svd(signal + self.noise, compute_uv=False)[:, k] ** 2
        mean, sd = values.mean(), values.std(ddof=1)
        if not sd > 0:
            return None, None, float(mean)
        skewness = max(_TW1_SKEWNESS, float(stats.skew(values)))
        shape = 4 / skewness**2
        scale = sd * skewness / 2
        return shape, scale, float(mean - shape * scale)

    @staticmethod
    def p_value(law, value):
        shape, scale, shift = law
        if shape is None:
            return float(value <= shift)
        return float(stats.gamma.sf(value - shift, shape, scale=scale))

    @staticmethod
    def edge(law, level):
        shape, scale, shift = law
        if shape is None:
            return shift
        return float(shift + stats.gamma.ppf(level, shape, scale=scale))
