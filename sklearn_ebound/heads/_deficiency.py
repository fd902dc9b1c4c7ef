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
rotary models a rank-``r`` form keeps ``r // 2`` whole rotation planes (ordered by their
kernel's energy in the weights or in the data metric) by zeroing the other query columns:
the rank then moves in steps of two and the keys (shared under grouped-query attention) are
left untouched. The trained step is not run for rotary heads.
"""

import copy
import math
import time
from numbers import Integral, Real

import numpy as np

from .._results import ResultTable
from ._inputs import capture_inputs, config_heads, load_pretrained, require, rope_tables
from ._weights import extract_layers

__all__ = ["HeadDeficiencyResult", "head_deficiency", "plan_ranks", "compress_heads",
           "embedding_fidelity", "perplexity", "compression_frontier", "head_predictors",
           "predictor_agreement"]

METHODS = ("weight", "data", "trained")
_GROUP = 32  # sequences per padded batch


# --- inputs -------------------------------------------------------------------------------


def _model_source(model_or_dir, tokenizer):
    import os

    if isinstance(model_or_dir, (str, os.PathLike)):
        model, loaded = load_pretrained(model_or_dir)
        tokenizer = loaded if tokenizer is None else tokenizer
    elif hasattr(model_or_dir, "state_dict") and hasattr(model_or_dir, "config"):
        model = model_or_dir
    else:
        raise TypeError("`model` must be a Hugging Face model or the directory of a saved one. "
                        f"Got {type(model_or_dir).__name__} instead.")
    if tokenizer is None:
        raise ValueError("Text needs a `tokenizer`; the model directory holds none.")
    return model, tokenizer


def _layers_of(model):
    n_heads, n_kv, theta = config_heads(model.config)
    naming, layers = extract_layers(model.state_dict(), n_heads, n_kv_heads=n_kv)
    if any(layer.w_v is None for layer in layers):
        raise ValueError("The model's state dict holds no value weights; the head outputs "
                         "need them.")
    return naming, layers, theta


def _is_causal(model, naming):
    return naming != "bert" or bool(getattr(model.config, "is_decoder", False))


def _check_texts(texts, name):
    if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
        raise TypeError(f"`{name}` must be a list of strings.")
    texts = [t for t in texts if t.strip()]
    if len(texts) < 2:
        raise ValueError(f"`{name}` must hold at least 2 non-empty texts. Got {len(texts)}.")
    return texts


class _Batches:
    """Sequences of one layer in padded groups of similar length, as float64 torch tensors.

    ``X`` is ``(b, n, d + 1)`` (the augmented tokens ``[x, 1]``, zero at padding), ``mask``
    ``(b, n, n)`` the allowed (query, key) pairs, ``valid`` ``(b, n)`` the real tokens,
    ``cos``/``sin`` ``(b, n, d_h)`` the rotary tables (``None`` without rotary).
    """

    def __init__(self, sequences, rotations, causal, dtype):
        torch = require("torch")
        order = np.argsort([len(x) for x in sequences], kind="stable")
        self.groups = []
        for start in range(0, len(order), _GROUP):
            idx = order[start:start + _GROUP]
            n = max(len(sequences[i]) for i in idx)
            d = sequences[idx[0]].shape[1]
            X = np.zeros((len(idx), n, d + 1))
            valid = np.zeros((len(idx), n), bool)
            cos = sin = None
            if rotations is not None:
                d_h = rotations[idx[0]][0].shape[1]
                cos, sin = np.ones((len(idx), n, d_h)), np.zeros((len(idx), n, d_h))
            for row, i in enumerate(idx):
                m = len(sequences[i])
                X[row, :m, :d] = sequences[i]
                X[row, :m, d] = 1.0
                valid[row, :m] = True
                if rotations is not None:
                    cos[row, :m], sin[row, :m] = rotations[i]
            mask = valid[:, None, :] & valid[:, :, None]
            if causal:
                mask &= np.tril(np.ones((n, n), bool))
            # Padding rows attend to themselves only, so that no row of softmax is empty.
            mask |= np.eye(n, dtype=bool)[None] & ~valid[:, :, None]
            def as_t(a):
                return None if a is None else torch.as_tensor(a, dtype=dtype)

            self.groups.append(dict(X=as_t(X), mask=torch.as_tensor(mask), cos=as_t(cos),
                                    sin=as_t(sin), valid=torch.as_tensor(valid),
                                    index=np.asarray(idx)))
        self.n_sequences = len(sequences)

    def tokens(self):
        """All real augmented tokens ``(T, d + 1)`` as numpy."""
        return np.concatenate([g["X"][g["valid"]].numpy() for g in self.groups])

    def energies(self):
        """``(n_sequences,)``: each sequence's ``sum ||x||^2`` over its tokens (no bias)."""
        out = np.zeros(self.n_sequences)
        for g in self.groups:
            out[g["index"]] = (g["X"][..., :-1] ** 2).sum((1, 2)).numpy()
        return out

    def per_sequence(self, g, values):
        """Sum ``values`` ``(b, n, k)`` over the real tokens and ``k``: ``(b,)`` numpy."""
        return (values * g["valid"][..., None]).sum((1, 2)).numpy()


def _rotate(t, cos, sin):
    if cos is None:
        return t
    half = t.shape[-1] // 2
    return t * cos + __import__("torch").cat([-t[..., half:], t[..., :half]], -1) * sin


def _attend(q, k, v, mask, d_h):
    """``softmax(q k^T / sqrt(d_h) + mask) v`` with a boolean mask (True: allowed)."""
    torch = require("torch")
    logits = q @ k.transpose(-1, -2) / math.sqrt(d_h)
    logits = logits.masked_fill(~mask, -torch.inf)
    return torch.softmax(logits, -1) @ v


