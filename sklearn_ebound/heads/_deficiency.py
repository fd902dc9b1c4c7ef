"""How much query-key rank each head of a pretrained transformer needs, on its own output.

For head ``h`` of a layer, with token vectors ``x`` (what enters the query projection) and the
augmented token ``x~ = [x, 1]``, the logits are ``x~_i^T B x~_j / sqrt(d_h)`` with the
bilinear form ``B = W~_Q W~_K^T`` on ``[x, 1]``: ``W~_Q = [W_Q; b_Q]`` (``(d + 1) x d_h``), the
biases included. The head's output on a sequence is ``O = softmax(X~ B X~^T / sqrt(d_h) + mask)
X~ W~_V``, with the model's own mask (padding, causal for decoders) and, for rotary models,
its rotations of queries and keys. Replacing ``B`` by a rank-``r`` form ``B_r`` changes the
output; the **deficiency curve** of the head is the relative squared error

    err_h(r) = ||O_h(r) - O_h||^2 / ||O_h||^2,    r = 0, ..., d_h,

summed over the tokens of held-out text. Three rank-``r`` forms are measured:

``"weight"``
    The truncated SVD of ``B`` itself (Eckart-Young in the Frobenius norm of the weights).
``"data"``
    The best rank-``r`` form in the metric of the tokens' own second moments, calibrated on
    text the error is not measured on: with ``Sigma_Q = E[x~ x~^T]`` (queries) and
    ``Sigma_K`` the second moment of the keys centred within each sequence (softmax ignores
    what is constant along a row), ``B_r`` minimises ``tr((B - B_r)^T Sigma_Q (B - B_r)
    Sigma_K)``, the mean squared logit error: ``B_r = L_Q^{-T} [L_Q^T B L_K]_r L_K^{-1}``.
``"trained"``
    The achievable: a rank-``r`` pair ``(W~_Q', W~_K')`` trained (L-BFGS, a bounded number of
    iterations) to reproduce the head's outputs on the calibration text with the value map
    fixed, started from ``"data"``.

All forms are factorised as ``W~_Q' = W~_Q A_Q``, ``W~_K' = W~_K A_K`` with ``d_h x r`` maps
(the trained ones free), so a compressed model keeps the shapes of its query and key
projections: :func:`compress_heads` writes them back.

Rotary embeddings rotate the coordinate pairs ``(k, k + d_h/2)`` of queries and keys by
position-dependent angles, so a general change of head basis does not commute with them. For
rotary models the rank-``r`` form acts on the query before its rotation:
``W~_Q' = W~_Q G_r`` with ``G_r = A_Q[:, :r] A_K[:, :r]^T`` (rank ``r``), which gives the
kernel at offset 0 exactly the form above and the kernel at every offset a rank of at most
``r``; the keys (shared under grouped-query attention) are left untouched. The trained step
is not run for rotary heads.

The analysis runs one layer at a time, in named steps: split the texts, capture the layer's
inputs, each head's forms and curves, its trained pairs, then assemble the result. A layer's
output (a ``LayerDeficiency``) depends on no other layer, so a checkpoint folder can keep
finished layers and a rerun resume from them (``_layer_store``).
"""

import math
import time
from dataclasses import dataclass
from numbers import Integral, Real

import numpy as np

from .._utils.results import ResultTable
from ._head_forms import (
    METHODS,
    HeadBatches,
    HeadModel,
    attend,
    augmented_weights,
    check_fraction,
    check_texts,
    data_metric_roots,
    layers_of,
    metric_root,
    model_source,
    rotate,
)
from ._inputs import capture_inputs, require, rope_tables
from ._layer_store import LayerDeficiency, LayerStore, fingerprint

__all__ = ["HeadDeficiencyResult", "head_deficiency"]


# --- curves ---------------------------------------------------------------------------------


def _stream_root(wo):
    """``C`` (``d_h x d_h``) with ``||delta C|| = ||delta w_o||`` for every row ``delta``."""
    return None if wo is None else metric_root(wo @ wo.T)


def _head_curve(batches, head, forms, ranks):
    """Errors of one head (a :class:`HeadModel`) at every rank of ``ranks`` (increasing).

    Returns the relative output error ``(len(ranks),)``, ``||O||^2``, ``||O w_o||^2`` (the
    head's energy in the residual stream) and ``(len(ranks), n_sequences)``: each sequence's
    ``||(O(r) - O) w_o||^2``, the error in the residual stream (the last two NaN without
    ``w_o``).
    """
    torch = require("torch")
    wo, d_h, scale = head.wo, head.d_h, head.scale
    if forms.rotary:  # each rank's map on the query before its rotation
        maps = [torch.as_tensor(forms.query_map(r)) for r in ranks]
    else:
        a_q, a_k = torch.as_tensor(forms.A_Q), torch.as_tensor(forms.A_K)
    root = _stream_root(wo)
    root_t = None if root is None else torch.as_tensor(root)
    num = np.zeros(len(ranks))
    per_seq = np.full((len(ranks), batches.n_sequences), np.nan if wo is None else 0.0)
    den, stream = 0.0, 0.0 if wo is not None else np.nan
    for g in batches.groups:
        X, mask, valid = g["X"], g["mask"], g["valid"][..., None]
        q_full, k_full, v = head.queries(X), head.keys(X), head.values(X)
        k_rot = rotate(k_full, g["cos"], g["sin"])
        full = attend(rotate(q_full, g["cos"], g["sin"]), k_rot, v, mask, d_h, scale)
        den += float(torch.sum((full * valid) ** 2))
        if wo is not None:
            stream += float(torch.sum(((full @ root_t) * valid) ** 2))
        if not forms.rotary:
            q, k = q_full @ a_q, k_full @ a_k
        for i, r in enumerate(ranks):
            if forms.rotary:  # the rank-r map on the query before its rotation, keys whole
                qc = rotate(q_full @ maps[i], g["cos"], g["sin"])
                kc = k_rot
            else:
                qc = q[..., :r] if r else torch.zeros_like(q[..., :1])
                kc = k[..., :r] if r else torch.zeros_like(k[..., :1])
            delta = attend(qc, kc, v, mask, d_h, scale) - full
            num[i] += float(torch.sum((delta * valid) ** 2))
            if wo is not None:
                per_seq[i, g["index"]] = batches.per_sequence(g, (delta @ root_t) ** 2)
    return num / max(den, np.finfo(float).tiny), den, stream, per_seq


