"""Least squares from moments: the static operator, its reduced-rank path and the canonical
correlations.

Notation: ``Cxx, Cxy, Cyy`` are the centred cross-products of :class:`~._moments.Moments`,
``B`` the least-squares (or ridge) operator with ``Y ~ X B``. The rank-``r`` model of the path
is ``B V_r V_r^T`` (reduced-rank regression), ``V`` the right singular vectors of the fitted
values.
"""

from dataclasses import dataclass
from functools import cached_property

import numpy as np

__all__ = [
    "StaticOperator",
    "solve_static",
    "canonical_correlations",
    "path_squared_errors",
    "input_spectrum",
    "orthonormal_directions",
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
    input_basis : ndarray of shape (p, input_rank) or None
        ``W`` with ``Wᵀ Cxx W = I``: the centred inputs times ``W`` are orthonormal columns
        spanning them (``None`` with ridge).
    """

    coef: np.ndarray
    output_directions: np.ndarray
    fitted_singular_values: np.ndarray
    input_rank: int
    residual: np.ndarray
    residual_dof: int
    target_energy: float
    input_basis: np.ndarray | None = None

    def noise_variance(self):
        """Residual variance per target entry, ``trace(residual) / (dof * q)``.

        The residual comes from ``Cyy - fitted``, a difference that rounds at about
        ``eps * trace(Cyy)``: the estimate is floored there so a noise-free task reads as
        noise at the resolution of float64, not as zero or negative noise.
        """
        q = self.residual.shape[0]
        resolution = 64 * np.finfo(np.float64).eps * self.target_energy
        return max(np.trace(self.residual), resolution) / (max(self.residual_dof, 1) * q)

    @cached_property
    def residual_covariance_eigh(self):
        """Eigenvalues (ascending) and eigenvectors of the residual covariance
        ``residual / residual_dof``, computed once: the noise edges and the residual
        diagnostics both read them."""
        return np.linalg.eigh(self.residual / max(self.residual_dof, 1))

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
        input_basis=None if alpha > 0 else W,
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


def path_squared_errors(operator, moments, X_test, Y_test):
    """Per-output squared test error of every rank 0..q from one decomposition.

    Returns ``sse`` of shape (q + 1, q): ``sse[r, j]`` for the rank-``r`` model, output ``j``.
    With ``C = (X - mean_x) B V`` and ``D = Y - mean_y`` the rank-``r`` residual of output ``j``
    is ``d_j - sum_{k<r} V[j, k] c_k``, whose square expands through ``H = D^T C`` and
    ``G = C^T C`` into cumulative sums over ``k``.
    """
    V = operator.output_directions
    C = (X_test - moments.mean_x) @ (operator.coef @ V)
    D = Y_test - moments.mean_y
    H = D.T @ C
    G = C.T @ C
    cross = np.cumsum(V * H, axis=1)
    # quad[j, r] = sum_{k, l <= r} V[j,k] V[j,l] G[k,l]; its increment at step t is
    # 2 V[j,t] sum_{l<t} V[j,l] G[l,t] + V[j,t]^2 G[t,t].
    A = V @ np.triu(G, k=1)
    quad = np.cumsum(2 * V * A + V**2 * np.diag(G), axis=1)
    base = np.einsum("ij,ij->j", D, D)
    sse = np.vstack([base, base - 2 * cross.T + quad.T])
    return np.clip(sse, 0, None)


def orthonormal_directions(directions):
    """Orthonormal basis of the columns' span, keeping their order (first k span the top k)."""
    if directions.shape[1] == 0:
        return directions.T
    Q, R = np.linalg.qr(directions)
    # Keep each basis vector pointing like its direction: diag(R) > 0.
    Q *= np.where(np.diag(R) < 0, -1.0, 1.0)
    return Q.T


def input_spectrum(moments):
    """Singular values of the centred inputs (at most ``dof`` of them) and their directions."""
    evals, evecs = np.linalg.eigh(moments.xx)
    evals, evecs = np.clip(evals[::-1], 0, None), evecs[:, ::-1]
    return np.sqrt(evals)[: min(moments.dof, moments.xx.shape[0])], evecs
