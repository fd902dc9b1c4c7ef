"""A pretrained head's attention on captured inputs, and its rank-``r`` query-key forms.

The inputs of a layer are batched with the model's own mask (padding, causal for decoders) and
rotary tables; :class:`HeadForms` holds a head's bases of the bilinear form ``B = W~_Q W~_K^T``
on ``[x, 1]`` (in the weights' metric or in the tokens' own), from which every rank-``r`` form
of :mod:`._deficiency` is cut. The conventions are those of :func:`head_deficiency`.
"""

import math
from numbers import Real

import numpy as np

from ._families._base import normalise
from ._inputs import config_heads, load_pretrained, require
from ._weights import detect_family, family_layers

METHODS = ("weight", "data", "trained")
_GROUP = 32  # sequences per padded batch


# --- inputs -------------------------------------------------------------------------------


def model_source(model_or_dir, tokenizer):
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


def layers_of(model):
    """``(family adapter, layers, rope theta)`` of a Hugging Face model, value maps required."""
    n_heads, n_kv, theta = config_heads(model.config)
    family, layers = family_layers(model.state_dict(), n_heads, n_kv_heads=n_kv,
                                   config=model.config)
    if any(layer.w_v is None for layer in layers):
        raise ValueError("The model's state dict holds no value weights; the head outputs "
                         "need them.")
    return family, layers, theta


def family_of(model):
    """The family adapter of a Hugging Face model, from its state dict's keys and config.

    A model of kept query-key channels (its config's ``qk_channels``, as the shrunk form
    writes it) is of its stock model's family: the ``q_turn`` its attention may hold (the
    kept planes' scaled rotations after a norm) and the ``query_map`` and ``key_map`` of
    latent keys are the shrunk form's, not the family's.
    """
    config = getattr(model, "config", None)
    keys = list(model.state_dict())
    if getattr(config, "qk_channels", None) is not None:
        keys = [k for k in keys if not k.endswith((".q_turn", ".query_map", ".key_map"))]
    return detect_family(keys, config=config)[0]


def check_texts(texts, name):
    if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
        raise TypeError(f"`{name}` must be a list of strings.")
    texts = [t for t in texts if t.strip()]
    if len(texts) < 2:
        raise ValueError(f"`{name}` must hold at least 2 non-empty texts. Got {len(texts)}.")
    return texts

def check_fraction(value, name):
    if isinstance(value, bool) or not isinstance(value, Real) or not 0 < value < 1:
        raise ValueError(f"`{name}` must be a number in (0, 1). Got {value!r} instead.")
    return float(value)


class HeadBatches:
    """Sequences of one layer in padded groups of similar length, as float64 torch tensors.

    ``X`` is ``(b, n, d + 1)`` (the augmented tokens ``[x, 1]``, zero at padding), ``mask``
    ``(b, n, n)`` the allowed (query, key) pairs, ``valid`` ``(b, n)`` the real tokens,
    ``cos``/``sin`` ``(b, n, d_h)`` the rotary tables (``None`` without rotary). With a
    sliding ``window`` query ``i`` sees key ``j`` only when ``i - j < window``.
    """

    def __init__(self, sequences, rotations, causal, dtype, window=None):
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
            if window is not None:
                offsets = np.arange(n)[:, None] - np.arange(n)[None, :]
                mask &= offsets < window
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


def rotate(t, cos, sin):
    if cos is None:
        return t
    half = t.shape[-1] // 2
    return t * cos + __import__("torch").cat([-t[..., half:], t[..., :half]], -1) * sin


def attend(q, k, v, mask, d_h, scale=None):
    """``softmax(s q k^T + mask) v`` with a boolean mask (True: allowed), ``s = scale`` or by
    default ``1 / sqrt(d_h)``."""
    torch = require("torch")
    scale = 1 / math.sqrt(d_h) if scale is None else scale
    logits = q @ k.transpose(-1, -2) * scale
    logits = logits.masked_fill(~mask, -torch.inf)
    return torch.softmax(logits, -1) @ v