def train_head(cal, ev, wq, wk, wv, forms, r, d_h, steps, wo=None, *, val=None,
                penalty=0.0, roots=None, weighting="tokens", start=None, reference=None):
    """Train a rank-``r`` pair from the data-aware one (or from ``start``).

    The pair lives in a :class:`~sklearn_ebound.nn.LowRankAttention` on the augmented tokens
    (its value map fixed to the head's, its logit scale making the scores ``q k^T /
    sqrt(d_h)``); the forward pass applies the model's mask, which that module does not take.

    With ``val`` (batches of calibration texts not trained on) the pair of the iteration with
    the lowest output error on ``val`` is kept (early stopping). With ``penalty > 0`` the loss
    adds ``penalty`` times the pair's mean squared logit departure from the full form in the
    metric ``roots = (L_Q, L_K)``, relative to the full form's own: a pull towards the
    head's logits in the directions the output error alone leaves free. ``weighting="texts"``
    averages each text's relative error instead of summing the tokens' errors.

    ``start = (W~_Q', W~_K')`` (each ``(d + 1) x r``) starts the training from that pair
    instead of the form's (``forms`` is then unused). ``reference`` maps a part's name
    (``"cal"``, ``"eval"``, ``"val"``) to batches of the same sequences in the same order
    on which the *full* head's output is the target (by default the part's own batches):
    the pair then learns to reproduce, on the part's inputs, what the full head does on
    the reference inputs (the sequential refinement of :func:`refine_compressed`). ``ev``
    may be ``None`` (the eval error is then NaN).

    Returns ``(eval error, per-sequence residual-stream error on eval, W~_Q', W~_K')`` (the
    second as in :func:`_head_curve`, NaN without ``wo``).
    """
    parts = {"cal": cal} if ev is None else {"cal": cal, "eval": ev}
    if val is not None:
        parts["val"] = val
    if start is None:
        cols = forms.columns(r)
        start = wq @ forms.A_Q[:, cols], wk @ forms.A_K[:, cols]
    fit = _PairFit(parts, wq, wk, wv, r, d_h, start, reference or {})
    pull = _logit_pull(fit.module, wq, wk, roots) if penalty > 0 else None

    def objective():
        loss = fit.loss("cal", weighting == "texts")
        return loss if pull is None else loss + penalty * pull()

    # Without early stopping: keep the start if training did not lower the objective; with
    # it: keep the iterate with the lowest error on the validation texts.
    score = objective if val is None else (lambda: fit.loss("val", weighting == "texts"))
    _minimise(fit.module, objective, score, steps, early_stopping=val is not None)
    if ev is None:
        return (np.nan, None, *fit.pair())
    return (fit.error("eval"), fit.stream_errors(ev, wo), *fit.pair())


