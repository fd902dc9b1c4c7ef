"""Data-only operators of sequence data ``X (N, n, d) -> Y (N, n, d_out)``.

* The naive static transfer: one token-mixing matrix ``M`` (``n x n``) shared by all sequences
  and channels, ``Y_s ~ M X_s``. Attention's mixing depends on the input, so its rank says
  nothing about the query–key kernel; it is kept to show that failure.
* The attention-native operator. Token ``i`` attends to its allowed keys ``K_i`` (all tokens
  without a mask, ``j <= i`` for a causal one, the unpadded ones of its sequence). For linear
  attention ``y_i = (1 / |K_i|) sum_{j in K_i} (x_iᵀ W x_j) V x_j = V S_i Wᵀ x_i`` with
  ``S_i`` the mean of ``x_j x_jᵀ`` over the allowed keys: linear in ``W``, so least squares on
  the features built from ``S_i`` and ``x_i`` recovers ``W`` when the value map ``V`` is
  known. Softmax attention with weights ``a_ij`` (zero outside ``K_i``) changes, to first
  order in its logits, by ``V S^a_i dA x_i`` with ``S^a_i`` the ``a``-weighted covariance of
  the allowed keys: around uniform weights ``y_i - V x̄_i = V C_i A x_i`` (``A`` the kernel
  times ``beta / sqrt(d)``, ``C_i`` the centred moment of the allowed keys). That linearised
  solve is refined by Gauss–Newton steps on the softmax itself, so the kernel fitted is the
  least squares of the exact model for the tokens at hand, whatever their law.
* Without ``V``: as ``n`` grows ``S_i -> Sigma``, so ``y_i ~ V Sigma Wᵀ x_i`` is a per-token
  linear map of the channels, of rank ``rank(W)`` for a full-rank ``V``.

Masks and padding. ``mask`` is ``None``, ``"causal"`` or an ``(n, n)`` array of 0/1 (row ``i``:
the keys query ``i`` may attend to; every row must allow one). Sequences of different lengths
are padded to ``n`` tokens and passed with their ``lengths``: tokens at positions ``>=
length`` are neither queries nor keys, and their values are ignored.

Weighted masks and logit biases (:func:`check_attention_pattern`). For linear attention
``mask`` may hold non-negative weights ``m_ij`` (zero: not a key), and the attention weights
at the kernel are ``a_ij = m_ij / sum_k m_ik`` (``mask_normalization="mean"``: averaged over
the visible keys, today's ``1 / |K_i|`` for 0/1) or ``a_ij = m_ij`` (``"none"``: as given,
e.g. ``(1/n) sum_{j <= i}``); then ``y_i = V S_i Wᵀ x_i`` with ``S_i = sum_j a_ij x_j x_jᵀ``,
still linear in ``W``. For softmax an additive ``logit_bias`` ``b_ij`` enters every
sequence's logits, ``a_ij ∝ exp(x_iᵀ A x_j + b_ij)``; the linearisation is then around the
bias's own weights ``softmax(b_i)`` (the weights at ``A = 0``) instead of uniform ones.
Everything below works with these base weights in place of uniform ones.
"""

from numbers import Real
from typing import NamedTuple

import numpy as np
import scipy.linalg
from scipy.linalg import blas
from sklearn.utils import Bunch

from ._conjugate_gradients import conjugate_gradients, refined_conjugate_gradients
from ._kernel_rank import kernel_threshold_rank

__all__ = [
    "token_mixing_data",
    "per_token_data",
    "own_share_energy",
    "KernelMoments",
    "qk_kernel_least_squares",
    "check_attention_mask",
    "check_attention_pattern",
    "check_lengths",
    "allowed_keys",
    "alibi_bias",
    "base_weights",
    "AttentionPattern",
]

MASK_NORMALIZATIONS = ("mean", "none")

# Sequences per chunk when accumulating the kernel statistics: the per-sequence moments of a
# chunk take 3 * _CHUNK * d^2 floats (25 MB at d = 128).
_CHUNK = 64
# Float64 values of the largest temporary of one block of sequences in the matrix-free passes.
_BLOCK_VALUES = 1 << 22


