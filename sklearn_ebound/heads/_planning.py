"""A per-head rank allocation under a budget or a tolerance, from measured deficiency curves.

Greedy by marginal error (the heads' relative output errors, their errors in the residual
stream, optionally over the worst texts, or the loss they are predicted to cost a language
model through the Fisher weights of :func:`head_sensitivity`), one tolerance for every head,
or uniform ranks.
"""

import math
from numbers import Real

import numpy as np

from .._utils.results import ResultTable
from ._deficiency import eps_rank
from ._head_forms import METHODS, check_fraction

__all__ = ["ALLOCATIONS", "plan_ranks"]


def plan_curves(result, method):
    curves = result.achievable_curves() if method == "trained" else result.curves(method)
    if np.isnan(curves).all():
        raise ValueError(f"The result holds no {method!r} curves; compute them with "
                         f"`methods` including {method!r}.")
    return curves


def _greedy(price, units, *, spend=False):
    """Ranks minimising the sum of ``price`` for ``units`` total rank, greedily by marginal gain.

    Each step moves one head up by the jump (of any size) with the largest price decrease per
    unit of rank. By default a non-monotone curve is read through its running minimum and
    the greedy stops when no step lowers the price; with ``spend`` every unit is spent (as
    far as the heads hold), the step taken even when the price rises: a price with a
    first-order term can fall as a head loses rank, and the budget is what the user keeps.
    """
    raw = price.reshape(-1, price.shape[-1])
    flat = raw if spend else np.minimum.accumulate(raw, axis=1)
    d_h = flat.shape[1] - 1
    ranks = np.zeros(len(flat), dtype=int)
    jumps = np.arange(1, d_h + 1)
    heads = np.arange(len(flat))
    left = min(units, len(flat) * d_h)
    while left > 0:
        target = ranks[:, None] + jumps[None, :]  # (heads, jumps)
        allowed = (target <= d_h) & (jumps[None, :] <= left)
        gains = (flat[heads, ranks][:, None] - flat[heads[:, None], np.minimum(target, d_h)])
        gains = np.where(allowed & ~np.isnan(gains), gains / jumps[None, :], -np.inf)
        h, j = np.unravel_index(np.argmax(gains), gains.shape)
        if gains[h, j] == -np.inf or not (spend or gains[h, j] > 0):
            break
        ranks[h] += jumps[j]
        left -= jumps[j]
    if spend:
        return ranks.reshape(price.shape[:2])
    # the smallest rank reaching each head's running minimum
    return np.array([int(np.argmin(raw[h, :r + 1])) for h, r in enumerate(ranks)]).reshape(
        price.shape[:2])


def _greedy_worst(per_text, units, share):
    """Ranks minimising the mean over the worst ``share`` of the texts of their summed
    errors (``per_text``: ``(n_layers, n_heads, d_h + 1, n_texts)``), greedily by marginal
    gain per unit of rank as :func:`_greedy` does."""
    flat = per_text.reshape(-1, *per_text.shape[2:])
    n, d_h, n_texts = flat.shape[0], flat.shape[1] - 1, flat.shape[2]
    k = max(1, int(math.ceil(share * n_texts)))
    heads, jumps = np.arange(n), np.arange(1, d_h + 1)

    def worst(totals):  # mean of the k largest along the last axis
        return -np.partition(-totals, k - 1, axis=-1)[..., :k].mean(-1)

    ranks = np.zeros(n, dtype=int)
    totals = flat[:, 0].sum(0)
    left = units
    while left > 0:
        target = np.minimum(ranks[:, None] + jumps[None, :], d_h)
        delta = flat[heads[:, None], target] - flat[heads, ranks][:, None]  # heads, jumps, texts
        gains = (worst(totals) - worst(totals + delta)) / jumps[None, :]
        allowed = (ranks[:, None] + jumps[None, :] <= d_h) & (jumps[None, :] <= left)
        gains = np.where(allowed, gains, -np.inf)
        h, j = np.unravel_index(np.argmax(gains), gains.shape)
        if not gains[h, j] > 0:
            break
        totals = totals + delta[h, j]
        ranks[h] += jumps[j]
        left -= jumps[j]
    return ranks.reshape(per_text.shape[:2])


def _tolerance_ranks(curves, eps):
    return np.array([[eps_rank(c, eps) for c in layer] for layer in curves])