class _PairFit:
    """A rank-``r`` pair in training: its module, the full head's targets on each part, and
    the relative output errors (summed over tokens, or averaged over texts) it is fit by."""

    def __init__(self, parts, wq, wk, wv, r, d_h, start, reference):
        torch = require("torch")
        from ..nn import LowRankAttention

        self.parts = parts
        d1 = wq.shape[0]
        self.module = LowRankAttention(d1, rank=r, attention="softmax", value=wv.T,
                                       logit_scale=math.sqrt(d1) / math.sqrt(d_h)).double()
        with torch.no_grad():
            self.module.W_Q.copy_(torch.as_tensor(start[0]))
            self.module.W_K.copy_(torch.as_tensor(start[1]))
        self.scale = self.module.logit_scale / math.sqrt(self.module.n_features)
        wq_t, wk_t = torch.as_tensor(wq), torch.as_tensor(wk)
        self.targets, self.den, self.text_den = {}, {}, {}
        for name, batches in parts.items():
            source = reference.get(name, batches)
            with torch.no_grad():
                self.targets[name] = [attend(g["X"] @ wq_t, g["X"] @ wk_t,
                                             self.module.value_map(g["X"]), g["mask"], d_h)
                                      for g in source.groups]
            pairs = list(zip(self.targets[name], batches.groups, strict=True))
            self.den[name] = sum(float(torch.sum((t * g["valid"][..., None]) ** 2))
                                 for t, g in pairs)
            # per-text energies of the targets, for the loss that weighs every text alike
            self.text_den[name] = [torch.clamp(torch.sum((t * g["valid"][..., None]) ** 2,
                                                         (1, 2)), min=1e-300)
                                   for t, g in pairs]

    def outputs(self, g):
        torch = require("torch")
        X, m = g["X"], self.module
        logits = X @ m.W_Q @ (X @ m.W_K).transpose(-1, -2) * self.scale
        return torch.softmax(logits.masked_fill(~g["mask"], -torch.inf), -1) @ m.value_map(X)

    def loss(self, name, by_text=False):
        torch = require("torch")
        part, total = self.parts[name], 0.0
        for i, (t, g) in enumerate(zip(self.targets[name], part.groups, strict=True)):
            err = ((self.outputs(g) - t) * g["valid"][..., None]) ** 2
            total = total + (torch.sum(err.sum((1, 2)) / self.text_den[name][i]) if by_text
                             else torch.sum(err))
        return total / (part.n_sequences if by_text else self.den[name])

    def error(self, name):
        with require("torch").no_grad():
            return float(self.loss(name))

    def stream_errors(self, ev, wo):
        """Each evaluation sequence's error in the residual stream (NaN without ``wo``)."""
        torch = require("torch")
        per_seq = np.full(ev.n_sequences, np.nan)
        if wo is not None:
            root = torch.as_tensor(_stream_root(wo))
            with torch.no_grad():
                for t, g in zip(self.targets["eval"], ev.groups, strict=True):
                    per_seq[g["index"]] = ev.per_sequence(g, ((self.outputs(g) - t) @ root) ** 2)
        return per_seq

    def pair(self):
        return (self.module.W_Q.detach().numpy().copy(),
                self.module.W_K.detach().numpy().copy())


def _logit_pull(module, wq, wk, roots):
    """The pair's squared logit departure from the full form in the metric ``roots``,
    relative to the full form's own energy (a callable)."""
    torch = require("torch")
    lq, lk = (torch.as_tensor(root) for root in roots)
    full = (lq.T @ torch.as_tensor(wq)) @ (lk.T @ torch.as_tensor(wk)).T
    full_energy = torch.sum(full ** 2)

    def pull():
        form = (lq.T @ module.W_Q) @ (lk.T @ module.W_K).T
        return torch.sum((form - full) ** 2) / full_energy
    return pull


def _minimise(module, objective, score, steps, *, early_stopping):
    """L-BFGS on ``objective`` over the pair; the iterate of the lowest ``score`` is left in
    ``module`` (the start included). Without early stopping one call runs ``steps``
    iterations; with it, ``steps`` calls of one iteration each, scored after each."""
    torch = require("torch")
    optimizer = torch.optim.LBFGS([module.W_Q, module.W_K],
                                  max_iter=1 if early_stopping else steps,
                                  line_search_fn="strong_wolfe", tolerance_grad=1e-12,
                                  tolerance_change=1e-14, history_size=20)

    def closure():
        optimizer.zero_grad()
        loss = objective()
        loss.backward()
        return loss

    def snapshot():
        return module.W_Q.detach().clone(), module.W_K.detach().clone()

    with torch.no_grad():
        best, best_pair = float(score()), snapshot()
    for _ in range(steps if early_stopping else 1):
        optimizer.step(closure)
        with torch.no_grad():
            current = float(score())
        if current < best:
            best, best_pair = current, snapshot()
    with torch.no_grad():
        module.W_Q.copy_(best_pair[0])
        module.W_K.copy_(best_pair[1])


def eps_rank(curve, eps):
    """Smallest rank whose error is at most ``eps`` (the last rank if none is)."""
    hits = np.flatnonzero(np.asarray(curve) <= eps)
    return int(hits[0]) if hits.size else len(curve) - 1


