"""Latent keys: a rank-``r`` form of a rotary head taken after its rotation.

Whole rotary planes (:func:`~._shrink.plane_plan`) are the subspaces that commute with every
rotation, so they fold into the projections; but a plane is all or nothing, and the channels a
key head needs rarely come in its planes. Taken *after* the rotation, any subspace will do:
key head ``g`` caches ``A_g R_j k_j`` (``r_g`` numbers per token, ``A_g`` of ``r_g x d_h``) and
its query heads meet it with ``B_g R_i q_i``, so their logit is ``q_i^T R_i^T B_g^T A_g R_j
k_j``, a rank-``r_g`` form of ``q_i^T R_i^T R_j k_j``. The projections (and a
family's norms) stay whole; only the two small maps are added.

Which maps: on calibration text, for the rotated queries ``q`` of the group and the rotated
keys ``k`` of ``g`` drawn independently, the mean squared logit error ``E (q^T (I - B^T A)
k)^2 = ||L_q^T (I - B^T A) L_k||_F^2``, with ``C_q = L_q L_q^T`` the group's query second
moment and ``C_k = L_k L_k^T`` the key covariance (centred: a shift of every key adds the
same to every logit of a query, which the softmax ignores). Its minimum over rank ``r_g``
(Eckart-Young on ``L_q^T L_k``) is ``A = V_r^T L_k^{-1}``, ``B = V_r^T L_k^T``, ``V_r`` the top
``r_g`` eigenvectors of ``L_k^T C_q L_k``; at ``r_g = d_h``, ``B^T A = I``: the original.

Shared latent keys (multi-head latent attention): one latent of ``r`` channels per layer reads
every rotated key head side by side, ``A R k`` with ``A`` of ``r x (n_kv d_h)``, and a query
head of key head ``g`` meets it with ``B_g R q``. Its target is ``E_g``, the block of the keys
that is ``g``'s, so the error is ``sum_g ||L_q,g^T (E_g - B_g^T A) L_k||_F^2`` with
``C_k`` the covariance of all the layer's keys; its minimum takes ``V_r`` the top ``r``
eigenvectors of ``L_k^T D_q L_k``, ``D_q`` block-diagonal with each key head's summed query
moment, ``A = V_r^T L_k^{-1}`` and ``B_g`` key head ``g``'s block of ``V_r^T L_k^T``. (A key
head's query heads share one map in either form: the error sums their moments.) The key
heads share the latent's channels, so the layer's keys cost what their sum of widths costs
per head but keep what the heads have in common once.

Each query head's error is taken relative to its logits' energy ``tr(C_q,h C_k,g)`` and priced
by its Fisher weight when the plan was priced by one (as the planes are priced): ``C_q,h``
enters ``D_q`` as ``w_h C_q,h / tr(C_q,h C_k,g)``. The eigenvalues of ``L_k^T D_q L_k`` are then
what each latent channel takes off the priced error, in one unit for every latent key head of
the model, so with ``pool=True`` the widths' total is shared among them by those eigenvalues
(the largest first): the key cache is the plan's, its channels where they buy the most.
"""

import numpy as np

from ._head_forms import HeadModel, augmented_weights, layers_of, rotate
from ._inputs import attention_inputs, augmented_tokens, require

__all__ = ["fit_latent_keys", "latent_channels", "latent_maps", "latent_widths",
           "shared_widths"]


def latent_widths(planes):
    """``{layer: [r_g per key head]}``: the key channels whole ``planes`` keep (two a plane),
    so that latent keys cost the cache what the planes cost."""
    return {layer: [2 * len(p) for p in heads] for layer, heads in planes.items()}


def shared_widths(planes):
    """``{layer: [r]}``: one latent per layer, as wide as the key channels of all its key
    heads' ``planes`` together (shared latent keys, the same key cache)."""
    return {layer: [2 * sum(len(p) for p in heads)] for layer, heads in planes.items()}


def _latent_heads(layer, widths):
    """``(latent key heads, key heads each reads)`` of ``layer`` for its ``widths``, checked:
    every latent key head reads an equal share of the key heads side by side."""
    count = len(widths)
    if not count or layer.n_kv_heads % count:
        raise ValueError(f"Layer {layer.index}: `widths` must give one width per latent key "
                         f"head, their number dividing its {layer.n_kv_heads} key heads (one "
                         f"per key head, or one shared by all). Got {widths!r}.")
    share = layer.n_kv_heads // count
    if any(not 0 <= int(r) <= share * layer.head_dim for r in widths):
        raise ValueError(f"Layer {layer.index}: `widths` must give each of its {count} latent "
                         f"key heads a width in 0..{share * layer.head_dim}. Got {widths!r}.")
    return count, share


