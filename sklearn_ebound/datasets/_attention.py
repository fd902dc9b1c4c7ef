"""Planted-rank sequence tasks: attention and static token mixing.

A data set is a 3-D array ``X`` of shape ``(n_samples, n_tokens, n_features)`` with targets
``Y`` of shape ``(n_samples, n_tokens, n_targets)``. The generators plant the rank of the
operator that mixes the tokens:

* :func:`make_attention_task` -- the query-key kernel ``W = W_Q W_K^T`` of linear or softmax
  attention has rank ``r*_att`` (rungs 3 and 4 of the interpolation ladder);
* :func:`make_static_mixing_task` -- a fixed mixing matrix ``M`` (rung 0), or a fixed logit
  matrix ``L`` mixed through a softmax (rung 2), has rank ``r*``.
"""

from numbers import Integral, Real

import numpy as np
from scipy.special import softmax
from sklearn.utils import Bunch, check_random_state, check_scalar

from .._attention_operators import (
    alibi_bias,
    base_weights,
    check_attention_pattern,
    check_lengths,
    valid_tokens,
)
from .._utils.deprecation import renamed_keyword
from .._utils.random import random_orthonormal
from ._static import padded_spectrum, planted_singular_values

__all__ = ["make_attention_task", "make_static_mixing_task", "alibi_bias"]

_VALUE_MAPS = ("identity", "random", "low_rank")


def _check_attention(attention, kind, what):
    """The attention class, read from the deprecated ``kind`` when that is given."""
    attention = renamed_keyword("kind", "attention", kind, attention,
                                reason="the estimators' word for it", stacklevel=3)
    if attention not in ("linear", "softmax"):
        raise ValueError(
            f"`attention` must be 'linear' or 'softmax' (the {what}). Got {attention!r} instead."
        )
    return attention


def _check_sizes(n_samples, n_tokens, n_features):
    check_scalar(n_samples, "n_samples", Integral, min_val=1)
    check_scalar(n_tokens, "n_tokens", Integral, min_val=1)
    check_scalar(n_features, "n_features", Integral, min_val=1)


def _value_map(value, n_features, n_targets, hidden, rng):
    """Value map ``V`` of shape ``(n_targets, n_features)`` and the resolved ``n_targets``.

    ``hidden`` is a unit vector of the input space that ``value='low_rank'`` annihilates.
    """
    if isinstance(value, str):
        if value not in _VALUE_MAPS:
            raise ValueError(
                f"`value` must be one of {_VALUE_MAPS} or an array of shape (n_targets, "
                f"n_features). Got {value!r} instead."
            )
        n_targets = n_features if n_targets is None else n_targets
        check_scalar(n_targets, "n_targets", Integral, min_val=1)
        if value == "identity":
            if n_targets != n_features:
                raise ValueError(
                    f"`value='identity'` needs `n_targets` == `n_features` = {n_features}. "
                    f"Got n_targets={n_targets} instead."
                )
            return np.eye(n_features), n_targets
        # A random partial isometry: all min(n_targets, n_features) singular values are 1.
        m = min(n_targets, n_features)
        V = random_orthonormal(n_targets, m, rng) @ random_orthonormal(n_features, m, rng).T
        if value == "low_rank":
            # V <- V (I - h h^T): the kernel direction h is invisible through the value map.
            V = V - np.outer(V @ hidden, hidden)
        return V, n_targets
    V = np.asarray(value, dtype=np.float64)
    if V.ndim != 2 or V.shape[1] != n_features or not np.all(np.isfinite(V)):
        raise ValueError(
            f"`value` as an array must be a finite matrix of shape (n_targets, n_features="
            f"{n_features}). Got shape {V.shape} instead."
        )
    if n_targets is not None and n_targets != V.shape[0]:
        raise ValueError(
            f"`n_targets`={n_targets} disagrees with the {V.shape[0]} rows of `value`."
        )
    return V, V.shape[0]