# --- the rank-r forms -----------------------------------------------------------------------


def _augmented(layer):
    """``W~_Q (n_heads, d+1, d_h)``, ``W~_K``, ``W~_V`` (``n_kv_heads``) with the bias rows."""
    def aug(w, b):
        row = np.zeros((w.shape[0], 1, w.shape[2])) if b is None else b[:, None, :]
        return np.concatenate([w, row], axis=1)
    return aug(layer.w_q, layer.b_q), aug(layer.w_k, layer.b_k), aug(layer.w_v, layer.b_v)


def _metric_root(M):
    """``L`` with ``L L^T = M`` for a symmetric PSD ``M`` (eigenvalues clipped at zero)."""
    w, E = np.linalg.eigh((M + M.T) / 2)
    return E * np.sqrt(np.clip(w, 0.0, None))


def _svd_bases(wq, wk, root_q=None, root_k=None):
    """``A_Q, A_K`` (``d_h x d_h``): the first ``r`` columns give the best rank-``r`` form.

    ``L_Q^T W~_Q = Q_1 R_1``, ``L_K^T W~_K = Q_2 R_2`` and ``R_1 R_2^T = U S V^T``; then
    ``L_Q^T W~_Q A_Q[:, :r] (L_K^T W~_K A_K[:, :r])^T = Q_1 [R_1 R_2^T]_r Q_2^T`` with
    ``A_Q = R_1^+ U S^{1/2}``, ``A_K = R_2^+ V S^{1/2}``: the truncated SVD of the form in the
    metric, with factors in the span of the head's own weights.
    """
    mq = wq if root_q is None else root_q.T @ wq
    mk = wk if root_k is None else root_k.T @ wk
    r1 = np.linalg.qr(mq, mode="r")
    r2 = np.linalg.qr(mk, mode="r")
    U, s, Vt = np.linalg.svd(r1 @ r2.T)
    root_s = np.sqrt(s)
    return np.linalg.pinv(r1) @ (U * root_s), np.linalg.pinv(r2) @ (Vt.T * root_s)


def _plane_order(wq, wk, root_q=None, root_k=None):
    """Rotation planes ``(k, k + d_h/2)`` by decreasing energy of their kernel (in the metric)."""
    mq = wq if root_q is None else root_q.T @ wq
    mk = wk if root_k is None else root_k.T @ wk
    half = wq.shape[1] // 2
    energy = []
    for k in range(half):
        cols = [k, k + half]
        energy.append(np.trace((mq[:, cols].T @ mq[:, cols]) @ (mk[:, cols].T @ mk[:, cols])))
    return np.argsort(energy, kind="stable")[::-1]