def _check_plan_options(budget, eps, method, allocation, weighting, worst_texts, sensitivity):
    """The checks of :func:`plan_ranks`' options that need no curves."""
    if (budget is None) == (eps is None):
        raise ValueError("Give exactly one of `budget` and `eps`.")
    if method not in METHODS:
        raise ValueError(f"`method` must be one of {list(METHODS)}. Got {method!r}.")
    if weighting not in ("output", "none"):
        raise ValueError(f"`weighting` must be 'output' or 'none'. Got {weighting!r}.")
    if allocation not in ALLOCATIONS:
        raise ValueError(f"`allocation` must be one of {list(ALLOCATIONS)}. Got "
                         f"{allocation!r}.")
    if worst_texts is not None:
        if allocation != "residual":
            raise ValueError("`worst_texts` needs allocation='residual'.")
        if (isinstance(worst_texts, bool) or not isinstance(worst_texts, Real)
                or not 0 < worst_texts <= 1):
            raise ValueError(f"`worst_texts` must be a number in (0, 1]. Got {worst_texts!r}.")
    if (allocation in ("fisher", "taylor")) != (sensitivity is not None):
        raise ValueError(f"allocation={allocation!r} needs `sensitivity` (head_sensitivity), "
                         "and `sensitivity` is only read by allocation='fisher' or 'taylor'.")
    if sensitivity is not None and not hasattr(sensitivity, "weights"):
        raise TypeError("`sensitivity` must be a head_sensitivity result. Got "
                        f"{type(sensitivity).__name__} instead.")


def _loss_price(result, curves, method, allocation, eps, sensitivity):
    """``(n_layers, n_heads, d_h + 1)``: each head's predicted loss at each rank, ``None``
    without ``sensitivity``. Second order: the Fisher weight times the relative error
    (``w_h err_h(r)``); with ``"taylor"`` plus the first-order term ``<M_h, G_r - I>``."""
    fisher = None if sensitivity is None else sensitivity.weights(result)
    price = None if fisher is None else curves * fisher[..., None]  # second order
    if allocation == "taylor":
        if method not in ("data", "weight") or eps is not None:
            raise ValueError("allocation='taylor' plans a `budget` on the 'data' or 'weight' "
                             f"forms (maps of the query). Got method={method!r}"
                             + (", eps" if eps is not None else "") + ".")
        price = price + sensitivity.first_order(result, method)
    return price