class HeadModel:
    """What one head computes from its layer's inputs, as its family declares it.

    With ``x~ = [x, 1]`` the head's query is ``q = n_Q(x~ W~_Q)``, its key ``k = n_K(x~
    W~_K)`` (``n`` the per-head normalisation of :func:`~._families._base.normalise` with the
    layer's gains, the identity for families without one), both rotated by position for a
    rotary layer, and its output on a sequence ``softmax(s R q . R k + mask) x~ W~_V``, ``s``
    the layer's logit scale and the mask the model's (padding, causal, sliding window) as the
    batches hold it. A rank-``r`` form acts on ``q`` (after the normalisation, before the
    rotation): ``q -> q G_r`` for a rotary head, the first ``r`` columns of ``q A_Q`` and ``k
    A_K`` otherwise (:class:`HeadForms`).
    """

    def __init__(self, layer, head, weights=None):
        wq, wk, wv = augmented_weights(layer) if weights is None else weights
        g = int(layer.kv_index[head])
        self.wq, self.wk, self.wv = wq[head], wk[g], wv[g]
        self.wo = None if layer.w_o is None else layer.w_o[head]
        self.q_gain = None if layer.q_gain is None else layer.q_gain[head]
        self.k_gain = None if layer.k_gain is None else layer.k_gain[g]
        self.eps, self.scale, self.d_h = layer.norm_eps, layer.scale, layer.head_dim
        self._t = {}

    @property
    def normalised(self):
        return self.q_gain is not None

    def _tensor(self, name):
        if name not in self._t:
            self._t[name] = require("torch").as_tensor(getattr(self, name))
        return self._t[name]

    def queries(self, X):
        """``n_Q(X W~_Q)`` before rotation, ``X`` ``(..., d + 1)`` float64 torch."""
        return normalise(X @ self._tensor("wq"), self.q_gain, self.eps)

    def keys(self, X):
        return normalise(X @ self._tensor("wk"), self.k_gain, self.eps)

    def values(self, X):
        return X @ self._tensor("wv")

    def output(self, g):
        """The head's output ``(b, n, d_h)`` on one group of :class:`HeadBatches`."""
        X = g["X"]
        return attend(rotate(self.queries(X), g["cos"], g["sin"]),
                      rotate(self.keys(X), g["cos"], g["sin"]), self.values(X), g["mask"],
                      self.d_h, self.scale)

    def forms(self, rotary, parts=None, shrinkage=0.0, roots=None):
        """The head's :class:`HeadForms`: weight-space without ``parts``/``roots``, else
        data-aware.

        For a normalised head the form is taken on the normalised queries and keys: in the
        weights' metric, of the kernel with the gains ``W~_Q D_Q (W~_K D_K)^T``; in the
        data's, of the identity on the ``d_h`` coordinates of ``q`` and ``k`` in the
        metrics of their own second moments on the calibration ``parts`` (the keys centred
        within each sequence), each shrunk as in :func:`data_metric_roots`. Otherwise the
        layer's ``roots`` (of the tokens' moments) give the data-aware form.
        """
        if not self.normalised:
            return HeadForms(self.wq, self.wk, rotary, *(roots or ()))
        if parts is None:
            return HeadForms(self.wq * self.q_gain, self.wk * self.k_gain, rotary)
        eye = np.eye(self.d_h)
        return HeadForms(eye, eye, rotary, *self.metric_roots(parts, shrinkage))

    def metric_roots(self, parts, shrinkage=0.0):
        """Roots of the second moments of the normalised queries and of the keys centred
        within each sequence, over the real tokens of ``parts`` (a list of batches)."""
        torch = require("torch")
        mq, mk, n_q, n_k = 0.0, 0.0, 0, 0
        with torch.no_grad():
            for batches in parts:
                for g in batches.groups:
                    valid = g["valid"]
                    q, k = self.queries(g["X"]), self.keys(g["X"])
                    qv = q[valid]
                    mq = mq + (qv.T @ qv).numpy()
                    counts = valid.sum(1).clamp(min=1)[:, None, None]
                    mean = (k * valid[..., None]).sum(1, keepdim=True) / counts
                    kc = (k - mean)[valid]
                    mk = mk + (kc.T @ kc).numpy()
                    n_q, n_k = n_q + len(qv), n_k + len(kc)
        roots = []
        for m in (mq / max(n_q, 1), mk / max(n_k, 1)):
            if shrinkage > 0:
                m = (1 - shrinkage) * m + shrinkage * np.trace(m) / len(m) * np.eye(len(m))
            roots.append(metric_root(m))
        return tuple(roots)


def head_model_errors(model, texts, tokenizer, *, max_length=64, batch_size=8):
    """How far :class:`HeadModel` is from the heads' real outputs on ``texts``.

    The model runs once on the texts; each layer's head outputs are read where the model
    feeds them to its output projection (head ``h`` in entries ``h d_h : (h + 1) d_h``), and
    computed from the captured inputs of its query projection by :class:`HeadModel`.

    Returns
    -------
    errors : ndarray of shape (n_layers, n_heads)
        ``||O_model - O_head_model|| / ||O_model||`` (Frobenius, over the real tokens).
    family : AttentionFamily
    """
    torch = require("torch")
    from ._inputs import capture_inputs, rope_tables, token_batches

    family, layers, theta = layers_of(model)
    outputs = [[] for _ in layers]

    def keep(store):
        def hook(module, args):
            store.append(args[0].detach().double())
        return hook

    handles = [model.get_submodule(family.output_module(layer)).register_forward_pre_hook(
        keep(store)) for layer, store in zip(layers, outputs, strict=True)]
    try:
        sequences, rotations = capture_inputs(model, layers, texts, tokenizer,
                                              rotary=family.rotary, max_length=max_length,
                                              batch_size=batch_size)
    finally:
        for handle in handles:
            handle.remove()
    masks = [b["attention_mask"].bool()
             for b in token_batches(tokenizer, texts, max_length, batch_size)]
    causal = family.is_causal(model.config)
    errors = np.zeros((len(layers), layers[0].n_heads))
    for li, layer in enumerate(layers):
        d_h = layer.head_dim
        real = torch.cat([o[m] for o, m in zip(outputs[li], masks, strict=True)])
        rots = None
        if family.rotary:
            base = theta if layer.rope_theta is None else layer.rope_theta
            rots = [r if r is not None else rope_tables(len(x), d_h, base)
                    for x, r in zip(sequences[li], rotations[li], strict=True)]
        batches = HeadBatches(sequences[li], rots, causal, torch.float64, window=layer.window)
        # the batches' sequences in the texts' order: real rows of sequence i
        starts = np.concatenate([[0], np.cumsum([len(x) for x in sequences[li]])])
        weights = augmented_weights(layer)
        for h in range(layer.n_heads):
            head = HeadModel(layer, h, weights)
            num = den = 0.0
            with torch.no_grad():
                for g in batches.groups:
                    out = head.output(g)
                    for row, i in enumerate(g["index"]):
                        n = starts[i + 1] - starts[i]
                        target = real[starts[i]:starts[i + 1], h * d_h:(h + 1) * d_h]
                        num += float(torch.sum((out[row, :n] - target) ** 2))
                        den += float(torch.sum(target ** 2))
            errors[li, h] = np.sqrt(num / max(den, np.finfo(float).tiny))
    return errors, family


