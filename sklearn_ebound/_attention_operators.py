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
from sklearn.utils import Bunch

from ._spectrum import optimal_hard_threshold

__all__ = ["token_mixing_data", "per_token_data", "qk_kernel_least_squares"]

# Sequences per chunk when accumulating the d^2 x d^2 normal equations.
_CHUNK = 512


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


def qk_kernel_least_squares(X, Y, V, kind):
    """Least-squares query–key kernel ``W`` of attention with a known value map ``V``.

    With ``A = Wᵀ`` and ``M_s = V S_s`` (``S_s`` the second moment of sequence ``s``, centred
    for ``kind="softmax"``), every token obeys ``y_i = M_s A x_i``. The normal equations of
    ``vec(A)`` are ``G vec(A) = b`` with ``G = sum_s T_s ⊗ P_s``, ``T_s = S_s Vᵀ V S_s``,
    ``P_s = X_sᵀ X_s`` and ``b = sum_s vec(S_s Vᵀ Y_sᵀ X_s)``.

    The noise of ``Â`` has covariance ``sigma^2 G^{-1}``. Approximating ``G`` by the Kronecker
    product of the means, ``N T̄ ⊗ P̄``, the kernel ``T̄^{1/2} Â P̄^{1/2} sqrt(N)`` carries
    i.i.d. noise of variance ``sigma^2``, and its rank is read with the Gavish–Donoho threshold.

    Returns a Bunch with ``kernel`` (``W``, for softmax up to the factor ``beta / sqrt(d)``),
    ``whitened`` (the noise-whitened kernel), ``singular_values`` (of ``whitened``),
    ``threshold``, ``rank``, ``noise_variance`` and ``logit_rms`` (root-mean-square of the
    fitted logits ``x_iᵀ W x_j`` times the softmax factor, a measure of how far the
    linearisation is stretched).
    """
    N, n, d = X.shape
    if kind == "softmax":
        # Around uniform weights the output is V x̄ plus a term linear in the centred moment.
        means = X.mean(axis=1, keepdims=True)
        Y = Y - means @ V.T
        Xc = X - means
    else:
        Xc = X
    VtV = V.T @ V
    gram = np.zeros((d, d, d, d))  # gram[a, a', b, b'] = sum_s T_s[a, a'] P_s[b, b']
    rhs = np.zeros((d, d))
    P_sum = np.zeros((d, d))
    T_sum = np.zeros((d, d))
    for start in range(0, N, _CHUNK):
        Xb, Xcb, Yb = X[start:start + _CHUNK], Xc[start:start + _CHUNK], Y[start:start + _CHUNK]
        S = Xcb.transpose(0, 2, 1) @ Xcb / n  # (b, d, d), the mixing moment of each sequence
        P = Xb.transpose(0, 2, 1) @ Xb  # sum_i x_i x_iᵀ
        T = S @ VtV @ S
        gram += (T.reshape(len(S), -1).T @ P.reshape(len(S), -1)).reshape(d, d, d, d)
        # b_s = S_s Vᵀ Y_sᵀ X_s
        rhs += np.einsum("sab,kb,sik,sic->ac", S, V, Yb, Xb, optimize=True)
        P_sum += P.sum(axis=0)
        T_sum += T.sum(axis=0)
    G = gram.transpose(0, 2, 1, 3).reshape(d * d, d * d)
    G = (G + G.T) / 2
    A = np.linalg.lstsq(G, rhs.ravel(), rcond=None)[0].reshape(d, d)
    # Residual sum of squares ||Y||^2 - bᵀ vec(Â) (least squares), floored at float64
    # resolution; N n d_out observations, d^2 parameters.
    total = float(np.sum(Y**2))
    rss = max(total - rhs.ravel() @ A.ravel(), 64 * np.finfo(float).eps * total)
    dof = max(N * n * Y.shape[2] - d * d, 1)
    noise_variance = rss / dof
    # G ~ N T̄ ⊗ P̄ with the means over sequences.
    P_mean, T_mean = P_sum / N, T_sum / N
    whitened = _sqrtm_psd(T_mean) @ A @ _sqrtm_psd(P_mean) * np.sqrt(N)
    s = np.linalg.svd(whitened, compute_uv=False)
    threshold = optimal_hard_threshold(s, np.sqrt(noise_variance), shape=(d, d))
    kernel = A.T
    # E[(x_iᵀ W x_j)^2] = ||Σ^{1/2} W Σ^{1/2}||_F^2 for independent tokens of moment Σ.
    root = _sqrtm_psd(P_mean / n)
    logit_rms = float(np.linalg.norm(root @ kernel @ root))
    return Bunch(kernel=kernel, whitened=whitened, singular_values=s, threshold=threshold,
                 rank=int(np.sum(s > threshold)), noise_variance=noise_variance,
                 logit_rms=logit_rms)


def _sqrtm_psd(M):
    evals, evecs = np.linalg.eigh((M + M.T) / 2)
    return (evecs * np.sqrt(np.clip(evals, 0, None))) @ evecs.T
