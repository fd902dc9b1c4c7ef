"""Lack of fit of the attention model a kernel was read with: are the residuals still explained?

The attention-native reading with a known value map fits one attention model (linear attention
averaged over the visible keys, or softmax attention) and reads the rank of its kernel. On data
of that model the residuals ``r_i = y_i - ŷ_i`` are noise; on data of another model the kernel
absorbs what it can and its rank, read with confidence, is not the task's. Two stages:

1. **A score test** (always, cheap): the residuals are regressed on the terms by which the other
   models differ from the one fitted, each a per-token vector of the inputs:

   * ``V x̄_i``, the values' mean over the visible keys (under the pattern's weights at a zero
     kernel: a weighted mask's, normalised, or a logit bias's ``softmax(b_i)``): softmax
     weights sum to one, so the softmax output carries it with coefficient 1, while linear
     attention's carries none (a term ``V x̄_i (x̄_iᵀ W x_i)`` of second order);
   * ``(c_i - c̄) ŷ_i`` with ``c_i`` the row sum of the key weights before normalisation
     (``|K_i| / n`` for a 0/1 mask; linear attention, where the visible keys vary: a mask or
     padding): linear attention with the weights as given (``1 / n`` per key) instead of
     averaged (``1 / |K_i|``) has the averaged output times ``c_i``, a gain that grows with the
     keys, and the other way round its output over ``c_i``.

   Per sequence ``s`` the scores ``u_s = sum_{i in s} Z_iᵀ r_i`` (one per term) are independent
   across sequences with mean zero when the fitted model holds (the noise is independent of
   the inputs), whatever the noise's law, its variance per token or its dependence within a
   sequence. Hotelling's ``T² = N ūᵀ S⁻¹ ū`` (``S`` their covariance) gives ``F = T² (N - k)
   / (k (N - 1))``, ``F(k, N - k)`` for normal scores, and the p-value. The kernel was fitted
   to the same residuals: they are the noise projected off the model's tangent space, so the
   scores vary less than ``S`` says and the test is conservative.
2. **A held-out comparison** (only when the test rejects at :data:`LACK_OF_FIT_LEVEL`): the
   asked model and the alternatives are fitted on one half of the sequences and scored on the
   other, both ways (cross-fitting), and the per-sequence held-out errors compared pairwise
   (a one-sided paired t-test against the asked model). What fits significantly better is
   named in the warning.

Pure functions of the data and the fitted kernel: nothing here sets state.
"""

import numpy as np
from scipy import special

from ._attention_operators import (
    KernelMoments,
    base_weights,
    check_attention_pattern,
    softmax_weights,
    valid_tokens,
)

__all__ = ["LACK_OF_FIT_LEVEL", "MODELS", "lack_of_fit", "lack_of_fit_message"]

# Chance that data of the fitted model fail the test (and warn): the level of the residual
# diagnostics (``_diagnostics.DIAGNOSTIC_LEVEL``), so that clean data warn about as rarely.
LACK_OF_FIT_LEVEL = 1e-5
# Sequences per block of the passes over the data: the weights take block * n^2 floats.
_BLOCK = 256
# The attention models compared, and their description in a warning. "linear-1/n" takes the
# key weights as given (``mask_normalization="none"``); for a 0/1 mask that is the weight
# ``1 / n_tokens`` on every visible key (up to a scale the kernel absorbs).
MODELS = {
    "linear": "linear attention averaged over the visible keys (attention='linear')",
    "linear-1/n": "linear attention with the key weights as given (for a 0/1 mask 1/n_tokens "
                  "per visible key), not averaged over the visible keys",
    "softmax": "softmax attention (attention='softmax')",
}
_ADVICE = {
    "linear": "read them with attention='linear' (mask_normalization='mean')",
    "softmax": "read them with attention='softmax'",
    "linear-1/n": "read them with the weights as given, mask_normalization='none' (for the "
                  "1/n causal convention: mask=np.tril(np.ones((n, n))) / n)",
}