class _HeadForms:
    """The rank-``r`` query and key factors of one head under one method."""

    def __init__(self, wq, wk, rotary, root_q=None, root_k=None):
        self.rotary = rotary
        self.d_h = wq.shape[1]
        if rotary:
            self.planes = _plane_order(wq, wk, root_q, root_k)
            self.A_Q = self.A_K = np.eye(self.d_h)
        else:
            self.A_Q, self.A_K = _svd_bases(wq, wk, root_q, root_k)

    def columns(self, r):
        """Columns of the bases kept at rank ``r``."""
        if not self.rotary:
            return np.arange(r)
        half = self.d_h // 2
        kept = self.planes[:r // 2]
        return np.sort(np.concatenate([kept, kept + half]))


# --- curves ---------------------------------------------------------------------------------


def _stream_root(wo):
    """``C`` (``d_h x d_h``) with ``||delta C|| = ||delta w_o||`` for every row ``delta``."""
    return None if wo is None else _metric_root(wo @ wo.T)


def _head_curve(batches, wq, wk, wv, forms, d_h, ranks, wo=None):
    """Errors of one head at every rank of ``ranks`` (increasing).

    Returns the relative output error ``(len(ranks),)``, ``||O||^2``, ``||O w_o||^2`` (the
    head's energy in the residual stream) and ``(len(ranks), n_sequences)``: each sequence's
    ``||(O(r) - O) w_o||^2``, the error in the residual stream (the last two NaN without
    ``wo``).
    """
    torch = require("torch")
    wq_b = torch.as_tensor(wq @ forms.A_Q)
    wk_b = torch.as_tensor(wk @ forms.A_K)
    wq_t, wk_t, wv_t = (torch.as_tensor(w) for w in (wq, wk, wv))
    root = _stream_root(wo)
    root_t = None if root is None else torch.as_tensor(root)
    num = np.zeros(len(ranks))
    per_seq = np.full((len(ranks), batches.n_sequences), np.nan if wo is None else 0.0)
    den, stream = 0.0, 0.0 if wo is not None else np.nan
    for g in batches.groups:
        X, mask, valid = g["X"], g["mask"], g["valid"][..., None]
        v = X @ wv_t
        full = _attend(_rotate(X @ wq_t, g["cos"], g["sin"]), _rotate(X @ wk_t, g["cos"],
                                                                       g["sin"]), v, mask, d_h)
        den += float(torch.sum((full * valid) ** 2))
        if wo is not None:
            stream += float(torch.sum(((full @ root_t) * valid) ** 2))
        q, k = _rotate(X @ wq_b, g["cos"], g["sin"]), _rotate(X @ wk_b, g["cos"], g["sin"])
        for i, r in enumerate(ranks):
            cols = forms.columns(r)
            qc = q[..., cols] if len(cols) else torch.zeros_like(q[..., :1])
            kc = k[..., cols] if len(cols) else torch.zeros_like(k[..., :1])
            delta = _attend(qc, kc, v, mask, d_h) - full
            num[i] += float(torch.sum((delta * valid) ** 2))
            if wo is not None:
                per_seq[i, g["index"]] = batches.per_sequence(g, (delta @ root_t) ** 2)
    return num / max(den, np.finfo(float).tiny), den, stream, per_seq


def _train_head(cal, ev, wq, wk, wv, forms, r, d_h, steps, wo=None):
    """Train a rank-``r`` pair from the data-aware one.

    The pair lives in a :class:`~sklearn_ebound.nn.LowRankAttention` on the augmented tokens
    (its value map fixed to the head's, its logit scale making the scores ``q k^T /
    sqrt(d_h)``); the forward pass applies the model's mask, which that module does not take.

    Returns ``(eval error, per-sequence residual-stream error on eval, W~_Q', W~_K')`` (the
    second as in :func:`_head_curve`, NaN without ``wo``).
    """
    torch = require("torch")
    from ..nn import LowRankAttention

    parts = {"cal": cal, "eval": ev}
    d1 = wq.shape[0]
    module = LowRankAttention(d1, rank=r, attention="softmax", value=wv.T,
                              logit_scale=math.sqrt(d1) / math.sqrt(d_h)).double()
    cols = forms.columns(r)
    with torch.no_grad():
        module.W_Q.copy_(torch.as_tensor(wq @ forms.A_Q[:, cols]))
        module.W_K.copy_(torch.as_tensor(wk @ forms.A_K[:, cols]))
    wq_t, wk_t = torch.as_tensor(wq), torch.as_tensor(wk)
    scale = module.logit_scale / math.sqrt(module.n_features)

    def outputs(g):
        X = g["X"]
        return (torch.softmax((X @ module.W_Q @ (X @ module.W_K).transpose(-1, -2) * scale)
                              .masked_fill(~g["mask"], -torch.inf), -1) @ module.value_map(X))

    targets, den = {}, {}
    for name, batches in parts.items():
        with torch.no_grad():
            targets[name] = [_attend(g["X"] @ wq_t, g["X"] @ wk_t, module.value_map(g["X"]),
                                     g["mask"], d_h) for g in batches.groups]
        den[name] = sum(float(torch.sum((t * g["valid"][..., None]) ** 2))
                        for t, g in zip(targets[name], batches.groups, strict=True))

    def loss_of(name):
        total = 0.0
        for t, g in zip(targets[name], parts[name].groups, strict=True):
            total = total + torch.sum(((outputs(g) - t) * g["valid"][..., None]) ** 2)
        return total / den[name]

    optimizer = torch.optim.LBFGS([module.W_Q, module.W_K], max_iter=steps,
                                  line_search_fn="strong_wolfe", tolerance_grad=1e-12,
                                  tolerance_change=1e-14, history_size=20)

    def closure():
        optimizer.zero_grad()
        loss = loss_of("cal")
        loss.backward()
        return loss

    with torch.no_grad():
        start = float(loss_of("cal"))
        init = (module.W_Q.detach().clone(), module.W_K.detach().clone())
    optimizer.step(closure)
    with torch.no_grad():
        if not float(loss_of("cal")) < start:  # keep the start if training did not help
            module.W_Q.copy_(init[0])
            module.W_K.copy_(init[1])
        error = float(loss_of("eval"))
        per_seq = np.full(ev.n_sequences, np.nan)
        if wo is not None:
            root = torch.as_tensor(_stream_root(wo))
            for t, g in zip(targets["eval"], ev.groups, strict=True):
                per_seq[g["index"]] = ev.per_sequence(g, ((outputs(g) - t) @ root) ** 2)
    return (error, per_seq, module.W_Q.detach().numpy().copy(),
            module.W_K.detach().numpy().copy())


def _eps_rank(curve, eps):
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
    layer's input, on the evaluation text; NaN without an output projection).
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
                        row[f"{m}_rank_{eps:g}"] = _eps_rank(curves[m][li, hi], eps)
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
        return _factors(wq[head], wk[g], forms, rank, pair)


def _factors(wq, wk, forms, rank, pair=None):
    """A head's rank-``rank`` ``(W~_Q', W~_K')`` padded to ``(d + 1) x d_h``: the trained
    ``pair`` if given, else the form's."""
    out_q, out_k = np.zeros_like(wq), np.zeros_like(wk)
    if pair is not None:
        out_q[:, :rank], out_k[:, :rank] = pair
        return out_q, out_k
    cols = forms.columns(rank)
    if forms.rotary:  # planes kept in place; keys untouched
        out_q[:, cols] = wq[:, cols]
        return out_q, wk.copy()
    out_q[:, :len(cols)] = wq @ forms.A_Q[:, cols]
    out_k[:, :len(cols)] = wk @ forms.A_K[:, cols]
    return out_q, out_k


def _check_fraction(value, name):
    if isinstance(value, bool) or not isinstance(value, Real) or not 0 < value < 1:
        raise ValueError(f"`{name}` must be a number in (0, 1). Got {value!r} instead.")
    return float(value)


def head_deficiency(model, texts, *, tokenizer=None, calibration=0.5, methods=METHODS,
                    epsilons=(0.01, 0.05, 0.1), train_steps=20, train_at=None, max_length=64,
                    batch_size=32, layers=None, heads=None, random_state=0, progress=None):
    """Deficiency curves ``err_h(r)`` of every head on its own output, at every rank.

    The texts are split at random into a calibration part (the data-aware metric, the trained
    pairs) and an evaluation part, on which every error is measured. The model runs one layer
    at a time (its forward pass stopped after that layer), so memory holds one layer's
    activations.

    Parameters
    ----------
    model : transformers model or path
        A Hugging Face model (BERT-, GPT-2- or LLaMA-style) or the directory of a saved one.
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
        Called as ``progress(done, total)`` after each head.
    Returns
    -------
    result : HeadDeficiencyResult

    Examples
    --------
    >>> import transformers, torch
    >>> from sklearn_ebound.heads import docstring_sentences, head_deficiency
    >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
    <...>
    >>> config = transformers.BertConfig(vocab_size=30, hidden_size=16, num_hidden_layers=1,
    ...                                  num_attention_heads=2, intermediate_size=16)
    >>> model = transformers.BertModel(config)
    >>> tokenize = lambda texts, **kw: {  # a stand-in tokenizer: one id per word
    ...     "input_ids": torch.tensor([[1 + len(w) % 29 for w in t.split()[:6]] for t in texts]),
    ...     "attention_mask": torch.ones(len(texts), 6, dtype=torch.long)}
    >>> tokenize.pad_token = "[PAD]"
    >>> texts = [s for s in docstring_sentences(["json"]) if len(s.split()) >= 6][:8]
    >>> result = head_deficiency(model, texts, tokenizer=tokenize, methods=("weight", "data"))
    >>> curves = result.curves("data")
    >>> curves.shape, bool(curves[0, 0, -1] < 1e-12)
    ((1, 2, 9), True)
    """
    torch = require("torch")
    model, tokenizer = _model_source(model, tokenizer)
    texts = _check_texts(texts, "texts")
    calibration = _check_fraction(calibration, "calibration")
    methods = tuple(methods)
    if not methods or any(m not in METHODS for m in methods):
        raise ValueError(f"`methods` must be a non-empty subset of {list(METHODS)}. Got "
                         f"{methods!r}.")
    if "trained" in methods and "data" not in methods:
        raise ValueError("`methods` with 'trained' needs 'data' (its starting point).")
    if isinstance(train_steps, bool) or not isinstance(train_steps, Integral) or train_steps < 1:
        raise ValueError(f"`train_steps` must be a positive integer. Got {train_steps!r}.")
    epsilons = tuple(float(e) for e in np.atleast_1d(epsilons))
    if not epsilons or any(not 0 < e < 1 for e in epsilons):
        raise ValueError(f"`epsilons` must be numbers in (0, 1). Got {epsilons!r}.")
    naming, all_layers, theta = _layers_of(model)
    rotary = naming == "llama"
    causal = _is_causal(model, naming)
    chosen = all_layers if layers is None else [lay for lay in all_layers if lay.index in
                                                set(layers)]
    if not chosen:
        raise ValueError(f"`layers` selects none of the model's layers "
                         f"{[lay.index for lay in all_layers]}.")
    head_list = list(range(chosen[0].n_heads)) if heads is None else sorted(set(heads))
    if not head_list or min(head_list) < 0 or max(head_list) >= chosen[0].n_heads:
        raise ValueError(f"`heads` must be query heads in [0, {chosen[0].n_heads}). Got "
                         f"{heads!r}.")
    if train_at is not None:
        if "trained" not in methods:
            raise ValueError("`train_at` needs 'trained' in `methods`.")
        pairs = ({(r["layer"], r["head"]): r["rank"] for r in train_at.rows}
                 if isinstance(train_at, ResultTable) else dict(train_at))
        train_at = {key: sorted({int(r) for r in np.atleast_1d(value)})
                    for key, value in pairs.items()}
    rng = np.random.default_rng(random_state)
    perm = rng.permutation(len(texts))
    n_cal = min(max(1, int(round(calibration * len(texts)))), len(texts) - 1)
    cal_texts = [texts[i] for i in np.sort(perm[:n_cal])]
    eval_texts = [texts[i] for i in np.sort(perm[n_cal:])]

    d_h = chosen[0].head_dim
    ranks = list(range(d_h + 1))
    rows, forms_all, trained_all, weights, kv_index = [], {}, {}, [], []
    share = np.full((len(chosen), len(head_list)), np.nan)
    n_eval = len(eval_texts)
    # Residual-stream errors of every evaluation text (float32: L x H x (d_h + 1) x texts).
    stream_err = {m: np.full((len(chosen), len(head_list), d_h + 1, n_eval), np.nan,
                             np.float32) for m in METHODS}
    text_energy = np.full((len(chosen), n_eval), np.nan)
    total, done = len(chosen) * len(head_list), 0
    train_seconds = 0.0
    n_eval_tokens = 0
    start = time.perf_counter()
    def batches_of(layer, part):
        seqs, rots = capture_inputs(model, [layer], part, tokenizer, rotary=rotary,
                                    max_length=max_length, batch_size=batch_size,
                                    stop_early=True)
        seqs, rots = seqs[0], rots[0]
        if rotary:
            rots = [r if r is not None else rope_tables(len(x), d_h, theta)
                    for x, r in zip(seqs, rots or [None] * len(seqs), strict=True)]
        return _Batches(seqs, rots if rotary else None, causal, torch.float64)

    for li, layer in enumerate(chosen):
        wq, wk, wv = _augmented(layer)
        weights.append((wq, wk))
        kv_index.append(layer.kv_index)
        parts = {name: batches_of(layer, part)
                 for name, part in (("cal", cal_texts), ("eval", eval_texts))}
        n_eval_tokens = int(sum(int(g["valid"].sum()) for g in parts["eval"].groups))
        text_energy[li] = parts["eval"].energies()
        input_energy = float(text_energy[li].sum())
        tokens = parts["cal"].tokens()
        root_q = _metric_root(tokens.T @ tokens / len(tokens))
        centred = np.concatenate([
            (g["X"][i][g["valid"][i]].numpy() - g["X"][i][g["valid"][i]].numpy().mean(0))
            for g in parts["cal"].groups for i in range(g["X"].shape[0])])
        root_k = _metric_root(centred.T @ centred / len(centred))
        w_o = layer.w_o  # (n_heads, d_h, d) output projections, or None
        for hi, h in enumerate(head_list):
            g = int(layer.kv_index[h])
            head_o = None if w_o is None else w_o[h]
            curves = {}
            for m in ("weight", "data"):
                if m not in methods and not (m == "data" and "trained" in methods):
                    continue
                forms = (_HeadForms(wq[h], wk[g], rotary) if m == "weight" else
                         _HeadForms(wq[h], wk[g], rotary, root_q, root_k))
                forms_all[(li, h, m)] = forms
                if m in methods:
                    curves[m], _, stream, stream_err[m][li, hi] = _head_curve(
                        parts["eval"], wq[h], wk[g], wv[g], forms, d_h, ranks, head_o)
                    share[li, hi] = stream / input_energy
            trained = np.full(d_h + 1, np.nan)
            if "trained" in methods and not rotary:
                t0 = time.perf_counter()
                forms = forms_all[(li, h, "data")]
                for r in [] if train_at is None else train_at.get((layer.index, h), []):
                    if 1 <= r < d_h:
                        (trained[r], stream_err["trained"][li, hi, r], tq,
                         tk) = _train_head(parts["cal"], parts["eval"], wq[h], wk[g], wv[g],
                                           forms, r, d_h, train_steps, head_o)
                        trained_all[(li, h, r)] = (tq, tk)
                for eps in [] if train_at is not None else epsilons:
                    r = _eps_rank(curves["data"], eps) - 1
                    while r >= 1:
                        if np.isnan(trained[r]):
                            (trained[r], stream_err["trained"][li, hi, r], tq,
                             tk) = _train_head(parts["cal"], parts["eval"], wq[h], wk[g], wv[g],
                                               forms, r, d_h, train_steps, head_o)
                            trained_all[(li, h, r)] = (tq, tk)
                        if trained[r] > eps:
                            break
                        r -= 1
                train_seconds += time.perf_counter() - t0
            for r in ranks:
                rows.append({"layer": layer.index, "head": h, "rank": r,
                             "err_weight": curves["weight"][r] if "weight" in curves else np.nan,
                             "err_data": curves["data"][r] if "data" in curves else np.nan,
                             "err_trained": trained[r]})
            done += 1
            if progress is not None:
                progress(done, total)
    result = HeadDeficiencyResult(
        rows, naming=naming, n_layers=len(chosen), n_heads=len(head_list), heads=head_list,
        layer_indices=[lay.index for lay in chosen], head_dim=d_h,
        d_model=chosen[0].w_q.shape[1], causal=causal, rotary=rotary, epsilons=list(epsilons),
        n_calibration=len(cal_texts), n_evaluation=len(eval_texts),
        calibration_index=np.sort(perm[:n_cal]).tolist(),
        evaluation_index=np.sort(perm[n_cal:]).tolist(),
        n_tokens_evaluation=n_eval_tokens,
        seconds=time.perf_counter() - start - train_seconds, train_seconds=train_seconds,
        train_steps=train_steps, n_trained=len(trained_all), output_share=share)
    # Kept for plans and compression (not exported): the factors of every form.
    result._forms, result._trained = forms_all, trained_all
    result._weights, result._kv_index = weights, kv_index
    result._full_heads = chosen[0].n_heads
    result._stream_err, result._text_energy = stream_err, text_energy
    return result


# --- plans and the compressed model ----------------------------------------------------------


def _plan_curves(result, method):
    curves = result.achievable_curves() if method == "trained" else result.curves(method)
    if np.isnan(curves).all():
        raise ValueError(f"The result holds no {method!r} curves; compute them with "
                         f"`methods` including {method!r}.")
    return curves


def _greedy(curves, units):
    """Ranks minimising the sum of errors for ``units`` total rank, greedily by marginal gain.

    Each step moves one head up by the jump (of any size) with the largest error decrease per
    unit of rank; a non-monotone curve is read through its running minimum.
    """
    flat = np.minimum.accumulate(curves.reshape(-1, curves.shape[-1]), axis=1)
    d_h = flat.shape[1] - 1
    ranks = np.zeros(len(flat), dtype=int)
    jumps = np.arange(1, d_h + 1)
    heads = np.arange(len(flat))
    left = units
    while left > 0:
        target = ranks[:, None] + jumps[None, :]  # (heads, jumps)
        allowed = (target <= d_h) & (jumps[None, :] <= left)
        gains = (flat[heads, ranks][:, None] - flat[heads[:, None], np.minimum(target, d_h)])
        gains = np.where(allowed, gains / jumps[None, :], -np.inf)
        h, j = np.unravel_index(np.argmax(gains), gains.shape)
        if not gains[h, j] > 0:
            break
        ranks[h] += jumps[j]
        left -= jumps[j]
    # the smallest rank reaching each head's running minimum
    raw = curves.reshape(-1, curves.shape[-1])
    return np.array([int(np.argmin(raw[h, :r + 1])) for h, r in enumerate(ranks)]).reshape(
        curves.shape[:2])


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
    return np.array([[_eps_rank(c, eps) for c in layer] for layer in curves])


ALLOCATIONS = ("greedy", "residual", "tolerance", "uniform")


def plan_ranks(result, *, budget=None, eps=None, method="trained", allocation="greedy",
               weighting="output", worst_texts=None):
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
    allocation : {"greedy", "residual", "tolerance", "uniform"}, default="greedy"
        For a budget: ``"greedy"`` by marginal error (the sum over heads of their relative
        errors, weighted by ``weighting``); ``"residual"`` greedy by marginal error in the
        residual stream (the sum over heads of
        :meth:`HeadDeficiencyResult.residual_curves`: each head's error after its output
        projection, relative to the stream at its layer, so that a head adding little to
        the stream weighs little); ``"tolerance"``: one tolerance for all heads (the largest
        total within the budget); ``"uniform"``: the same rank for every head. Measured on
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

    Returns
    -------
    plan : ResultTable
        Rows ``layer``, ``head``, ``rank``, ``error`` (the head's measured relative error
        at that rank) and ``residual_error`` (its residual-stream error, NaN without output
        projections); metadata ``budget_used``, ``method``, ``allocation``, ``weighting``,
        ``worst_texts``, ``budget``, ``eps``.
    """
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
    curves = _plan_curves(result, method)
    residual = result.residual_curves(method)
    if allocation == "residual" and np.isnan(residual[np.isfinite(curves)]).any():
        raise ValueError("allocation='residual' needs the heads' output projections; the "
                         "result holds no residual-stream errors.")
    d_h = result.head_dim
    if eps is not None:
        eps = _check_fraction(eps, "eps")
        ranks = _tolerance_ranks(curves, eps)
    else:
        if isinstance(budget, bool) or not isinstance(budget, Real) or not 0 <= budget <= 1:
            raise ValueError(f"`budget` must be a number in [0, 1]. Got {budget!r} instead.")
        units = int(np.floor(budget * curves.shape[0] * curves.shape[1] * d_h + 1e-9))
        if allocation == "uniform":
            ranks = np.full(curves.shape[:2], units // (curves.shape[0] * curves.shape[1]))
        elif allocation == "greedy":
            weights = np.ones(curves.shape[:2])
            if weighting == "output" and np.all(np.isfinite(result.output_share)):
                weights = np.asarray(result.output_share, dtype=float)
            ranks = _greedy(curves * weights[..., None], units)
        elif allocation == "residual" and worst_texts is not None:
            ranks = _greedy_worst(result.residual_curves(method, per_text=True), units,
                                  float(worst_texts))
        elif allocation == "residual":
            ranks = _greedy(residual, units)
        else:  # one tolerance: bisect on log eps for the largest total within the budget
            lo, hi = 1e-8, 1.0
            ranks = _tolerance_ranks(curves, hi)
            for _ in range(60):
                mid = math.sqrt(lo * hi)
                trial = _tolerance_ranks(curves, mid)
                if trial.sum() <= units:
                    hi, ranks = mid, trial
                else:
                    lo = mid
    rows = []
    for li, layer in enumerate(result.layer_indices):
        for hi_, h in enumerate(result.heads):
            r = int(ranks[li, hi_])
            rows.append({"layer": int(layer), "head": h, "rank": r,
                         "error": float(curves[li, hi_, r]),
                         "residual_error": float(residual[li, hi_, r])})
    used = float(ranks.sum() / (ranks.size * d_h))
    return ResultTable(rows, budget_used=used, method=method, allocation=allocation,
                       weighting=weighting, worst_texts=worst_texts, budget=budget, eps=eps,
                       head_dim=d_h)


def _projection_names(naming, attention_module):
    if naming == "bert":
        return attention_module + ".query", attention_module + ".key"
    if naming == "gpt2":
        return attention_module + ".c_attn", attention_module + ".c_attn"
    return attention_module + ".q_proj", attention_module + ".k_proj"


def _write_head(model, naming, layer, head, kv_head, new_q, new_k):
    """Write one head's ``W~_Q'`` and ``W~_K'`` (``(d + 1) x d_h``) into the model in place."""
    torch = require("torch")
    d, d_h = new_q.shape[0] - 1, new_q.shape[1]
    q_name, k_name = _projection_names(naming, layer.attention_module)
    for name, new, index, offset in ((q_name, new_q, head, 0), (k_name, new_k, kv_head, 1)):
        module = model.get_submodule(name)
        weight, bias = module.weight, getattr(module, "bias", None)
        if bias is None and np.any(new[d] != 0):
            raise ValueError(f"`{name}` has no bias but the rank-r form needs one.")
        with torch.no_grad():
            w = torch.as_tensor(new[:d], dtype=weight.dtype)
            b = torch.as_tensor(new[d], dtype=weight.dtype)
            if naming == "gpt2":  # Conv1D (d, 3 d): y = x W + b, [query | key | value]
                cols = slice(offset * d + index * d_h, offset * d + (index + 1) * d_h)
                weight[:, cols] = w
                if bias is not None:
                    bias[cols] = b
            else:  # nn.Linear (n_heads d_h, d)
                rows = slice(index * d_h, (index + 1) * d_h)
                weight[rows] = w.T
                if bias is not None:
                    bias[rows] = b


def compress_heads(model, result, plan, *, method="trained"):
    """A copy of ``model`` whose heads have the query-key ranks of ``plan``.

    Only the query and key projections change: head ``h`` at rank ``r`` gets
    ``W~_Q' = [W_Q'; b_Q']`` and ``W~_K'`` of the same shapes, whose product on ``[x, 1]`` is
    the rank-``r`` form of ``method`` (:meth:`HeadDeficiencyResult.factors`; columns beyond
    ``r`` are zero). Every other weight is the original's, bit for bit. Save it with
    ``save_pretrained``: it is a standard Hugging Face model.

    Parameters
    ----------
    model : transformers model
        The model ``result`` was measured on (its query and key weights unchanged since), or a
        model with the same attention weights (for example the causal-LM class around it).
    result : HeadDeficiencyResult
    plan : ResultTable or mapping
        A :func:`plan_ranks` table, or ``{(layer, head): rank}``.
    method : {"trained", "data", "weight"}, default="trained"
        Whose rank-``r`` forms: ``"trained"`` uses the trained pair where one was trained at
        that rank and the data-aware one elsewhere.

    Returns
    -------
    compressed : transformers model
    """
    if method not in METHODS:
        raise ValueError(f"`method` must be one of {list(METHODS)}. Got {method!r}.")
    ranks = ({(row["layer"], row["head"]): row["rank"] for row in plan.rows}
             if isinstance(plan, ResultTable) else dict(plan))
    naming, layers, _ = _layers_of(model)
    if naming != result.naming:
        raise ValueError(f"The model is {naming}-style, the result {result.naming}-style.")
    by_index = {layer.index: layer for layer in layers}
    compressed = copy.deepcopy(model)
    positions = {v: i for i, v in enumerate(result.layer_indices)}
    for (layer_index, head), rank in ranks.items():
        if layer_index not in positions or head not in result.heads:
            raise ValueError(f"The plan's head {layer_index}.{head} is not in the result.")
        if not 0 <= rank <= result.head_dim:
            raise ValueError(f"Rank {rank} of head {layer_index}.{head} is outside [0, "
                             f"{result.head_dim}].")
        li = positions[layer_index]
        layer = by_index[layer_index]
        new_q, new_k = result.factors(li, head, int(rank), method)
        _write_head(compressed, naming, layer, head, int(layer.kv_index[head]), new_q, new_k)
    return compressed


def _batches_of(tokenizer, texts, max_length, batch_size):
    if getattr(tokenizer, "pad_token", None) is None:
        batch_size = 1
    for start in range(0, len(texts), batch_size):
        yield tokenizer(list(texts[start:start + batch_size]), padding=True, truncation=True,
                        max_length=max_length, return_tensors="pt")


def _embeddings(model, texts, tokenizer, max_length, batch_size):
    torch = require("torch")
    out = []
    model.eval()
    with torch.no_grad():
        for batch in _batches_of(tokenizer, texts, max_length, batch_size):
            hidden = model(**batch)[0]  # the last hidden state
            mask = batch["attention_mask"][..., None].to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)
            out.append(torch.nn.functional.normalize(pooled.double(), dim=-1).numpy())
    return np.concatenate(out)


