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

from .._attention_operators import check_attention_mask
from .._deprecation import renamed_keyword

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
    :class:`~sklearn_ebound.IntrinsicRankEstimator`.

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
        ``n_tokens`` tokens).
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
        kind=None,
    ):
        super().__init__()
        attention = renamed_keyword("kind", "attention", kind, attention, reason=_KIND_REASON)
        value = resolve_learned(value)
        if attention not in ("softmax", "linear"):
            raise ValueError(
                f"`attention` must be 'softmax' or 'linear'. Got {attention!r} instead."
            )
        self.causal = isinstance(mask, str) and check_attention_mask(mask, 1) is not None
        if mask is not None and not self.causal:
            self.register_buffer("mask", torch.as_tensor(
                check_attention_mask(mask, np.shape(mask)[0] if np.ndim(mask) else 0)))
        else:
            self.mask = None
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

    def allowed_keys(self, n_tokens, lengths=None):
        """Boolean tensor of the keys each query may attend to, or ``None`` for all.

        ``(n, n)`` from the mask alone; ``(b, n, n)`` with ``lengths`` (a tensor of ``b``
        sequence lengths), where a padding token (position ``>= lengths[s]``) is no key and,
        as a query, has no allowed key at all.
        """
        if self.causal:
            mask = torch.ones(n_tokens, n_tokens, dtype=torch.bool).tril()
        else:
            if self.mask is not None and self.mask.shape[0] != n_tokens:
                raise ValueError(f"The attention mask is {tuple(self.mask.shape)} but the "
                                 f"sequences have {n_tokens} tokens.")
            mask = self.mask
        if lengths is None:
            return mask
        lengths = torch.as_tensor(lengths)
        valid = torch.arange(n_tokens, device=lengths.device) < lengths[:, None]  # (b, n)
        allowed = valid[:, :, None] & valid[:, None, :]
        return allowed if mask is None else allowed & mask.to(allowed.device)

    def forward(self, X, lengths=None):
        """Attend over each sequence of ``X`` ``(b, n, d)``; ``lengths`` ``(b,)`` marks the
        padding, whose outputs are zero."""
        Q, K, values = X @ self.W_Q, X @ self.W_K, self.value_map(X)
        allowed = self.allowed_keys(X.shape[-2], lengths)
        if allowed is None:
            if self.attention == "linear":
                # (1/n) (Q K^T) values = (1/n) Q (K^T values): O(n k d_out), no n x n matrix.
                return Q @ (K.transpose(-2, -1) @ values) / X.shape[-2]
            scale = self.logit_scale / math.sqrt(self.n_features)
            return F.scaled_dot_product_attention(Q, K, values, scale=scale)
        allowed = allowed.to(X.device)
        # A query without an allowed key (padding) outputs zero.
        has_key = allowed.any(dim=-1, keepdim=True)
        if self.attention == "linear":
            # 1 / |K_i| on the allowed keys of query i.
            weights = allowed / allowed.sum(dim=-1, keepdim=True).clamp(min=1)
            return ((Q @ K.transpose(-2, -1)) * weights.to(Q.dtype)) @ values
        scale = self.logit_scale / math.sqrt(self.n_features)
        # Rows without a key attend to all (no NaN), then are zeroed.
        out = F.scaled_dot_product_attention(Q, K, values, attn_mask=allowed | ~has_key,
                                             scale=scale)
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