class _Float32Pair:
    """A float64 array ``a`` kept as two float32 arrays, ``hi = float32(a)`` and ``lo =
    float32(a - hi)``: the memory of ``a``, which ``hi + lo`` gives back to ``2^-48`` relative
    (``a - hi`` is exact, and its rounding to float32 errs by ``2^-24`` of it), while ``hi``
    alone is the float32 copy the single-precision products read. Kept moments take this
    form so that a solve needs no float32 copy of them: on a machine (a virtual one above all)
    where first touching fresh memory is slow, making that copy took longer than the products
    it served."""

    __slots__ = ("hi", "lo")

    def __init__(self, hi, lo):
        self.hi, self.lo = hi, lo

    @classmethod
    def split(cls, a, work):
        """The pair of the float64 array ``a`` (``work``: a float64 scratch of its shape),
        a slice of about 1 MB at a time so that ``a`` is read from the cache, not memory."""
        hi, lo = np.empty(a.shape, np.float32), np.empty(a.shape, np.float32)
        step = max(1, (1 << 17) // max(1, a[0].size))
        for start in range(0, len(a), step):
            part = slice(start, start + step)
            hi[part] = a[part]
            lo[part] = np.subtract(a[part], hi[part], out=work[part])
        return cls(hi, lo)

    def __len__(self):
        return len(self.hi)

    def float64(self, out):
        """``hi + lo`` in float64, written into ``out`` (an array of the same shape)."""
        return np.add(self.hi, self.lo, out=out, dtype=np.float64)

    @classmethod
    def concatenate(cls, pairs):
        return cls(np.concatenate([q.hi for q in pairs]), np.concatenate([q.lo for q in pairs]))


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


def check_attention_mask(mask, n_tokens):
    """The attention mask as a boolean ``(n_tokens, n_tokens)`` array, or ``None``.

    ``mask`` is ``None`` (every token attends to every token), ``"causal"`` (token ``i`` to the
    tokens ``j <= i``) or an array of shape ``(n_tokens, n_tokens)`` of 0/1 or booleans whose
    row ``i`` marks the keys query ``i`` may attend to; every row must allow at least one key.
    """
    if mask is None:
        return None
    if isinstance(mask, str):
        if mask != "causal":
            raise ValueError(f"`mask` must be None, 'causal' or an array of shape (n_tokens, "
                             f"n_tokens) of 0/1. Got {mask!r} instead.")
        return np.tril(np.ones((n_tokens, n_tokens), dtype=bool))
    array = np.asarray(mask)
    if array.shape != (n_tokens, n_tokens):
        raise ValueError(f"`mask` as an array must have shape (n_tokens, n_tokens) = "
                         f"({n_tokens}, {n_tokens}). Got shape {array.shape} instead.")
    if array.dtype != bool:
        if not np.issubdtype(array.dtype, np.number) or not np.all(
                (array == 0) | (array == 1)):
            raise ValueError("`mask` as an array must hold only 0 and 1 (or booleans): 1 where "
                             "a query may attend to a key.")
        array = array == 1
    empty = np.flatnonzero(~array.any(axis=1))
    if empty.size:
        raise ValueError(f"Every row of `mask` must allow at least one key; rows {empty[:5]} "
                         "allow none.")
    return array.copy()


def alibi_bias(n_tokens, slope):
    """The ALiBi logit bias of one head: ``b_ij = -slope * |i - j|``, shape ``(n_tokens,
    n_tokens)``.

    Added to the attention logits it penalises distant keys linearly (Press, Smith & Lewis,
    "Train short, test long", ICLR 2022). With ``mask="causal"`` the visible keys ``j <= i``
    get ``-slope * (i - j)``, the decoders' form; without a mask the bias is symmetric.

    Parameters
    ----------
    n_tokens : int
        Tokens per sequence ``n``.
    slope : float
        The head's slope ``m >= 0`` (decoders use ``2^(-8 h / H)`` for head ``h`` of ``H``).

    Returns
    -------
    bias : ndarray of shape (n_tokens, n_tokens)

    Examples
    --------
    >>> from sklearn_ebound.datasets import alibi_bias
    >>> alibi_bias(3, 0.5)
    array([[ 0. , -0.5, -1. ],
           [-0.5,  0. , -0.5],
           [-1. , -0.5,  0. ]])
    """
    if isinstance(slope, bool) or not isinstance(slope, Real) or not np.isfinite(slope) or (
            slope < 0):
        raise ValueError(f"The ALiBi `slope` must be a finite real >= 0 (the bias is -slope * "
                         f"|i - j|). Got {slope!r} instead.")
    if isinstance(n_tokens, bool) or not isinstance(n_tokens, (int, np.integer)) or n_tokens < 1:
        raise ValueError(f"`n_tokens` must be a positive integer. Got {n_tokens!r} instead.")
    positions = np.arange(n_tokens)
    # 0 - m |i - j|: no negative zeros on the diagonal
    return 0.0 - float(slope) * np.abs(positions[:, None] - positions[None, :]).astype(np.float64)


class AttentionPattern(NamedTuple):
    """A checked attention pattern: what the attention of a query does besides the kernel.

    ``allowed``: boolean ``(n, n)`` keys (``None``: all); ``weights``: the float ``(n, n)``
    weights of a weighted mask (``None`` for 0/1); ``normalization``: ``"mean"`` or
    ``"none"``; ``bias``: the float ``(n, n)`` logit bias (``None`` for none).
    """

    allowed: object = None
    weights: object = None
    normalization: str = "mean"
    bias: object = None

    @property
    def plain(self):
        """Whether every query averages uniformly over all the keys (no pattern at all)."""
        return (self.allowed is None and self.weights is None and self.bias is None
                and self.normalization == "mean")

    def keys(self, valid, n_tokens):
        """Boolean ``(b, n, n)`` keys with the padding ``valid`` (see :func:`allowed_keys`);
        all-true rather than ``None`` where the pattern has weights or a bias."""
        allowed = allowed_keys(self.allowed, valid, n_tokens)
        if allowed is None and not self.plain:
            allowed = np.ones((1, n_tokens, n_tokens), dtype=bool)
        return allowed


def _check_mask_weights(mask, n_tokens, normalization, attention):
    """The allowed keys and the weights (``None`` for 0/1) of ``mask``."""
    if mask is None or isinstance(mask, str):
        return check_attention_mask(mask, n_tokens), None
    array = np.asarray(mask)
    binary = array.dtype == bool or (np.issubdtype(array.dtype, np.number) and np.all(
        (array == 0) | (array == 1)))
    if binary or array.shape != (n_tokens, n_tokens) or not np.issubdtype(
            array.dtype, np.number):
        return check_attention_mask(mask, n_tokens), None  # 0/1, or the 0/1 form's errors
    if attention != "linear":
        raise ValueError("`mask` with weights other than 0 and 1 applies to attention='linear'. "
                         "For softmax attention add their logarithm to the logits instead: "
                         "`logit_bias=np.log(weights)` (with `mask` the 0/1 pattern of their "
                         "non-zero entries).")
    if not np.all(np.isfinite(array)) or np.any(array < 0):
        raise ValueError("`mask` as an array of weights must be finite and non-negative (row i: "
                         "the weight of key j for query i; 0 where i does not attend to j).")
    if normalization is None:
        raise ValueError(
            "`mask` holds weights other than 0 and 1: say how each row is used with "
            "`mask_normalization='mean'` (a weighted average over the visible keys, a_ij = m_ij "
            "/ sum_k m_ik) or `mask_normalization='none'` (the weights as given, e.g. 1/n on "
            "j <= i for the unnormalised causal convention).")
    allowed = check_attention_mask(array > 0, n_tokens)
    return allowed, np.where(allowed, array, 0.0).astype(np.float64)


def is_alibi(logit_bias):
    """Whether ``logit_bias`` has the form ``("alibi", slope)`` (whatever its words)."""
    return (isinstance(logit_bias, tuple) and len(logit_bias) == 2
            and isinstance(logit_bias[0], str))


def check_logit_bias(logit_bias, n_tokens, attention="softmax"):
    """``logit_bias`` as a float ``(n_tokens, n_tokens)`` array, or ``None``; see
    :func:`check_attention_pattern`."""
    if logit_bias is None:
        return None
    if attention != "softmax":
        raise ValueError(f"`logit_bias` is added to the logits of softmax attention; it applies "
                         f"to attention='softmax'. Got attention={attention!r} (weight the keys "
                         "of linear attention with a weighted `mask` instead).")
    if is_alibi(logit_bias):
        if logit_bias[0] != "alibi":
            raise ValueError(f"`logit_bias` as a pair must be ('alibi', slope). Got "
                             f"{logit_bias!r} instead.")
        return alibi_bias(n_tokens, logit_bias[1])
    if isinstance(logit_bias, str):
        raise ValueError(f"`logit_bias` must be None, an array of shape (n_tokens, n_tokens) or "
                         f"('alibi', slope). Got {logit_bias!r} instead.")
    array = np.asarray(logit_bias)
    if array.shape != (n_tokens, n_tokens) or not np.issubdtype(array.dtype, np.number) or (
            np.issubdtype(array.dtype, np.complexfloating)):
        raise ValueError(f"`logit_bias` as an array must be real with shape (n_tokens, n_tokens) "
                         f"= ({n_tokens}, {n_tokens}). Got a {array.dtype} array of shape "
                         f"{array.shape} instead.")
    if not np.all(np.isfinite(array)):
        raise ValueError("`logit_bias` must be finite; keys a query must not see are set by "
                         "`mask` (0 there), not by an infinite bias.")
    return array.astype(np.float64)


def check_attention_pattern(mask, n_tokens, attention, mask_normalization=None,
                            logit_bias=None):
    """The checked :class:`AttentionPattern` of ``mask``, ``mask_normalization`` and
    ``logit_bias``.

    * ``mask``: ``None``, ``"causal"``, an ``(n, n)`` array of 0/1, or, for linear attention,
      of non-negative weights ``m_ij`` (zero: not a key; every row needs a positive one).
    * ``mask_normalization`` (linear attention): ``"mean"`` (``None``, the default, means it
      for 0/1 masks) divides row ``i`` by its sum, ``a_ij = m_ij / sum_k m_ik`` (``1 / |K_i|``
      for 0/1, ``1 / n`` without a mask); ``"none"`` uses the weights as given, ``a_ij =
      m_ij`` (for ``"causal"`` and ``None``, the plain sums over the keys). Weights other than
      0/1 must state it. For softmax only ``None`` and ``"mean"`` (the softmax normalises).
    * ``logit_bias`` (softmax attention): ``None``, a finite ``(n, n)`` array added to every
      sequence's (scaled) logits, or ``("alibi", slope)``, the array of :func:`alibi_bias`.
    """
    if mask_normalization is not None and mask_normalization not in MASK_NORMALIZATIONS:
        raise ValueError(f"`mask_normalization` must be None, 'mean' or 'none'. Got "
                         f"{mask_normalization!r} instead.")
    if attention == "softmax" and mask_normalization == "none":
        raise ValueError("`mask_normalization='none'` applies to attention='linear': the softmax "
                         "normalises each row of weights itself.")
    allowed, weights = _check_mask_weights(mask, n_tokens, mask_normalization, attention)
    bias = check_logit_bias(logit_bias, n_tokens, attention)
    return AttentionPattern(allowed, weights, mask_normalization or "mean", bias)


def base_weights(pattern, allowed):
    """The attention weights at a zero kernel, ``(b, n, n)``, and the queries that have a key,
    ``(b, n)``: the normalised mask weights of linear attention, ``softmax(b_i)`` over the keys
    for a logit bias, uniform over the allowed keys otherwise. A query without a key
    (padding) has a row of zeros."""
    if pattern.bias is not None:
        queries = allowed.any(axis=-1)
        logits = np.where(allowed, pattern.bias, -np.inf)
        top = np.max(logits, axis=-1, keepdims=True)
        weights = np.exp(logits - np.where(np.isfinite(top), top, 0.0))
        total = weights.sum(axis=-1, keepdims=True)
        return np.divide(weights, total, out=np.zeros_like(weights), where=total > 0), queries
    if pattern.weights is None and pattern.normalization == "mean":
        return uniform_weights(allowed)
    raw = allowed * (1.0 if pattern.weights is None else pattern.weights)
    queries = allowed.any(axis=-1)
    if pattern.normalization == "none":
        return raw, queries
    total = raw.sum(axis=-1, keepdims=True)
    return np.divide(raw, total, out=np.zeros(raw.shape), where=total > 0), queries


def check_lengths(lengths, n_samples, n_tokens):
    """Per-sequence lengths as an int array of shape ``(n_samples,)`` in ``[1, n_tokens]``, or
    ``None``."""
    if lengths is None:
        return None
    array = np.asarray(lengths)
    if array.shape != (n_samples,) or not np.issubdtype(array.dtype, np.integer):
        if array.shape == (n_samples,) and np.issubdtype(array.dtype, np.floating) and np.all(
                array == np.round(array)):
            array = array.astype(np.intp)
        else:
            raise ValueError(f"`lengths` must be an array of {n_samples} integers (one per "
                             f"sequence). Got {array.dtype} array of shape {array.shape}.")
    if array.size and (array.min() < 1 or array.max() > n_tokens):
        raise ValueError(f"`lengths` must lie in [1, n_tokens={n_tokens}]. Got values from "
                         f"{array.min()} to {array.max()}.")
    return array.astype(np.intp)


def valid_tokens(lengths, n_tokens):
    """Boolean ``(n_samples, n_tokens)``: the tokens that are not padding (``None`` for none)."""
    if lengths is None:
        return None
    return np.arange(n_tokens)[None, :] < np.asarray(lengths)[:, None]


def allowed_keys(mask, valid, n_tokens):
    """Boolean ``(b, n, n)`` (``b = 1`` without padding): key ``j`` allowed for query ``i``.

    ``mask`` is a checked mask (``None`` or boolean ``(n, n)``), ``valid`` the non-padding
    tokens ``(b, n)`` or ``None``. ``None`` when every token attends to every token.
    """
    if mask is None and valid is None:
        return None
    allowed = np.ones((1, n_tokens, n_tokens), dtype=bool) if mask is None else mask[None]
    if valid is not None:
        allowed = allowed & valid[:, :, None] & valid[:, None, :]
    return allowed


def uniform_weights(allowed):
    """Uniform attention weights over the allowed keys, ``(b, n, n)``, and the queries that
    have a key, ``(b, n)``. A query without one (padding) has a row of zeros."""
    counts = allowed.sum(axis=-1)
    weights = np.zeros(allowed.shape)
    np.divide(allowed, counts[..., None], out=weights, where=counts[..., None] > 0)
    return weights, counts > 0


def softmax_weights(X, A, allowed, bias=None):
    """Softmax weights ``a_ij ∝ exp(x_iᵀ Aᵀ x_j + b_ij)`` over the allowed keys (zero
    elsewhere); ``bias`` the ``(n, n)`` logit bias, or ``None``."""
    logits = (X @ A.T) @ X.transpose(0, 2, 1)
    if bias is not None:
        logits += bias
    if allowed is not None:
        logits = np.where(allowed, logits, -np.inf)
    top = np.max(logits, axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    weights = np.exp(logits - top)
    total = weights.sum(axis=-1, keepdims=True)
    return np.divide(weights, total, out=np.zeros_like(weights), where=total > 0)


def _apply_moments(X, Z, weights, centred):
    """``r_i = S_i z_i`` for every token: ``S_i`` the ``weights``-weighted second moment of
    the keys (their covariance if ``centred``); ``weights=None`` means uniform over all.

    With weights, ``r_i = sum_k a_ik (x_kᵀ z_i) x_k - x̄_i sum_k a_ik (x_kᵀ z_i)`` costs
    ``O(n^2 d)`` per sequence; without, ``Z S`` costs ``O(n d^2)``.
    """
    if weights is None:
        Xc = X - X.mean(axis=1, keepdims=True) if centred else X
        return Z @ (Xc.transpose(0, 2, 1) @ Xc / X.shape[1])
    H = weights * (Z @ X.transpose(0, 2, 1))  # H[i, k] = a_ik x_kᵀ z_i
    R = H @ X
    if centred:
        R -= (weights @ X) * H.sum(axis=-1, keepdims=True)
    return R


def _moment_products(X, weights, M, centred):
    """``sum_s sum_i S_i M S_i`` (``d x d``) over a block of sequences.

    ``S_i = Xᵀ E_i X`` with ``E_i = diag(a_i) - c a_i a_iᵀ`` (``c = 1`` when centred), so the
    sum is ``Xᵀ K X`` with ``K = sum_i E_i H E_i`` and ``H = X M Xᵀ``, in ``O(n^3)`` per
    sequence: ``K = H ∘ (Aᵀ A) - c (Bᵀ A + Aᵀ B) + c Aᵀ diag(q) A`` with ``B = A ∘ (H Aᵀ)ᵀ``
    and ``q`` the row sums of ``B`` (``A`` the weights).
    """
    n = X.shape[1]
    if weights is None:
        Xc = X - X.mean(axis=1, keepdims=True) if centred else X
        S = Xc.transpose(0, 2, 1) @ Xc / n
        return n * (S @ M @ S).sum(axis=0)
    H = (X @ M) @ X.transpose(0, 2, 1)
    Wt = weights.transpose(0, 2, 1)
    K = H * (Wt @ weights)
    if centred:
        B = weights * (H @ Wt).transpose(0, 2, 1)
        BtA = B.transpose(0, 2, 1) @ weights
        K -= BtA + BtA.transpose(0, 2, 1)
        K += Wt @ (B.sum(axis=-1, keepdims=True) * weights)
    return np.einsum("bia,bij,bjc->ac", X, K, X, optimize=True)


def own_share_energy(pattern, n_tokens):
    """``2 E[a_ii^2]`` over the queries of a checked :class:`AttentionPattern` (``a_ii`` the
    query's own share of its normalised weights at a zero kernel), each query weighted as
    :func:`per_token_data` weights its row (``|K_i| / n``): the relative energy of the
    per-token operator's systematic term, ``2 / n^2`` without a mask (see
    :func:`._rank_rules.short_sequence_caveat`). A causal mask's first queries see few keys,
    so their own share is large: ``0.025`` at ``n = 24``, against ``0.0035`` unmasked."""
    allowed = pattern.keys(None, n_tokens)
    if allowed is None:
        return 2.0 / n_tokens**2
    weights, queries = base_weights(pattern, allowed)
    weights, queries = weights[0], np.broadcast_to(queries, (1, n_tokens))[0]
    total = weights.sum(axis=-1)
    squares = np.maximum((weights**2).sum(axis=-1), np.finfo(float).tiny)
    counts = total**2 / squares  # the effective number of keys, |K_i| for 0/1
    own = np.divide(np.diagonal(weights), total, out=np.zeros(n_tokens), where=total > 0)
    row = np.where(queries, counts / n_tokens, 0.0)
    return float(2.0 * np.sum(row * own**2) / max(np.sum(row), np.finfo(float).tiny))


def per_token_data(X, Y, center_sequences, mask=None, lengths=None):
    """Tokens as samples: ``(N n, d)`` and ``(N n, d_out)``, optionally centred per sequence.

    With a mask or padding (``mask`` a checked boolean mask or :class:`AttentionPattern`,
    ``lengths`` per sequence): the padding tokens are left out, the inputs are centred over
    each token's allowed keys (``x_i - x̄_i``, which is uncorrelated with ``x̄_i``, the
    softmax's zeroth-order term), and each token's row is weighted by ``sqrt(|K_i| / n)``: the
    token's own share ``1 / |K_i|`` of its moment is a systematic term, which the weights keep
    near that of ``n`` keys.

    With weights ``a_ij`` at the zero kernel (:func:`base_weights`: a weighted mask, a logit
    bias) ``|K_i|`` is the effective count ``c_i^2 / sum_j a_ij^2`` (``c_i = sum_j a_ij``);
    linear attention's input is ``c_i x_i`` (``y_i ~ c_i V Sigma Wᵀ x_i`` for unnormalised
    weights), and a logit bias's centring is ``x_i - t_i x̄_i`` with ``t_i = a_ii / sum_j
    a_ij^2``, uncorrelated with ``x̄_i`` (``t_i = 1`` for uniform weights).
    """
    n = X.shape[1]
    pattern = mask if isinstance(mask, AttentionPattern) else AttentionPattern(mask)
    allowed = pattern.keys(valid_tokens(lengths, n), n)
    if allowed is None:
        if center_sequences:
            X = X - X.mean(axis=1, keepdims=True)
            Y = Y - Y.mean(axis=1, keepdims=True)
        return X.reshape(-1, X.shape[2]), Y.reshape(-1, Y.shape[2])
    weights, queries = base_weights(pattern, allowed)
    if pattern.weights is None and pattern.bias is None and pattern.normalization == "mean":
        if center_sequences:
            X = X - weights @ X
        counts = np.broadcast_to(allowed.sum(axis=-1), queries.shape)
    else:
        weights = np.broadcast_to(weights, (X.shape[0], n, n))
        total = weights.sum(axis=-1)
        squares = np.maximum((weights**2).sum(axis=-1), np.finfo(float).tiny)
        counts = total**2 / squares
        if center_sequences:
            share = np.diagonal(weights, axis1=-2, axis2=-1) / squares
            X = X - share[..., None] * (weights @ X)
        else:
            X = X * total[..., None]
    root = np.sqrt(counts / n)[..., None]
    keep = np.broadcast_to(queries, X.shape[:2])
    return (X * root)[keep], (Y * root)[keep]


class KernelMoments:
    """Sufficient statistics of the query–key kernel least squares, added sequence by sequence.

    With ``A = Wᵀ`` and ``M_i = V S_i`` (``S_i`` the second moment of the keys token ``i``
    may attend to, centred for ``attention="softmax"``), every token obeys ``y_i = M_i A x_i``.
    The normal equations of ``vec(A)`` are ``G vec(A) = b`` with ``G = sum_i T_i ⊗ P_i``,
    ``T_i = S_i Vᵀ V S_i``, ``P_i = x_i x_iᵀ`` and ``b = sum_i vec(S_i Vᵀ y_iᵀ x_i)``.

    Two solvers, chosen by size (``solver="auto"``):

    * ``"dense"``: ``T_i`` and ``P_i`` are symmetric, so ``G[(a, b), (a', b')] =
      C[ab(a, a'), ab(b, b')]`` with ``C = sum_i vech(T_i) vech(P_i)ᵀ``, a ``d(d+1)/2``-square
      matrix accumulated by one GEMM per chunk of sequences (without a mask all the tokens of
      a sequence share ``T_s``: one row per sequence). Memory ``d^4 / 4`` floats, independent of
      the number of sequences; used up to ``d = 48`` without a mask.
    * ``"cg"``: matrix-free conjugate gradients. ``G vec(A)`` is applied through per-sequence
      products (``z_i = A x_i``, then ``S_i z_i``, ``Vᵀ V``, ``S_i`` again and ``sum_i
      (.) x_iᵀ``), ``O(n^2 d + n d^2)`` per sequence with a mask, ``O(n d^2)`` without, and
      preconditioned by the Kronecker product of the means. It keeps the sequences (the data's
      own ``N n d`` floats) and ``O(d^2)`` besides, so any width runs. Without a mask, linear
      attention keeps each sequence's moment ``S_s`` instead when ``d <= n`` (a product: three
      GEMMs of ``N d^3``), and ``T_s`` beside it when ``2 d <= n`` (two GEMMs, still no more
      memory than the sequences). On kept moments the conjugate gradients run their products
      in float32 on float32 copies made for the solve (half the kept moments' memory, about
      half the time) and test their stops on float64 residuals (iterative refinement), so
      the solution is that of float64 iterations (see
      :func:`._conjugate_gradients.refined_conjugate_gradients`).

    For softmax the sequences are kept in either case, and the linearised solve is refined by
    Gauss–Newton steps on the softmax model (the same matrix-free products with the fitted
    weights in place of uniform ones).

    A weighted mask (linear, ``mask_normalization``) or a logit bias (softmax,
    ``logit_bias``), see :func:`check_attention_pattern`, replaces the uniform weights over
    the allowed keys by the base weights of :func:`base_weights` (``S_i = sum_j a_ij x_j
    x_jᵀ``, centred under ``softmax(b_i)`` for a bias); both solvers take them as they take
    a 0/1 mask's (``"auto"`` chooses ``"cg"``).
    """

    def __init__(self, V, attention, scale=1.0, mask=None, solver="auto", refine=True,
                 mask_normalization=None, logit_bias=None):
        self.V = np.asarray(V, dtype=np.float64)
        self.attention = attention
        # X and Y enter divided by this power of two (exact), so that the statistics, cubic and
        # quartic in X, stay finite for extreme data; they are those of the scaled data.
        self.scale = scale
        # None, "causal", an (n, n) array of 0/1 or (linear) of weights, and a logit bias
        # (softmax); checked at the first update (check_attention_pattern). The bias is in
        # the units of the logits, which the power-of-two scaling leaves unchanged.
        self.mask = mask
        self.mask_normalization = mask_normalization
        self.logit_bias = logit_bias
        self.solver = solver
        self.refine = refine
        d = self.V.shape[1]
        self.rows, self.cols = np.triu_indices(d)
        self.C = None
        self.rhs = np.zeros((d, d))
        self.P_sum = np.zeros((d, d))
        self.T_sum = np.zeros((d, d))  # sum over tokens of T_i
        self.y_energy = 0.0
        self.n_sequences = 0
        self.n_queries = 0  # tokens that attend to at least one key
        # Equations the data give on the kernel: query i constrains only ``V S_i A x_i``, at
        # most min(rank V, rank S_i) numbers (rank S_i <= |K_i|, less one when centred).
        self.n_equations = 0
        self.n_tokens = None
        self.n_targets = self.V.shape[0]
        self.blocks = []  # kept sequences: (X, Y or None, valid or None), scaled
        # Without a mask, linear attention's normal operator needs only each sequence's
        # moment S_s (T_s = S_s M S_s, P_s = n S_s): kept instead of X_s when d <= n. When
        # 2 d <= n, T_s is kept beside it (``square_blocks``, block by block), so that a product
        # takes two GEMMs of N d^3 instead of three, in no more memory than the sequences.
        self.moment_blocks = []
        self.square_blocks = []
        self._identity = (self.V.shape[0] == d and np.array_equal(self.V, np.eye(d)))
        self.value_rank = d if self._identity else int(np.linalg.matrix_rank(self.V))

    @property
    def centred(self):
        return self.attention == "softmax"

    @property
    def keeps_data(self):
        return self.C is None or (self.centred and self.refine)

    @property
    def _keeps_moments(self):
        return self.C is None and not self.centred and self.V.shape[1] <= self.n_tokens

    @property
    def _keeps_squares(self):
        # S_s and T_s together take 2 d^2 floats a sequence: no more than its n d when 2 d <= n.
        return self._keeps_moments and 2 * self.V.shape[1] <= self.n_tokens

    def _start(self, n_tokens):
        self.n_tokens = n_tokens
        self._pattern = check_attention_pattern(self.mask, n_tokens, self.attention,
                                                self.mask_normalization, self.logit_bias)
        # The allowed keys; all-true where only weights or a bias shape the attention, so
        # that every path below takes the per-token moments of the base weights.
        self._mask = self._pattern.keys(None, n_tokens)
        self._mask = None if self._mask is None else self._mask[0]
        d = self.V.shape[1]
        solver = self.solver
        if solver == "auto":
            # The dense route's one-off factorisation (d^6 / 3 flops) stays below a few CG
            # passes over the sequences up to d = 48.
            solver = "dense" if (d <= 48 and self._mask is None) else "cg"
        if solver == "dense":
            m = len(self.rows)
            self.C = np.zeros((m, m))

    def update(self, X, Y, lengths=None):
        """Add sequences ``X (b, n, d)``, ``Y (b, n, d_out)`` (``lengths`` of the padded ones,
        or ``None``); returns ``self``."""
        if self.n_tokens is None:
            self._start(X.shape[1])
        elif X.shape[1] != self.n_tokens:
            raise ValueError(f"All sequences must have {self.n_tokens} tokens. Got {X.shape[1]}.")
        lengths = check_lengths(lengths, X.shape[0], X.shape[1])
        VtV = self.V.T @ self.V
        work = {}  # work arrays of the chunks' statistics, reused from chunk to chunk
        for start in range(0, X.shape[0], _CHUNK):
            Xb, Yb = X[start:start + _CHUNK], Y[start:start + _CHUNK]
            valid = None if lengths is None else valid_tokens(lengths[start:start + _CHUNK],
                                                              X.shape[1])
            allowed = allowed_keys(self._mask, valid, X.shape[1])
            n, d = X.shape[1], X.shape[2]
            if (allowed is None and not self.centred and (self.C is not None or n >= d)
                    and 2.0**-60 <= self.scale <= 2.0**60):
                # Linear attention's moments of a chunk that is not kept: the statistics of the
                # raw chunk, divided by scale^2 (a power of two, exact), equal those of the
                # scaled one, without its copy; at this scale none can overflow.
                self._add_unmasked(Xb, Yb, VtV, 1.0 / self.scale**2, work)
                self.n_sequences += len(Xb)
                continue
            Xb, Yb = Xb / self.scale, Yb / self.scale  # also a copy that the caller cannot alter
            if allowed is None and self.C is None and n < d:
                # Wide tokens: the products through the n x n token Gram (O(n^2 d)) are
                # cheaper than through the d x d moments (O(d^3)).
                self._add_masked(Xb, Yb, np.ones((1, n, n), dtype=bool), VtV)
            elif allowed is None:
                self._add_unmasked(Xb, Yb, VtV, work=work)
            else:
                self._add_masked(Xb, Yb, allowed, VtV)
            self.n_sequences += len(Xb)
            if self.keeps_data and not (allowed is None and self._keeps_moments):
                self.blocks.append((Xb, Yb if self.centred else None, valid))
        return self

    def _add_unmasked(self, Xb, Yb, VtV, factor=1.0, work=None):
        """``factor``: the statistics' second-order scaling (``1 / scale^2`` for a raw chunk of
        linear attention, whose statistics are all quadratic in the data). ``work``: a dict of
        work arrays reused from chunk to chunk (fresh temporaries of megabytes each cost the
        kernel's page faults, as much as the products themselves)."""
        work = {} if work is None else work
        b, n, d = Xb.shape
        kept = self._keeps_moments  # then S_s is kept, as a float32 pair
        P = np.matmul(Xb.transpose(0, 2, 1), Xb,  # sum_i x_i x_iᵀ
                      out=_work_array(work, "P", (b, d, d)))
        if factor != 1.0:
            P *= factor
        self.P_sum += P.sum(axis=0)
        if self.centred:
            # Around uniform weights the output is V x̄ plus a term linear in the centred
            # moment: y_i - V x̄ = V C A x_i.
            means = Xb.mean(axis=1, keepdims=True)
            Yb = Yb - means @ self.V.T
            Xcb = Xb - means
            S = Xcb.transpose(0, 2, 1) @ Xcb / n  # mixing moment of each sequence
        elif kept:
            S = P
            S /= n
        else:
            S = np.divide(P, n, out=_work_array(work, "S", (b, d, d)))
        stacked = S.reshape(-1, d)  # [S_1; ...; S_b], and its transpose [S_1 ... S_b]
        if kept:
            self.moment_blocks.append(_Float32Pair.split(S, _work_array(work, "S", S.shape)))
        if self.C is None and self._identity and not self._keeps_squares:
            # sum_s S_s S_s = [S_1; ...; S_b]ᵀ [S_1; ...; S_b]: one GEMM, no T_s kept.
            self.T_sum += n * (stacked.T @ stacked)
        else:
            T = _work_array(work, "T", (b, d, d))
            if self._identity:
                T = np.matmul(S, S, out=T)
            else:
                T = np.matmul(np.matmul(S, VtV, out=_work_array(work, "SM", (b, d, d))), S,
                              out=T)
            self.T_sum += n * T.sum(axis=0)
            if self._keeps_squares:
                self.square_blocks.append(_Float32Pair.split(T, _work_array(work, "S",
                                                                            T.shape)))
            if self.C is not None:
                _accumulate_outer(self.C, T[:, self.rows, self.cols], P[:, self.rows, self.cols])
        # sum_s b_s = sum_s S_s Vᵀ Y_sᵀ X_s = [S_1 ... S_b] [Vᵀ Y_1ᵀ X_1; ...]: one GEMM.
        YtX = np.matmul(Yb.transpose(0, 2, 1), Xb,
                        out=_work_array(work, "YtX", (b, Yb.shape[2], d)))
        if factor != 1.0:
            YtX *= factor
        if not self._identity:
            YtX = np.matmul(self.V.T, YtX, out=_work_array(work, "VtYtX", (b, d, d)))
        self.rhs += stacked.T @ YtX.reshape(-1, d)
        self.y_energy += factor * float(np.vdot(Yb, Yb))
        self.n_queries += b * n
        self.n_equations += b * n * min(self.value_rank, n - self.centred)

    def _base_weights(self, allowed):
        """The weights at a zero kernel and the queries with a key (:func:`base_weights`)."""
        return base_weights(self._pattern, allowed)

    def _add_masked(self, Xb, Yb, allowed, VtV):
        weights, queries = self._base_weights(allowed)
        queries = np.broadcast_to(queries, Xb.shape[:2])
        Xq = Xb * queries[..., None]  # the queries' x_i; padding rows zero
        if self.centred:
            Yb = Yb - (weights @ Xb) @ self.V.T
        Yb = Yb * queries[..., None]
        R = _apply_moments(Xb, Yb @ self.V, weights, self.centred)
        self.rhs += R.reshape(-1, R.shape[2]).T @ Xq.reshape(-1, Xq.shape[2])
        self.P_sum += Xq.reshape(-1, Xq.shape[2]).T @ Xq.reshape(-1, Xq.shape[2])
        self.T_sum += _moment_products(Xb, weights, VtV, self.centred)
        self.y_energy += float(np.sum(Yb**2))
        self.n_queries += int(queries.sum())
        counts = np.broadcast_to(allowed.sum(axis=-1), queries.shape)
        self.n_equations += int(np.clip(np.minimum(self.value_rank, counts - self.centred), 0,
                                        None).sum())
        if self.C is not None:
            self._add_dense_per_token(Xb, Xq, weights, VtV)

    def _add_dense_per_token(self, Xb, Xq, weights, VtV):
        """Rows ``vech(T_i)``, ``vech(P_i)`` of every token into ``C`` (a mask: ``T_i`` differs
        from token to token)."""
        n, d = Xb.shape[1], Xb.shape[2]
        weights = np.broadcast_to(weights, (Xb.shape[0], n, n))
        step = max(1, _BLOCK_VALUES // (n * d * d))
        for s in range(0, Xb.shape[0], step):
            X, Wt = Xb[s:s + step], weights[s:s + step]
            S = np.einsum("bij,bjk,bjl->bikl", Wt, X, X, optimize=True)
            if self.centred:
                means = Wt @ X
                S -= means[..., :, None] * means[..., None, :]
            T = (S @ VtV @ S).reshape(-1, d, d)
            P = (Xq[s:s + step, :, :, None] * Xq[s:s + step, :, None, :]).reshape(-1, d, d)
            _accumulate_outer(self.C, T[:, self.rows, self.cols], P[:, self.rows, self.cols])

    def merge(self, other):
        """Add the statistics of other sequences, in place; returns ``self``."""
        if other.n_sequences == 0:
            return self
        if other.scale != self.scale:
            raise ValueError("Cannot merge kernel statistics of data scaled differently.")
        if self.n_tokens is not None and other.n_tokens != self.n_tokens:
            raise ValueError(f"All sequences must have {self.n_tokens} tokens. Got "
                             f"{other.n_tokens}.")
        if self.n_tokens is None:
            self._start(other.n_tokens)
        if not _same_pattern(self._pattern, other._pattern):
            raise ValueError("Cannot merge kernel statistics of different attention patterns "
                             "(mask, mask_normalization, logit_bias).")
        if (self.C is None) != (other.C is None):
            raise ValueError("Cannot merge kernel statistics of different solvers.")
        if self.C is not None:
            self.C += other.C
        self.rhs += other.rhs
        self.P_sum += other.P_sum
        self.T_sum += other.T_sum
        self.y_energy += other.y_energy
        self.n_sequences += other.n_sequences
        self.n_queries += other.n_queries
        self.n_equations += other.n_equations
        self.blocks += other.blocks
        self.moment_blocks += other.moment_blocks
        self.square_blocks += other.square_blocks
        return self

    # --- the dense and compressed solves ------------------------------------------------------

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

    def _preconditioner(self, T_sum):
        """``(T ⊗ P / n_queries)^{-1}``: the Kronecker product of the means, inverted."""
        Tinv = np.linalg.pinv(T_sum, hermitian=True)
        Pinv = np.linalg.pinv(self.P_sum, hermitian=True)
        N = self.n_queries
        return lambda R: N * (Tinv @ R @ Pinv)

    def _solve_iteratively(self, tol=1e-10, max_iter=500):
        """Conjugate gradients on ``G vec(A) = b`` from the compressed ``C``."""
        index = self._index()
        A, _, self._products = conjugate_gradients(
            lambda A: self._matvec(A, index), self.rhs, self._preconditioner(self.T_sum), tol,
            max_iter)
        return A

    def _dense_solve(self):
        d = self.rhs.shape[0]
        G = self.normal_matrix()
        self._factor = None
        try:  # G is positive definite whenever the data determine the kernel
            factor = scipy.linalg.cho_factor(G, lower=True, check_finite=False)
            A = scipy.linalg.cho_solve(factor, self.rhs.ravel(), check_finite=False)
            if np.all(np.isfinite(A)):
                self._factor = factor  # reused for the noise along directions near the cut
                return A.reshape(d, d)
        except np.linalg.LinAlgError:
            pass
        return np.linalg.lstsq(G, self.rhs.ravel(), rcond=None)[0].reshape(d, d)

    # --- the matrix-free passes over the kept sequences ----------------------------------------

    def _consolidate(self):
        """Merge the kept chunks (``partial_fit`` may send tiny ones) into blocks of about
        ``_BLOCK_VALUES`` floats of per-block temporaries; done once per solve, a group at a
        time, so that at most one block is held twice."""
        n, d = self.n_tokens, self.rhs.shape[0]
        # Sequences per block of moments: blocks of half an update chunk already run the
        # products at full speed, and are left in place (a copy of the kept moments costs
        # about a product, its fresh memory's page faults included).
        step = max(1, min(_BLOCK_VALUES // (d * d), _CHUNK // 2))
        if len(self.moment_blocks) > 1 and min(len(S) for S in self.moment_blocks) < step:
            self.moment_blocks = _regroup(self.moment_blocks, step, _Float32Pair.concatenate)
            if self.square_blocks:  # the same sequences per block as the moments
                self.square_blocks = _regroup(self.square_blocks, step,
                                              _Float32Pair.concatenate)
        size = max(1, _BLOCK_VALUES // (n * max(n, d, self.n_targets)))
        if len(self.blocks) > 1 and min(len(X) for X, _, _ in self.blocks) < size:
            self.blocks = _regroup(self.blocks, size, _concatenate_blocks)

    def _passes(self, A=None):
        """Per block: ``X``, ``Y``, the weights (``None``: uniform over all tokens, else
        ``(b, n, n)``), and the queries ``(b, n)`` or ``None``. ``A``: the softmax weights at
        kernel ``A`` (logits ``x_iᵀ Aᵀ x_j``), else uniform weights over the allowed keys."""
        n, d = self.n_tokens, self.rhs.shape[0]
        cache = getattr(self, "_weights_cache", None)
        if A is not None and (cache is None or cache[0] is not A):
            # The softmax weights at A, kept for the conjugate-gradient passes of one
            # Gauss-Newton step when they take no more than the sequences themselves.
            small = self.n_sequences * n * n <= max(_BLOCK_VALUES, self.n_sequences * n * d)
            cache = self._weights_cache = (A, [] if small else None)
        for index, (X, Y, valid) in enumerate(self.blocks):
            allowed = allowed_keys(self._mask, valid, n)
            if A is not None:
                kept = cache[1]
                if kept is not None and index < len(kept):
                    weights = kept[index]
                else:
                    weights = softmax_weights(X, A, allowed, self._pattern.bias)
                    if kept is not None:
                        kept.append(weights)
                queries = None if allowed is None else allowed.any(axis=-1)
            elif allowed is None:
                # Without a mask, S = Xᵀ X / n (O(n d^2)), or uniform weights (O(n^2 d)).
                weights = None if n >= d else np.full((1, n, n), 1.0 / n)
                queries = None
            else:
                weights, queries = self._base_weights(allowed)
            if queries is not None:
                queries = np.broadcast_to(queries, X.shape[:2])[..., None]
            yield X, Y, weights, queries

    def _normal_apply(self, D, A=None):
        """``G vec(D)`` (the Gauss–Newton matrix at ``A`` for softmax) by per-sequence
        products."""
        out = np.zeros_like(D)
        d, n = D.shape[0], self.n_tokens
        VtV = None if self._identity else self.V.T @ self.V
        work = getattr(self, "_work", None)
        work = {} if work is None else work  # work arrays reused from block to block
        squares = self.square_blocks
        for pair_S, pair_T in zip(self.moment_blocks if squares else (), squares, strict=True):
            # T_s D P_s = n T_s (D S_s) = n [T_1 ... T_b] [D S_1; ...; D S_b] (T_s symmetric):
            # one batched product and one GEMM.
            shape = pair_S.hi.shape
            S = pair_S.float64(_work_array(work, "S64", shape))
            T = pair_T.float64(_work_array(work, "T64", shape))
            U = np.matmul(D, S, out=_work_array(work, "U", shape))
            out += n * (T.reshape(-1, d).T @ U.reshape(-1, d))
        for pair_S in () if squares else self.moment_blocks:  # T_s D P_s = n S_s M S_s D S_s
            # The outer products as two GEMMs over the block ([S_1; ...; S_b] stacked, and its
            # transpose [S_1 ... S_b] since each S_s is symmetric), the middle one batched.
            S = pair_S.float64(_work_array(work, "S64", pair_S.hi.shape))
            stacked = S.reshape(-1, d)
            U = np.matmul(stacked, D.T, out=_work_array(work, "U", S.shape).reshape(-1, d))
            R = np.matmul(S, U.reshape(S.shape).transpose(0, 2, 1),
                          out=_work_array(work, "R", S.shape))  # S_s D S_s
            if VtV is not None:
                R = np.matmul(VtV, R, out=_work_array(work, "U", S.shape))
            out += n * (stacked.T @ R.reshape(-1, d))
        for X, _, weights, queries in self._passes(A):
            R = _apply_moments(X, X @ D.T, weights, self.centred)
            if not self._identity:
                R = R @ (self.V.T @ self.V)
            R = _apply_moments(X, R, weights, self.centred)
            if queries is not None:
                R = R * queries
            out += R.reshape(-1, d).T @ X.reshape(-1, d)
        return out

    def _single_blocks(self):
        """The float32 ``(S, T or None)`` of every kept block (their pairs' ``hi``, no copy),
        for :meth:`_single_apply`."""
        squares = self.square_blocks or [None] * len(self.moment_blocks)
        return [(S.hi, None if T is None else T.hi)
                for S, T in zip(self.moment_blocks, squares, strict=True)]

    def _single_apply(self, D):
        """``G vec(D)`` with float32 products over the float32 kept ``S_s`` (and ``T_s``
        where kept; ``_singles``, set for one solve by :meth:`_single_blocks`), summed in
        float64 over the blocks: the products of :meth:`_normal_apply` at about 1e-7
        relative error, in about half its time."""
        out = np.zeros_like(D)
        d, single = D.shape[0], D.astype(np.float32)
        work = getattr(self, "_work", None)
        work = {} if work is None else work
        VtV = None if self._identity else (self.V.T @ self.V).astype(np.float32)
        for S, T in self._singles:
            U = _work_array(work, "U32", S.shape, np.float32)
            if T is not None:  # n T_s (D S_s)
                np.matmul(single, S, out=U)
                out += T.reshape(-1, d).T @ U.reshape(-1, d)
                continue
            stacked = S.reshape(-1, d)  # n S_s M (S_s D S_s), as in _normal_apply
            np.matmul(stacked, single.T, out=U.reshape(-1, d))
            R = np.matmul(S, U.transpose(0, 2, 1), out=_work_array(work, "R32", S.shape,
                                                                    np.float32))
            if VtV is not None:
                R = np.matmul(VtV, R, out=U)
            out += stacked.T @ R.reshape(-1, d)
        return self.n_tokens * out

    def _softmax_residuals(self, A):
        """Residual energy of the softmax model at ``A``, its gradient side ``b`` (the
        ``J_Aᵀ r``) and ``sum_i T_i`` at ``A``."""
        d = A.shape[0]
        loss, rhs, T_sum = 0.0, np.zeros_like(A), np.zeros_like(A)
        VtV = self.V.T @ self.V
        for X, Y, weights, queries in self._passes(A):
            residual = Y - (weights @ X) @ self.V.T
            if queries is not None:
                residual = residual * queries
            loss += float(np.sum(residual**2))
            R = _apply_moments(X, residual @ self.V, weights, True)
            rhs += R.reshape(-1, d).T @ X.reshape(-1, d)
            T_sum += _moment_products(X, weights, VtV, True)
        return loss, rhs, T_sum

    def _gauss_newton(self, A, span=None, max_steps=30, max_products=100, fraction=1e-2):
        """Least squares of the softmax model from the linearised ``A``: Levenberg–Marquardt
        steps, each solved by preconditioned conjugate gradients.

        The Gauss–Newton matrix ``Jᵀ J`` is singular along kernels the tokens and the value
        map do not determine (few keys per query, ``rank V < d``), and ill-conditioned near
        them, so plain Gauss–Newton steps neither converge in a bounded number of products
        nor stay bounded. Each step solves ``(Jᵀ J + lambda D) step = Jᵀ r`` with ``D`` the
        Kronecker metric ``T ⊗ P / N`` of the preconditioner: the preconditioned operator's
        eigenvalues lie above ``lambda``, and ``lambda`` follows the gain ratio of the steps
        (Nielsen's rule, Madsen, Nielsen & Tingleff 2004, sect. 3.2).

        Stops (converged) when the decrease the Gauss–Newton model still offers, ``gᵀ M g``
        (``g = Jᵀ r``, ``M`` the preconditioner; about the squared ``G``-norm of the kernel's
        error), is below ``fraction^2`` times the noise energy of the least squares, ``sigma^2
        k^2`` (``k^2`` entries on the tokens' span, ``sigma^2`` from the residual), as for the
        linearised solve; or at float64 resolution, where a noise-free fit ends (its residual
        is rounding, and a relative test on it would never pass). Otherwise after
        ``max_steps`` steps of at most ``max_products`` products each (not converged).

        Returns the kernel, its residual energy, ``sum_i T_i`` at it, whether the steps
        converged, the steps taken and the products of the normal operator.
        """
        loss, rhs, T_sum = self._softmax_residuals(A)
        # The decrease left below which the kernel's error is rounding: its relative size
        # 1e3 eps (the residual, which sets the noise level, is floored far above, at 64 eps).
        floor = (1e3 * np.finfo(float).eps) ** 2 * self.y_energy
        N = self.n_queries
        k2 = self.rhs.size if span is None else round(np.trace(span)) ** 2
        tol = fraction**2 * k2 / max(N * self.n_targets - k2, 1)
        damping, growth = 1e-3, 2.0
        converged, steps, products = False, 0, 0
        while steps < max_steps:
            precondition = self._preconditioner(T_sum)
            if float(np.sum(rhs * precondition(rhs))) <= max(tol * loss, floor):
                converged = True
                break
            steps += 1

            def metric(D, T_sum=T_sum):
                return T_sum @ D @ self.P_sum / N

            def apply(D, A=A, damping=damping, metric=metric):
                return self._normal_apply(D, A) + damping * metric(D)

            step, _, used = conjugate_gradients(apply, rhs, precondition, 1e-4, max_products)
            products += used
            if span is not None:
                step = span @ step @ span
            # The decrease the damped linear model predicts: gᵀ step + lambda stepᵀ D step.
            predicted = float(np.sum(rhs * step) + damping * np.sum(step * metric(step)))
            with np.errstate(over="ignore", invalid="ignore"):
                new = self._softmax_residuals(A + step)
            gain = (loss - new[0]) / predicted if predicted > 0 else -1.0
            if np.isfinite(new[0]) and gain > 0:
                A = A + step
                loss, rhs, T_sum = new
                damping *= max(1 / 3, 1 - (2 * gain - 1) ** 3)
                growth = 2.0
            else:
                damping *= growth
                growth *= 2
        self._weights_cache = None
        return A, loss, T_sum, converged, steps, products

    def _local_noise(self, whitened_direction, T_root, P_root, A, tol=1e-4):
        """The noise variance along a direction of the whitened kernel, relative to the
        ``sigma^2`` the Kronecker whitening assumes: ``vec(B)ᵀ G^{-1} vec(B) / N`` with
        ``B = T^{1/2} Z P^{1/2}`` (``Z`` of unit norm; ``A``: the Gauss–Newton point, or
        ``None``). One conjugate-gradient solve."""
        B = T_root @ whitened_direction @ P_root
        factor = getattr(self, "_factor", None)
        if A is None and factor is not None:
            solution = scipy.linalg.cho_solve(factor, B.ravel(), check_finite=False)
            return float(B.ravel() @ solution) / self.n_queries
        if A is None and self.C is not None:
            index = self._index()
            apply = lambda Z: self._matvec(Z, index)  # noqa: E731
            T_sum = self.T_sum
        else:
            apply = lambda Z: self._normal_apply(Z, A)  # noqa: E731
            T_sum = T_root @ T_root
        if A is None and getattr(self, "_singles", None):
            # float32 products (1e-7 relative) are far below the stop's 1e-4 relative error
            apply = self._single_apply
        # The CG iterate Z underestimates Bᵀ G^{-1} B by the error's squared G-norm rᵀ G^{-1} r,
        # which exceeds rz = rᵀ M r by at most the largest noise ratio: about 1 for linear
        # attention (0.98-1.17 measured: Gaussian, causal, vocabulary tokens), 1.2-3.4 for the
        # softmax fit on clean tokens and up to 2e4 saturated (A given). Stopped
        # when rz is below 1e-3 of the estimate over that ratio (a cut off by < 0.1%), or at the
        # residual tol.
        fraction = 1e-4 if A is None else 1e-7
        solution, _, _ = conjugate_gradients(
            apply, B, self._preconditioner(T_sum), tol, 300,
            enough=lambda Z, rz: rz <= fraction * float(np.sum(B * Z)))
        return float(np.sum(B * solution)) / self.n_queries

    def _enough(self, A, rz, fraction=1e-2):
        """Whether the error of the conjugate-gradient iterate ``A`` is below ``fraction`` of
        the noise: its squared ``G``-norm (about ``rz``) under ``fraction^2`` times the noise
        energy ``sigma^2 d^2`` of the least squares, with ``sigma^2`` from the residual of
        ``A`` (``||y||^2 - bᵀ vec(A)``, exact at the solution)."""
        d = A.shape[0]
        dof = max(self.n_queries * self.n_targets - d * d, 1)
        noise = max(self.y_energy - float(np.sum(self.rhs * A)), 0.0) / dof
        return rz <= fraction**2 * noise * d * d

    def solve(self, dense_limit=4096, tol=None):
        """Least-squares kernel, its noise-whitened spectrum and the threshold rank.

        With the dense statistics and up to ``dense_limit`` unknowns the normal matrix is
        factorised directly; beyond, conjugate gradients run on the compressed statistics, or,
        for the matrix-free solver, on the kept sequences: to the relative residual ``tol``
        when given (``1e-13`` agrees with the dense solve to about ``1e-10``), by default until
        the error is below 1% of the noise of the least squares (in the ``G``-norm), which no
        rank reading can tell apart from the exact solve. For
        softmax with the sequences kept, Gauss–Newton steps then fit the softmax model itself.

        The noise of ``Â`` has covariance ``sigma^2 G^{-1}``. Approximating ``G`` by the
        Kronecker product of the means, ``N T̄ ⊗ P̄`` over the ``N`` queries, the kernel
        ``T̄^{1/2} Â P̄^{1/2} sqrt(N)`` carries i.i.d. noise of variance ``sigma^2``, and its
        rank is read with the Gavish–Donoho threshold
        (:func:`._kernel_rank.kernel_threshold_rank`).

        Returns a Bunch with ``kernel`` (``W``, for softmax times the factor ``beta /
        sqrt(d)``), ``whitened`` (the noise-whitened kernel), ``singular_values`` (of
        ``whitened``), ``threshold``, ``rank``, ``noise_variance``, ``logit_rms``
        (root-mean-square of the fitted logits ``x_iᵀ W x_j`` over independent tokens, times
        the softmax factor), ``linearised_logit_rms`` (the same for the linearised solve),
        ``kronecker_rank`` (the count above the uncorrected cut), ``local_noise`` (``{k:
        ratio}``: the noise variance along the singular directions near the cut relative to
        the whitening's assumption; the cut of direction ``k`` is scaled by its square
        root),
        ``converged`` (``False`` where the softmax fit did not converge), ``solver``,
        ``identified`` (whether the data give at least as many equations, ``n_equations``,
        as the kernel on the tokens' span has entries, ``n_unknowns``; without, the softmax
        fit is not refined and the rank is not read from the normal matrix), ``refined``
        (whether Gauss–Newton steps fitted the softmax model), ``gauss_newton_steps``, ``n_products`` (float64 products of the normal operator by a
        ``d x d`` matrix in the conjugate-gradient solves, dense solves aside) and
        ``n_single_products`` (float32 ones, of the refined solve on kept moments).
        """
        if self.n_sequences == 0:
            raise ValueError("No sequences were added.")
        d = self.rhs.shape[0]
        N = self.n_queries
        self._factor = self._singles = None
        self._work = {}  # work arrays of the products, for this solve
        self._products = self._single_products = 0
        if self.C is not None and d * d <= dense_limit:
            A, solver = self._dense_solve(), "dense"
        elif self.C is not None:
            A, solver = self._solve_iteratively(tol=1e-10 if tol is None else tol), "cg"
        else:
            self._consolidate()
            tol_cg, enough = (1e-9, self._enough) if tol is None else (tol, None)
            precondition = self._preconditioner(self.T_sum)
            if self.moment_blocks and not self.blocks:
                # float32 products over the moments' float32 parts; not with kept sequences
                # beside them (padded chunks among unpadded ones)
                self._singles = self._single_blocks()
                A, _, self._products, singles = refined_conjugate_gradients(
                    self._normal_apply, self._single_apply, self.rhs, precondition, tol_cg,
                    1000, enough=enough)
                self._single_products = singles
            else:
                A, _, self._products = conjugate_gradients(
                    self._normal_apply, self.rhs, precondition, tol_cg, 1000, enough=enough)
            solver = "cg"
        products = self._products
        # Only the kernel on the span of the tokens acts (x_iᵀ A x_j, S_i A x_i): tokens of a
        # vocabulary may span fewer than d directions, and the rest of A is not identifiable.
        span = _token_span(self.P_sum)
        if span is not None:
            A = span @ A @ span
        k = d if span is None else int(round(np.trace(span)))  # the identifiable block
        # The data give at most n_equations numbers on the k^2 entries of that block: fewer,
        # and the least squares is one of many exact fits (the minimum-norm one), whose rank
        # says nothing of the kernel's; the softmax fit would only fit more of the same.
        identified = self.n_equations >= k * k
        # Residual sum of squares ||Y||^2 - bᵀ vec(Â) (least squares), floored at float64
        # resolution.
        rss = max(self.y_energy - self.rhs.ravel() @ A.ravel(),
                  64 * np.finfo(float).eps * self.y_energy)
        root = _sqrtm_psd(self.P_sum / N)
        linearised_rms = float(np.linalg.norm(root @ A.T @ root))
        T_sum, converged, weights_at, steps = self.T_sum, True, None, 0
        refined = self.centred and self.refine and bool(self.blocks) and identified
        if refined:
            self._consolidate()
            A, loss, T_sum, converged, steps, used = self._gauss_newton(A, span)
            products += used
            rss = max(loss, 64 * np.finfo(float).eps * self.y_energy)
            weights_at = A

        # N d_out observations, d^2 parameters (at most n_equations of them determined).
        noise_variance = rss / max(N * self.n_targets - min(d * d, self.n_equations), 1)
        T_root, P_root = _sqrtm_psd(T_sum), _sqrtm_psd(self.P_sum)
        whitened = T_root @ A @ P_root / np.sqrt(N)
        U, s, Vt = np.linalg.svd(whitened)

        def direction_noise(j):  # the noise along the j-th direction, relative to sigma^2
            return self._local_noise(np.outer(U[:, j], Vt[j]), T_root, P_root, weights_at)

        kernel = A.T
        # E[(x_iᵀ W x_j)^2] = ||Σ^{1/2} W Σ^{1/2}||_F^2 for independent tokens of moment Σ.
        fit = Bunch(kernel=kernel, whitened=whitened, singular_values=s,
                    noise_variance=noise_variance,
                    logit_rms=float(np.linalg.norm(root @ kernel @ root)),
                    linearised_logit_rms=linearised_rms, converged=converged, solver=solver,
                    identified=identified, n_equations=int(self.n_equations),
                    n_unknowns=k * k, gauss_newton_steps=steps, n_products=int(products),
                    n_single_products=int(self._single_products), refined=refined,
                    exact=identified and (not self.centred or (refined and converged)))
        # The rank: the Gavish–Donoho cut of the whitened spectrum, checked near the cut
        # against the noise along each direction.
        fit.update(kernel_threshold_rank(fit, direction_noise))
        # Not kept (nor pickled) beyond the solve.
        self._factor = self._weights_cache = self._singles = self._work = None
        return fit


def _same_pattern(a, b):
    """Whether two checked :class:`AttentionPattern` are the same."""
    return a.normalization == b.normalization and all(
        (x is None and y is None) or (x is not None and y is not None and np.array_equal(x, y))
        for x, y in ((a.allowed, b.allowed), (a.weights, b.weights), (a.bias, b.bias)))


def _token_span(P, rtol=1e-10):
    """The orthogonal projector on the span of the tokens (second moment ``P``), or ``None``
    when they span every direction."""
    values, vectors = np.linalg.eigh((P + P.T) / 2)
    keep = values > rtol * max(values[-1], 0.0)
    if keep.all() or not keep.any():
        return None
    return vectors[:, keep] @ vectors[:, keep].T


def _regroup(blocks, size, concatenate):
    """Consecutive ``blocks`` joined into groups of at least ``size`` sequences, consuming the
    list as it goes (each original is released once its group is joined)."""
    merged, group, count = [], [], 0
    blocks.reverse()
    while blocks:
        block = blocks.pop()
        group.append(block)
        count += len(block[0]) if isinstance(block, tuple) else len(block)
        if count >= size:
            merged.append(group[0] if len(group) == 1 else concatenate(group))
            group, count = [], 0
    if group:
        merged.append(group[0] if len(group) == 1 else concatenate(group))
    return merged


def _concatenate_blocks(group):
    """One kept block ``(X, Y, valid)`` from several."""
    if len(group) == 1:
        return group[0]
    X = np.concatenate([g[0] for g in group])
    Y = None if group[0][1] is None else np.concatenate([g[1] for g in group])
    if all(g[2] is None for g in group):
        return X, Y, None
    valid = np.concatenate([np.ones(g[0].shape[:2], dtype=bool) if g[2] is None else g[2]
                            for g in group])
    return X, Y, valid


def qk_kernel_least_squares(X, Y, V, attention, mask=None, lengths=None,
                            mask_normalization=None, logit_bias=None):
    """Least-squares query–key kernel of attention with a known value map ``V``.

    One pass of :class:`KernelMoments` over all sequences; see :meth:`KernelMoments.solve`.
    """
    return KernelMoments(V, attention, mask=mask, mask_normalization=mask_normalization,
                         logit_bias=logit_bias).update(X, Y, lengths).solve()


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


def _work_array(work, key, shape, dtype=np.float64):
    """A work array of ``shape`` from the dict ``work``, reused while its leading dimension
    suffices (a view of its first rows), replaced otherwise."""
    array = work.get(key)
    if array is None or array.dtype != dtype or array.shape[1:] != shape[1:] or (
            array.shape[0] < shape[0]):
        array = work[key] = np.empty(shape, dtype=dtype)
    return array[:shape[0]]


def _sqrtm_psd(M):
    evals, evecs = np.linalg.eigh((M + M.T) / 2)
    return (evecs * np.sqrt(np.clip(evals, 0, None))) @ evecs.T
