"""Operators solved from moments: least squares, reduced rank, and the edges of noise.

Notation: ``Cxx, Cxy, Cyy`` are the centred cross-products of :class:`~._moments.Moments`,
``B`` the least-squares (or ridge) operator with ``Y ~ X B``.
"""

from dataclasses import dataclass

import numpy as np
from scipy.optimize import brentq

__all__ = [
    "StaticOperator",
    "solve_static",
    "canonical_correlations",
    "null_edge_canonical",
    "null_edge_white",
    "null_edge_correlated",
    "shrunk_noise_covariance",
    "residuals_look_white",
]

# Eigenvalues of a correlation-scaled Gram below this fraction of the largest are taken as
# exact collinearity (a Gram's rounding error is about eps * its largest eigenvalue).
_GRAM_RTOL = 1e-10


def _whitening_basis(gram):
    """Return ``W`` (p x k) with ``W^T gram W = I_k`` over the numerically non-null eigenspace.

    The Gram is scaled to a correlation matrix first, so that features of wildly different
    scales keep their full relative precision; constant features are dropped.
    """
    scale = np.sqrt(np.clip(np.diag(gram), 0, None))
    keep = scale > 0
    inv_scale = np.zeros_like(scale)
    inv_scale[keep] = 1.0 / scale[keep]
    # One side at a time: |gram_ij| / s_i <= s_j, so no intermediate overflows.
    corr = (gram * inv_scale[:, None]) * inv_scale[None, :]
    evals, evecs = np.linalg.eigh(corr)
    top = evals[-1] if evals.size else 0.0
    nonnull = evals > _GRAM_RTOL * top if top > 0 else np.zeros_like(evals, dtype=bool)
    # gram = D corr D, corr = Q L Q^T  =>  W = D^{-1} Q L^{-1/2} whitens gram.
    return (inv_scale[:, None] * evecs[:, nonnull]) / np.sqrt(evals[nonnull])


@dataclass
class StaticOperator:
    """The least-squares operator of a static task and its rank-``r`` reduction path.

    Attributes
    ----------
    coef : ndarray of shape (p, q)
        Least-squares (``alpha=0``, minimum norm) or ridge operator ``B``.
    output_directions : ndarray of shape (q, q)
        Right singular vectors of the fitted values, by decreasing singular value: the rank-``r``
        model is ``B V_r V_r^T`` (reduced-rank regression; with ridge, Mukherjee & Zhu 2011).
    fitted_singular_values : ndarray of shape (q,)
        Singular values of the (centred) fitted values ``X_c B``.
    input_rank : int
        Numerical rank of the centred inputs.
    residual : ndarray of shape (q, q)
        Residual cross-products ``(Y_c - X_c B)^T (Y_c - X_c B)``.
    residual_dof : int
        Residual degrees of freedom ``n - 1 - input_rank`` (``n - input_rank`` uncentred).
    target_energy : float
        ``trace(Cyy)``, the scale below which the residual cannot be resolved.
    """

    coef: np.ndarray
    output_directions: np.ndarray
    fitted_singular_values: np.ndarray
    input_rank: int
    residual: np.ndarray
    residual_dof: int
    target_energy: float

    def noise_variance(self):
        """Residual variance per target entry, ``trace(residual) / (dof * q)``.

        The residual comes from ``Cyy - fitted``, a difference that rounds at about
        ``eps * trace(Cyy)``: the estimate is floored there so a noise-free task reads as
        noise at the resolution of float64, not as zero or negative noise.
        """
        q = self.residual.shape[0]
        resolution = 64 * np.finfo(np.float64).eps * self.target_energy
        return max(np.trace(self.residual), resolution) / (max(self.residual_dof, 1) * q)

    def reduced_coef(self, rank):
        """``B V_r V_r^T``: the best rank-``rank`` operator on the training data."""
        V = self.output_directions[:, :rank]
        return (self.coef @ V) @ V.T