def _model_pattern(model, asked):
    """The ``mask``, ``mask_normalization`` and ``logit_bias`` of ``model`` on the keys and key
    weights of the pattern ``asked`` (an :class:`AttentionPattern`): the same weights as
    multiplicative ones for linear attention (a logit bias ``b``: ``exp(b)``), as a logit
    bias for softmax (weights ``m``: ``log m``), averaged (``"linear"``) or as given
    (``"linear-1/n"``)."""
    keys, weights, bias = asked.allowed, asked.weights, asked.bias
    if model == "softmax":
        if weights is not None:
            bias = np.log(np.where(weights > 0, weights, 1.0))
        return dict(mask=keys, logit_bias=bias)
    if bias is not None:  # exp(b) per row up to a factor, which the average removes
        weights = np.exp(bias - bias.max(axis=1, keepdims=True))
        if keys is not None:
            weights = np.where(keys, weights, 0.0)
    normalization = "none" if model == "linear-1/n" else "mean"
    return dict(mask=keys if weights is None else weights, mask_normalization=normalization)


def _checked(model, n_tokens, asked):
    family = "softmax" if model == "softmax" else "linear"
    return check_attention_pattern(n_tokens=n_tokens, attention=family,
                                   **_model_pattern(model, asked))


def _blocks(X, Y, lengths, pattern):
    """``(X, Y, allowed, weights, queries, gains)`` block by block for a checked ``pattern``:
    the allowed keys ``(b, n, n)`` and the weights at a zero kernel (:func:`base_weights`;
    both ``None``: uniform over all keys), the queries that are not padding ``(b, n)``, and
    ``c_i``, the row sums of the key weights before any normalisation (``|K_i| / n`` for a
    0/1 mask; ``None`` without keys)."""
    n = X.shape[1]
    for start in range(0, X.shape[0], _BLOCK):
        stop = start + _BLOCK
        Xb, Yb = X[start:stop], Y[start:stop]
        valid = None if lengths is None else valid_tokens(lengths[start:stop], n)
        allowed = pattern.keys(valid, n)
        if allowed is None:
            yield Xb, Yb, None, None, np.ones(Xb.shape[:2], dtype=bool), None
            continue
        weights, queries = base_weights(pattern, allowed)
        raw = allowed * (1.0 / n if pattern.weights is None else pattern.weights)
        gains = np.broadcast_to(raw.sum(axis=-1), Xb.shape[:2])
        yield Xb, Yb, allowed, weights, np.broadcast_to(queries, Xb.shape[:2]), gains


def _predict(model, X, kernel, V, allowed, weights, bias):
    """The output ``ŷ`` of attention ``model`` with kernel ``W`` (logits ``x_iᵀ W x_j``) and
    the weights of its pattern at a zero kernel."""
    if model == "softmax":
        return softmax_weights(X, kernel.T, allowed, bias) @ X @ V.T
    # Linear: ŷ_i = V S_i Wᵀ x_i, S_i = sum_j a_ij x_j x_jᵀ over the keys, so
    # S_i z_i = sum_j a_ij (x_jᵀ z_i) x_j with z_i = Wᵀ x_i (Xᵀ X Z / n without a mask).
    Z = X @ kernel
    if weights is None:
        return Z @ (X.transpose(0, 2, 1) @ X / X.shape[1]) @ V.T
    return (weights * (Z @ X.transpose(0, 2, 1))) @ X @ V.T


def _alternatives(asked, varying, biased):
    """The models compared with the one asked for (``varying``: the visible keys vary, so that
    averaging and the weights as given differ; ``biased``: a logit bias, whose weights have
    no scale of their own to take as given)."""
    models = ["linear", "softmax"] + (["linear-1/n"] if varying and not biased else [])
    return [m for m in models if m != asked]


def _score_terms(attention, varying):
    terms = ["values' mean"]
    if attention == "linear" and varying:
        terms.append("gain with the visible keys")
    return terms


def _fit_kernel(model, X, Y, V, asked, lengths):
    """Kernel ``W`` of ``model`` fitted to sequences, on the keys and weights of ``asked``."""
    family = "softmax" if model == "softmax" else "linear"
    moments = KernelMoments(V, family, **_model_pattern(model, asked))
    return moments.update(X, Y, lengths).solve().kernel


def _sequence_errors(model, X, Y, kernel, V, asked, lengths):
    """Squared error of ``model``'s output per sequence."""
    pattern = _checked(model, X.shape[1], asked)
    errors = []
    for Xb, Yb, allowed, weights, queries, _ in _blocks(X, Y, lengths, pattern):
        predicted = _predict(model, Xb, kernel, V, allowed, weights, pattern.bias)
        residual = (Yb - predicted) * queries[..., None]
        errors.append(np.einsum("sij,sij->s", residual, residual))
    return np.concatenate(errors)