# --- the rank-r forms -----------------------------------------------------------------------


def augmented_weights(layer):
    """``W~_Q (n_heads, d+1, d_h)``, ``W~_K``, ``W~_V`` (``n_kv_heads``) with the bias rows."""
    def aug(w, b):
        row = np.zeros((w.shape[0], 1, w.shape[2])) if b is None else b[:, None, :]
        return np.concatenate([w, row], axis=1)
    return aug(layer.w_q, layer.b_q), aug(layer.w_k, layer.b_k), aug(layer.w_v, layer.b_v)


def metric_root(M):
    """``L`` with ``L L^T = M`` for a symmetric PSD ``M`` (eigenvalues clipped at zero)."""
    w, E = np.linalg.eigh((M + M.T) / 2)
    return E * np.sqrt(np.clip(w, 0.0, None))


def data_metric_roots(parts, shrinkage=0.0):
    """Roots ``L_Q, L_K`` of the data-aware metrics of a layer, from its calibration batches.

    ``M_Q`` is the second moment of the augmented tokens, ``M_K`` that of the tokens centred
    within each sequence (softmax ignores what is constant along a row); each is shrunk
    towards the identity on the scale of its mean eigenvalue, ``(1 - shrinkage) M +
    shrinkage tr(M) / (d + 1) I``, so that directions the calibration text rarely uses keep
    a weight (``shrinkage = 1``: the weights' metric up to a factor).
    """
    tokens = np.concatenate([b.tokens() for b in parts])
    centred = np.concatenate([
        g["X"][i][g["valid"][i]].numpy() - g["X"][i][g["valid"][i]].numpy().mean(0)
        for b in parts for g in b.groups for i in range(g["X"].shape[0])])
    roots = []
    for m in (tokens.T @ tokens / len(tokens), centred.T @ centred / len(centred)):
        if shrinkage > 0:
            m = (1 - shrinkage) * m + shrinkage * np.trace(m) / len(m) * np.eye(len(m))
        roots.append(metric_root(m))
    return tuple(roots)


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


class HeadForms:
    """The rank-``r`` query and key factors of one head under one method.

    ``A_Q``, ``A_K`` (``d_h x d_h``) are the bases of :func:`_svd_bases`: the first ``r``
    columns give the best rank-``r`` form of the kernel in the method's metric. A rotary
    head cannot take a change of basis (the rotation sits between its queries and keys), so
    its rank-``r`` form is a map on the query before the rotation,
    ``q -> q G_r`` with ``G_r = A_Q[:, :r] A_K[:, :r]^T`` (:meth:`query_map`): at offset 0
    the kernel is the same best rank-``r`` form, at every offset its rank is at most ``r``,
    and the keys, shared under grouped-query attention, stay whole.
    """

    def __init__(self, wq, wk, rotary, root_q=None, root_k=None):
        self.rotary = bool(rotary)
        self.d_h = wq.shape[1]
        self.A_Q, self.A_K = _svd_bases(wq, wk, root_q, root_k)

    @classmethod
    def restore(cls, A_Q, A_K, rotary=False):
        """The forms from their kept bases."""
        forms = cls.__new__(cls)
        forms.rotary, forms.d_h = bool(rotary), A_Q.shape[0]
        forms.A_Q, forms.A_K = A_Q, A_K
        return forms

    def columns(self, r):
        """Columns of the bases kept at rank ``r``."""
        return np.arange(r)

    def query_map(self, r):
        """``G_r`` (``d_h x d_h``, rank ``r``): a rotary head's rank-``r`` query ``q G_r``."""
        return self.A_Q[:, :r] @ self.A_K[:, :r].T


