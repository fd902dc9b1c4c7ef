"""Data-only operators of sequence data ``X (N, n, d) -> Y (N, n, d_out)``.

* The naive static transfer: one token-mixing matrix ``M`` (``n x n``) shared by all sequences
  and channels, ``Y_s ~ M X_s``. Attention's mixing depends on the input, so its rank says
  nothing about the query–key kernel; it is kept to show that failure.
* The attention-native operator. For linear attention, token ``i`` of a sequence is
  ``y_i = V S Wᵀ x_i`` with ``S = Xᵀ X / n`` the sequence's second moment: linear in ``W``,
  so least squares on the features built from ``S`` and ``x_i`` recovers ``W`` when the value
  map ``V`` is known. Softmax attention linearised around uniform weights gives
  ``y_i - V x̄ = (beta / sqrt(d)) V C Wᵀ x_i`` with ``C`` the centred second moment: the same
  estimator on centred data.
* Without ``V``: as ``n`` grows ``S -> Sigma``, so ``y_i ~ V Sigma Wᵀ x_i`` is a per-token
  linear map of the channels, of rank ``rank(W)`` for a full-rank ``V``.
"""

import numpy as np
from scipy.linalg import blas
from sklearn.utils import Bunch

from ._spectrum import optimal_hard_threshold

__all__ = ["token_mixing_data", "per_token_data", "KernelMoments", "qk_kernel_least_squares"]

# Sequences per chunk when accumulating the kernel statistics: the per-sequence moments of a
# chunk take 3 * _CHUNK * d^2 floats (25 MB at d = 128).
_CHUNK = 64


def token_mixing_data(X, Y):
    """2-D data of the naive static transfer: token vectors of every channel as samples.

    Returns ``(Xt, Yt)`` of shape ``(N d, n)``, with channel ``c`` of ``Y`` paired with
    channel ``c`` of ``X``, so that the static operator fitted on them is ``Mᵀ``.
    """
    if X.shape[2] != Y.shape[2]:
        raise ValueError(
            "The static token-mixing operator pairs each output channel with the same input "
            f"channel and needs n_targets == n_features. Got {Y.shape[2]} and {X.shape[2]}.")
    n = X.shape[1]
    return X.transpose(0, 2, 1).reshape(-1, n), Y.transpose(0, 2, 1).reshape(-1, n)


def per_token_data(X, Y, center_sequences):
    """Tokens as samples: ``(N n, d)`` and ``(N n, d_out)``, optionally centred per sequence."""
    if center_sequences:
        X = X - X.mean(axis=1, keepdims=True)
        Y = Y - Y.mean(axis=1, keepdims=True)
    return X.reshape(-1, X.shape[2]), Y.reshape(-1, Y.shape[2])