def _scores(model, X, Y, kernel, V, pattern, lengths, varying):
    """Per-sequence scores ``u_s``, one column per term of :func:`_score_terms`."""
    n = X.shape[1]
    if model == "linear" and pattern.plain and lengths is None:
        # Every token sees the whole sequence: sum_i (V x̄)ᵀ r_i = n (V x̄)ᵀ (ȳ - V S Wᵀ x̄)
        # with S Wᵀ x̄ = Xᵀ (X Wᵀ x̄) / n: O(n d) a sequence, no output formed.
        ones = np.full(n, 1.0 / n)
        means, target = ones @ X, ones @ Y
        q = np.matmul(X, (means @ kernel)[:, :, None])
        fitted = np.matmul(q.transpose(0, 2, 1), X)[:, 0] @ (V.T / n)
        return n * np.einsum("sj,sj->s", means @ V.T, target - fitted)[:, None]
    scores = []
    for Xb, Yb, allowed, weights, queries, gains in _blocks(X, Y, lengths, pattern):
        predicted = _predict(model, Xb, kernel, V, allowed, weights, pattern.bias)
        residual = (Yb - predicted) * queries[..., None]
        if weights is None:
            means = Xb.mean(axis=1, keepdims=True) @ V.T
        else:  # the values' mean under the pattern's weights, normalised over the keys
            total = weights.sum(axis=-1, keepdims=True)
            mean_weights = np.divide(weights, total, out=np.zeros(weights.shape),
                                     where=total > 0)
            means = mean_weights @ Xb @ V.T
        columns = [np.einsum("sij,sij->s", means, residual)]
        if model != "softmax" and varying:
            gain = gains - gains[queries].mean()
            columns.append(np.einsum("sij,sij->s", gain[..., None] * predicted, residual))
        scores.append(np.stack(columns, axis=1))
    return np.concatenate(scores)


def _hotelling(U):
    """Hotelling's test that the rows of ``U`` have mean zero: the statistic ``F`` and its
    ``F(k, N - k)`` p-value (terms without variance dropped)."""
    N = U.shape[0]
    mean = U.mean(axis=0)
    S = np.cov(U, rowvar=False).reshape(U.shape[1], U.shape[1])
    scale = np.sqrt(np.diag(S))
    keep = scale > 1e-12 * max(scale.max(initial=0.0), np.finfo(float).tiny)
    k = int(keep.sum())
    if k == 0 or N <= k + 1:
        return np.nan, 1.0, k
    # Correlations, not covariances: the terms' scales differ by orders of magnitude.
    z = mean[keep] / scale[keep]
    R = S[np.ix_(keep, keep)] / np.outer(scale[keep], scale[keep])
    T2 = N * float(z @ np.linalg.lstsq(R, z, rcond=1e-12)[0])
    F = T2 * (N - k) / (k * (N - 1))
    return F, float(special.fdtrc(k, N - k, F)), k