def _budget_ranks(result, curves, price, residual, units, method, allocation, weighting,
                  worst_texts):
    """``(n_layers, n_heads)`` ranks summing to at most ``units``, by ``allocation``."""
    if allocation == "uniform":
        return np.full(curves.shape[:2], units // (curves.shape[0] * curves.shape[1]))
    if allocation == "greedy":
        weights = np.ones(curves.shape[:2])
        if weighting == "output" and np.all(np.isfinite(result.output_share)):
            weights = np.asarray(result.output_share, dtype=float)
        return _greedy(curves * weights[..., None], units)
    if allocation == "fisher":  # predicted loss: weight x relative error, summed
        return _greedy(price, units)
    if allocation == "taylor":  # the same with the first-order term: spend it all
        return _greedy(price, units, spend=True)
    if allocation == "residual" and worst_texts is not None:
        return _greedy_worst(result.residual_curves(method, per_text=True), units,
                             float(worst_texts))
    if allocation == "residual":
        return _greedy(residual, units)
    return _one_tolerance_ranks(curves, units)


def _one_tolerance_ranks(curves, units):
    """One tolerance for every head: the eps-ranks with the largest total within ``units``,
    by bisection on ``log eps`` in ``[1e-8, 1]``."""
    lo, hi = 1e-8, 1.0
    ranks = _tolerance_ranks(curves, hi)
    for _ in range(60):
        mid = math.sqrt(lo * hi)
        trial = _tolerance_ranks(curves, mid)
        if trial.sum() <= units:
            hi, ranks = mid, trial
        else:
            lo = mid
    return ranks


def _plan_rows(result, ranks, curves, residual, price):
    """One row per head: its planned rank, its relative and residual-stream errors there,
    and with a ``price`` its predicted loss."""
    rows = []
    for li, layer in enumerate(result.layer_indices):
        for hi_, h in enumerate(result.heads):
            r = int(ranks[li, hi_])
            row = {"layer": int(layer), "head": h, "rank": r,
                   "error": float(curves[li, hi_, r]),
                   "residual_error": float(residual[li, hi_, r])}
            if price is not None:
                row["predicted_loss"] = float(price[li, hi_, r])
            rows.append(row)
    return rows


ALLOCATIONS = ("greedy", "residual", "fisher", "taylor", "tolerance", "uniform")


def plan_ranks(result, *, budget=None, eps=None, method="trained", allocation="greedy",
               weighting="output", worst_texts=None, sensitivity=None):
    """A per-head rank allocation from the measured curves.

    Parameters
    ----------
    result : HeadDeficiencyResult
    budget : float, default=None
        Total query-key rank kept, as a fraction of ``n_heads x d_h`` summed over the layers.
    eps : float, default=None
        Tolerance: each head gets its eps-rank (exactly one of ``budget`` and ``eps``).
    method : {"trained", "data", "weight"}, default="trained"
        The curves planned on (``"trained"``: the best pair found at each rank).
    allocation : {"greedy", "residual", "fisher", "taylor", "tolerance", "uniform"}
        For a budget: ``"greedy"`` by marginal error (the sum over heads of their relative
        errors, weighted by ``weighting``); ``"residual"`` greedy by marginal error in the
        residual stream (the sum over heads of
        :meth:`HeadDeficiencyResult.residual_curves`: each head's error after its output
        projection, relative to the stream at its layer, so that a head adding little to
        the stream weighs little); ``"fisher"``: greedy by the predicted increase of a
        causal language model's next-token loss, the sum over heads of each head's Fisher
        weight (``sensitivity``) times its relative error, so that the rank goes where the
        model downstream reads the head's output (on SmolLM2-135M it has the lowest
        next-token KL of the plans at every budget from 30% to 90%, and a lower
        perplexity than one uniform rank from 30% to 60%, :ref:`real_models_fisher`);
        ``"taylor"``: the Fisher price plus each head's first-order loss change along its
        truncation (:meth:`HeadSensitivityResult.first_order`, shrunk by its split-half
        reliability), spending the whole budget even where the price falls with the rank:
        a lower perplexity on text of the calibration's kind, bought mostly by making an
        overconfident model less sure of itself, so further from the original in KL than
        ``"fisher"`` and above one uniform rank once each model's softmax temperature is
        fitted; on text of another kind it can lose to one uniform rank
        (:ref:`real_models_taylor`, :ref:`real_models_temperature`);
        ``"tolerance"``: one tolerance for all
        heads (the largest total within the budget); ``"uniform"``: the same rank for every
        head. Measured on
        all-MiniLM-L6-v2, ``"greedy"`` and ``"residual"`` give the same held-out fidelity
        within the texts' spread (:ref:`real_models`).
    weighting : {"output", "none"}, default="output"
        What ``"greedy"`` sums: each head's relative error times its ``output_share`` (the
        head's energy in the residual stream, so that the error is on the scale of what the
        layer adds), or the relative errors as they are.
    worst_texts : float, default=None
        With ``"residual"``: plan for the mean over the worst ``worst_texts`` fraction of
        the evaluation texts (each text's residual-stream error summed over heads) instead
        of the error over all tokens, to protect the texts that suffer most.
    sensitivity : HeadSensitivityResult, default=None
        The Fisher weights of :func:`head_sensitivity`, measured on the same model;
        needed by, and only by, ``allocation="fisher"`` and ``"taylor"``.

    Returns
    -------
    plan : ResultTable
        Rows ``layer``, ``head``, ``rank``, ``error`` (the head's measured relative error
        at that rank) and ``residual_error`` (its residual-stream error, NaN without output
        projections), and with ``sensitivity`` ``predicted_loss`` (the head's weight times
        its error, with ``"taylor"`` plus its first-order term: its predicted share of the loss
        increase, nats per token); metadata ``predicted_loss`` (their sum, with
        ``sensitivity``), ``first_order_reliability`` (with ``"taylor"``), ``budget_used``,
        ``method``, ``allocation``, ``weighting``, ``worst_texts``, ``budget``, ``eps``.
    """
    _check_plan_options(budget, eps, method, allocation, weighting, worst_texts, sensitivity)
    curves = plan_curves(result, method)
    price = _loss_price(result, curves, method, allocation, eps, sensitivity)
    residual = result.residual_curves(method)
    if allocation == "residual" and np.isnan(residual[np.isfinite(curves)]).any():
        raise ValueError("allocation='residual' needs the heads' output projections; the "
                         "result holds no residual-stream errors.")
    d_h = result.head_dim
    if eps is not None:
        eps = check_fraction(eps, "eps")
        ranks = _tolerance_ranks(curves, eps)
    else:
        if isinstance(budget, bool) or not isinstance(budget, Real) or not 0 <= budget <= 1:
            raise ValueError(f"`budget` must be a number in [0, 1]. Got {budget!r} instead.")
        units = int(np.floor(budget * curves.shape[0] * curves.shape[1] * d_h + 1e-9))
        ranks = _budget_ranks(result, curves, price, residual, units, method, allocation,
                              weighting, worst_texts)
    rows = _plan_rows(result, ranks, curves, residual, price)
    used = float(ranks.sum() / (ranks.size * d_h))
    extra = {} if price is None else {
        "predicted_loss": float(sum(row["predicted_loss"] for row in rows))}
    if allocation == "taylor":
        extra["first_order_reliability"] = sensitivity.first_order_reliability(result, method)
    return ResultTable(rows, **extra, budget_used=used, method=method, allocation=allocation,
                       weighting=weighting, worst_texts=worst_texts, budget=budget, eps=eps,
                       head_dim=d_h)
