"""Lack of fit of the attention model a kernel was read with: are the residuals still explained?

The attention-native reading with a known value map fits one attention model (linear attention
averaged over the visible keys, or softmax attention) and reads the rank of its kernel. On data
of that model the residuals ``r_i = y_i - ŷ_i`` are noise; on data of another model the kernel
absorbs what it can and its rank, read with confidence, is not the task's. Two stages:

1. **A score test** (always, cheap): the residuals are regressed on the terms by which the other
   models differ from the one fitted, each a per-token vector of the inputs:

   * ``V x̄_i``, the values' mean over the visible keys: softmax weights sum to one, so the
     softmax output carries it with coefficient 1, while linear attention's carries none (a
     term ``V x̄_i (x̄_iᵀ W x_i)`` of second order);
   * ``(c_i - c̄) ŷ_i`` with ``c_i = |K_i| / n`` (linear attention, where the number of visible
     keys varies: a mask or padding): linear attention weighted ``1 / n`` instead of
     ``1 / |K_i|`` has the fitted output times ``c_i``, a gain that grows with the keys.

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
    allowed_keys,
    check_attention_mask,
    softmax_weights,
    uniform_weights,
    valid_tokens,
)

__all__ = ["LACK_OF_FIT_LEVEL", "MODELS", "lack_of_fit", "lack_of_fit_message"]

# Chance that data of the fitted model fail the test (and warn): the level of the residual
# diagnostics (``_diagnostics.DIAGNOSTIC_LEVEL``), so that clean data warn about as rarely.
LACK_OF_FIT_LEVEL = 1e-5
# Sequences per block of the passes over the data: the weights take block * n^2 floats.
_BLOCK = 256
# The attention models compared, and their description in a warning.
MODELS = {
    "linear": "linear attention averaged over the visible keys (attention='linear')",
    "linear-1/n": "linear attention weighted 1/n_tokens, not averaged over the visible keys",
    "softmax": "softmax attention (attention='softmax')",
}


def _blocks(X, Y, lengths, mask):
    """``(X, Y, allowed, uniform, queries, counts)`` block by block: the allowed keys ``(b, n,
    n)`` and the uniform weights over them (``None``: all keys), the queries that are not
    padding ``(b, n)``, ``c_i = |K_i| / n``."""
    n = X.shape[1]
    for start in range(0, X.shape[0], _BLOCK):
        stop = start + _BLOCK
        Xb, Yb = X[start:stop], Y[start:stop]
        valid = None if lengths is None else valid_tokens(lengths[start:stop], n)
        allowed = allowed_keys(mask, valid, n)
        if allowed is None:
            yield Xb, Yb, None, None, np.ones(Xb.shape[:2], dtype=bool), None
            continue
        uniform, queries = uniform_weights(allowed)
        counts = np.broadcast_to(allowed.sum(axis=-1), Xb.shape[:2])
        yield Xb, Yb, allowed, uniform, np.broadcast_to(queries, Xb.shape[:2]), counts / n


def _predict(model, X, kernel, V, allowed, uniform, counts):
    """The output ``ŷ`` of attention ``model`` with kernel ``W`` (logits ``x_iᵀ W x_j``)."""
    if model == "softmax":
        return softmax_weights(X, kernel.T, allowed) @ X @ V.T
    # Linear: ŷ_i = V S_i Wᵀ x_i, S_i the mean of x_j x_jᵀ over the visible keys, so
    # S_i z_i = sum_j a_ij (x_jᵀ z_i) x_j with z_i = Wᵀ x_i (Xᵀ X Z / n without a mask).
    Z = X @ kernel
    if uniform is None:
        out = Z @ (X.transpose(0, 2, 1) @ X / X.shape[1]) @ V.T
    else:
        out = (uniform * (Z @ X.transpose(0, 2, 1))) @ X @ V.T
    if model == "linear-1/n" and counts is not None:
        out *= counts[..., None]
    return out


def _alternatives(attention, varying):
    """The models compared with the one asked for (``varying``: the visible keys vary)."""
    models = ["linear", "softmax"] + (["linear-1/n"] if varying else [])
    return [m for m in models if m != attention]


def _score_terms(attention, varying):
    terms = ["values' mean"]
    if attention == "linear" and varying:
        terms.append("gain with the visible keys")
    return terms


def _fit_kernel(model, X, Y, V, mask, lengths):
    """Kernel ``W`` of ``model`` fitted to sequences (the 1/n weighting: least squares of the
    averaged model on the targets divided by ``c_i``, the same equations reweighted)."""
    if model == "linear-1/n":
        Y = Y.copy()
        for (*_, queries, counts), start in zip(
                _blocks(X, Y, lengths, mask), range(0, X.shape[0], _BLOCK), strict=True):
            if counts is not None:
                Y[start:start + _BLOCK] /= np.where(queries, counts, 1.0)[..., None]
        model = "linear"
    fit = KernelMoments(V, model, mask=mask).update(X, Y, lengths).solve()
    return fit.kernel


def _sequence_errors(model, X, Y, kernel, V, mask, lengths):
    """Squared error of ``model``'s output per sequence."""
    errors = []
    for Xb, Yb, allowed, uniform, queries, counts in _blocks(X, Y, lengths, mask):
        predicted = _predict(model, Xb, kernel, V, allowed, uniform, counts)
        residual = (Yb - predicted) * queries[..., None]
        errors.append(np.einsum("sij,sij->s", residual, residual))
    return np.concatenate(errors)