def embedding_fidelity(original, compressed, texts, tokenizer, *, max_length=128,
                       batch_size=32):
    """Cosine of the mean-pooled, normalised embeddings of two models, text by text.

    Returns
    -------
    table : ResultTable
        Rows ``text`` (index) and ``cosine``; metadata ``mean_cosine``, ``min_cosine``.
    """
    texts = _check_texts(texts, "texts")
    a = _embeddings(original, texts, tokenizer, max_length, batch_size)
    b = _embeddings(compressed, texts, tokenizer, max_length, batch_size)
    cos = np.sum(a * b, axis=1)
    return ResultTable([{"text": i, "cosine": float(c)} for i, c in enumerate(cos)],
                       mean_cosine=float(cos.mean()), min_cosine=float(cos.min()),
                       n_texts=len(texts))


def perplexity(model, texts, tokenizer, *, max_length=128, batch_size=8):
    """Perplexity of a causal language model on ``texts`` (token-weighted, padding excluded)."""
    torch = require("torch")
    texts = _check_texts(texts, "texts")
    total, count = 0.0, 0
    model.eval()
    with torch.no_grad():
        for batch in _batches_of(tokenizer, texts, max_length, batch_size):
            labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
            n = int((labels[:, 1:] != -100).sum())
            if n == 0:
                continue
            loss = model(**batch, labels=labels).loss
            total += float(loss) * n
            count += n
    if count == 0:
        raise ValueError("`texts` hold no token to predict (each needs at least two tokens).")
    return float(np.exp(total / count))


