"""Torch modules whose token mixing has a factorised, rank-limited kernel.

* :class:`LowRankAttention` -- one attention layer with query-key kernel ``W = W_Q W_K^T``;
* :class:`StaticTokenMixer` -- a fixed (input-independent) mixing matrix ``M = A B^T`` or
  softmax mixing of fixed logits ``L = A B^T``: the static surrogate of the ladder.

Both start the factors from ``N(0, init_scale^2)``: a small initialisation gives gradient
descent its implicit bias towards low rank.
"""

import math
import warnings

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from .._attention_operators import check_attention_pattern, is_alibi
from .._utils.deprecation import renamed_keyword

__all__ = ["LowRankAttention", "StaticTokenMixer"]

_KIND_REASON = "the estimators' word for it"


def resolve_learned(value, stacklevel=3):
    """``value``, with the deprecated ``'learned'`` replaced by ``None`` and a FutureWarning."""
    if isinstance(value, str) and value == "learned":
        warnings.warn(
            "`value='learned'` is now spelt `value=None` (an unknown value map, as in "
            "IntrinsicRankEstimator); 'learned' will be removed in the next release.",
            FutureWarning,
            stacklevel=stacklevel,
        )
        return None
    return value


class _ValueMap(nn.Module):
    """The value map ``x -> V x``: learned (``value=None``), the identity, or a fixed matrix."""

    def __init__(self, value, n_features, n_targets):
        super().__init__()
        if value is None:
            # Same scale as the default init of nn.Linear: the value map is not rank-limited.
            weight = torch.empty(n_targets, n_features)
            nn.init.kaiming_uniform_(weight, a=math.sqrt(5))
            self.weight = nn.Parameter(weight)
        elif isinstance(value, str) and value == "identity":
            if n_targets != n_features:
                raise ValueError(
                    f"`value='identity'` needs n_targets == n_features = {n_features}. "
                    f"Got n_targets={n_targets} instead."
                )
            self.weight = None
        elif isinstance(value, str):
            raise ValueError(
                "`value` must be 'learned', 'identity', None or an array of shape (n_targets, "
                f"n_features). Got {value!r} instead."
            )
        else:
            weight = torch.as_tensor(np.asarray(value), dtype=torch.float32)
            if weight.shape != (n_targets, n_features):
                raise ValueError(
                    f"`value` as an array must have shape (n_targets, n_features) = "
                    f"({n_targets}, {n_features}). Got {tuple(weight.shape)} instead."
                )
            self.register_buffer("weight", weight.clone())

    def forward(self, X):
        return X if self.weight is None else X @ self.weight.T


def _factor(n_rows, rank, init_scale):
    return nn.Parameter(init_scale * torch.randn(n_rows, rank))