def _embeddings(law, size, n_features, rng):
    """``size`` embedding vectors of the token ``law`` (see :func:`make_attention_task`)."""
    if law == "gaussian":
        return rng.standard_normal((size, n_features))
    if law == "symmetric":
        if size % 2:
            raise ValueError(f"`vocabulary_law='symmetric'` pairs each embedding with its "
                             f"negative and needs an even `vocabulary_size`. Got {size}.")
        half = rng.standard_normal((size // 2, n_features))
        return np.concatenate([half, -half])
    if law == "skewed":
        return rng.exponential(size=(size, n_features)) - 1.0
    raise ValueError(f"`vocabulary_law` must be 'gaussian', 'symmetric' or 'skewed'. Got "
                     f"{law!r}.")


def _planted_kernel(rank, singular_values, decay, n_features, rng):
    """The planted singular values ``s`` and factors ``W_Q = U S^{1/2}``, ``W_K = R
    S^{1/2}`` (Haar-random orthonormal ``U, R``, ``d x rank``), and the unit direction that
    ``value='low_rank'`` hides."""
    s = planted_singular_values(rank, singular_values, decay) if rank else np.zeros(0)
    U = random_orthonormal(n_features, rank, rng)
    R = random_orthonormal(n_features, rank, rng)
    W_Q, W_K = U * np.sqrt(s), R * np.sqrt(s)
    # The weakest key direction (or any direction when rank = 0) is the one 'low_rank' hides.
    hidden = R[:, -1] if rank else random_orthonormal(n_features, 1, rng)[:, 0]
    return s, W_Q, W_K, hidden


def _tokens(n_samples, n_tokens, n_features, vocabulary_size, vocabulary_law, rng):
    """The tokens ``X``, standard normal or drawn uniformly from a vocabulary, and the
    vocabulary's embeddings (``None`` without one)."""
    if vocabulary_size is None:
        return rng.standard_normal((n_samples, n_tokens, n_features)), None
    check_scalar(vocabulary_size, "vocabulary_size", Integral, min_val=1)
    embeddings = _embeddings(vocabulary_law, vocabulary_size, n_features, rng)
    return embeddings[rng.randint(vocabulary_size, size=(n_samples, n_tokens))], embeddings


def _mixing(X, W, attention, pattern, allowed, logit_scale):
    """The token-mixing weights ``A_s`` of every sequence, ``Y_s = A_s X_s V^T + E_s``;
    ``allowed``: the keys each query sees (``None``: all)."""
    n_tokens, n_features = X.shape[1], X.shape[2]
    # logits[s, i, j] = x_i^T W x_j
    logits = X @ W @ X.transpose(0, 2, 1)
    if attention == "linear":
        # a_ij: 1/n, 1/|K_i|, or the mask's weights (normalised, or as given)
        return logits / n_tokens if allowed is None else logits * base_weights(
            pattern, allowed)[0]
    scaled = logit_scale * logits / np.sqrt(n_features)
    if pattern.bias is not None:
        scaled = scaled + pattern.bias
    if allowed is not None:
        scaled = np.where(allowed, scaled, -np.inf)
        scaled[~np.broadcast_to(allowed.any(axis=-1), scaled.shape[:2])] = 0.0  # padding rows
    return softmax(scaled, axis=-1)


def make_attention_task(
    attention="linear",
    n_samples=1000,
    n_tokens=16,
    n_features=8,
    n_targets=None,
    *,
    rank=2,
    logit_scale=1.0,
    value="identity",
    singular_values=None,
    decay=1.0,
    noise=0.1,
    vocabulary_size=None,
    vocabulary_law="gaussian",
    mask=None,
    mask_normalization=None,
    logit_bias=None,
    lengths=None,
    random_state=None,
    return_params=False,
    kind=None,
):
    """Generate sequences mixed by one attention layer with a planted query-key rank.

    With standard normal tokens ``X_s`` (``n_tokens x n_features``), each target sequence is

    * linear attention: ``Y_s = (1/n) (X_s W X_s^T) X_s V^T + E_s``;
    * softmax attention: ``Y_s = softmax(beta * X_s W X_s^T / sqrt(d)) X_s V^T + E_s``, the
      softmax taken along each row, ``beta = logit_scale`` and ``d = n_features``;

    With a ``mask`` token ``i`` attends only to its allowed keys ``K_i``: linear attention
    averages over them, ``y_i = (1/|K_i|) sum_{j in K_i} (x_i^T W x_j) V x_j`` (``1/n``
    without a mask), and the softmax is taken over them. With ``lengths`` the sequences are
    padded: the tokens at positions ``>= lengths[s]`` are zero in ``X`` and ``Y`` (no noise),
    and are neither queries nor keys.

    Linear attention with mask weights ``m_ij``: ``y_i = sum_j a_ij (x_i^T W x_j) V x_j``
    with ``a_ij = m_ij / sum_k m_ik`` (``mask_normalization="mean"``) or ``a_ij = m_ij``
    (``"none"``). Softmax attention with a logit bias ``b``: ``softmax(beta X_s W X_s^T /
    sqrt(d) + b)``, the bias added to the scaled logits of every sequence.

    with the query-key kernel ``W = W_Q W_K^T`` of rank ``r*_att = rank``: ``W_Q = U S^{1/2}``,
    ``W_K = R S^{1/2}`` with Haar-random orthonormal ``U, R`` (``d x r``) and ``S`` the planted
    singular values, so that ``W = U S R^T``. ``E_s`` holds i.i.d. ``N(0, noise^2)`` entries.

    Parameters
    ----------
    attention : {"linear", "softmax"}, default="linear"
        The attention class.
    n_samples : int, default=1000
        Number of sequences ``N``.
    n_tokens : int, default=16
        Tokens per sequence ``n``.
    n_features : int, default=8
        Channels per token ``d``.
    n_targets : int, default=None
        Output channels ``d_out``; ``None`` means ``d_out = d`` (or the rows of an array
        ``value``).
    rank : int, default=2
        The planted rank ``r*_att`` of ``W``, ``0 <= rank <= n_features``.
    logit_scale : float, default=1.0
        ``beta``, the inverse temperature of softmax attention; ignored for linear attention.
        The logits ``beta x_i^T W x_j / sqrt(d)`` have root-mean-square ``beta ||s||_2 /
        sqrt(d)``.
    value : {"identity", "random", "low_rank"} or array-like of shape (n_targets, n_features), \
            default="identity"
        The value map ``V``: the identity (needs ``d_out = d``); a random partial isometry
        (all singular values 1); the same with the weakest key direction ``R[:, -1]``
        annihilated (``V <- V (I - r r^T)``, the kernel--value identifiability case; only the
        input dependence of the weights still carries that direction); or a given matrix.
    singular_values : array-like of shape (rank,), default=None
        Singular values of ``W``. ``None`` uses ``decay**k``, ``k = 0..rank-1``.
    decay : float, default=1.0
        Geometric decay of the default singular values, in ``(0, 1]``.
    noise : float, default=0.1
        Standard deviation of each noise entry.
    vocabulary_size : int, default=None
        ``None`` draws every token from a standard normal law. An integer draws each token
        uniformly from a fixed vocabulary of that many standard normal embedding vectors, as
        language tokens are: a non-Gaussian token law, under which the softmax nonlinearity
        leaks into directions outside the kernel's (Gaussian tokens are the special case in
        which, by Stein's lemma, it cannot).
    vocabulary_law : {"gaussian", "symmetric", "skewed"}, default="gaussian"
        The law of the embeddings of a vocabulary (``vocabulary_size`` given): standard
        normal; standard normal in ``±`` pairs (a symmetric token law with non-Gaussian
        fourth moments; ``vocabulary_size`` must be even); or centred, unit-variance
        exponential entries (a skewed law).
    mask : None, "causal" or array-like of shape (n_tokens, n_tokens), default=None
        Which keys each query attends to: all (``None``), ``j <= i`` (``"causal"``, as in a
        decoder), or the 1 entries of row ``i`` of a 0/1 array (each row must allow one). For
        linear attention also non-negative weights: ``m_ij`` is the weight of key ``j`` for
        query ``i`` (0: not a key; each row needs a positive one), used as
        ``mask_normalization`` says.
    mask_normalization : {None, "mean", "none"}, default=None
        How linear attention uses row ``i`` of the mask: ``"mean"`` averages over the visible
        keys, ``a_ij = m_ij / sum_k m_ik`` (``1/|K_i|`` for 0/1, ``1/n`` without a mask);
        ``"none"`` uses the weights as given, ``a_ij = m_ij`` (``mask=np.tril(np.ones((n,
        n))) / n`` is the unnormalised causal ``(1/n) sum_{j <= i}`` of in-context-learning
        theory; ``"causal"`` or ``None`` give plain sums). ``None`` means ``"mean"`` for 0/1
        masks, and weights must state it. For softmax only ``None`` or ``"mean"``.
    logit_bias : None, array-like of shape (n_tokens, n_tokens) or ("alibi", slope), \
            default=None
        Softmax attention only: a finite bias ``b_ij`` added to every sequence's scaled
        logits (position terms, relative-position tables), or ALiBi's ``b_ij = -slope |i -
        j|`` (:func:`alibi_bias`; with ``mask="causal"`` the decoders' ``-slope (i - j)``).
    lengths : array-like of shape (n_samples,), default=None
        Lengths of padded sequences, in ``[1, n_tokens]``; ``None``: no padding.
    random_state : int, RandomState instance or None, default=None
        Seed of the draw.
    return_params : bool, default=False
        Also return a :class:`~sklearn.utils.Bunch` with the ground truth.
    kind : {"linear", "softmax"}, default=None
        Deprecated spelling of ``attention``, kept for one release: when given, it replaces
        ``attention``, with a ``FutureWarning``.

    Returns
    -------
    X : ndarray of shape (n_samples, n_tokens, n_features)
    Y : ndarray of shape (n_samples, n_tokens, n_targets)
    params : Bunch, only when ``return_params=True``
        ``vocabulary`` (the embeddings, or ``None``), ``mask`` (the boolean allowed keys,
        or ``None``), ``mask_weights`` (the mask's weights, ``None`` for 0/1),
        ``mask_normalization``, ``logit_bias`` (the ``(n, n)`` array, or ``None``),
        ``lengths``, ``W_Q``, ``W_K`` (``d x r``), ``W``
        (``d x d``), ``V`` (``d_out x d``),
        ``singular_values`` (of ``W``, length ``d``), ``rank``, ``attention``, ``logit_scale``,
        ``noise``, and ``noise_floor = noise^2 * d_out``: the population risk of the true
        model per token, ``E ||y_i - f(X)_i||^2`` summed over the output channels (the mean
        squared error over all entries times ``d_out``).

    See Also
    --------
    make_static_mixing_task : the static rungs 0-2 of the interpolation ladder.

    Examples
    --------
    >>> from sklearn_ebound.datasets import make_attention_task
    >>> X, Y, params = make_attention_task(
    ...     "softmax", 200, 12, 6, rank=2, random_state=0, return_params=True)
    >>> X.shape, Y.shape, params.rank, params.W.shape
    ((200, 12, 6), (200, 12, 6), 2, (6, 6))
    """
    attention = _check_attention(attention, kind, "attention")
    _check_sizes(n_samples, n_tokens, n_features)
    check_scalar(rank, "rank", Integral, min_val=0, max_val=n_features)
    check_scalar(logit_scale, "logit_scale", Real, min_val=0)
    check_scalar(noise, "noise", Real, min_val=0)
    rng = check_random_state(random_state)

    s, W_Q, W_K, hidden = _planted_kernel(rank, singular_values, decay, n_features, rng)
    W = W_Q @ W_K.T
    V, n_targets = _value_map(value, n_features, n_targets, hidden, rng)

    pattern = check_attention_pattern(mask, n_tokens, attention, mask_normalization, logit_bias)
    lengths = check_lengths(lengths, n_samples, n_tokens)
    X, embeddings = _tokens(n_samples, n_tokens, n_features, vocabulary_size, vocabulary_law,
                            rng)
    valid = valid_tokens(lengths, n_tokens)
    if valid is not None:
        X = X * valid[..., None]
    mixing = _mixing(X, W, attention, pattern, pattern.keys(valid, n_tokens), logit_scale)
    Y = mixing @ X @ V.T + noise * rng.standard_normal((n_samples, n_tokens, n_targets))
    if valid is not None:
        Y = Y * valid[..., None]
    if not return_params:
        return X, Y
    params = Bunch(
        vocabulary=embeddings, mask=pattern.allowed, mask_weights=pattern.weights,
        mask_normalization=pattern.normalization, logit_bias=pattern.bias, lengths=lengths,
        W_Q=W_Q, W_K=W_K, W=W, V=V, singular_values=padded_spectrum(s, n_features),
        rank=rank, attention=attention, logit_scale=logit_scale, noise=noise,
        noise_floor=noise**2 * n_targets,
    )
    return X, Y, params


def make_static_mixing_task(
    attention="linear",
    n_samples=1000,
    n_tokens=16,
    n_features=8,
    n_targets=None,
    *,
    rank=2,
    logit_scale=1.0,
    value="identity",
    singular_values=None,
    decay=1.0,
    noise=0.1,
    random_state=None,
    return_params=False,
    kind=None,
):
    """Generate sequences mixed by a fixed token-mixing matrix with a planted rank.

    With standard normal tokens ``X_s`` (``n_tokens x n_features``), each target sequence is
    ``Y_s = A X_s V^T + E_s`` with the same mixing matrix ``A`` (``n x n``) for every sequence:

    * ``attention="linear"`` (ladder rungs 0 and 1): ``A = M = U S R^T`` of rank ``r* = rank``, its
      singular values ``S`` as planted;
    * ``attention="softmax"`` (rung 2): ``A = softmax(beta * L)`` row-wise, with the logit matrix
      ``L = c U S R^T`` of rank ``r*``; ``c = n / ||s||_2`` normalises the logits to unit
      root-mean-square entry (``||L||_F = n``), so ``beta = logit_scale`` is the logit size.
      ``A`` itself has full rank; the rank lives in ``L``, and row-centring ``log A`` gives
      ``beta L (I - 1 1^T / n)``, of rank ``r*`` again.

    Parameters
    ----------
    attention : {"linear", "softmax"}, default="linear"
        Linear mixing by ``M`` or softmax mixing of the logits ``L``.
    n_samples : int, default=1000
        Number of sequences ``N``.
    n_tokens : int, default=16
        Tokens per sequence ``n``.
    n_features : int, default=8
        Channels per token ``d``.
    n_targets : int, default=None
        Output channels ``d_out``; ``None`` means ``d_out = d`` (or the rows of an array
        ``value``).
    rank : int, default=2
        The planted rank ``r*``, ``0 <= rank <= n_tokens`` (``rank >= 1`` for softmax).
    logit_scale : float, default=1.0
        ``beta`` of the softmax mixing; ignored when ``attention="linear"``.
    value : {"identity", "random", "low_rank"} or array-like of shape (n_targets, n_features), \
            default="identity"
        The value map ``V``, as in :func:`make_attention_task` (``"low_rank"`` annihilates a
        random input direction).
    singular_values : array-like of shape (rank,), default=None
        Singular values ``S`` before the logit normalisation. ``None`` uses ``decay**k``.
    decay : float, default=1.0
        Geometric decay of the default singular values, in ``(0, 1]``.
    noise : float, default=0.1
        Standard deviation of each noise entry.
    random_state : int, RandomState instance or None, default=None
        Seed of the draw.
    return_params : bool, default=False
        Also return a :class:`~sklearn.utils.Bunch` with the ground truth.
    kind : {"linear", "softmax"}, default=None
        Deprecated spelling of ``attention``, kept for one release: when given, it replaces
        ``attention``, with a ``FutureWarning``.

    Returns
    -------
    X : ndarray of shape (n_samples, n_tokens, n_features)
    Y : ndarray of shape (n_samples, n_tokens, n_targets)
    params : Bunch, only when ``return_params=True``
        ``mixing`` (``A``, ``n x n``), ``logits`` (``L`` for softmax, ``None`` for linear),
        ``V``, ``singular_values`` (of ``M`` or ``L``, length ``n``), ``rank``, ``attention``,
        ``logit_scale``, ``noise`` and ``noise_floor = noise^2 * d_out`` (per token, summed over
        output channels, as in :func:`make_attention_task`).

    See Also
    --------
    make_attention_task : the input-conditioned rungs 3 and 4.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_ebound.datasets import make_static_mixing_task
    >>> X, Y, params = make_static_mixing_task(
    ...     "softmax", 100, 10, 4, rank=3, random_state=0, return_params=True)
    >>> Y.shape, int(np.linalg.matrix_rank(params.logits))
    ((100, 10, 4), 3)
    """
    attention = _check_attention(attention, kind, "token mixing")
    _check_sizes(n_samples, n_tokens, n_features)
    check_scalar(rank, "rank", Integral, min_val=1 if attention == "softmax" else 0,
                 max_val=n_tokens)
    check_scalar(logit_scale, "logit_scale", Real, min_val=0)
    check_scalar(noise, "noise", Real, min_val=0)
    rng = check_random_state(random_state)

    s = planted_singular_values(rank, singular_values, decay) if rank else np.zeros(0)
    U = random_orthonormal(n_tokens, rank, rng)
    R = random_orthonormal(n_tokens, rank, rng)
    hidden = random_orthonormal(n_features, 1, rng)[:, 0]
    V, n_targets = _value_map(value, n_features, n_targets, hidden, rng)

    if attention == "linear":
        logits = None
        mixing = (U * s) @ R.T
        full_s = padded_spectrum(s, n_tokens)
    else:
        # ||L||_F = n: unit root-mean-square logit.
        c = n_tokens / np.linalg.norm(s)
        logits = c * (U * s) @ R.T
        mixing = softmax(logit_scale * logits, axis=-1)
        full_s = padded_spectrum(c * s, n_tokens)

    X = rng.standard_normal((n_samples, n_tokens, n_features))
    Y = mixing @ X @ V.T + noise * rng.standard_normal((n_samples, n_tokens, n_targets))
    if not return_params:
        return X, Y
    params = Bunch(
        mixing=mixing,
        logits=logits,
        V=V,
        singular_values=full_s,
        rank=rank,
        attention=attention,
        logit_scale=logit_scale,
        noise=noise,
        noise_floor=noise**2 * n_targets,
    )
    return X, Y, params