def _scores(attention, X, Y, kernel, V, mask, lengths, varying):
    """Per-sequence scores ``u_s``, one column per term of :func:`_score_terms`."""
    n = X.shape[1]
    if attention == "linear" and mask is None and lengths is None:
        # Every token sees the whole sequence: sum_i (V x̄)ᵀ r_i = n (V x̄)ᵀ (ȳ - V S Wᵀ x̄)
        # with S Wᵀ x̄ = Xᵀ (X Wᵀ x̄) / n: O(n d) a sequence, no output formed.
        ones = np.full(n, 1.0 / n)
        means, target = ones @ X, ones @ Y
        q = np.matmul(X, (means @ kernel)[:, :, None])
        fitted = np.matmul(q.transpose(0, 2, 1), X)[:, 0] @ (V.T / n)
        return n * np.einsum("sj,sj->s", means @ V.T, target - fitted)[:, None]
    scores = []
    for Xb, Yb, allowed, uniform, queries, counts in _blocks(X, Y, lengths, mask):
        predicted = _predict(attention, Xb, kernel, V, allowed, uniform, counts)
        residual = (Yb - predicted) * queries[..., None]
        means = (Xb.mean(axis=1, keepdims=True) if uniform is None else uniform @ Xb) @ V.T
        columns = [np.einsum("sij,sij->s", means, residual)]
        if attention == "linear" and varying:
            gain = counts - counts[queries].mean()
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


def lack_of_fit(X, Y, kernel, V, attention, mask=None, lengths=None, level=LACK_OF_FIT_LEVEL):
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
        The attention mask (``None``, ``"causal"`` or a 0/1 array) and the padded lengths
        (checked, or ``None``).
    level : float
        The test's level; below it the held-out comparison runs.

    Returns
    -------
    result : dict
        ``"statistic"`` (Hotelling's ``F``), ``"p_value"``, ``"df"`` (``(k, N - k)``),
        ``"terms"`` (what the residuals were regressed on), ``"level"``, ``"failed"``
        (``p_value <= level``), ``"model"`` (the one fitted); where it failed, ``"held_out"``
        (per model its mean held-out squared error per query token), ``"held_out_p_values"``
        (per alternative, the one-sided paired test of fitting better than the model fitted)
        and ``"better"`` (the alternative with the smallest held-out error among those that fit
        significantly better at ``level``, or ``None``).
    """
    checked = check_attention_mask(mask, X.shape[1])
    n_queries = (X.shape[0] * X.shape[1] if lengths is None else int(np.sum(lengths)))
    varying = checked is not None or (lengths is not None and np.any(lengths < X.shape[1]))
    U = _scores(attention, X, Y, kernel, V, checked, lengths, varying)
    F, p_value, k = _hotelling(U)
    result = {"statistic": F, "p_value": p_value, "df": (k, X.shape[0] - k),
              "terms": _score_terms(attention, varying), "level": level,
              "failed": bool(p_value <= level), "model": attention, "better": None}
    if result["failed"] and X.shape[0] >= 4:
        result.update(_held_out(X, Y, V, attention, mask, lengths, varying, level, n_queries))
    return result


def _held_out(X, Y, V, attention, mask, lengths, varying, level, n_queries):
    """Cross-fitted comparison on the two halves of the sequences (even and odd indices)."""
    halves = [np.arange(0, X.shape[0], 2), np.arange(1, X.shape[0], 2)]
    checked = check_attention_mask(mask, X.shape[1])
    errors = {}
    part = [None, None] if lengths is None else [lengths[half] for half in halves]
    for model in [attention, *_alternatives(attention, varying)]:
        per_sequence = np.empty(X.shape[0])
        for train, test in ((0, 1), (1, 0)):
            kernel = _fit_kernel(model, X[halves[train]], Y[halves[train]], V, checked,
                                 part[train])
            per_sequence[halves[test]] = _sequence_errors(
                model, X[halves[test]], Y[halves[test]], kernel, V, checked, part[test])
        errors[model] = per_sequence
    p_values = {}
    for model in errors:
        if model == attention:
            continue
        gain = errors[attention] - errors[model]  # > 0 where the alternative fits better
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
    advice = {"linear": "read them with attention='linear'",
              "softmax": "read them with attention='softmax'",
              "linear-1/n": "their rank is not that of this model's normalisation"}[better]
    return text + (f"{MODELS[better][0].upper()}{MODELS[better][1:]} fits these data better: "
                   f"held-out mean squared error per token {held_out[better]:.3g} against "
                   f"{mine:.3g} (paired p = {result['held_out_p_values'][better]:.2g}); "
                   f"{advice}.")
