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

The peers above keep the original shapes (they measure what a rank costs, not what it saves).
Their *shrinking* forms, at a share ``budget`` of the key cache (the savings benchmark):

* ``palu_latent``: Palu's low-rank keys as its authors run them. Key head ``g`` keeps a latent
  ``z = [x, 1] W~_K V_g`` of ``r_g`` channels (``V_g`` the top eigenvectors of the whitened key
  moment, as ``palu``), which the key cache holds *before* the rotation; every step rebuilds
  the keys of all cached tokens, ``k = R_t(z V_g^T)``, and attends with them (the rotation sits
  between the latent and the logit, so it cannot be folded into the queries). The queries
  are untouched.
* ``think_planes``: ThinK (Xu et al., 2024) pruned to whole rotary pairs. Key head ``g`` scores
  plane ``f`` by ``sum_{h in g} ||q_hf|| ||k_gf||`` (the norms over the calibration tokens'
  channels ``f`` and ``f + d_h / 2``) and keeps its best planes; its query heads keep the same
  planes, and no map is fitted. The model is written in the package's shrunk form.

Both keep ``round(budget * n)`` of the ``n`` key channels (planes) of the whole model: every
key head the same count, give or take one, the extra ones going to the key heads whose next
channel (plane) holds the largest share of their own total.
"""

import copy

import numpy as np

from sklearn_ebound.heads._deficiency import rank_factors
from sklearn_ebound.heads._head_forms import HeadForms, augmented_weights, layers_of

__all__ = ["activation_statistics", "weight_svd", "asvd", "palu", "PEERS", "palu_latent",
           "think_planes", "SHRINKING_PEERS"]


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


# --- the shrinking forms --------------------------------------------------------------------


def _even_counts(shares, total):
    """How many leading items each unit keeps: ``total`` in all, as even as possible.

    ``shares[u]``: unit ``u``'s items' shares of its own total, largest first. Every unit keeps
    ``total // n`` (or all it has); the rest go one each to the units whose next item has the
    largest share.
    """
    counts = [min(total // len(shares), len(s)) for s in shares]
    following = sorted(((s[c] if c < len(s) else -np.inf), u)
                       for u, (s, c) in enumerate(zip(shares, counts, strict=True)))[::-1]
    for _, u in following[:total - sum(counts)]:
        counts[u] += 1
    return counts


def _check_llama(model, name):
    family, layers, _ = layers_of(model)
    if family.name != "llama" or not family.rotary:
        raise ValueError(f"{name} is written for LLaMA-style rotary attention (no query-key "
                         f"norms); got {family.name}-style attention.")
    return family, layers


def think_planes(model, budget, texts, tokenizer, *, max_length=64):
    """ThinK's rotary planes per key head at a share ``budget`` of the key cache:
    ``{layer index: [[plane, ...] per key head]}`` (as :func:`~._shrink.plane_plan` gives)."""
    from sklearn_ebound.heads._shrink import _head_energies

    _, layers = _check_llama(model, "ThinK's pair pruning")
    energies = _head_energies(model, layers, texts, tokenizer, max_length)
    orders, shares = [], []
    for layer in layers:
        half = layer.head_dim // 2
        eq, ek = energies[layer.index]
        q_norm = np.sqrt(eq[:, :half] + eq[:, half:])  # (n_heads, half): ||q_hf|| / sqrt(n)
        k_norm = np.sqrt(ek[:, :half] + ek[:, half:])
        for g in range(layer.n_kv_heads):
            heads = np.flatnonzero(np.asarray(layer.kv_index) == g)
            score = q_norm[heads].sum(0) * k_norm[g]
            order = np.argsort(-score, kind="stable")
            orders.append(order)
            shares.append(score[order] / max(score.sum(), np.finfo(float).tiny))
    n_planes = sum(len(o) for o in orders)
    counts = iter(_even_counts(shares, round(budget * n_planes)))
    orders = iter(orders)
    return {layer.index: [sorted(int(f) for f in next(orders)[:next(counts)])
                          for _ in range(layer.n_kv_heads)] for layer in layers}


class _RotaryTable:
    """``cos, sin`` of the model's rotary embedding at positions ``0 .. m - 1``
    (``(1, m, d_h)``), computed once for the longest ``m`` asked and sliced after."""

    def __init__(self, rotary_embedding):
        self.rotary_embedding = rotary_embedding
        self.tables = {}

    def __call__(self, m, like):
        import torch

        key = (like.device, like.dtype)
        if key not in self.tables or self.tables[key][0].shape[1] < m:
            positions = torch.arange(max(m, 2048), device=like.device)[None]
            self.tables[key] = self.rotary_embedding(like, positions)
        cos, sin = self.tables[key]
        return cos[:, :m], sin[:, :m]


def _latent_attention_class():
    import torch
    from torch import nn
    from transformers.models.llama.modeling_llama import (
        ALL_ATTENTION_FUNCTIONS,
        eager_attention_forward,
        rotate_half,
    )

    class LatentKeyAttention(nn.Module):
        """A LLaMA attention block whose key cache holds Palu's latent keys.

        ``k_latent``: ``[x, 1] -> z`` (``sum_g r_g`` channels, before the rotation), cached as
        one ``(batch, 1, tokens, sum_g r_g)`` tensor; ``k_up[g]`` ``(r_g, d_h)`` rebuilds key
        head ``g``'s keys of every cached token, which are then rotated to their positions
        ``0 .. m - 1`` (one sequence from its start) and attended with the stock attention.
        """

        def __init__(self, stock, down_weight, down_bias, ups, table):
            super().__init__()
            for name in ("config", "layer_idx", "head_dim", "num_key_value_groups", "scaling",
                         "attention_dropout", "is_causal"):
                setattr(self, name, getattr(stock, name))
            self.q_proj, self.v_proj, self.o_proj = stock.q_proj, stock.v_proj, stock.o_proj
            dtype = stock.k_proj.weight.dtype
            self.k_latent = nn.Linear(down_weight.shape[1], down_weight.shape[0],
                                      bias=down_bias is not None, dtype=dtype)
            with torch.no_grad():
                self.k_latent.weight.copy_(torch.as_tensor(np.ascontiguousarray(down_weight)))
                if down_bias is not None:
                    self.k_latent.bias.copy_(torch.as_tensor(np.ascontiguousarray(down_bias)))
            self.k_up = nn.ParameterList(nn.Parameter(torch.as_tensor(u, dtype=dtype),
                                                      requires_grad=False) for u in ups)
            self.widths = [len(u) for u in ups]
            self._table = [table]  # shared, not a submodule

        def forward(self, hidden_states, position_embeddings=None, attention_mask=None,
                    cache=None, past_key_values=None, **kwargs):
            cache = past_key_values if cache is None else cache
            b, n = hidden_states.shape[:-1]
            query = self.q_proj(hidden_states).view(b, n, -1, self.head_dim).transpose(1, 2)
            value = self.v_proj(hidden_states).view(b, n, -1, self.head_dim).transpose(1, 2)
            cos, sin = position_embeddings
            query = query * cos[:, None] + rotate_half(query) * sin[:, None]
            latent = self.k_latent(hidden_states)[:, None]
            if cache is not None:
                latent, value = cache.update(latent, value, self.layer_idx, kwargs=kwargs)
            m = latent.shape[2]
            parts = latent[:, 0].split(self.widths, dim=-1)
            key = torch.stack([z @ up for z, up in zip(parts, self.k_up, strict=True)], dim=1)
            cos_m, sin_m = self._table[0](m, key)
            key = key * cos_m[:, None] + rotate_half(key) * sin_m[:, None]
            attention = ALL_ATTENTION_FUNCTIONS.get_interface(
                self.config._attn_implementation, eager_attention_forward)
            out, weights = attention(self, query, key, value, attention_mask,
                                     dropout=0.0 if not self.training else
                                     self.attention_dropout, scaling=self.scaling, **kwargs)
            return self.o_proj(out.reshape(b, n, -1).contiguous()), weights

    return LatentKeyAttention


def palu_latent(model, budget, stats):
    """Palu's latent keys at a share ``budget`` of the key cache, on a copy of ``model``.

    Key head ``g``'s latent is ``z = [x, 1] W~_K V_g`` with ``V_g`` the top ``r_g``
    eigenvectors of its keys' second moment ``W~_K^T M W~_K`` (``M`` the augmented tokens'
    moment from :func:`activation_statistics`), the best rank-``r_g`` keys on the
    calibration tokens; the copy caches ``z`` and rebuilds ``k = z V_g^T`` at every step.
    """
    _, layers = _check_llama(model, "Palu's latent keys")
    compressed = copy.deepcopy(model)
    heads = []  # (layer, g, eigenvalues share, eigenvectors, augmented key map (d+1, d_h))
    for layer in layers:
        k_proj = model.get_submodule(layer.attention_module).k_proj
        weight = k_proj.weight.detach().double().numpy()
        bias = (np.zeros(len(weight)) if k_proj.bias is None
                else k_proj.bias.detach().double().numpy())
        augmented = np.concatenate([weight, bias[:, None]], axis=1).T  # (d + 1, n_kv d_h)
        moment = stats[layer.index]["moment"]
        d_h = layer.head_dim
        for g in range(layer.n_kv_heads):
            w_g = augmented[:, g * d_h:(g + 1) * d_h]
            key_moment = w_g.T @ moment @ w_g  # E[k k^T] of the head's keys
            values, vectors = np.linalg.eigh((key_moment + key_moment.T) / 2)
            values, vectors = np.clip(values[::-1], 0, None), vectors[:, ::-1]
            heads.append((layer, g, values / max(values.sum(), np.finfo(float).tiny),
                          vectors, w_g))
    n_channels = sum(len(h[2]) for h in heads)
    counts = _even_counts([h[2] for h in heads], round(budget * n_channels))
    latent = _latent_attention_class()
    table = _RotaryTable(compressed.model.rotary_emb)
    for layer in layers:
        mine = [(h, c) for h, c in zip(heads, counts, strict=True) if h[0] is layer]
        down = np.concatenate([w_g @ vectors[:, :c] for (_, _, _, vectors, w_g), c in mine],
                              axis=1)  # (d + 1, sum r_g)
        ups = [np.ascontiguousarray(vectors[:, :c].T) for (_, _, _, vectors, _), c in mine]
        stock = compressed.get_submodule(layer.attention_module)
        bias = None if stock.k_proj.bias is None else down[-1]
        compressed.set_submodule(layer.attention_module,
                                 latent(stock, down[:-1].T.copy(), bias, ups, table))
    compressed.latent_key_widths = [
        sum(c for h, c in zip(heads, counts, strict=True) if h[0] is layer) for layer in layers]
    return compressed


SHRINKING_PEERS = ("Palu (latent keys)", "ThinK (pairs)")
