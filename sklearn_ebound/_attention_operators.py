"""Data-only operators of sequence data ``X (N, n, d) -> Y (N, n, d_out)``.

What lives here: the rows of the per-token and token-mixing readings (:func:`per_token_data`,
:func:`token_mixing_data`); the attention patterns, checked (masks, padding ``lengths``, mask
weights, logit biases: :func:`check_attention_pattern`, :class:`AttentionPattern`) and turned
into the attention weights at a zero kernel (:func:`base_weights`) or at a fitted one
(:func:`softmax_weights`); and the per-sequence products with the key moments ``S_i``
(:func:`apply_moments`, :func:`moment_products`) that the kernel's statistics and its solver
share. The kernel itself is accumulated in :mod:`._kernel_moments`, solved in
:mod:`._attention_solver` and its rank read in :mod:`._kernel_rank`.

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

__all__ = [
    "token_mixing_data",
    "per_token_data",
    "own_share_energy",
    "check_attention_mask",
    "check_attention_pattern",
    "check_lengths",
    "allowed_keys",
    "alibi_bias",
    "base_weights",
    "AttentionPattern",
    "softmax_weights",
    "apply_moments",
    "moment_products",
]

MASK_NORMALIZATIONS = ("mean", "none")

# Float64 values of the largest temporary of one block of sequences in the matrix-free passes
# of the kernel statistics (:mod:`._kernel_moments`, :mod:`._attention_solver`).
BLOCK_VALUES = 1 << 22


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


def apply_moments(X, Z, weights, centred):
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


def moment_products(X, weights, M, centred):
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
    :func:`._rules.caveats.short_sequence_caveat`). A causal mask's first queries see few keys,
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


def work_array(work, key, shape, dtype=np.float64):
    """A work array of ``shape`` from the dict ``work``, reused while its leading dimension
    suffices (a view of its first rows), replaced otherwise."""
    array = work.get(key)
    if array is None or array.dtype != dtype or array.shape[1:] != shape[1:] or (
            array.shape[0] < shape[0]):
        array = work[key] = np.empty(shape, dtype=dtype)
    return array[:shape[0]]