def solve_static(moments, alpha=0.0):
    """Solve moments for the static operator and its reduced-rank path."""
    W = _whitening_basis(moments.xx)
    input_rank = W.shape[1]
    if alpha > 0:
        coef = np.linalg.solve(moments.xx + alpha * np.eye(moments.xx.shape[0]), moments.xy)
    else:
        # B = Cxx^+ Cxy = W W^T Cxy (minimum-norm least squares).
        coef = W @ (W.T @ moments.xy)
    # Fitted Gram: (X_c B)^T (X_c B) = B^T Cxy without ridge; B^T (Cxx + alpha I) B = B^T Cxy
    # is the augmented-data form of reduced-rank ridge regression.
    fitted_gram = coef.T @ moments.xy
    fitted_gram = (fitted_gram + fitted_gram.T) / 2
    evals, evecs = np.linalg.eigh(fitted_gram)
    order = np.argsort(evals)[::-1]
    evals, evecs = evals[order], evecs[:, order]
    # Eigenvalues of a Gram are resolved to about eps * its largest one; below that they are
    # rounding (whose square roots would pass for singular values of size sqrt(eps)).
    resolution = 64 * len(evals) * np.finfo(np.float64).eps * max(evals[0] if evals.size else 0, 0)
    evals = np.where(evals > resolution, evals, 0.0)
    # Deterministic signs: the largest entry of each direction is positive.
    signs = np.sign(evecs[np.argmax(np.abs(evecs), axis=0), np.arange(evecs.shape[1])])
    evecs *= np.where(signs == 0, 1, signs)
    # Residual cross-products of the least-squares fit: Cyy - Cxy^T Cxx^+ Cxy.
    projected = W.T @ moments.xy
    residual = moments.yy - projected.T @ projected
    residual = (residual + residual.T) / 2
    return StaticOperator(
        coef=coef,
        output_directions=evecs,
        fitted_singular_values=np.sqrt(evals),
        input_rank=input_rank,
        residual=residual,
        residual_dof=moments.dof - input_rank,
        target_energy=float(np.trace(moments.yy)),
    )


def canonical_correlations(moments):
    """Canonical correlations between ``X`` and ``Y``, largest first.

    They are the singular values of ``Wx^T Cxy Wy`` with ``Wx, Wy`` whitening the two sets,
    and do not change under any invertible linear map of the inputs or of the outputs. Their
    squares are the eigenvalues of ``(H + E)^{-1} H`` with ``H`` the fitted and ``E`` the
    residual cross-products: the noise-whitened spectrum of the operator.
    """
    Wx = _whitening_basis(moments.xx)
    Wy = _whitening_basis(moments.yy)
    if Wx.shape[1] == 0 or Wy.shape[1] == 0:
        return np.zeros(0), Wx.shape[1], Wy.shape[1]
    rho = np.linalg.svd(Wx.T @ moments.xy @ Wy, compute_uv=False)
    return np.clip(rho, 0.0, 1.0), Wx.shape[1], Wy.shape[1]


# 99.9% quantile of the Tracy-Widom law for real matrices (beta = 1).
_TW1_Q999 = 3.2724


def null_edge_canonical(n_inputs, n_outputs, dof):
    """Largest squared canonical correlation expected from pure noise (99.9% level).

    Under independence of ``X`` (rank ``n_inputs``) and ``Y`` (rank ``n_outputs``) with ``dof``
    degrees of freedom, the squared canonical correlations follow a Jacobi (double Wishart)
    ensemble. Johnstone (2008) shows that ``logit(theta_1)`` is approximately
    ``mu + sigma * TW1``; the threshold is that approximation's 99.9% quantile. Returns ``None``
    when the residual degrees of freedom cannot estimate the noise (``dof <= n_inputs +
    n_outputs``, where every canonical correlation is forced towards 1).
    """
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
    logit = mu + _TW1_Q999 * sigma
    return 1 / (1 + np.exp(-logit))


def null_edge_white(n_rows, n_cols):
    """Largest squared singular value of an ``n_rows x n_cols`` matrix of i.i.d. unit Gaussian
    noise, at the 99.9% level.

    Johnstone (2001): the largest eigenvalue of ``WᵀW`` is approximately
    ``mu + sigma * TW1`` with ``mu = (sqrt(n - 1/2) + sqrt(p - 1/2))^2`` and
    ``sigma = sqrt(mu) (1/sqrt(n - 1/2) + 1/sqrt(p - 1/2))^{1/3}`` (``n >= p`` the two sides).
    """
    n, p = max(n_rows, n_cols) - 0.5, min(n_rows, n_cols) - 0.5
    if p <= 0:
        return 0.0
    root_mu = np.sqrt(n) + np.sqrt(p)
    sigma = root_mu * (1 / np.sqrt(n) + 1 / np.sqrt(p)) ** (1 / 3)
    return root_mu**2 + _TW1_Q999 * sigma


# 99.9% quantile of the standard normal law.
_Z_Q999 = 3.0902


