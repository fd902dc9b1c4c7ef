"""Rank predictors of every head (weights, logit field, data alone) against its eps-ranks."""

import time
from numbers import Integral

import numpy as np

from .._utils.results import ResultTable
from ._head_forms import (
    HeadBatches,
    HeadModel,
    augmented_weights,
    check_texts,
    layers_of,
    model_source,
)
from ._inputs import capture_inputs, require, rope_tables

__all__ = ["head_predictors", "predictor_agreement"]


def _known_value_bytes(d, n_sequences, n_tokens):
    """Memory of the value-known statistics of :class:`~sklearn_ebound.IntrinsicRankEstimator`.

    Up to ``d = 48`` (no mask) a ``d(d+1)/2``-square float64 matrix; above, the matrix-free
    solver keeps the sequences (and, for softmax, their weights and residuals: about three
    copies) and a few ``d x d`` matrices.
    """
    if d <= 48:
        m = d * (d + 1) // 2
        return 8 * m * m
    return 8 * (3 * n_sequences * n_tokens * (d + n_tokens) + 16 * d * d)


def _kernel_equations(n_windows, window, value_rank, causal):
    """At most how many equations the windows give on a head's query-key kernel, value known.

    A query attending to ``K`` keys constrains ``min(rank V, K - 1)`` numbers of the kernel
    (the softmax is blind to a shift of its logits): the count of
    :class:`~sklearn_ebound.IntrinsicRankEstimator`, below which the kernel is not identified.
    """
    keys = np.arange(1, window + 1) if causal else np.full(window, window)
    return int(n_windows * np.minimum(value_rank, keys - 1).sum())


def _known_value_reason(d, n_windows, window, span, value_rank, causal, max_memory):
    """Why the value-known estimate is not run on the windows (``""`` when it is); ``span`` is
    the dimension the windows' tokens span, ``value_rank`` the rank of the value map."""
    need = _known_value_bytes(d, n_windows, window)
    if need > max_memory:
        return f"value-known statistics need {need / 2 ** 30:.1f} GiB > max_memory"
    equations = _kernel_equations(n_windows, window, value_rank, causal)
    if equations < span * span:
        return (f"kernel not identified: {n_windows} windows give at most {equations} equations "
                f"on its {span}^2 = {span * span} entries")
    return ""


def _layer_windows(model, layer, texts, tokenizer, window, rotary, theta, max_length,
                   batch_size):
    """The first ``window`` input tokens of the layer's attention, ``(n_windows, window,
    d)``, of every text that has as many, and with rotary embeddings their rotation tables
    (``None`` without)."""
    seqs, rots = capture_inputs(model, [layer], texts, tokenizer, rotary=rotary,
                                max_length=max_length, batch_size=batch_size,
                                stop_early=True)
    keep = [i for i, x in enumerate(seqs[0]) if len(x) >= window]
    if len(keep) < 2:
        raise ValueError(f"Fewer than 2 texts have `window`={window} tokens; lower it.")
    X = np.stack([seqs[0][i][:window] for i in keep])
    rot = None
    if rotary:
        base = theta if layer.rope_theta is None else layer.rope_theta
        tables = [rots[0][i] if rots[0] and rots[0][i] is not None
                  else rope_tables(len(seqs[0][i]), layer.head_dim, base) for i in keep]
        rot = [(c[:window], s[:window]) for c, s in tables]
    return X, rot


def _head_outputs(layer, head_list, X, rot, causal, window):
    """``{head: (n_windows, window, d_h)}``: each head's output on the windows, with the
    model's mask."""
    torch = require("torch")

    batches = HeadBatches(list(X), rot, causal, torch.float64, window=layer.window)
    wq, wk, wv = augmented_weights(layer)
    order = np.argsort([window] * len(X), kind="stable")  # HeadBatches keeps this order
    outputs = {}
    for h in head_list:
        head = HeadModel(layer, h, (wq, wk, wv))
        with torch.no_grad():
            outs = [head.output(grp).numpy() for grp in batches.groups]
        outputs[h] = np.concatenate(outs)[np.argsort(order)]
    return outputs