class KernelMoments:
    """Sufficient statistics of the query–key kernel least squares, added sequence by sequence.

    With ``A = Wᵀ`` and ``M_s = V S_s`` (``S_s`` the second moment of sequence ``s``, centred
    for ``attention="softmax"``), every token obeys ``y_i = M_s A x_i``. The normal equations of
    ``vec(A)`` are ``G vec(A) = b`` with ``G = sum_s T_s ⊗ P_s``, ``T_s = S_s Vᵀ V S_s``,
    ``P_s = X_sᵀ X_s`` and ``b = sum_s vec(S_s Vᵀ Y_sᵀ X_s)``.

    ``T_s`` and ``P_s`` are symmetric, so ``G[(a, b), (a', b')] = C[ab(a, a'), ab(b, b')]`` with
    ``C = sum_s vech(T_s) vech(P_s)ᵀ``, a ``d(d+1)/2``-square matrix: a quarter of the dense
    ``d^2 x d^2`` normal matrix (545 MB instead of 2 GB at ``d = 128``), accumulated by one GEMM
    per chunk of sequences. Memory is independent of the number of sequences.
    """

    def __init__(self, V, attention, scale=1.0):
        self.V = np.asarray(V, dtype=np.float64)
        self.attention = attention
        # X and Y enter divided by this power of two (exact), so that the statistics, cubic and
        # quartic in X, stay finite for extreme data; they are those of the scaled data.
        self.scale = scale
        d = self.V.shape[1]
        self.rows, self.cols = np.triu_indices(d)
        m = len(self.rows)
        self.C = np.zeros((m, m))
        self.rhs = np.zeros((d, d))
        self.P_sum = np.zeros((d, d))
        self.T_sum = np.zeros((d, d))
        self.y_energy = 0.0
        self.n_sequences = 0
        self.n_tokens = None
        self.n_targets = self.V.shape[0]

    def update(self, X, Y):
        """Add sequences ``X (b, n, d)``, ``Y (b, n, d_out)``; returns ``self``."""
        if self.n_tokens is None:
            self.n_tokens = X.shape[1]
        elif X.shape[1] != self.n_tokens:
            raise ValueError(f"All sequences must have {self.n_tokens} tokens. Got {X.shape[1]}.")
        VtV = self.V.T @ self.V
        for start in range(0, X.shape[0], _CHUNK):
            Xb, Yb = X[start:start + _CHUNK], Y[start:start + _CHUNK]
            if self.scale != 1.0:
                Xb, Yb = Xb / self.scale, Yb / self.scale
            P = Xb.transpose(0, 2, 1) @ Xb  # sum_i x_i x_iᵀ
            if self.attention == "softmax":
                # Around uniform weights the output is V x̄ plus a term linear in the centred
                # moment: y_i - V x̄ = (beta / sqrt(d)) V C Wᵀ x_i.
                means = Xb.mean(axis=1, keepdims=True)
                Yb = Yb - means @ self.V.T
                Xcb = Xb - means
                S = Xcb.transpose(0, 2, 1) @ Xcb / X.shape[1]  # mixing moment of each sequence
            else:
                S = P / X.shape[1]
            T = S @ VtV @ S
            _accumulate_outer(self.C, T[:, self.rows, self.cols], P[:, self.rows, self.cols])
            # b_s = S_s Vᵀ Y_sᵀ X_s, by batched products (an einsum took twice as long).
            self.rhs += (S @ (self.V.T @ (Yb.transpose(0, 2, 1) @ Xb))).sum(axis=0)
            self.P_sum += P.sum(axis=0)
            self.T_sum += T.sum(axis=0)
            self.y_energy += float(np.sum(Yb**2))
            self.n_sequences += len(Xb)
        return self

    def merge(self, other):
        """Add the statistics of other sequences, in place; returns ``self``."""
        if other.n_sequences == 0:
            return self
        if other.scale != self.scale:
            raise ValueError("Cannot merge kernel statistics of data scaled differently.")
        if self.n_tokens is not None and other.n_tokens != self.n_tokens:
            raise ValueError(f"All sequences must have {self.n_tokens} tokens. Got "
                             f"{other.n_tokens}.")
        self.n_tokens = other.n_tokens
        self.C += other.C
        self.rhs += other.rhs
        self.P_sum += other.P_sum
        self.T_sum += other.T_sum
        self.y_energy += other.y_energy
        self.n_sequences += other.n_sequences
        return self

    def _index(self):
        d = self.rhs.shape[0]
        index = np.empty((d, d), dtype=np.intp)
        index[self.rows, self.cols] = np.arange(len(self.rows))
        index[self.cols, self.rows] = np.arange(len(self.rows))
        return index

    def normal_matrix(self):
        """The dense ``d^2 x d^2`` matrix ``G`` (rows and columns ``(a, b)``, row-major)."""
        index = self._index()
        # G[(a, b), (a', b')] = C[index[a, a'], index[b, b']]
        G = self.C[index[:, None, :, None], index[None, :, None, :]]
        d = index.shape[0]
        return G.reshape(d * d, d * d)

    def _matvec(self, A, index, block=128):
        """``G vec(A)`` from the compressed ``C``, without forming ``G``."""
        out = np.zeros_like(A)
        unpack = index.ravel()
        d = A.shape[0]
        for start in range(0, len(self.rows), block):
            rows = slice(start, start + block)
            # Each row i = (a, a') of C unpacks to the symmetric matrix C_i[b, b'] (a gather of
            # one block of rows: 16 MB at d = 128).
            Ci = np.take(self.C[rows], unpack, axis=1).reshape(-1, d, d)
            a, a2 = self.rows[rows], self.cols[rows]
            # out[a, b] += sum_b' C_i[b, b'] A[a', b'] and, for a != a', out[a', b] += ... A[a, b']:
            # both products in one batched matrix product.
            both = Ci @ np.stack([A[a2], A[a]], axis=2)
            np.add.at(out, a, both[:, :, 0])
            off = a != a2
            np.add.at(out, a2[off], both[off, :, 1])
        return out

    def _solve_iteratively(self, tol=1e-10, max_iter=500):
        """Conjugate gradients on ``G vec(A) = b``, preconditioned by ``N T̄ ⊗ P̄``."""
        index = self._index()
        N = self.n_sequences
        Tinv = np.linalg.pinv(self.T_sum / N, hermitian=True)
        Pinv = np.linalg.pinv(self.P_sum / N, hermitian=True)

        def precondition(R):
            return Tinv @ R @ Pinv / N  # (N T̄ ⊗ P̄)^{-1} vec(R) = vec(T̄^{-1} R P̄^{-1}) / N

        b = self.rhs
        A = precondition(b)
        R = b - self._matvec(A, index)
        Z = precondition(R)
        D = Z.copy()
        rz = np.sum(R * Z)
        b_norm = np.linalg.norm(b)
        for _ in range(max_iter):
            if np.linalg.norm(R) <= tol * b_norm:
                break
            GD = self._matvec(D, index)
            step = rz / np.sum(D * GD)
            A += step * D
            R -= step * GD
            Z = precondition(R)
            rz_new = np.sum(R * Z)
            D = Z + (rz_new / rz) * D
            rz = rz_new
        return A

    def solve(self, dense_limit=4096):
        """Least-squares kernel, its noise-whitened spectrum and the threshold rank.

        Up to ``dense_limit`` unknowns (``d = 64``) the dense normal matrix is solved
        directly; beyond, conjugate gradients run on the compressed statistics.

        The noise of ``Â`` has covariance ``sigma^2 G^{-1}``. Approximating ``G`` by the
        Kronecker product of the means, ``N T̄ ⊗ P̄``, the kernel ``T̄^{1/2} Â P̄^{1/2} sqrt(N)``
        carries i.i.d. noise of variance ``sigma^2``, and its rank is read with the
        Gavish–Donoho threshold.

        Returns a Bunch with ``kernel`` (``W``, for softmax up to the factor
        ``beta / sqrt(d)``), ``whitened`` (the noise-whitened kernel), ``singular_values`` (of
        ``whitened``), ``threshold``, ``rank``, ``noise_variance`` and ``logit_rms``
        (root-mean-square of the fitted logits ``x_iᵀ W x_j``, times the softmax factor: how far
        the linearisation is stretched).
        """
        d = self.rhs.shape[0]
        N, n = self.n_sequences, self.n_tokens
        if d * d <= dense_limit:
            G = self.normal_matrix()
            A = np.linalg.lstsq(G, self.rhs.ravel(), rcond=None)[0].reshape(d, d)
        else:
            A = self._solve_iteratively()
        # Residual sum of squares ||Y||^2 - bᵀ vec(Â) (least squares), floored at float64
        # resolution; N n d_out observations, d^2 parameters.
        rss = max(self.y_energy - self.rhs.ravel() @ A.ravel(),
                  64 * np.finfo(float).eps * self.y_energy)
        noise_variance = rss / max(N * n * self.n_targets - d * d, 1)
        P_mean, T_mean = self.P_sum / N, self.T_sum / N
        whitened = _sqrtm_psd(T_mean) @ A @ _sqrtm_psd(P_mean) * np.sqrt(N)
        s = np.linalg.svd(whitened, compute_uv=False)
        threshold = optimal_hard_threshold(s, np.sqrt(noise_variance), shape=(d, d))
        kernel = A.T
        # E[(x_iᵀ W x_j)^2] = ||Σ^{1/2} W Σ^{1/2}||_F^2 for independent tokens of moment Σ.
        root = _sqrtm_psd(P_mean / n)
        return Bunch(kernel=kernel, whitened=whitened, singular_values=s, threshold=threshold,
                     rank=int(np.sum(s > threshold)), noise_variance=noise_variance,
                     logit_rms=float(np.linalg.norm(root @ kernel @ root)))