class HeadDeficiencyResult(ResultTable):
    """Deficiency curves of every head; see :func:`head_deficiency`.

    One row per (layer, head, rank) with columns ``layer``, ``head``, ``rank`` and
    ``err_weight``, ``err_data``, ``err_trained`` (NaN where no pair was trained). Metadata
    (also attributes): ``naming``, ``n_layers``, ``n_heads``, ``head_dim``, ``d_model``,
    ``causal``, ``rotary``, ``epsilons``, ``n_calibration``, ``n_evaluation`` (texts),
    ``calibration_index`` and ``evaluation_index`` (positions of the texts of each part),
    ``n_tokens_evaluation``, ``seconds`` (curves), ``train_seconds`` (the trained step),
    ``train_steps``, ``output_share`` (``n_layers x n_heads``: the energy each head adds to
    the residual stream through the output projection, relative to the energy of the
    layer's input, on the evaluation text; NaN without an output projection),
    ``resumed_layers`` (the layers read back from a ``checkpoint`` rather than computed).
    """

    def curves(self, method="data"):
        """``(n_layers, n_heads, d_h + 1)`` errors of ``method`` (NaN where not measured)."""
        if method not in METHODS:
            raise ValueError(f"`method` must be one of {list(METHODS)}. Got {method!r}.")
        out = np.full((self.n_layers, self.n_heads, self.head_dim + 1), np.nan)
        layers = {v: i for i, v in enumerate(self.layer_indices)}
        heads = {v: i for i, v in enumerate(self.heads)}
        for row in self.rows:
            value = row[f"err_{method}"]
            out[layers[row["layer"]], heads[row["head"]], row["rank"]] = (
                np.nan if value is None else value)
        return out

    def eps_ranks(self, epsilons=None):
        """Per head, the smallest rank with error at most each ``eps``, for every method.

        For ``"trained"`` the curve is the data-aware one where no pair was trained at a rank,
        improved where one was (a trained pair is started from the data-aware one).

        Returns
        -------
        table : ResultTable
            Columns ``layer``, ``head`` and ``{method}_rank_{eps}`` for the methods measured
            (``trained`` only where some pair was trained).
        """
        epsilons = self.epsilons if epsilons is None else epsilons
        curves = {m: self.curves(m) for m in ("weight", "data")
                  if not np.isnan(self.curves(m)).all()}
        if "data" in curves and not np.isnan(self.curves("trained")).all():
            curves["trained"] = self.achievable_curves()
        rows = []
        for li, layer in enumerate(self.layer_indices):
            for hi, h in enumerate(self.heads):
                row = {"layer": int(layer), "head": h}
                for eps in epsilons:
                    for m in curves:
                        row[f"{m}_rank_{eps:g}"] = eps_rank(curves[m][li, hi], eps)
                rows.append(row)
        return ResultTable(rows, epsilons=list(epsilons), head_dim=self.head_dim)

    def residual_curves(self, method="data", *, per_text=False):
        """Each head's error in the residual stream, relative to the stream at its layer.

        The error of head ``h`` of a layer at rank ``r`` after the output projection,
        ``||(O_h(r) - O_h) w_o[h]||^2``, over the energy ``||x||^2`` of the layer's input on
        the same evaluation tokens: absolute in the stream's units, so that a head which adds
        little to the stream weighs little however large its relative error. Summed over the
        heads of a layer it is the layer's relative stream error up to the cross terms of
        the heads' errors.

        Parameters
        ----------
        method : {"data", "weight", "trained"}, default="data"
            ``"trained"``: the trained pair where one was trained at a rank (as
            :func:`compress_heads` writes it), else the data-aware form.
        per_text : bool, default=False
            ``False``: over all evaluation tokens, ``(n_layers, n_heads, d_h + 1)``;
            ``True``: each evaluation text on its own, ``(n_layers, n_heads, d_h + 1,
            n_evaluation)``.

        Returns
        -------
        curves : ndarray
            NaN where not measured (and everywhere for a model without output projection).
        """
        if method not in METHODS:
            raise ValueError(f"`method` must be one of {list(METHODS)}. Got {method!r}.")
        err = self._stream_err["data" if method == "trained" else method].astype(float)
        if method == "trained":
            trained = self._stream_err["trained"].astype(float)
            err = np.where(np.isnan(trained), err, trained)
        energy = self._text_energy[:, None, None, :]
        if per_text:
            return err / np.maximum(energy, np.finfo(float).tiny)
        return err.sum(-1) / np.maximum(energy.sum(-1), np.finfo(float).tiny)

    def achievable_curves(self):
        """The best error found at each rank: trained where trained, else data-aware."""
        data, trained = self.curves("data"), self.curves("trained")
        return np.where(np.isnan(trained), data, np.fmin(trained, data))

    def summary(self, epsilons=None):
        """Median, min and max over heads of every method's eps-rank, one row per eps."""
        table = self.eps_ranks(epsilons)
        rows = []
        for eps in table.epsilons:
            row = {"eps": eps}
            for m in [m for m in METHODS if f"{m}_rank_{eps:g}" in table.columns]:
                ranks = table.column(f"{m}_rank_{eps:g}")
                row.update({f"{m}_median": float(np.median(ranks)), f"{m}_min": int(ranks.min()),
                            f"{m}_max": int(ranks.max())})
            rows.append(row)
        return ResultTable(rows, head_dim=self.head_dim, n_heads_total=len(table.rows))

    def factors(self, layer, head, rank, method="data"):
        """``(W~_Q', W~_K')``, each ``(d + 1) x d_h``, of one head's rank-``rank`` form.

        Columns beyond the rank are zero (the shapes of the model's projections); the last row
        is the bias. ``layer`` is the position among the result's layers.
        """
        wq, wk = self._weights[layer]
        g = self._kv_index[layer][head]
        pair = self._trained.get((layer, head, rank)) if method == "trained" else None
        forms = self._forms[(layer, head, "weight" if method == "weight" else "data")]
        return rank_factors(wq[head], wk[g], forms, rank, pair)

    def bases(self, layer, head, method="data"):
        """``(A_Q, A_K)``, each ``d_h x d_h``, of one head's rank-``r`` forms.

        The head's rank-``r`` kernel is ``W~_Q G_r W~_K^T`` with ``G_r = A_Q[:, :r]
        A_K[:, :r]^T`` (``G_{d_h}`` is the identity on the query's span): for every head,
        rotary or not, the form is the map ``q -> q G_r`` on its query. ``layer`` is the
        position among the result's layers; ``method`` is ``"data"`` or ``"weight"`` (a
        trained pair is no map of the query).
        """
        if method not in ("data", "weight"):
            raise ValueError(f"`method` must be 'data' or 'weight'. Got {method!r}.")
        if (layer, head, method) not in self._forms:
            raise ValueError(f"The result holds no {method!r} forms of head {head} at layer "
                             f"position {layer}; compute them with `methods` including "
                             f"{method!r}.")
        forms = self._forms[(layer, head, method)]
        return forms.A_Q, forms.A_K