def _energy_ranks(ranks_row, taus):
    """The kernel's and the logit field's energy ranks of a :func:`head_ranks` row."""
    row = {}
    for tau in taus:
        label = format(100 * tau, "g")
        row[f"kernel_energy_rank_{label}"] = ranks_row[f"kernel_energy_rank_{label}"]
        row[f"field_energy_rank_{label}"] = ranks_row[f"field_energy_rank_{label}"]
    return row


def _data_only_ranks(layer, g, X, Y, causal, reason):
    """The data-only estimates of a head's rank from its windows ``X`` and outputs ``Y``:
    value map unknown, and known (``W_V^T`` of key head ``g``, its bias taken off the
    outputs), NaN when ``reason`` says why it is not run."""
    import warnings

    from .. import IntrinsicRankEstimator
    from ..exceptions import RankEstimationWarning

    mask = "causal" if causal else None
    with warnings.catch_warnings():
        # The caveats (softmax linearised, finite windows) are the point measured here.
        warnings.simplefilter("ignore", RankEstimationWarning)
        # Only the ranks are measured: no lack-of-fit check (and its refits).
        unknown = IntrinsicRankEstimator(
            operator="attention", attention="softmax", value=None,
            mask=mask, lack_of_fit=False).fit(X, Y).rank_
        if reason:
            return unknown, np.nan
        bias = 0.0 if layer.b_v is None else layer.b_v[g]
        known = IntrinsicRankEstimator(
            operator="attention", attention="softmax", value=layer.w_v[g].T,
            mask=mask, lack_of_fit=False).fit(X, Y - bias).rank_
    return unknown, known


def head_predictors(model, texts, *, tokenizer=None, layers=None, heads=None, window=16,
                    taus=(0.9,), max_memory=2 ** 31, max_length=64, batch_size=32):
    """Rank predictors of every head, from its weights, its logit field and its data alone.

    Per head: the energy ranks of the query-key kernel ``W_Q W_K^T`` and of the logit field on
    ``texts`` (:func:`~sklearn_ebound.heads.head_ranks`), and the data-only estimate of
    :class:`~sklearn_ebound.IntrinsicRankEstimator` (``operator="attention"``,
    ``attention="softmax"``) from the head's inputs and outputs: with the head's value map
    known (``value = W_V^T``, ``d_h x d``; the value bias taken off the outputs, since the
    attention weights sum to one) and unknown (``value=None``).

    The estimator takes sequences of one length: every text with at least ``window`` tokens
    gives its first ``window`` tokens, and the head's output is computed on that window with
    the model's mask (for a causal model the window's outputs are the model's own).

    The value-known statistics take a ``d(d+1)/2``-square matrix up to ``d = 48`` and the
    windows themselves above (the matrix-free solver). The estimate is NaN, and
    ``known_reason`` says why, when that exceeds ``max_memory`` bytes, or when the windows
    give fewer equations on the kernel than it has entries (a query constrains at most
    ``min(rank W_V, keys - 1)`` numbers; the estimator's own count): there the kernel is not
    identified, and any rank read from it would be one exact fit among many. A causal model's
    windows are read with ``mask="causal"``.

    Returns
    -------
    table : ResultTable
        Rows ``layer``, ``head``, ``kernel_energy_rank_{tau}``, ``field_energy_rank_{tau}``,
        ``data_only_value_unknown``, ``data_only_value_known``, ``known_reason``; metadata
        ``window``, ``n_windows``, ``seconds``.
    """
    from ._ranks import head_ranks

    require("torch")
    model, tokenizer = model_source(model, tokenizer)
    texts = check_texts(texts, "texts")
    if isinstance(window, bool) or not isinstance(window, Integral) or window < 2:
        raise ValueError(f"`window` must be an integer >= 2. Got {window!r}.")
    start = time.perf_counter()
    family, all_layers, theta = layers_of(model)
    rotary, causal = family.rotary, family.is_causal(model.config)
    chosen = all_layers if layers is None else [lay for lay in all_layers
                                                if lay.index in set(layers)]
    head_list = list(range(all_layers[0].n_heads)) if heads is None else sorted(set(heads))
    ranks = head_ranks(model, inputs=texts, tokenizer=tokenizer, taus=taus,
                       max_length=max_length, batch_size=batch_size)
    by_head = {(row["layer"], row["head"]): row for row in ranks.rows}
    d = all_layers[0].w_q.shape[1]
    rows, n_windows = [], 0
    for layer in chosen:
        X, rot = _layer_windows(model, layer, texts, tokenizer, window, rotary, theta,
                                max_length, batch_size)
        n_windows = len(X)
        span = np.linalg.matrix_rank(X.reshape(-1, d))  # the kernel's identifiable side
        outputs = _head_outputs(layer, head_list, X, rot, causal, window)
        for h in head_list:
            g = int(layer.kv_index[h])
            row = {"layer": layer.index, "head": h,
                   **_energy_ranks(by_head[(layer.index, h)], taus)}
            reason = _known_value_reason(d, n_windows, window, span,
                                         np.linalg.matrix_rank(layer.w_v[g]), causal, max_memory)
            row["data_only_value_unknown"], row["data_only_value_known"] = _data_only_ranks(
                layer, g, X, outputs[h], causal, reason)
            row["known_reason"] = reason
            rows.append(row)
    return ResultTable(rows, window=window, n_windows=n_windows,
                       seconds=time.perf_counter() - start, taus=list(taus))