def qk_kernel_least_squares(X, Y, V, attention):
    """Least-squares query–key kernel of attention with a known value map ``V``.

    One pass of :class:`KernelMoments` over all sequences; see :meth:`KernelMoments.solve`.
    """
    return KernelMoments(V, attention).update(X, Y).solve()


def _accumulate_outer(C, A, B):
    """``C += Aᵀ B`` in place, without the ``m x m`` temporary of ``C + A.T @ B``.

    BLAS sees the C-ordered ``C`` as ``Cᵀ`` in Fortran order: ``Cᵀ += Bᵀ A`` is one GEMM with
    ``beta = 1`` on ``C``'s own memory (545 MB at ``d = 128`` that need not be allocated twice).
    """
    if not (C.flags.c_contiguous and C.dtype == np.float64):
        C += A.T @ B
        return
    result = blas.dgemm(1.0, np.ascontiguousarray(B).T, np.ascontiguousarray(A).T, beta=1.0,
                        c=C.T, trans_b=1, overwrite_c=1)
    if not np.shares_memory(result, C):  # BLAS could not work in place: copy back
        C[...] = result.T


def _sqrtm_psd(M):
    evals, evecs = np.linalg.eigh((M + M.T) / 2)
    return (evecs * np.sqrt(np.clip(evals, 0, None))) @ evecs.T