def rank_factors(wq, wk, forms, rank, pair=None):
    """A head's rank-``rank`` ``(W~_Q', W~_K')`` padded to ``(d + 1) x d_h``: the trained
    ``pair`` if given, else the form's."""
    out_q, out_k = np.zeros_like(wq), np.zeros_like(wk)
    if pair is not None:
        out_q[:, :rank], out_k[:, :rank] = pair
        return out_q, out_k
    if forms.rotary:  # the query mapped before its rotation; keys untouched
        return wq @ forms.query_map(rank), wk.copy()
    cols = forms.columns(rank)
    out_q[:, :len(cols)] = wq @ forms.A_Q[:, cols]
    out_k[:, :len(cols)] = wk @ forms.A_K[:, cols]
    return out_q, out_k



# --- the analysis, one named step at a time ------------------------------------------------


@dataclass
class _Settings:
    """The validated arguments every layer's step reads."""

    methods: tuple
    epsilons: tuple
    heads: list
    rotary: bool
    causal: bool
    theta: float
    train_steps: int
    train_at: dict | None
    shrinkage: float
    train_validation: float | None
    train_penalty: float
    train_weighting: str
    max_length: int
    batch_size: int

    def fingerprinted(self, calibration, random_state):
        """What the curves depend on beyond the model and the texts (JSON-serialisable)."""
        if random_state is not None and not isinstance(random_state, Integral):
            raise ValueError("`checkpoint` needs an integer `random_state` (or None), so that "
                             f"a rerun splits the texts alike. Got {random_state!r}.")
        train_at = (None if self.train_at is None else
                    sorted([int(k[0]), int(k[1]), v] for k, v in self.train_at.items()))
        return dict(calibration=calibration, random_state=random_state,
                    methods=list(self.methods), epsilons=list(self.epsilons),
                    heads=list(self.heads), train_steps=int(self.train_steps),
                    train_at=train_at, shrinkage=float(self.shrinkage),
                    train_validation=self.train_validation,
                    train_penalty=float(self.train_penalty),
                    train_weighting=self.train_weighting, max_length=int(self.max_length),
                    batch_size=int(self.batch_size))


def _check_options(methods, epsilons, train_steps, shrinkage, train_validation, train_penalty,
                   train_weighting):
    """``(methods, epsilons, train_validation)`` validated; the other options checked."""
    methods = tuple(methods)
    if not methods or any(m not in METHODS for m in methods):
        raise ValueError(f"`methods` must be a non-empty subset of {list(METHODS)}. Got "
                         f"{methods!r}.")
    if "trained" in methods and "data" not in methods:
        raise ValueError("`methods` with 'trained' needs 'data' (its starting point).")
    if isinstance(train_steps, bool) or not isinstance(train_steps, Integral) or train_steps < 1:
        raise ValueError(f"`train_steps` must be a positive integer. Got {train_steps!r}.")
    if (isinstance(shrinkage, bool) or not isinstance(shrinkage, Real)
            or not 0 <= shrinkage <= 1):
        raise ValueError(f"`shrinkage` must be a number in [0, 1]. Got {shrinkage!r}.")
    if train_validation is not None:
        train_validation = check_fraction(train_validation, "train_validation")
    if (isinstance(train_penalty, bool) or not isinstance(train_penalty, Real)
            or not train_penalty >= 0):
        raise ValueError(f"`train_penalty` must be a non-negative number. Got "
                         f"{train_penalty!r}.")
    if train_weighting not in ("tokens", "texts"):
        raise ValueError(f"`train_weighting` must be 'tokens' or 'texts'. Got "
                         f"{train_weighting!r}.")
    epsilons = tuple(float(e) for e in np.atleast_1d(epsilons))
    if not epsilons or any(not 0 < e < 1 for e in epsilons):
        raise ValueError(f"`epsilons` must be numbers in (0, 1). Got {epsilons!r}.")
    return methods, epsilons, train_validation


def _select(all_layers, layers, heads):
    """The layers and query heads analysed."""
    chosen = all_layers if layers is None else [lay for lay in all_layers if lay.index in
                                                set(layers)]
    if not chosen:
        raise ValueError(f"`layers` selects none of the model's layers "
                         f"{[lay.index for lay in all_layers]}.")
    head_list = list(range(chosen[0].n_heads)) if heads is None else sorted(set(heads))
    if not head_list or min(head_list) < 0 or max(head_list) >= chosen[0].n_heads:
        raise ValueError(f"`heads` must be query heads in [0, {chosen[0].n_heads}). Got "
                         f"{heads!r}.")
    return chosen, head_list


def _train_targets(train_at, methods):
    """``{(layer, head): sorted ranks}`` from a plan or a mapping; ``None`` without one."""
    if train_at is None:
        return None
    if "trained" not in methods:
        raise ValueError("`train_at` needs 'trained' in `methods`.")
    pairs = ({(r["layer"], r["head"]): r["rank"] for r in train_at.rows}
             if isinstance(train_at, ResultTable) else dict(train_at))
    return {key: sorted({int(r) for r in np.atleast_1d(value)}) for key, value in pairs.items()}