class LowRankAttention(nn.Module):
    """One attention layer whose query-key kernel ``W = W_Q W_K^T`` has rank at most ``rank``.

    For a batch of sequences ``X`` (``n`` tokens, ``d`` channels) and value map ``V``:

    * ``attention="linear"``: ``Y = (1/n) (X W X^T) X V^T``;
    * ``attention="softmax"``: ``Y = softmax(beta * X W X^T / sqrt(d)) X V^T``, row-wise,
      computed by :func:`torch.nn.functional.scaled_dot_product_attention` with queries
      ``X W_Q``, keys ``X W_K`` and ``scale = beta / sqrt(d)``.

    With a ``mask`` query ``i`` attends only to its allowed keys ``K_i``: linear attention
    averages over them (``1 / |K_i|`` in place of ``1 / n``), the softmax is taken over them;
    the conventions of :func:`~sklearn_ebound.datasets.make_attention_task` and
    :class:`~sklearn_ebound.IntrinsicRankEstimator`. Linear attention with mask weights
    ``m_ij`` mixes by ``(Q K^T) ∘ a`` with ``a_ij = m_ij / sum_k m_ik`` (``mask_normalization
    ="mean"``, over the keys that are not padding) or ``a_ij = m_ij`` (``"none"``); softmax
    attention adds ``logit_bias`` to its scaled logits, ``softmax(beta X W X^T / sqrt(d) +
    b)``.

    Parameters
    ----------
    n_features : int
        Channels per token ``d``.
    rank : int, default=None
        Inner width ``k`` of the factors ``W_Q, W_K`` (``d x k``); ``None`` means ``d``.
    attention : {"softmax", "linear"}, default="softmax"
        Attention class.
    value : None, "identity" or array-like of shape (n_targets, n_features), default=None
        Value map ``V``: ``None`` learns it (``"learned"`` is its deprecated spelling, kept for
        one release), ``"identity"`` fixes the identity, an array fixes that matrix.
    n_targets : int, default=None
        Output channels ``d_out``; ``None`` means ``d`` (or the rows of an array ``value``).
    logit_scale : float, default=1.0
        ``beta``, the inverse temperature of softmax attention.
    init_scale : float, default=1e-2
        Standard deviation of the entries of ``W_Q`` and ``W_K`` at initialisation.
    mask : None, "causal" or array-like of shape (n_tokens, n_tokens), default=None
        Which keys each query attends to: all, ``j <= i`` (``"causal"``), or the 1 entries of
        its row of a 0/1 array (every row must allow a key; sequences must then have
        ``n_tokens`` tokens); for linear attention also non-negative weights (0: not a key).
    mask_normalization : {None, "mean", "none"}, default=None
        Linear attention: ``"mean"`` divides each row of the mask by its sum (``None``, for
        0/1 masks), ``"none"`` uses the weights as given; weights must state it. See
        :func:`~sklearn_ebound.datasets.make_attention_task`.
    logit_bias : None, array-like of shape (n_tokens, n_tokens) or ("alibi", slope), \
            default=None
        Softmax attention: a finite bias added to every sequence's scaled logits, or ALiBi's
        ``-slope |i - j|`` (built for the sequences' length).
    kind : {"softmax", "linear"}, default=None
        Deprecated spelling of ``attention``, kept for one release: when given, it replaces
        ``attention``, with a ``FutureWarning``.

    Attributes
    ----------
    attention : str
        The attention class.
    W_Q, W_K : torch.nn.Parameter of shape (n_features, rank)
    value_map : torch.nn.Module
        ``x -> V x``; its ``weight`` is ``V`` (``None`` for the identity).

    Examples
    --------
    >>> import torch
    >>> from sklearn_ebound.nn import LowRankAttention
    >>> module = LowRankAttention(6, rank=2, attention="linear", value="identity")
    >>> module(torch.randn(5, 10, 6)).shape, module.qk_kernel().shape
    (torch.Size([5, 10, 6]), torch.Size([6, 6]))
    """

    def __init__(
        self,
        n_features,
        rank=None,
        attention="softmax",
        value=None,
        n_targets=None,
        logit_scale=1.0,
        init_scale=1e-2,
        mask=None,
        *,
        mask_normalization=None,
        logit_bias=None,
        kind=None,
    ):
        super().__init__()
        attention = renamed_keyword("kind", "attention", kind, attention, reason=_KIND_REASON)
        value = resolve_learned(value)
        if attention not in ("softmax", "linear"):
            raise ValueError(
                f"`attention` must be 'softmax' or 'linear'. Got {attention!r} instead."
            )
        # Checked against a size read from the arrays (1 for the forms without one); the
        # sequences' length is checked at forward.
        sized = [np.shape(a)[0] for a in (mask, logit_bias)
                 if a is not None and not isinstance(a, str) and not is_alibi(a) and np.ndim(a)]
        pattern = check_attention_pattern(mask, sized[0] if sized else 1, attention,
                                          mask_normalization, logit_bias)
        self.causal = isinstance(mask, str)
        self.mask_normalization = pattern.normalization
        self.alibi_slope = float(logit_bias[1]) if is_alibi(logit_bias) else None
        tensors = {"mask": None if self.causal else pattern.allowed,
                   "mask_weights": pattern.weights,
                   "logit_bias": None if self.alibi_slope is not None else pattern.bias}
        for name, array in tensors.items():
            if array is None:
                setattr(self, name, None)
            else:
                dtype = torch.bool if array.dtype == bool else torch.float32
                self.register_buffer(name, torch.as_tensor(array, dtype=dtype))
        rank = n_features if rank is None else rank
        if n_targets is None:
            fixed = value is not None and not isinstance(value, str)
            n_targets = np.shape(value)[0] if fixed else n_features
        self.n_features, self.rank, self.attention = n_features, rank, attention
        self.logit_scale = float(logit_scale)
        self.W_Q = _factor(n_features, rank, init_scale)
        self.W_K = _factor(n_features, rank, init_scale)
        self.value_map = _ValueMap(value, n_features, n_targets)

    def qk_kernel(self):
        """The query-key kernel ``W = W_Q W_K^T``, a ``d x d`` tensor of rank ``<= k``."""
        return self.W_Q @ self.W_K.T

    @property
    def _plain(self):
        # Every query averages uniformly over all the keys: the O(n) paths below apply.
        return (not self.causal and self.mask is None and self.mask_weights is None
                and self.logit_bias is None and self.alibi_slope is None
                and self.mask_normalization == "mean")

    def _check_size(self, tensor, what, n_tokens):
        if tensor is not None and tensor.shape[0] != n_tokens:
            raise ValueError(f"The {what} is {tuple(tensor.shape)} but the sequences have "
                             f"{n_tokens} tokens.")

    def allowed_keys(self, n_tokens, lengths=None):
        """Boolean tensor of the keys each query may attend to, or ``None`` for all.

        ``(n, n)`` from the mask alone; ``(b, n, n)`` with ``lengths`` (a tensor of ``b``
        sequence lengths), where a padding token (position ``>= lengths[s]``) is no key and,
        as a query, has no allowed key at all.
        """
        if self.causal:
            mask = torch.ones(n_tokens, n_tokens, dtype=torch.bool).tril()
        else:
            self._check_size(self.mask, "attention mask", n_tokens)
            mask = self.mask
        if lengths is None:
            return mask
        lengths = torch.as_tensor(lengths)
        valid = torch.arange(n_tokens, device=lengths.device) < lengths[:, None]  # (b, n)
        allowed = valid[:, :, None] & valid[:, None, :]
        return allowed if mask is None else allowed & mask.to(allowed.device)

    def bias(self, n_tokens):
        """The ``(n, n)`` logit bias added to the scaled logits, or ``None``."""
        if self.alibi_slope is not None:
            positions = torch.arange(n_tokens, dtype=torch.float32)
            return -self.alibi_slope * (positions[:, None] - positions[None, :]).abs()
        self._check_size(self.logit_bias, "logit bias", n_tokens)
        return self.logit_bias

    def forward(self, X, lengths=None):
        """Attend over each sequence of ``X`` ``(b, n, d)``; ``lengths`` ``(b,)`` marks the
        padding, whose outputs are zero."""
        Q, K, values = X @ self.W_Q, X @ self.W_K, self.value_map(X)
        n = X.shape[-2]
        allowed = self.allowed_keys(n, lengths)
        if allowed is None and self._plain:
            if self.attention == "linear":
                # (1/n) (Q K^T) values = (1/n) Q (K^T values): O(n k d_out), no n x n matrix.
                return Q @ (K.transpose(-2, -1) @ values) / n
            scale = self.logit_scale / math.sqrt(self.n_features)
            return F.scaled_dot_product_attention(Q, K, values, scale=scale)
        if allowed is None:
            allowed = torch.ones(n, n, dtype=torch.bool)
        allowed = allowed.to(X.device)
        # A query without an allowed key (padding) outputs zero.
        has_key = allowed.any(dim=-1, keepdim=True)
        if self.attention == "linear":
            # a_ij: the mask's weights (1 for 0/1) on the allowed keys of query i, divided by
            # their sum ("mean": 1 / |K_i| for 0/1) or as given ("none").
            self._check_size(self.mask_weights, "mask of weights", n)
            weights = allowed.to(Q.dtype)
            if self.mask_weights is not None:
                weights = weights * self.mask_weights.to(device=X.device, dtype=Q.dtype)
            if self.mask_normalization == "mean":
                total = weights.sum(dim=-1, keepdim=True)
                weights = weights / torch.where(total > 0, total, torch.ones_like(total))
            return ((Q @ K.transpose(-2, -1)) * weights) @ values
        scale = self.logit_scale / math.sqrt(self.n_features)
        # Rows without a key attend to all (no NaN), then are zeroed.
        attend = allowed | ~has_key
        bias = self.bias(n)
        if bias is not None:  # additive form: the bias where allowed, -inf elsewhere
            bias = bias.to(device=X.device, dtype=Q.dtype)
            attend = torch.where(attend, bias, torch.full_like(bias, -torch.inf))
        out = F.scaled_dot_product_attention(Q, K, values, attn_mask=attend, scale=scale)
        return out * has_key.to(out.dtype)