def _is_language_model(model):
    getter = getattr(model, "get_output_embeddings", None)
    return getter is not None and getter() is not None


STRATEGIES = {"uniform": ("data", "uniform"), "weight": ("weight", "tolerance"),
              "data": ("data", "tolerance"), "plan": ("trained", "greedy")}


def compression_frontier(model, result, texts, tokenizer, *, budgets=(0.2, 0.3, 0.4, 0.5),
                         strategies=tuple(STRATEGIES), max_length=128, batch_size=32):
    """End-to-end fidelity of compressed models against the budget, for several strategies.

    ``"uniform"``: the same rank for every head (data-aware forms); ``"weight"``: one
    tolerance on the weight-space curves, weight-space forms; ``"data"``: one tolerance on the
    data-aware curves, data-aware forms; ``"plan"``: the package's plan, greedy by marginal
    error on the achievable curves, with the trained pairs where there are any.

    For a sentence-embedding model (no language-model head) the measure is the cosine of
    the mean-pooled normalised embeddings to the original's (mean and min over ``texts``);
    for a causal language model, the perplexity on ``texts``.

    Returns
    -------
    frontier : ResultTable
        Rows ``strategy``, ``budget``, ``budget_used`` and ``mean_cosine``, ``min_cosine`` or
        ``perplexity``; metadata ``measure`` and, for a language model,
        ``perplexity_original``.
    """
    texts = _check_texts(texts, "texts")
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown:
        raise ValueError(f"`strategies` must be among {list(STRATEGIES)}. Got {unknown}.")
    lm = _is_language_model(model)
    meta = {"measure": "perplexity" if lm else "cosine"}
    reference = None
    if lm:
        meta["perplexity_original"] = perplexity(model, texts, tokenizer, max_length=max_length)
    else:
        reference = _embeddings(model, texts, tokenizer, max_length, batch_size)
    rows = []
    for strategy in strategies:
        method, allocation = STRATEGIES[strategy]
        if np.isnan(_plan_curves(result, "data" if method == "trained" else method)).all():
            continue
        for budget in budgets:
            plan = plan_ranks(result, budget=budget, method=method, allocation=allocation)
            compressed = compress_heads(model, result, plan, method=method)
            row = {"strategy": strategy, "budget": float(budget),
                   "budget_used": plan.budget_used}
            if lm:
                row["perplexity"] = perplexity(compressed, texts, tokenizer,
                                               max_length=max_length)
            else:
                cos = np.sum(reference * _embeddings(compressed, texts, tokenizer, max_length,
                                                     batch_size), axis=1)
                row.update(mean_cosine=float(cos.mean()), min_cosine=float(cos.min()))
            rows.append(row)
            del compressed
    return ResultTable(rows, **meta)