def _split_texts(texts, calibration, train_validation, random_state):
    """``(split, calibration index, evaluation index)``: the texts of each part.

    ``split`` maps ``"cal"`` and ``"eval"`` (and ``"val"``, the calibration texts kept out
    of the training for early stopping, with ``train_validation``) to their texts.
    """
    rng = np.random.default_rng(random_state)
    perm = rng.permutation(len(texts))
    n_cal = min(max(1, int(round(calibration * len(texts)))), len(texts) - 1)
    cal_index, eval_index = np.sort(perm[:n_cal]), np.sort(perm[n_cal:])
    cal_texts = [texts[i] for i in cal_index]
    split = {"cal": cal_texts, "eval": [texts[i] for i in eval_index]}
    if train_validation:
        if n_cal < 2:
            raise ValueError("`train_validation` needs at least 2 calibration texts.")
        inner = rng.permutation(n_cal)
        n_val = min(max(1, int(round(train_validation * n_cal))), n_cal - 1)
        split["cal"] = [cal_texts[i] for i in np.sort(inner[n_val:])]
        split["val"] = [cal_texts[i] for i in np.sort(inner[:n_val])]
    return split, cal_index.tolist(), eval_index.tolist()


def _layer_batches(model, tokenizer, layer, split, settings):
    """Each part's inputs of ``layer``, batched with the model's mask and rotations.

    The forward pass stops after the layer, so memory holds one layer's activations.
    """
    torch = require("torch")
    d_h = layer.head_dim
    parts = {}
    for name, part in split.items():
        seqs, rots = capture_inputs(model, [layer], part, tokenizer, rotary=settings.rotary,
                                    max_length=settings.max_length,
                                    batch_size=settings.batch_size, stop_early=True)
        seqs, rots = seqs[0], rots[0]
        if settings.rotary:  # the default tables where the model passed none
            theta = settings.theta if layer.rope_theta is None else layer.rope_theta
            rots = [r if r is not None else rope_tables(len(x), d_h, theta)
                    for x, r in zip(seqs, rots or [None] * len(seqs), strict=True)]
        parts[name] = HeadBatches(seqs, rots if settings.rotary else None, settings.causal,
                                  torch.float64, window=layer.window)
    return parts


def _head_curves(out, hi, h, head, parts, roots, settings, input_energy):
    """The weight-space and data-aware forms of one head (a :class:`HeadModel`) and their
    curves, into ``out``."""
    calibration = [parts[name] for name in ("cal", "val") if name in parts]
    for m in ("weight", "data"):
        if m not in settings.methods and not (m == "data" and "trained" in settings.methods):
            continue
        forms = (head.forms(settings.rotary) if m == "weight" else
                 head.forms(settings.rotary, calibration, settings.shrinkage, roots))
        out.forms[(h, m)] = forms
        if m in settings.methods:
            out.errors[m][hi], _, stream, out.stream_err[m][hi] = _head_curve(
                parts["eval"], head, forms, range(head.d_h + 1))
            out.share[hi] = stream / input_energy


def _train_pairs(out, hi, h, layer_index, head, parts, roots, settings):
    """Trained rank-``r`` pairs of one head, into ``out``.

    At the ranks ``train_at`` names for the head; without it, for each ``eps`` downwards from
    the data-aware eps-rank until a trained pair misses the tolerance.
    """
    wq, wk, wv, wo = head
    d_h = wq.shape[1]
    forms, errors = out.forms[(h, "data")], out.errors["trained"][hi]
    fit = dict(val=parts.get("val"), penalty=settings.train_penalty, roots=roots,
               weighting=settings.train_weighting)

    def train(r):
        (errors[r], out.stream_err["trained"][hi, r], tq,
         tk) = train_head(parts["cal"], parts["eval"], wq, wk, wv, forms, r, d_h,
                          settings.train_steps, wo, **fit)
        out.trained[(h, r)] = (tq, tk)

    if settings.train_at is not None:
        for r in settings.train_at.get((layer_index, h), []):
            if 1 <= r < d_h:
                train(r)
        return
    for eps in settings.epsilons:
        r = eps_rank(out.errors["data"][hi], eps) - 1
        while r >= 1:
            if np.isnan(errors[r]):
                train(r)
            if errors[r] > eps:
                break
            r -= 1


def _analyse_layer(model, tokenizer, layer, split, settings, progress=None):
    """The deficiency analysis of one layer: a :class:`LayerDeficiency`.

    ``progress(i)`` is called after the ``i``-th head of the layer.
    """
    start = time.perf_counter()
    d_h, n_heads = layer.head_dim, len(settings.heads)
    wq, wk, wv = augmented_weights(layer)
    # "cal" trains the pairs; the metric is read from all calibration text ("cal" and, with
    # early stopping, "val")
    parts = _layer_batches(model, tokenizer, layer, split, settings)
    n_eval = parts["eval"].n_sequences
    out = LayerDeficiency(
        index=layer.index, errors={m: np.full((n_heads, d_h + 1), np.nan) for m in METHODS},
        stream_err={m: np.full((n_heads, d_h + 1, n_eval), np.nan, np.float32)
                    for m in METHODS},
        share=np.full(n_heads, np.nan), text_energy=parts["eval"].energies(),
        n_eval_tokens=int(sum(int(g["valid"].sum()) for g in parts["eval"].groups)))
    roots = data_metric_roots([parts[name] for name in ("cal", "val") if name in parts],
                              settings.shrinkage)
    input_energy = float(out.text_energy.sum())
    for hi, h in enumerate(settings.heads):
        g = int(layer.kv_index[h])
        head = (wq[h], wk[g], wv[g], None if layer.w_o is None else layer.w_o[h])
        _head_curves(out, hi, h, HeadModel(layer, h, (wq, wk, wv)), parts, roots, settings,
                     input_energy)
        # trained pairs are bilinear forms in the tokens: not for rotary or normalised heads
        if "trained" in settings.methods and not settings.rotary and not layer.normalised:
            t0 = time.perf_counter()
            _train_pairs(out, hi, h, layer.index, head, parts, roots, settings)
            out.train_seconds += time.perf_counter() - t0
        if progress is not None:
            progress(hi + 1)
    out.seconds = time.perf_counter() - start - out.train_seconds
    return out