def latent_channels(model, widths):
    """The latent channels as :func:`~._shrink.kept_channels` lists channels: ``0 .. r - 1``
    for each latent key head and each query head that reads it (a latent key head per key
    head, or one per layer shared by all, :func:`shared_widths`)."""
    _, layers, _ = layers_of(model)
    out = []
    for layer in layers:
        count, _ = _latent_heads(layer, widths[layer.index])
        key = [list(range(int(r))) for r in widths[layer.index]]
        group = layer.n_heads // count
        out.append({"layer": layer.index, "query": [key[h // group]
                                                    for h in range(layer.n_heads)],
                    "key": key})
    return out


def _moments(model, layers, texts, tokenizer, max_length, batch_size, counts):
    """Per layer, summed over the real tokens of ``texts``: each query head's rotated query
    second moment ``(n_heads, d_h, d_h)``, each latent key head's second moment and sum of the
    rotated keys it reads side by side (``counts[layer]`` latent key heads, each reading an
    equal share of the key heads), and the number of tokens, as :class:`HeadModel` computes
    the queries and keys."""
    torch = require("torch")
    sums = {}
    weights = {layer.index: augmented_weights(layer) for layer in layers}

    def visit(layer, x, cos, sin, valid):
        X = augmented_tokens(x)[valid]
        cos, sin = (t.expand(*valid.shape, -1)[valid] for t in (cos, sin))
        models = [HeadModel(layer, h, weights[layer.index]) for h in range(layer.n_heads)]
        group = layer.n_heads // layer.n_kv_heads
        q = torch.stack([rotate(m.queries(X), cos, sin) for m in models])
        k = torch.stack([rotate(m.keys(X), cos, sin) for m in models[::group]])
        count = counts[layer.index]
        # (latent key heads, tokens, the channels of the key heads each reads side by side)
        k = k.reshape(count, -1, *k.shape[1:]).transpose(1, 2).reshape(count, len(X), -1)
        new = (torch.einsum("htc,hte->hce", q, q), torch.einsum("gtc,gte->gce", k, k),
               k.sum(1), len(X))
        old = sums.get(layer.index)
        sums[layer.index] = new if old is None else tuple(a + b for a, b in zip(old, new,
                                                                              strict=True))

    attention_inputs(model, layers, texts, tokenizer, visit, max_length, batch_size)
    return sums


def _whitened(cq, ck):
    """``(L_k, eigenvalues, eigenvectors)`` of ``L_k^T D_q L_k``, the largest first:
    ``cq`` the (weighted, block-diagonal) query moment ``D_q``, ``ck`` the keys' covariance."""
    size = len(ck)
    ridge = 1e-8 * max(np.trace(ck) / size, np.finfo(float).tiny)
    lk = np.linalg.cholesky(ck + ridge * np.eye(size))
    values, vectors = np.linalg.eigh(lk.T @ cq @ lk)
    order = np.argsort(-values, kind="stable")
    return lk, values[order], vectors[:, order]


def _top_maps(whitened, width):
    """``(A, B)`` of one latent key head (module docstring) at ``width``, from
    :func:`_whitened`."""
    lk, _, vectors = whitened
    top = vectors[:, :width]
    return np.linalg.solve(lk.T, top).T, top.T @ lk.T  # V^T L_k^{-1}, V^T L_k^T


def fit_latent_keys(model, widths, texts, *, tokenizer, sensitivity=None, pool=False,
                    max_length=128, batch_size=8):
    """The latent keys of every layer, fitted: ``(widths, {layer: (query_map, key_map)})``.

    ``key_map`` ``(sum_s r_s, c d_h)`` holds ``A_s`` of every latent key head in turn (each
    reading ``c`` key heads side by side: ``c = 1`` for a latent per key head, every key head
    of the layer for shared latent keys), ``query_map`` ``(sum_g r_s(g), d_h)`` ``B_g`` of every
    key head, shared by its query heads (module docstring), fitted on the queries and keys
    the logits take on ``texts`` (calibration text; normalised with the gains where the
    family normalises its heads, rotated by the layer's rotary tables).

    Parameters
    ----------
    model : transformers model with rotary heads
    widths : dict
        ``{layer: [r_s per latent key head]}`` (:func:`latent_widths`, :func:`shared_widths`).
    texts : list of str
        Calibration text.
    tokenizer : transformers tokenizer
    sensitivity : HeadSensitivityResult, default=None
        :func:`~._sensitivity.head_sensitivity`: each query head's error priced by its Fisher
        weight (1 for every head without it).
    pool : bool, default=False
        Share the widths' total among all latent key heads by what each channel takes off
        the priced error (module docstring); ``False`` keeps ``widths``.
    max_length, batch_size : int
        Tokens per text at most; texts per forward pass.

    Returns
    -------
    widths : dict
        The widths fitted (``widths`` itself unless pooled).
    maps : dict
    """
    family, layers, _ = layers_of(model)
    if not family.rotary:
        raise ValueError("Latent keys are a form of rotary heads; a head without rotary "
                         "embeddings keeps query and key maps of width r (form='shrunk').")
    latent_channels(model, widths)  # checks the widths
    counts = {layer.index: len(widths[layer.index]) for layer in layers}
    sums = _moments(model, layers, texts, tokenizer, max_length, batch_size, counts)
    weights = {} if sensitivity is None else {
        (int(r["layer"]), int(r["head"])): float(r["weight"]) for r in sensitivity.rows}
    solved = {layer.index: [_whitened(cq, ck) for cq, ck in _problems(
        layer, counts[layer.index], *sums[layer.index], weights)] for layer in layers}
    if pool:
        widths = _pooled(layers, widths, solved)
    return widths, {layer.index: _layer_maps(layer, widths[layer.index], solved[layer.index])
                    for layer in layers}


def latent_maps(model, widths, texts, *, tokenizer, sensitivity=None, max_length=128,
                batch_size=8):
    """The latent maps of every layer at ``widths``, ``{layer: (query_map, key_map)}``
    (:func:`fit_latent_keys` without pooling)."""
    return fit_latent_keys(model, widths, texts, tokenizer=tokenizer, sensitivity=sensitivity,
                           max_length=max_length, batch_size=batch_size)[1]


def _problems(layer, count, cq, ck, k_sum, n, weights):
    """Per latent key head of ``layer``, ``(D_q, C_k)``: the block-diagonal query moment,
    each query head's ``w_h C_q,h / tr(C_q,h C_k,g)`` summed on its key head's block, and the
    covariance of the keys it reads (module docstring), from the summed moments of
    :func:`_moments`."""
    cq, ck, k_sum = cq.numpy() / n, ck.numpy() / n, k_sum.numpy() / n
    d_h, group = layer.head_dim, layer.n_heads // layer.n_kv_heads
    per = layer.n_kv_heads // count  # key heads each latent key head reads
    out = []
    for s in range(count):
        covariance = ck[s] - np.outer(k_sum[s], k_sum[s])
        blocks = np.zeros_like(covariance)
        for j in range(per):
            part = slice(j * d_h, (j + 1) * d_h)
            g = s * per + j
            for h in range(g * group, (g + 1) * group):
                energy = np.sum(cq[h] * covariance[part, part])  # tr(C_q,h C_k,g)
                blocks[part, part] += (weights.get((layer.index, h), 1.0)
                                       / max(energy, np.finfo(float).tiny) * cq[h])
        out.append((blocks, covariance))
    return out


def _pooled(layers, widths, solved):
    """The widths' total shared among all latent key heads by their eigenvalues, the largest
    first, each at most the channels it reads."""
    gains = [(value, layer.index, s) for layer in layers
             for s, (_, values, _) in enumerate(solved[layer.index]) for value in values]
    total = sum(int(r) for layer in layers for r in widths[layer.index])
    pooled = {layer.index: [0] * len(widths[layer.index]) for layer in layers}
    for _, index, s in sorted(gains, key=lambda g: -g[0])[:total]:
        pooled[index][s] += 1
    return pooled


def _layer_maps(layer, widths, solved):
    """``(query_map, key_map)`` of one layer: each latent key head's top ``r_s`` maps
    (:func:`_whitened`), ``B_g`` the block of each key head it reads."""
    d_h, per = layer.head_dim, layer.n_kv_heads // len(widths)
    query_rows, key_rows = [], []
    for s, width in enumerate(widths):
        a, b = _top_maps(solved[s], int(width))
        key_rows.append(a)
        query_rows.extend(b[:, j * d_h:(j + 1) * d_h] for j in range(per))
    return np.concatenate(query_rows), np.concatenate(key_rows)