def lack_of_fit(X, Y, kernel, V, attention, mask=None, lengths=None, level=LACK_OF_FIT_LEVEL,
                *, mask_normalization=None, logit_bias=None):
    """Test the fitted attention model for lack of fit; compare it with the others if it fails.

    Parameters
    ----------
    X, Y : ndarray of shape (N, n, d) and (N, n, d_out)
        The sequences, in the units ``kernel`` was fitted in.
    kernel : ndarray of shape (d, d)
        The fitted kernel ``W`` (logits ``x_iᵀ W x_j``; for softmax, times ``beta / sqrt(d)``).
    V : ndarray of shape (d_out, d)
        The value map.
    attention : {"linear", "softmax"}
        The model fitted.
    mask, lengths
        The attention mask (``None``, ``"causal"``, a 0/1 array or, for linear attention, an
        array of key weights) and the padded lengths (checked, or ``None``).
    level : float
        The test's level; below it the held-out comparison runs.
    mask_normalization, logit_bias
        The rest of the attention pattern, as the estimator takes them
        (:func:`~._attention_operators.check_attention_pattern`). The alternatives are fitted
        on the same keys and key weights: a softmax alternative takes the weights ``m`` as the
        bias ``log m``, a linear one a bias ``b`` as the weights ``exp(b)``.

    Returns
    -------
    result : dict
        ``"statistic"`` (Hotelling's ``F``), ``"p_value"``, ``"df"`` (``(k, N - k)``),
        ``"terms"`` (what the residuals were regressed on), ``"level"``, ``"failed"``
        (``p_value <= level``), ``"model"`` (the one fitted: ``"linear-1/n"`` for linear
        attention whose weights are taken as given); where it failed, ``"held_out"`` (per
        model its mean held-out squared error per query token), ``"held_out_p_values"`` (per
        alternative, the one-sided paired test of fitting better than the model fitted) and
        ``"better"`` (the alternative with the smallest held-out error among those that fit
        significantly better at ``level``, or ``None``).
    """
    pattern = check_attention_pattern(mask, X.shape[1], attention, mask_normalization,
                                      logit_bias)
    asked = "linear-1/n" if attention == "linear" and pattern.normalization == "none" else (
        attention)
    n_queries = (X.shape[0] * X.shape[1] if lengths is None else int(np.sum(lengths)))
    varying = (pattern.allowed is not None or pattern.weights is not None
               or (lengths is not None and np.any(lengths < X.shape[1])))
    U = _scores(asked, X, Y, kernel, V, pattern, lengths, varying)
    F, p_value, k = _hotelling(U)
    result = {"statistic": F, "p_value": p_value, "df": (k, X.shape[0] - k),
              "terms": _score_terms(attention, varying), "level": level,
              "failed": bool(p_value <= level), "model": asked, "better": None}
    if result["failed"] and X.shape[0] >= 4:
        result.update(_held_out(X, Y, V, asked, pattern, lengths, varying, level, n_queries))
    return result


def _held_out(X, Y, V, asked, pattern, lengths, varying, level, n_queries):
    """Cross-fitted comparison on the two halves of the sequences (even and odd indices)."""
    halves = [np.arange(0, X.shape[0], 2), np.arange(1, X.shape[0], 2)]
    errors = {}
    part = [None, None] if lengths is None else [lengths[half] for half in halves]
    for model in [asked, *_alternatives(asked, varying, pattern.bias is not None)]:
        per_sequence = np.empty(X.shape[0])
        for train, test in ((0, 1), (1, 0)):
            kernel = _fit_kernel(model, X[halves[train]], Y[halves[train]], V, pattern,
                                 part[train])
            per_sequence[halves[test]] = _sequence_errors(
                model, X[halves[test]], Y[halves[test]], kernel, V, pattern, part[test])
        errors[model] = per_sequence
    p_values = {}
    for model in errors:
        if model == asked:
            continue
        gain = errors[asked] - errors[model]  # > 0 where the alternative fits better
        spread = gain.std(ddof=1)
        t = gain.mean() / spread * np.sqrt(gain.size) if spread > 0 else 0.0
        p_values[model] = float(special.stdtr(gain.size - 1, -t))  # P(T > t)
    better = [m for m in p_values if p_values[m] <= level]
    return {"held_out": {m: float(e.sum() / n_queries) for m, e in errors.items()},
            "held_out_p_values": p_values,
            "better": min(better, key=lambda m: errors[m].sum()) if better else None}


def lack_of_fit_message(result):
    """The warning for a failed :func:`lack_of_fit` result, naming what fits better."""
    fitted = MODELS[result["model"]]
    text = (f"The fitted {fitted} does not explain these data: its residuals are still "
            f"explained by the inputs ({' and '.join(result['terms'])}; lack-of-fit F = "
            f"{result['statistic']:.3g}, p = {result['p_value']:.2g} <= {result['level']:g}), "
            "so the rank read from its kernel need not be the task's. ")
    held_out = result.get("held_out")
    if held_out is None:
        return text + "Read the data with the attention model that made them."
    mine = held_out[result["model"]]
    better = result["better"]
    if better is None:
        others = ", ".join(f"{m}: {held_out[m]:.3g}" for m in held_out if m != result["model"])
        return text + (f"No other attention model fits them significantly better on held-out "
                       f"sequences (mean squared error per token {mine:.3g}; {others}): they "
                       "may not be one attention layer of this value map.")
    advice = _ADVICE[better]
    return text + (f"{MODELS[better][0].upper()}{MODELS[better][1:]} fits these data better: "
                   f"held-out mean squared error per token {held_out[better]:.3g} against "
                   f"{mine:.3g} (paired p = {result['held_out_p_values'][better]:.2g}); "
                   f"{advice}.")