def _assemble(done, chosen, settings, naming, cal_index, eval_index, resumed):
    """The :class:`HeadDeficiencyResult` of the analysed layers (in model order)."""
    d_h = chosen[0].head_dim
    rows = []
    for lay in done:
        for hi, h in enumerate(settings.heads):
            for r in range(d_h + 1):
                rows.append({"layer": lay.index, "head": h, "rank": r,
                             **{f"err_{m}": lay.errors[m][hi, r] for m in METHODS}})
    result = HeadDeficiencyResult(
        rows, naming=naming, n_layers=len(chosen), n_heads=len(settings.heads),
        heads=list(settings.heads), layer_indices=[lay.index for lay in chosen], head_dim=d_h,
        d_model=chosen[0].w_q.shape[1], causal=settings.causal, rotary=settings.rotary,
        epsilons=list(settings.epsilons), n_calibration=len(cal_index),
        n_evaluation=len(eval_index), calibration_index=cal_index,
        evaluation_index=eval_index, n_tokens_evaluation=done[-1].n_eval_tokens,
        seconds=sum(lay.seconds for lay in done),
        train_seconds=sum(lay.train_seconds for lay in done),
        train_steps=settings.train_steps, n_trained=sum(len(lay.trained) for lay in done),
        output_share=np.stack([lay.share for lay in done]),
        shrinkage=float(settings.shrinkage), train_validation=settings.train_validation,
        train_penalty=float(settings.train_penalty), train_weighting=settings.train_weighting,
        resumed_layers=list(resumed))
    # Kept for plans and compression (not exported): the factors of every form.
    result._forms = {(li, h, m): f for li, lay in enumerate(done)
                     for (h, m), f in lay.forms.items()}
    result._trained = {(li, h, r): pair for li, lay in enumerate(done)
                       for (h, r), pair in lay.trained.items()}
    result._weights = [augmented_weights(layer)[:2] for layer in chosen]
    result._kv_index = [layer.kv_index for layer in chosen]
    result._full_heads = chosen[0].n_heads
    result._stream_err = {m: np.stack([lay.stream_err[m] for lay in done]) for m in METHODS}
    result._text_energy = np.stack([lay.text_energy for lay in done])
    return result