def predictor_agreement(predictors, deficiency, *, epsilons=None, reference="trained"):
    """How close each predictor comes to the heads' eps-ranks.

    Parameters
    ----------
    predictors : ResultTable
        Output of :func:`head_predictors`.
    deficiency : HeadDeficiencyResult
    epsilons : sequence of float, default=None
        Tolerances; ``None`` means the result's.
    reference : {"trained", "data", "weight"}, default="trained"
        Whose eps-ranks are the truth (``"trained"``: the achievable ones).

    Returns
    -------
    table : ResultTable
        One row per (predictor, eps): ``mean_abs_diff``, ``within_2`` (share of heads within
        +-2), ``mean_bias`` (predictor minus eps-rank) and ``n_heads`` (heads with a value).
    """
    eps_table = deficiency.eps_ranks(epsilons)
    if f"{reference}_rank_{eps_table.epsilons[0]:g}" not in eps_table.columns:
        raise ValueError(f"The result has no {reference!r} eps-ranks; pass `reference` among "
                         "the methods it measured.")
    truth = {(r["layer"], r["head"]): r for r in eps_table.rows}
    names = [c for c in predictors.columns if c not in ("layer", "head", "known_reason")]
    rows = []
    for eps in eps_table.epsilons:
        for name in names:
            pairs = [(row[name], truth[(row["layer"], row["head"])][
                f"{reference}_rank_{eps:g}"]) for row in predictors.rows
                if (row["layer"], row["head"]) in truth]
            values = np.array([p for p, _ in pairs], dtype=float)
            target = np.array([t for _, t in pairs], dtype=float)
            ok = ~np.isnan(values)
            diff = values[ok] - target[ok]
            rows.append({"predictor": name, "eps": eps,
                         "mean_abs_diff": float(np.mean(np.abs(diff))) if ok.any() else np.nan,
                         "within_2": float(np.mean(np.abs(diff) <= 2)) if ok.any() else np.nan,
                         "mean_bias": float(np.mean(diff)) if ok.any() else np.nan,
                         "n_heads": int(ok.sum())})
    return ResultTable(rows, reference=reference)