class StaticTokenMixer(nn.Module):
    """Fixed token mixing with a factorised ``n x n`` kernel ``A B^T`` of inner width ``rank``.

    The same mixing is applied to every sequence ``X`` (``n`` tokens, ``d`` channels):

    * ``attention="linear"``: ``Y = M X V^T`` with ``M = A B^T`` (ladder rungs 0 and 1);
    * ``attention="softmax"``: ``Y = softmax(beta * L) X V^T`` row-wise, with the logit matrix
      ``L = A B^T`` (rung 2).

    Parameters
    ----------
    n_tokens : int
        Tokens per sequence ``n``.
    rank : int, default=None
        Inner width ``k`` of the factors ``A, B`` (``n x k``); ``None`` means ``n``.
    attention : {"linear", "softmax"}, default="linear"
        Linear mixing by ``M`` or softmax mixing of the logits ``L``.
    n_features : int, default=None
        Channels per token ``d``; needed only for a learned value map.
    value : "identity", None or array-like of shape (n_targets, n_features), \
            default="identity"
        Value map ``V``: the identity, learned (``None``; ``"learned"`` is its deprecated
        spelling, kept for one release), or a fixed matrix.
    n_targets : int, default=None
        Output channels; ``None`` means ``d`` (or the rows of an array ``value``).
    logit_scale : float, default=1.0
        ``beta`` of the softmax mixing.
    init_scale : float, default=1e-2
        Standard deviation of the entries of ``A`` and ``B`` at initialisation.
    kind : {"linear", "softmax"}, default=None
        Deprecated spelling of ``attention``, kept for one release: when given, it replaces
        ``attention``, with a ``FutureWarning``.

    Attributes
    ----------
    attention : str
        The mixing class.
    A, B : torch.nn.Parameter of shape (n_tokens, rank)
    value_map : torch.nn.Module
        ``x -> V x``; its ``weight`` is ``V`` (``None`` for the identity).

    Examples
    --------
    >>> import torch
    >>> from sklearn_ebound.nn import StaticTokenMixer
    >>> mixer = StaticTokenMixer(10, rank=3)
    >>> mixer(torch.randn(5, 10, 4)).shape, mixer.mixing_kernel().shape
    (torch.Size([5, 10, 4]), torch.Size([10, 10]))
    """

    def __init__(
        self,
        n_tokens,
        rank=None,
        attention="linear",
        n_features=None,
        value="identity",
        n_targets=None,
        logit_scale=1.0,
        init_scale=1e-2,
        *,
        kind=None,
    ):
        super().__init__()
        attention = renamed_keyword("kind", "attention", kind, attention, reason=_KIND_REASON)
        value = resolve_learned(value)
        if attention not in ("softmax", "linear"):
            raise ValueError(
                f"`attention` must be 'linear' or 'softmax'. Got {attention!r} instead."
            )
        rank = n_tokens if rank is None else rank
        fixed = value is not None and not isinstance(value, str)
        if n_features is None:
            if value is None:
                raise ValueError("`n_features` is required with `value=None` (a learned map).")
            n_features = np.shape(value)[1] if fixed else 1
        if n_targets is None:
            n_targets = np.shape(value)[0] if fixed else n_features
        self.n_tokens, self.rank, self.attention = n_tokens, rank, attention
        self.logit_scale = float(logit_scale)
        self.A = _factor(n_tokens, rank, init_scale)
        self.B = _factor(n_tokens, rank, init_scale)
        self.value_map = _ValueMap(value, n_features, n_targets)

    def mixing_kernel(self):
        """The factorised kernel ``A B^T`` (``n x n``): ``M`` when linear, ``L`` when softmax."""
        return self.A @ self.B.T

    def forward(self, X):
        kernel = self.mixing_kernel()
        if self.attention == "linear":
            mixing = kernel
        else:
            mixing = torch.softmax(self.logit_scale * kernel, -1)
        return mixing @ self.value_map(X)