def head_deficiency(model, texts, *, tokenizer=None, calibration=0.5, methods=METHODS,
                    epsilons=(0.01, 0.05, 0.1), train_steps=20, train_at=None,
                    shrinkage=0.0, train_validation=None, train_penalty=0.0,
                    train_weighting="tokens", max_length=64,
                    batch_size=32, layers=None, heads=None, random_state=0, progress=None,
                    on_layer=None, checkpoint=None):
    """Deficiency curves ``err_h(r)`` of every head on its own output, at every rank.

    The texts are split at random into a calibration part (the data-aware metric, the trained
    pairs) and an evaluation part, on which every error is measured. The model runs one layer
    at a time (its forward pass stopped after that layer), so memory holds one layer's
    activations.

    Parameters
    ----------
    model : transformers model or path
        A Hugging Face model (BERT-, GPT-2-, LLaMA- or Gemma 3-style) or the directory of a
        saved one. For a family that normalises its query and key heads (Gemma 3) the forms
        and curves are taken on the normalised queries and keys.
    texts : list of str
        Real text, one sentence or passage per entry.
    tokenizer : transformers tokenizer, default=None
        Needed unless ``model`` is a directory holding one.
    calibration : float, default=0.5
        Fraction of the texts used for calibration, in ``(0, 1)``.
    methods : sequence of {"weight", "data", "trained"}, default=all
        The rank-``r`` forms measured (see the module docstring); ``"trained"`` needs
        ``"data"``.
    epsilons : sequence of float, default=(0.01, 0.05, 0.1)
        Tolerances of the eps-ranks. The trained step searches, for each, downwards from the
        data-aware eps-rank until a trained pair misses the tolerance.
    train_steps : int, default=20
        L-BFGS iterations per trained pair (each iteration one or more passes over the
        calibration text).
    train_at : ResultTable or mapping, default=None
        Ranks to train at instead of the eps search: a :func:`plan_ranks` table (each head at
        its planned rank) or ``{(layer, head): rank or list of ranks}``. A plan from a first
        call, trained in a second, gives :func:`compress_heads` trained pairs at exactly the
        planned ranks.
    shrinkage : float, default=0.0
        Shrinks the data-aware metrics towards the weights' own, ``(1 - shrinkage) M +
        shrinkage tr(M) / (d + 1) I`` for each second moment ``M`` of the calibration
        tokens, so that directions the calibration text rarely uses are not discarded
        outright (``1``: the weight-space form). Changes the ``"data"`` forms and the start
        of the trained pairs. On all-MiniLM-L6-v2 it changed the held-out fidelity of the
        compressed model by less than the texts' spread (:ref:`real_models`).
    train_validation : float, default=None
        Early stopping of the trained pairs: this fraction of the calibration texts is kept
        out of the training, and each pair is the L-BFGS iterate (of ``train_steps``) with
        the lowest output error on them. The metric still uses every calibration text;
        the evaluation split is unchanged. ``None``: train on all calibration texts and
        keep the last iterate (or the start if training did not help).
    train_penalty : float, default=0.0
        Adds to the training loss this multiple of the pair's mean squared logit departure
        from the head's full form on the calibration tokens (in the data-aware metric, with
        ``shrinkage``), relative to the full form's own: a pull towards the head's logits in
        the directions the output error leaves free.
    train_weighting : {"tokens", "texts"}, default="tokens"
        The training loss: the output error summed over the calibration tokens relative to
        the outputs' energy, or the mean over calibration texts of each text's relative
        error (every text weighs alike, however long or typical). On all-MiniLM-L6-v2 none
        of ``train_validation``, ``train_penalty`` and ``train_weighting`` lifted the
        held-out fidelity beyond the texts' spread (:ref:`real_models`).
    max_length : int, default=64
        Tokens per text at most.
    batch_size : int, default=32
        Texts per forward pass of the model.
    layers : sequence of int, default=None
        Layer indices to analyse; ``None`` means all.
    heads : sequence of int, default=None
        Query heads to analyse in each layer; ``None`` means all.
    random_state : int, default=0
        Seed of the calibration split.
    progress : callable, default=None
        Called as ``progress(done, total)`` after each head (heads of layers read from
        ``checkpoint`` count as done at once).
    on_layer : callable, default=None
        Called after each layer as ``on_layer(info)``, ``info`` a dict with ``layer`` (its
        index), ``done`` and ``total`` (layers), ``seconds`` (this layer's) and ``resumed``
        (read from ``checkpoint``). By then the layer is kept in ``checkpoint``: an
        exception raised here (or a ``KeyboardInterrupt``) loses no finished layer.
    checkpoint : str or path-like, default=None
        A folder that keeps each finished layer (``layer_<index>.npz``, written atomically,
        beside a ``manifest.json``). A rerun with the same model, texts and arguments reads
        the layers kept there instead of computing them again, and gives the same result;
        the fingerprint covers the model's weights, the texts and their token ids, every
        argument but ``layers``, ``progress`` and ``on_layer``, and the package version.
        Layers of another analysis found there are removed, with a warning, and it starts
        over. ``None``: nothing is written.

    Returns
    -------
    result : HeadDeficiencyResult
        Its ``resumed_layers`` lists the layers read from ``checkpoint``.

    Examples
    --------
    >>> from sklearn_ebound.heads import (docstring_sentences, head_deficiency,
    ...                                   make_tiny_transformer)
    >>> model, tokenizer = make_tiny_transformer("bert")
    >>> texts = docstring_sentences(["json"])[:8]
    >>> result = head_deficiency(model, texts, tokenizer=tokenizer, methods=("weight", "data"))
    >>> curves = result.curves("data")
    >>> curves.shape, bool(curves[0, 0, -1] < 1e-12)
    ((1, 2, 9), True)
    """
    model, tokenizer = model_source(model, tokenizer)
    texts = check_texts(texts, "texts")
    calibration = check_fraction(calibration, "calibration")
    methods, epsilons, train_validation = _check_options(
        methods, epsilons, train_steps, shrinkage, train_validation, train_penalty,
        train_weighting)
    if on_layer is not None and not callable(on_layer):
        raise TypeError(f"`on_layer` must be callable or None. Got {type(on_layer).__name__}.")
    family, all_layers, theta = layers_of(model)
    chosen, head_list = _select(all_layers, layers, heads)
    settings = _Settings(
        methods=methods, epsilons=epsilons, heads=head_list, rotary=family.rotary,
        causal=family.is_causal(model.config), theta=theta, train_steps=train_steps,
        train_at=_train_targets(train_at, methods), shrinkage=shrinkage,
        train_validation=train_validation, train_penalty=train_penalty,
        train_weighting=train_weighting, max_length=max_length, batch_size=batch_size)
    split, cal_index, eval_index = _split_texts(
        texts, calibration, train_validation if "trained" in methods else None, random_state)
    store = None if checkpoint is None else LayerStore(checkpoint, fingerprint(
        model, tokenizer, texts, settings.fingerprinted(calibration, random_state)))
    n_heads, total = len(head_list), len(chosen) * len(head_list)
    done, resumed = [], []
    for position, layer in enumerate(chosen):
        start = time.perf_counter()
        kept = None if store is None else store.load(layer.index)
        if kept is None:
            def heads_done(i, before=position * n_heads):
                if progress is not None:
                    progress(before + i, total)

            kept = _analyse_layer(model, tokenizer, layer, split, settings, heads_done)
            if store is not None:
                store.save(kept)
        else:
            resumed.append(layer.index)
            if progress is not None:
                progress((position + 1) * n_heads, total)
        done.append(kept)
        if on_layer is not None:
            on_layer({"layer": layer.index, "done": position + 1, "total": len(chosen),
                      "seconds": time.perf_counter() - start,
                      "resumed": layer.index in resumed})
    return _assemble(done, chosen, settings, family.name, cal_index, eval_index, resumed)