def residuals_look_white(residual, dof):
    """Whether residual cross-products are consistent with white noise ``sigma^2 I``.

    John's sphericity statistic ``U = q tr(S^2) / tr(S)^2 - 1`` of the residual covariance
    ``S``; under sphericity ``dof U - q`` tends to ``N(1, 4)`` as ``dof`` and ``q`` grow in any
    proportion (Ledoit & Wolf 2002), so ``q > dof`` is allowed. Sphericity is kept unless
    rejected at the 0.1% level.
    """
    q = residual.shape[0]
    trace = np.trace(residual)
    if q < 2 or dof < 2 or trace <= 0:
        return True
    unit = residual / trace  # tr = 1: no under- or overflow in tr(S^2) / tr(S)^2
    u = q * np.sum(unit * unit) - 1
    return (dof * u - q - 1) / 2 <= _Z_Q999


def null_edge_correlated(noise_eigenvalues, n_rows):
    """Largest squared singular value of an ``n_rows x q`` Gaussian matrix whose rows have a
    covariance with eigenvalues ``noise_eigenvalues``, at the 99.9% level.

    El Karoui (2007), real case Lee & Schnelli (2016): with ``t_j`` the eigenvalues and
    ``c in (0, 1 / max t)`` the root of ``sum_j (t_j c / (1 - t_j c))^2 = n``, the largest
    eigenvalue of ``ZᵀZ`` is about ``n mu + n sigma TW1`` with
    ``mu = (1 + sum_j t_j c / (1 - t_j c) / n) / c`` and
    ``sigma = (1 + sum_j (t_j c / (1 - t_j c))^3 / n)^{1/3} / (n^{2/3} c)``. Johnstone's
    half-integer corrections (``n - 1/2`` rows, ``q - 1/2`` columns) make it equal
    :func:`null_edge_white` when every ``t_j`` is 1. An isolated large eigenvalue (a spike)
    makes the edge conservative: the largest eigenvalue then fluctuates less than TW1 says.
    """
    t = np.asarray(noise_eigenvalues, dtype=np.float64)
    t = t[t > 0]
    if t.size == 0 or n_rows < 1:
        return 0.0
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
    return n * (mu + _TW1_Q999 * sigma)


def shrunk_noise_covariance(residual, dof):
    """Noise covariance from residual cross-products with ``dof`` degrees of freedom, as
    eigenvalues and eigenvectors, for the edge of the noise in the fitted values.

    The sample covariance ``S = residual / dof`` spreads its eigenvalues (Marchenko–Pastur), so
    an edge computed from it is far too high when ``q / dof`` is not small. The oracle
    approximating shrinkage (Chen, Wiesel, Eldar & Hero 2010) pulls ``S`` towards
    ``tr(S) / q I`` with a weight computed from ``S`` alone (Gaussian noise), which is all that
    moments keep. Shrinkage also pulls a strong noise direction (a spike) down, which would put
    the edge too low; so a sample eigenvalue the shrunk covariance cannot explain (above its own
    99.9% edge for ``dof`` rows) keeps the population value the spiked model gives it,
    ``ell = lambda (1 + gamma s2 / (lambda - s2))`` solved for ``lambda`` (Baik & Silverstein
    2006; Paul 2007), ``gamma = q / dof`` and ``s2`` the mean of the other eigenvalues.
    """
    q = residual.shape[0]
    sample, vectors = np.linalg.eigh(residual / dof)
    sample = np.clip(sample, 0.0, None)
    total, squares = sample.sum(), np.sum(sample**2)
    if total <= 0 or q < 2:
        return sample, vectors
    # OAS weight: ((1 - 2/q) tr(S^2) + tr(S)^2) / ((dof + 1 - 2/q) (tr(S^2) - tr(S)^2 / q)).
    spread = (dof + 1 - 2 / q) * (squares - total**2 / q)
    weight = 1.0 if spread <= 0 else min(1.0, ((1 - 2 / q) * squares + total**2) / spread)
    shrunk = (1 - weight) * sample + weight * total / q
    spikes = sample > null_edge_correlated(shrunk, dof) / dof
    if spikes.any() and not spikes.all():
        bulk = sample[~spikes].mean()
        gamma = q / dof
        ell = sample[spikes] / bulk
        b = ell + 1 - gamma
        population = bulk * (b + np.sqrt(np.clip(b**2 - 4 * ell, 0.0, None))) / 2
        shrunk[spikes] = np.maximum(shrunk[spikes], population)
    return shrunk, vectors