# --- predictors -----------------------------------------------------------------------------


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
    torch = require("torch")
    from .. import IntrinsicRankEstimator
    from ._ranks import head_ranks

    model, tokenizer = _model_source(model, tokenizer)
    texts = _check_texts(texts, "texts")
    if isinstance(window, bool) or not isinstance(window, Integral) or window < 2:
        raise ValueError(f"`window` must be an integer >= 2. Got {window!r}.")
    start = time.perf_counter()
    naming, all_layers, theta = _layers_of(model)
    rotary, causal = naming == "llama", _is_causal(model, naming)
    chosen = all_layers if layers is None else [lay for lay in all_layers
                                                if lay.index in set(layers)]
    head_list = list(range(all_layers[0].n_heads)) if heads is None else sorted(set(heads))
    ranks = head_ranks(model, inputs=texts, tokenizer=tokenizer, taus=taus,
                       max_length=max_length, batch_size=batch_size)
    by_head = {(row["layer"], row["head"]): row for row in ranks.rows}
    d = all_layers[0].w_q.shape[1]
    rows, n_windows = [], 0
    for layer in chosen:
        seqs, rots = capture_inputs(model, [layer], texts, tokenizer, rotary=rotary,
                                    max_length=max_length, batch_size=batch_size,
                                    stop_early=True)
        keep = [i for i, x in enumerate(seqs[0]) if len(x) >= window]
        if len(keep) < 2:
            raise ValueError(f"Fewer than 2 texts have `window`={window} tokens; lower it.")
        X = np.stack([seqs[0][i][:window] for i in keep])
        n_windows = len(X)
        span = np.linalg.matrix_rank(X.reshape(-1, d))  # the kernel's identifiable side
        rot = None
        if rotary:
            tables = [rots[0][i] if rots[0] and rots[0][i] is not None
                      else rope_tables(len(seqs[0][i]), layer.head_dim, theta) for i in keep]
            rot = [(c[:window], s[:window]) for c, s in tables]
        batches = _Batches(list(X), rot, causal, torch.float64)
        wq, wk, wv = _augmented(layer)
        order = np.argsort([window] * len(X), kind="stable")  # _Batches keeps this order
        for h in head_list:
            g = int(layer.kv_index[h])
            outs = []
            with torch.no_grad():
                for grp in batches.groups:
                    Xg = grp["X"]
                    q = _rotate(Xg @ torch.as_tensor(wq[h]), grp["cos"], grp["sin"])
                    k = _rotate(Xg @ torch.as_tensor(wk[g]), grp["cos"], grp["sin"])
                    outs.append(_attend(q, k, Xg @ torch.as_tensor(wv[g]), grp["mask"],
                                        layer.head_dim).numpy())
            Y = np.concatenate(outs)[np.argsort(order)]
            row = {"layer": layer.index, "head": h}
            base = by_head[(layer.index, h)]
            for tau in taus:
                label = format(100 * tau, "g")
                row[f"kernel_energy_rank_{label}"] = base[f"kernel_energy_rank_{label}"]
                row[f"field_energy_rank_{label}"] = base[f"field_energy_rank_{label}"]
            import warnings

            from ..exceptions import RankEstimationWarning

            mask = "causal" if causal else None
            reason = _known_value_reason(d, n_windows, window, span,
                                         np.linalg.matrix_rank(layer.w_v[g]), causal, max_memory)
            with warnings.catch_warnings():
                # The caveats (softmax linearised, finite windows) are the point measured here.
                warnings.simplefilter("ignore", RankEstimationWarning)
                row["data_only_value_unknown"] = IntrinsicRankEstimator(
                    operator="attention", attention="softmax", value=None,
                    mask=mask).fit(X, Y).rank_
                if reason:
                    row["data_only_value_known"] = np.nan
                else:
                    bias = 0.0 if layer.b_v is None else layer.b_v[g]
                    row["data_only_value_known"] = IntrinsicRankEstimator(
                        operator="attention", attention="softmax", value=layer.w_v[g].T,
                        mask=mask).fit(X, Y - bias).rank_
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
