"""Latent keys: a rank-``r`` form of a rotary head taken after its rotation.

Whole rotary planes (:func:`~._shrink.plane_plan`) are the subspaces that commute with every
rotation, so they fold into the projections; but a plane is all or nothing, and the channels a
key head needs rarely come in its planes. Taken *after* the rotation, any subspace will do:
key head ``g`` caches ``A_g R_j k_j`` (``r_g`` numbers per token, ``A_g`` of ``r_g x d_h``) and
each of its query heads ``h`` meets it with ``B_h R_i q_i``, so its logit is ``q_i^T R_i^T
B_h^T A_g R_j k_j``, a rank-``r_g`` form of ``q_i^T R_i^T R_j k_j``. The projections (and a
family's norms) stay whole; only the two small maps are added.

Which maps: on calibration text, for the rotated queries ``q`` of the group and the rotated
keys ``k`` of ``g`` drawn independently, the mean squared logit error ``E (q^T (I - B^T A)
k)^2 = ||L_q^T (I - B^T A) L_k||_F^2``, with ``C_q = L_q L_q^T`` the group's query second
moment and ``C_k = L_k L_k^T`` the key covariance (centred: a shift of every key adds the
same to every logit of a query, which the softmax ignores). Its minimum over rank ``r_g``
(Eckart-Young on ``L_q^T L_k``) is ``A = V_r^T L_k^{-1}``, ``B = V_r^T L_k^T``, ``V_r`` the top
``r_g`` eigenvectors of ``L_k^T C_q L_k``; at ``r_g = d_h``, ``B^T A = I``: the original.
"""

import numpy as np

from ._head_forms import HeadModel, augmented_weights, layers_of, rotate
from ._inputs import attention_inputs, augmented_tokens, require

__all__ = ["latent_channels", "latent_maps", "latent_widths"]


def latent_widths(planes):
    """``{layer: [r_g per key head]}``: the key channels whole ``planes`` keep (two a plane),
    so that latent keys cost the cache what the planes cost."""
    return {layer: [2 * len(p) for p in heads] for layer, heads in planes.items()}


def latent_channels(model, widths):
    """The latent channels as :func:`~._shrink.kept_channels` lists channels: ``0 .. r_g - 1``
    for key head ``g`` and each of its query heads."""
    _, layers, _ = layers_of(model)
    out = []
    for layer in layers:
        key = [list(range(int(r))) for r in widths[layer.index]]
        if len(key) != layer.n_kv_heads or any(not 0 <= len(k) <= layer.head_dim for k in key):
            raise ValueError(f"Layer {layer.index}: `widths` must give each of its "
                             f"{layer.n_kv_heads} key heads a width in 0..{layer.head_dim}. "
                             f"Got {widths[layer.index]!r}.")
        out.append({"layer": layer.index, "query": [key[g] for g in layer.kv_index],
                    "key": key})
    return out


def _moments(model, layers, texts, tokenizer, max_length, batch_size):
    """Per layer, summed over the real tokens of ``texts``: each query head's rotated query
    second moment ``(n_heads, d_h, d_h)``, each key head's rotated key second moment and sum,
    and the number of tokens, as :class:`HeadModel` computes the queries and keys."""
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
        new = (torch.einsum("htc,hte->hce", q, q), torch.einsum("gtc,gte->gce", k, k),
               k.sum(1), len(X))
        old = sums.get(layer.index)
        sums[layer.index] = new if old is None else tuple(a + b for a, b in zip(old, new,
                                                                              strict=True))

    attention_inputs(model, layers, texts, tokenizer, visit, max_length, batch_size)
    return sums


def _maps(cq, ck, width):
    """``(A, B)`` of one key head (module docstring): ``cq`` its group's summed query second
    moment, ``ck`` its key covariance, both ``(d_h, d_h)``."""
    d_h = len(ck)
    ridge = 1e-8 * max(np.trace(ck) / d_h, np.finfo(float).tiny)
    lk = np.linalg.cholesky(ck + ridge * np.eye(d_h))
    values, vectors = np.linalg.eigh(lk.T @ cq @ lk)
    top = vectors[:, np.argsort(-values, kind="stable")[:width]]
    return np.linalg.solve(lk.T, top).T, top.T @ lk.T  # V^T L_k^{-1}, V^T L_k^T


def latent_maps(model, widths, texts, *, tokenizer, max_length=128, batch_size=8):
    """The latent maps of every layer: ``{layer: (query_map, key_map)}``.

    ``key_map`` ``(sum_g r_g, d_h)`` holds ``A_g`` of every key head in turn, ``query_map``
    ``(sum_h r_g(h), d_h)`` ``B_h`` of every query head (module docstring), fitted on the
    queries and keys the logits take on ``texts`` (calibration text; normalised with the gains
    where the family normalises its heads, rotated by the layer's rotary tables). ``widths``:
    ``{layer: [r_g per key head]}`` (:func:`latent_widths`).
    """
    family, layers, _ = layers_of(model)
    if not family.rotary:
        raise ValueError("Latent keys are a form of rotary heads; a head without rotary "
                         "embeddings keeps query and key maps of width r (form='shrunk').")
    latent_channels(model, widths)  # checks the widths
    sums = _moments(model, layers, texts, tokenizer, max_length, batch_size)
    out = {}
    for layer in layers:
        cq, ck, k_sum, n = sums[layer.index]
        cq, ck, k_sum = cq.numpy(), ck.numpy(), k_sum.numpy()
        group = layer.n_heads // layer.n_kv_heads
        query_rows, key_rows = [], []
        for g, width in enumerate(widths[layer.index]):
            mean = k_sum[g] / n
            a, b = _maps(cq[g * group:(g + 1) * group].sum(0) / n,
                         ck[g] / n - np.outer(mean, mean), int(width))
            key_rows.append(a)
            query_rows.extend([b] * group)
        out[layer.index] = (np.concatenate(query_rows), np.concatenate(key_rows))
    return out
