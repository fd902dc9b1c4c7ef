"""Query-key compressions of the literature, as the decoder benchmark runs them.

Each peer gives every head of a Hugging Face model the same query-key rank ``r`` and returns
a compressed copy (only the query and key projections change, as with
:func:`~sklearn_ebound.heads.compress_heads`):

* ``weight_svd``: the truncated SVD of each head's kernel ``W~_Q W~_K^T`` in the weights' own
  metric (for a rotary head: the ``r / 2`` rotation planes of largest kernel energy).
* ``asvd``: ASVD (Yuan et al., 2023): the same truncation after scaling each input channel
  ``j`` by ``s_j^alpha``, ``s_j`` the mean absolute activation entering the projections on
  calibration text (``alpha = 0.5``, the authors' default), then unscaled.
* ``palu``: Palu (Chang et al., 2024): each key head's projection, shared by its group of
  query heads, is replaced by its best rank-``r`` approximation on the calibration tokens,
  ``W~_K' = W~_K V_r V_r^T`` with ``V_r`` the top ``r`` eigenvectors of ``W~_K^T M W~_K``
  (``M`` the second moment of the augmented tokens, the whitening of SVD-LLM: it minimises
  ``||X W~_K - X W~_K'||``); the queries are untouched. With rotary positions the low-rank
  keys are rotated as before, so each offset's kernel has rank ``r`` (no whole planes).

SVD-LLM's truncation-aware whitening at a uniform rank is the package's own data-aware form
(``plan_ranks(..., allocation="uniform")``), which the benchmark runs through the package.
"""

import copy

import numpy as np

from sklearn_ebound.heads._deficiency import rank_factors
from sklearn_ebound.heads._head_forms import HeadForms, augmented_weights, layers_of

__all__ = ["activation_statistics", "weight_svd", "asvd", "palu", "PEERS"]


def activation_statistics(model, texts, tokenizer, *, max_length=64):
    """Per layer (by index): mean ``|x|`` ``(d,)`` and second moment ``(d + 1, d + 1)`` of
    the augmented tokens ``[x, 1]`` entering the query projection, one text at a time."""
    import torch

    _, layers, _ = layers_of(model)
    sums = {layer.index: [0.0, 0.0, 0] for layer in layers}

    def hook_for(index):
        def hook(module, args):
            x = args[0].detach().to(torch.float64).reshape(-1, args[0].shape[-1])
            x = torch.cat([x, torch.ones(len(x), 1, dtype=x.dtype)], 1)
            acc = sums[index]
            acc[0] = acc[0] + x.abs().sum(0).numpy()
            acc[1] = acc[1] + (x.T @ x).numpy()
            acc[2] += len(x)
        return hook

    hooks = [model.get_submodule(layer.module).register_forward_pre_hook(hook_for(layer.index))
             for layer in layers]
    try:
        with torch.no_grad():
            for text in texts:
                ids = tokenizer(text, return_tensors="pt", truncation=True,
                                max_length=max_length)
                model(**ids)
    finally:
        for h in hooks:
            h.remove()
    return {i: {"mean_abs": a[0][:-1] / a[2], "moment": a[1] / a[2]} for i, a in sums.items()}


def _kernel_truncation(model, rank, roots=None):
    """Every head's kernel truncated to ``rank`` in the metric ``roots[layer]`` (or the
    weights' own)."""
    family, layers, _ = layers_of(model)
    compressed = copy.deepcopy(model)
    for layer in layers:
        wq, wk, _ = augmented_weights(layer)
        root = None if roots is None else roots[layer.index]
        for head in range(layer.n_heads):
            g = int(layer.kv_index[head])
            forms = HeadForms(wq[head], wk[g], family.rotary, root, root)
            new_q, new_k = rank_factors(wq[head], wk[g], forms, rank)
            family.write_head(compressed, layer, head, g, new_q, new_k)
    return compressed


def weight_svd(model, rank, stats=None):
    """Uniform truncated SVD of every head's kernel in the weights' metric."""
    return _kernel_truncation(model, rank)


def asvd(model, rank, stats, alpha=0.5):
    """Uniform activation-scaled SVD: the metric ``diag(s^alpha)`` on ``[x, 1]``."""
    roots = {i: np.diag(np.append(s["mean_abs"], 1.0) ** alpha) for i, s in stats.items()}
    return _kernel_truncation(model, rank, roots)


def palu(model, rank, stats):
    """Uniform rank-``rank`` key projection per key head, whitened by the tokens' moment."""
    family, layers, _ = layers_of(model)
    compressed = copy.deepcopy(model)
    for layer in layers:
        wq, wk, _ = augmented_weights(layer)
        moment = stats[layer.index]["moment"]
        new_keys = []
        for g in range(layer.n_kv_heads):
            key_moment = wk[g].T @ moment @ wk[g]  # E[k k^T] of the head's keys
            _, vectors = np.linalg.eigh((key_moment + key_moment.T) / 2)
            top = vectors[:, ::-1][:, :rank]
            new_keys.append(wk[g] @ top @ top.T)
        for head in range(layer.n_heads):
            g = int(layer.kv_index[head])
            family.write_head(compressed, layer, head, g, wq[head], new_keys[g])
    return compressed


PEERS = {"weight SVD": weight_svd, "ASVD": asvd, "Palu (key groups)": palu}
