"""Forms whose written tensors are smaller, and the model directory that holds them.

A rank-``r`` form saves memory only where the tensors it writes are smaller
(science.md, 10.1). A head without rotary embeddings (BERT, GPT-2) keeps query and key maps
of width ``r``: the first ``r`` columns of its rank-``r`` factors
(:meth:`HeadDeficiencyResult.factors`; the other columns are zero). A rotary head
(LLaMA, Qwen2, SmolLM2) cannot take a change of basis between its queries and keys, since the
rotation sits between them; what commutes with every rotation acts within its planes
(channels ``f`` and ``f + d_h / 2``). So a rotary layer keeps whole planes per *key* head,
shared by the query heads of its group under grouped-query attention, and the queries keep the
same planes (:func:`plane_plan`). The key cache then holds ``2 p`` of ``d_h`` channels of a
key head with ``p`` planes kept.

Which planes: a plane's price is its share of the logits of the group's heads on
calibration text, ``E|q_hf|^2 E|k_gf|^2`` (the mean squared logit the plane adds over the
offsets, up to a factor 1/2, for queries and keys drawn independently), over the head's sum
of it on all its planes, summed over the query heads ``h`` of key head ``g``, each weighted by
its Fisher weight when the plan was priced by one. How many: key head ``g`` gets
``p_g = ceil(mean_{h in g} r_h / 2)`` planes for the plan's ranks ``r_h`` of its query heads;
then, while the kept rank ``sum_g 2 p_g group`` exceeds the plan's total, the key head whose
last kept plane is the cheapest gives it up: the plan's budget is kept.

A family that normalises each query and key head before its rotation (Gemma 3) keeps its
projections and norms whole: the norm needs every channel of the head. Its planes are priced
and fitted on the normalised queries and keys (:class:`HeadModel`, gains included), with the
layer's logit scale, sliding window and rotary tables, and only the kept channels of the
normalised heads are rotated, enter the logits and are cached. A kept plane's scaled rotation
(:func:`plane_maps`) folds into a rotary query projection only when nothing sits between
them; after a norm it is the written attention's ``q_turn``.

:func:`save_shrunk` writes the compressed model as a Hugging Face directory whose attention
holds only the kept channels (``modeling_shrunk.py``, ``auto_map``, loaded with
``trust_remote_code=True``); every other weight is the original's, bit for bit, in its dtype.
:func:`shrunk_model` is the same model in memory.
"""

import copy
import importlib.util
import json
import math
import sys
import types
from pathlib import Path

import numpy as np

from ._head_forms import HeadModel, augmented_weights, layers_of, rotate
from ._inputs import attention_inputs, augmented_tokens, require

__all__ = ["check_shrinkable", "kept_channels", "plane_plan", "plane_maps", "fold_plane_maps",
           "zero_dropped", "channel_masks", "qk_sizes", "save_shrunk", "shrunk_model"]

# The stock attention class of each family's transformers module (None: the one named after
# the model's class), and the factory of ``modeling_shrunk.py`` that wraps it.
_ATTENTION = {"gpt2": ("GPT2Attention", "gpt2_attention"),
              "bert": ("BertSelfAttention", "bert_attention"),
              "llama": (None, "rotary_attention"),
              "gemma3": ("Gemma3Attention", "normalised_attention"),
              "qwen3": (None, "normalised_attention")}  # Qwen3Attention, Qwen3MoeAttention


def check_shrinkable(model, *, normalised=False):
    """Whether ``model``'s heads are rotary (their shrunk form keeps planes), or with
    ``normalised=True`` whether they are normalised before the rotation (their projections
    stay whole); an error for a family without a shrunk form."""
    family, layers, _ = layers_of(model)
    if family.name not in _ATTENTION:
        raise ValueError(f"No shrunk form for {family.name}-style attention; use "
                         "form='query'.")
    return any(layer.normalised for layer in layers) if normalised else family.rotary


def kept_channels(model, *, plan=None, planes=None):
    """The query and key channels each layer keeps, ``[{"layer", "query", "key"}, ...]``.

    ``plan`` (``{(layer, head): rank}`` or a :func:`plan_ranks` table): a head without
    rotary embeddings keeps its first ``r`` channels of query and key (the rank-``r``
    factors); ``planes`` (``{layer: [[plane, ...] per key head]}``): a rotary key head keeps
    channels ``f`` and ``f + d_h / 2`` of its planes, and so do its query heads. A head the
    plan does not name keeps every channel.
    """
    _, layers, _ = layers_of(model)
    ranks = None
    if plan is not None:
        ranks = ({(row["layer"], row["head"]): int(row["rank"]) for row in plan.rows}
                 if hasattr(plan, "rows") else {k: int(v) for k, v in dict(plan).items()})
    out = []
    for layer in layers:
        d_h, half = layer.head_dim, layer.head_dim // 2
        if planes is not None:
            key = [sorted(int(f) for f in p) + sorted(int(f) + half for f in p)
                   for p in planes[layer.index]]
            query = [key[g] for g in layer.kv_index]
        else:
            if layer.n_kv_heads != layer.n_heads:
                raise ValueError("Grouped keys need the rotary (planes) form.")
            widths = [d_h if ranks is None else ranks.get((layer.index, h), d_h)
                      for h in range(layer.n_heads)]
            query = [list(range(w)) for w in widths]
            key = [list(range(w)) for w in widths]
        out.append({"layer": layer.index, "query": query, "key": key})
    return out


def _head_energies(model, layers, texts, tokenizer, max_length, batch_size=8):
    """Per layer, the mean over real tokens of every query and key channel's square.

    ``{layer index: (E q^2 (n_heads, d_h), E k^2 (n_kv_heads, d_h))}`` of the queries and keys
    the logits take, as :class:`HeadModel` computes them (biases included, normalised with
    the gains where the family normalises its heads), before the rotation, which leaves each
    plane's norm alone.
    """
    sums, counts = {}, {}
    weights = {layer.index: augmented_weights(layer) for layer in layers}

    def visit(layer, x, cos, sin, valid):
        X = augmented_tokens(x)[valid]
        queries = [HeadModel(layer, h, weights[layer.index]) for h in range(layer.n_heads)]
        group = layer.n_heads // layer.n_kv_heads
        keys = queries[::group]  # the first query head of each group reads its key head
        eq = np.stack([(m.queries(X) ** 2).sum(0).numpy() for m in queries])
        ek = np.stack([(m.keys(X) ** 2).sum(0).numpy() for m in keys])
        old = sums.get(layer.index, (0.0, 0.0))
        sums[layer.index] = (old[0] + eq, old[1] + ek)
        counts[layer.index] = counts.get(layer.index, 0) + len(X)

    attention_inputs(model, layers, texts, tokenizer, visit, max_length, batch_size)
    return {index: (eq / counts[index], ek / counts[index]) for index, (eq, ek) in sums.items()}


def plane_plan(model, plan, texts, *, tokenizer, sensitivity=None, max_length=128):
    """The rotary planes each key head keeps: ``{layer index: [[plane, ...] per key head]}``.

    ``plan``: a :func:`plan_ranks` table (or ``{(layer, head): rank}``) of the query heads'
    ranks; the planes are priced on ``texts`` (calibration text) as the module docstring
    says, on the queries and keys the logits take (normalised where the family normalises
    them), each query head weighted by its Fisher weight from ``sensitivity`` when given.
    """
    family, layers, _ = layers_of(model)
    if not family.rotary:
        raise ValueError("Planes are the shrunk form of rotary heads; this model has none.")
    ranks = ({(row["layer"], row["head"]): int(row["rank"]) for row in plan.rows}
             if hasattr(plan, "rows") else {k: int(v) for k, v in dict(plan).items()})
    weights = {}
    if sensitivity is not None:
        weights = {(int(r["layer"]), int(r["head"])): float(r["weight"])
                   for r in sensitivity.rows}
    energies = _head_energies(model, layers, texts, tokenizer, max_length)
    prices, counts, groups = {}, {}, {}
    total = 0
    for layer in layers:
        d_h, half = layer.head_dim, layer.head_dim // 2
        eq, ek = energies[layer.index]
        plane_q = eq[:, :half] + eq[:, half:]  # (n_heads, half): E|q_hf|^2
        plane_k = ek[:, :half] + ek[:, half:]
        group = layer.n_heads // layer.n_kv_heads
        for g in range(layer.n_kv_heads):
            heads = range(g * group, (g + 1) * group)
            price = np.zeros(half)
            for h in heads:
                logit = plane_q[h] * plane_k[g]
                share = logit / max(logit.sum(), np.finfo(float).tiny)
                price += weights.get((layer.index, h), 1.0) * share
            order = np.argsort(-price, kind="stable")
            mean_rank = np.mean([ranks.get((layer.index, h), d_h) for h in heads])
            total += sum(ranks.get((layer.index, h), d_h) for h in heads)
            prices[(layer.index, g)] = (price, order)
            counts[(layer.index, g)] = min(half, math.ceil(mean_rank / 2))
            groups[(layer.index, g)] = group

    def kept_rank():
        return sum(2 * p * groups[key] for key, p in counts.items())

    while kept_rank() > total:
        # the key head whose last kept plane adds least to its group's logits gives it up
        # (the price of a plane kept for a group of g heads counts g times)
        candidates = [(prices[key][0][prices[key][1][p - 1]] / groups[key], key)
                      for key, p in counts.items() if p > 0]
        _, cheapest = min(candidates)
        counts[cheapest] -= 1
    out = {}
    for layer in layers:
        out[layer.index] = [sorted(int(f) for f in prices[(layer.index, g)][1][
            :counts[(layer.index, g)]]) for g in range(layer.n_kv_heads)]
    return out


def _allowed(layer, valid):
    """``(b, n, n)``: whether query ``i`` attends key ``j`` in the layer, for the real tokens
    ``valid`` ``(b, n)``: causal, padding, and the layer's sliding window."""
    torch = require("torch")
    n = valid.shape[1]
    allowed = (torch.tril(torch.ones(n, n, dtype=torch.bool))[None]
               & valid[:, None, :] & valid[:, :, None])
    if layer.window is not None:  # query i sees key j only when i - j < window
        offsets = torch.arange(n)[:, None] - torch.arange(n)[None, :]
        allowed = allowed & (offsets < layer.window)
    return allowed


def _attention(head, X, k, cos, sin, allowed):
    """A head's rotated queries ``(b, n, d_h)``, its logits and its attention ``(b, n, n)``
    (zero outside ``allowed``) on tokens ``X`` (``[x, 1]``) and its key head's rotated keys
    ``k``, as :class:`HeadModel` computes them."""
    torch = require("torch")
    q = rotate(head.queries(X), cos, sin)
    logits = (q @ k.transpose(-1, -2)) * head.scale
    p = torch.softmax(logits.masked_fill(~allowed, -torch.inf), -1)
    return q, logits, torch.nan_to_num(p) * allowed  # padding rows: no weight


def plane_maps(model, planes, texts, *, tokenizer, max_length=128, batch_size=8):
    """The scaled rotation of each kept plane of every query head that best makes up for the
    planes dropped: ``{(layer index, head): (a, b)}``, each ``(len(planes of its key head),)``
    for its planes in increasing order.

    A map ``a I + b J`` on a plane (``J`` the quarter turn, :func:`rotate_half`) commutes with
    every rotation of the plane, so it can act on the query before the rotation: plane ``f``
    of query head ``h`` adds ``s (a_f c_f + b_f s_f)`` to the logit of ``(i, j)``, ``c_f = q_f
    . k_f`` and ``s_f = (J q_f) . k_f`` on the rotated query and key, ``s`` the layer's logit
    scale. The queries and keys are the logits' own (:class:`HeadModel`: normalised with the
    gains where the family normalises them), rotated by the layer's rotary tables, and the
    attention ``p_ij`` is the original's under the layer's mask (padding, causal, sliding
    window). ``(a, b)`` minimise, over the calibration ``texts``, ``E_i Var_{p_i}(l_ij -
    sum_f s (a_f c_f + b_f s_f))`` (half of it is the attention's KL divergence to second
    order), a weighted least-squares problem of ``2 |planes|`` unknowns per head; ``a = 1, b =
    0`` (keeping the planes as they are) is its solution when no plane is dropped.
    """
    torch = require("torch")
    _, layers, _ = layers_of(model)
    weights = {layer.index: augmented_weights(layer) for layer in layers}
    systems = {}

    def visit(layer, x, cos, sin, valid):
        half, group = layer.head_dim // 2, layer.n_heads // layer.n_kv_heads
        X, allowed = augmented_tokens(x), _allowed(layer, valid)
        for g, kept in enumerate(planes[layer.index]):
            if not kept:
                continue
            heads = [HeadModel(layer, h, weights[layer.index])
                     for h in range(g * group, (g + 1) * group)]
            k = rotate(heads[0].keys(X), cos, sin)
            f = torch.as_tensor(sorted(kept))
            ka, kb = k[..., f][:, None], k[..., f + half][:, None]
            for i, head in enumerate(heads):
                gram, rhs = _plane_normal_equations(head, X, k, cos, sin, allowed, f, ka, kb,
                                                    half)
                key = (layer.index, g * group + i)
                old = systems.get(key, (0.0, 0.0))
                systems[key] = (old[0] + gram, old[1] + rhs)

    attention_inputs(model, layers, texts, tokenizer, visit, max_length, batch_size)
    return {key: _solve_plane_map(gram, rhs) for key, (gram, rhs) in systems.items()}


def _plane_normal_equations(head, X, k, cos, sin, allowed, f, ka, kb, half):
    """One head's weighted least-squares normal equations ``(gram, rhs)``, ``(2 m, 2 m)`` and
    ``(2 m,)`` for its ``m`` kept planes ``f``: the features of ``(i, j)`` are ``c_f = q_f .
    k_f`` and ``s_f = (J q_f) . k_f`` (scaled), the target the original logit ``l_ij``; both
    centred under the attention ``p_ij`` of row ``i``: ``gram = sum p (x - E_p x)(x - E_p
    x)^T``, ``rhs = sum p (x - E_p x)(l - E_p l)``."""
    torch = require("torch")
    q, logits, p = _attention(head, X, k, cos, sin, allowed)
    qa, qb = q[..., f][:, :, None], q[..., f + half][:, :, None]
    features = torch.cat([qa * ka + qb * kb, qa * kb - qb * ka], -1) * head.scale
    centred = features - (p[..., None] * features).sum(-2, keepdim=True)
    target = logits - (p * logits).sum(-1, keepdim=True)
    gram = torch.einsum("bij,bijk,bijl->kl", p, centred, centred).numpy()
    rhs = torch.einsum("bij,bijk,bij->k", p, centred, target).numpy()
    return gram, rhs


def _solve_plane_map(gram, rhs):
    """``(a, b)`` solving one head's normal equations, with a ridge of ``1e-9`` times the mean
    diagonal pulling towards ``a = 1, b = 0`` (the planes as they are)."""
    m = len(rhs) // 2
    start = np.concatenate([np.ones(m), np.zeros(m)])  # the planes as they are
    ridge = 1e-9 * max(np.trace(gram) / len(rhs), np.finfo(float).tiny)
    theta = np.linalg.solve(gram + ridge * np.eye(len(rhs)), rhs + ridge * start)
    return theta[:m], theta[m:]


def fold_plane_maps(compressed, planes, maps):
    """Fold each kept plane's ``a I + b J`` (:func:`plane_maps`) into the query projection of
    ``compressed`` in place: rows ``f, f + d_h/2`` of head ``h`` become ``a W_f - b W_{f+h}``
    and ``a W_{f+h} + b W_f`` (and the bias likewise), i.e. ``q -> a q + b rotate_half(q)``
    on the plane. Refused for a family that normalises its heads: the norm between the
    projection and the rotation would undo it (:func:`shrunk_model` takes the maps)."""
    torch = require("torch")
    family, layers, _ = layers_of(compressed)
    _refuse_normalised(layers, "fold plane maps into its query projection")
    by_index = {layer.index: layer for layer in layers}
    for (layer_index, head), (a, b) in maps.items():
        layer = by_index[layer_index]
        half, group = layer.head_dim // 2, layer.n_heads // layer.n_kv_heads
        kept = np.asarray(sorted(planes[layer_index][head // group]), dtype=int)
        slot = family.slots(layer, head, 0)[0]
        module = compressed.get_submodule(slot.module)
        first, second = slot.start + kept, slot.start + kept + half
        with torch.no_grad():
            for param in [module.weight] + ([module.bias] if getattr(module, "bias", None)
                                            is not None else []):
                rows = param.double()
                x, y = rows[first], rows[second]
                a_t = torch.as_tensor(a).reshape(-1, *([1] * (rows.dim() - 1)))
                b_t = torch.as_tensor(b).reshape(-1, *([1] * (rows.dim() - 1)))
                param[first] = (a_t * x - b_t * y).to(param.dtype)
                param[second] = (a_t * y + b_t * x).to(param.dtype)
    return compressed


def _refuse_normalised(layers, what):
    normalised = [layer.attention_module for layer in layers if layer.normalised]
    if normalised:
        raise ValueError(
            f"Cannot {what}: this model normalises each query and key head before its "
            f"rotation ({normalised[0]}), so the projections stay whole and the kept channels "
            "are taken after the norm; use shrunk_model or save_shrunk with the original "
            "model (and the plane maps).")


def zero_dropped(model, channels):
    """A copy of ``model`` whose dropped query and key channels (weights and biases) are zero.

    The copy computes what the shrunk model computes: a dropped channel adds nothing to any
    logit. Every other weight is the original's. Refused for a family that normalises its
    heads (zero rows of a projection would change the norm of the rest).
    """
    torch = require("torch")
    _refuse_normalised(layers_of(model)[1], "zero the dropped channels of its projections")
    compressed = copy.deepcopy(model)
    params = dict(compressed.named_parameters())
    with torch.no_grad():
        for name, mask in channel_masks(compressed, channels, kept=False).items():
            params[name][mask] = 0
    return compressed


def channel_masks(model, channels, *, kept=True):
    """``{parameter name: bool mask}`` of the query and key projections' entries (weights and
    biases) that make the channels ``channels`` keeps, in the heads that drop some
    (``kept=False``: the entries of the channels it drops).

    ``model`` is in the original's shapes; ``channels`` as :func:`kept_channels` gives them.
    """
    torch = require("torch")
    family, layers, _ = layers_of(model)
    by_index = {layer.index: layer for layer in layers}
    params = dict(model.named_parameters())
    masks = {}
    for entry in channels:
        layer = by_index[entry["layer"]]
        for part, heads in (("query", entry["query"]), ("key", entry["key"])):
            for head, keep in enumerate(heads):
                keep = np.asarray(keep, dtype=int)
                drop = np.setdiff1d(np.arange(layer.head_dim), keep)
                if not drop.size:
                    continue
                q_slot, k_slot = family.slots(layer, head if part == "query" else 0,
                                              head if part == "key" else 0)
                slot = q_slot if part == "query" else k_slot
                rows = torch.as_tensor(slot.start + (keep if kept else drop), dtype=torch.long)
                for name in (slot.module + ".weight", slot.module + ".bias"):
                    if name not in params:
                        continue
                    mask = masks.setdefault(name, torch.zeros_like(params[name],
                                                                   dtype=torch.bool))
                    if name.endswith(".weight") and not slot.linear:  # Conv1D: (in, out)
                        mask[:, rows] = True
                    else:
                        mask[rows] = True
    return masks


def qk_sizes(model, channels=None, *, latent=False):
    """``qk_parameters`` and ``key_cache_channels``, each ``{"original", "compressed"}``.

    Query and key weights and biases of the attention layers, and the key channels cached per
    token, summed over the layers; ``channels=None``: the original shapes (a form that keeps
    them). A family that normalises its heads keeps its projections whole and adds ``q_turn``
    (two numbers per kept query channel); latent keys (``latent=True``,
    :mod:`~._latent_keys`) keep them whole and add ``2 d_h`` numbers per latent key channel
    and key head it reads: its row of ``key_map`` there, and of that key head's query map
    (shared by its query heads).
    """
    _, layers, _ = layers_of(model)
    d_model = layers[0].w_q.shape[1]
    bias = {"q": layers[0].b_q is not None, "k": layers[0].b_k is not None}
    original = sum((d_model + bias["q"]) * layer.n_heads * layer.head_dim
                   + (d_model + bias["k"]) * layer.n_kv_heads * layer.head_dim
                   for layer in layers)
    cache = sum(layer.n_kv_heads * layer.head_dim for layer in layers)
    if channels is None:
        return {"qk_parameters": {"original": original, "compressed": original},
                "key_cache_channels": {"original": cache, "compressed": cache}}
    width_q = sum(len(c) for entry in channels for c in entry["query"])
    width_k = sum(len(c) for entry in channels for c in entry["key"])
    if latent:  # a latent key channel reads its share of the key heads side by side
        n_kv = {layer.index: layer.n_kv_heads for layer in layers}
        reads = sum(len(c) * n_kv[entry["layer"]] // len(entry["key"])
                    for entry in channels for c in entry["key"])
        return {"qk_parameters": {"original": original,
                                  "compressed": original + 2 * layers[0].head_dim * reads},
                "key_cache_channels": {"original": cache, "compressed": width_k}}
    if layers[0].normalised:
        return {"qk_parameters": {"original": original, "compressed": original + 2 * width_q},
                "key_cache_channels": {"original": cache, "compressed": width_k}}
    return {"qk_parameters": {"original": original, "compressed":
                              (d_model + bias["q"]) * width_q + (d_model + bias["k"]) * width_k},
            "key_cache_channels": {"original": cache, "compressed": width_k}}


# --- the written directory ------------------------------------------------------------------


MODELING_FILE = "modeling_shrunk.py"


def _modeling_source(model, family, latent=False):
    """The names of the kept model and config classes and the text of ``modeling_shrunk.py``
    for ``model``'s class: the template, then the lines that wrap the model's stock class, its
    stock config and its family's stock attention (by latent keys with ``latent``)."""
    stock = type(model)
    module = stock.__module__
    if not module.startswith("transformers.models."):
        raise ValueError(f"Writing the shrunk form needs a stock transformers model class. "
                         f"Got {stock.__module__}.{stock.__name__}.")
    attention, factory = _ATTENTION[family.name]
    if latent:
        if not family.rotary:
            raise ValueError("Latent keys are a form of rotary heads.")
        factory = "latent_attention"
    if attention is None:  # a LLaMA-style family: the attention class of the model's module
        attention = next((name for name in dir(sys.modules[module])
                          if name.endswith("Attention") and name[:-len("Attention")]
                          and stock.__name__.startswith(name[:-len("Attention")])), None)
        if attention is None:
            raise ValueError(f"No attention class found beside {stock.__name__} in {module}.")
    config = type(model.config)
    if not config.__module__.startswith("transformers.models."):
        raise ValueError(f"Writing the shrunk form needs a stock transformers config class. "
                         f"Got {config.__module__}.{config.__name__}.")
    template = (Path(__file__).with_name("_shrunk_modeling.py")).read_text(encoding="utf-8")
    name, config_name = "Kept" + stock.__name__, "Kept" + config.__name__
    return name, config_name, template + (
        f"\n\n# The model this directory holds: {stock.__name__} with kept query-key channels.\n"
        f"from {module} import {attention}, {stock.__name__}  # noqa: E402\n"
        f"from {config.__module__} import {config.__name__}  # noqa: E402\n\n"
        f"{config_name} = kept_config({config.__name__})\n"
        f"{name} = kept_model({stock.__name__}, {attention}, {factory}, {config_name})\n")


def _auto_class(model):
    """The name of the transformers auto class that maps the model's config to its class."""
    transformers = require("transformers")
    for auto in ("AutoModelForCausalLM", "AutoModel", "AutoModelForMaskedLM",
                 "AutoModelForSequenceClassification", "AutoModelForTokenClassification"):
        mapping = getattr(transformers, auto)._model_mapping
        try:
            if mapping[type(model.config)] is type(model):
                return auto
        except KeyError:
            continue
    raise ValueError(f"No transformers auto class maps to {type(model).__name__}.")


def _shrunk_state(model, family, layers, channels, maps=None, latent=None):
    """The compressed model's state dict with each query and key projection cut to its kept
    channels (rows of an ``nn.Linear``; for GPT-2's fused ``Conv1D``, ``[kept queries |
    kept keys | values]`` columns). Every other tensor is the model's own. A family that
    normalises its heads keeps its projections whole and takes each layer's ``q_turn``;
    latent keys keep them whole and take each layer's ``query_map`` and ``key_map``."""
    torch = require("torch")
    state = dict(model.state_dict())
    by_index = {layer.index: layer for layer in layers}
    if latent is not None:
        dtype = next(model.parameters()).dtype
        for layer in layers:
            query_map, key_map = latent[layer.index]
            state[layer.attention_module + ".query_map"] = torch.as_tensor(query_map).to(dtype)
            state[layer.attention_module + ".key_map"] = torch.as_tensor(key_map).to(dtype)
        return state
    if layers[0].normalised:
        dtype = next(model.parameters()).dtype
        for entry in channels:
            layer = by_index[entry["layer"]]
            turn = _turn(layer, entry["query"], maps or {})
            state[layer.attention_module + ".q_turn"] = torch.as_tensor(turn).to(dtype)
        return state
    if maps:
        raise ValueError("Plane maps of a model without normalised heads are folded into its "
                         "query projection (fold_plane_maps), not written beside it.")
    check_dropped_are_zero(by_index, channels)
    for entry in channels:
        layer = by_index[entry["layer"]]
        q_rows = [family.slots(layer, h, 0)[0].start + np.asarray(c, dtype=int)
                  for h, c in enumerate(entry["query"])]
        k_rows = [family.slots(layer, 0, g)[1].start + np.asarray(c, dtype=int)
                  for g, c in enumerate(entry["key"])]
        q_rows = torch.as_tensor(np.concatenate(q_rows + [np.zeros(0, int)]), dtype=torch.long)
        k_rows = torch.as_tensor(np.concatenate(k_rows + [np.zeros(0, int)]), dtype=torch.long)
        q_slot, k_slot = family.slots(layer, 0, 0)
        if not q_slot.linear:  # GPT-2: one Conv1D, (d, 3 d), columns [q | k | v]
            d = layer.w_q.shape[1]
            columns = torch.cat([q_rows, k_rows, torch.arange(2 * d, 3 * d)])
            for suffix, dim in ((".weight", 1), (".bias", 0)):
                key = q_slot.module + suffix
                if key in state:
                    state[key] = state[key].index_select(dim, columns).contiguous()
            continue
        for slot, rows in ((q_slot, q_rows), (k_slot, k_rows)):
            for suffix in (".weight", ".bias"):
                key = slot.module + suffix
                if key in state:
                    state[key] = state[key].index_select(0, rows).contiguous()
    return state


def _turn(layer, query, maps):
    """``(2, kept query channels)``: ``a`` and ``b`` of :func:`plane_maps` for each kept
    channel of the layer's query heads (``query``: their kept channels, as
    :func:`kept_channels` lists them), the identity where ``maps`` has no entry."""
    half, rows = layer.head_dim // 2, []
    for head, kept in enumerate(query):
        planes = sorted({int(c) % half for c in kept})
        a, b = maps.get((layer.index, head), (np.ones(len(planes)), np.zeros(len(planes))))
        if len(a) != len(planes):
            raise ValueError(f"Layer {layer.index}, query head {head}: {len(a)} plane maps for "
                             f"{len(planes)} kept planes.")
        by_plane = dict(zip(planes, zip(a, b, strict=True), strict=True))  # increasing planes
        rows.extend(by_plane[int(c) % half] for c in kept)
    return np.asarray(rows, dtype=np.float64).T.reshape(2, -1)


def check_dropped_are_zero(by_index, channels):
    """An error unless every query and key channel ``channels`` drops is zero in the model
    (weights and biases): only then does the model of the kept channels compute the same."""
    from ._head_forms import augmented_weights

    for entry in channels:
        layer = by_index[entry["layer"]]
        w_q, w_k, _ = augmented_weights(layer)
        for name, maps, heads in (("query", w_q, entry["query"]), ("key", w_k, entry["key"])):
            for head, kept in enumerate(heads):
                drop = np.setdiff1d(np.arange(layer.head_dim), np.asarray(kept, dtype=int))
                if drop.size and np.any(maps[head][:, drop] != 0):
                    raise ValueError(
                        f"Layer {layer.index}, {name} head {head}: a channel the shrunk form "
                        "drops is not zero in the model; give the compressed model these "
                        "channels came with (compress_model's, or zero_dropped's).")


def _load_modeling(path, name):
    spec = importlib.util.spec_from_file_location(f"_ebound_shrunk_{id(path)}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


def _built(model, family, layers, channels, maps, cls, latent=None):
    """``cls`` (the kept model's class) built on ``model``'s config, as its own config class
    holds it, and on the compressed weights."""
    settings = model.config.to_dict()
    settings.pop("model_type", None)  # the kept config's own
    config = cls.config_class.from_dict(settings)
    config.qk_channels = {"query": [e["query"] for e in channels],
                          "key": [e["key"] for e in channels]}
    if latent is not None:  # the channels are latent: the maps of query_map and key_map
        config.qk_latent = True
    # the kept attention builds the masks of the stock eager or SDPA attention, not others'
    eager = model.config._attn_implementation == "eager"
    config._attn_implementation = "eager" if eager else "sdpa"
    dtype = next(model.parameters()).dtype
    state = _shrunk_state(model, family, layers, channels, maps, latent)
    torch = require("torch")
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # built as from_pretrained builds it: the rotary tables'
    try:  # frequencies stay float32 in a bf16 model, as a user's load of the directory has
        shrunk = cls(config)
    finally:
        torch.set_default_dtype(default)
    missing, unexpected = shrunk.load_state_dict(state, strict=False)
    if unexpected or [k for k in missing if k in dict(shrunk.named_parameters())]:
        raise RuntimeError(f"The shrunk model does not take the compressed weights: missing "
                           f"{missing}, unexpected {unexpected}.")
    shrunk.eval()
    shrunk.config.dtype = dtype
    return shrunk


def shrunk_model(model, channels, *, maps=None, latent=None):
    """The model of the kept channels in memory: what :func:`save_shrunk` writes.

    ``model``, ``channels`` and ``latent`` as :func:`save_shrunk` takes them; ``maps``
    (:func:`plane_maps`) only for a family that normalises its heads (the original model,
    whose projections stay whole; the maps become ``q_turn``), elsewhere already folded into
    ``model``.
    """
    family, layers, _ = layers_of(model)
    name, _, source = _modeling_source(model, family, latent is not None)
    module = types.ModuleType(f"_ebound_shrunk_{name}")
    exec(compile(source, MODELING_FILE, "exec"), module.__dict__)  # the file save_shrunk writes
    return _built(model, family, layers, channels, maps, getattr(module, name), latent)


def save_shrunk(model, channels, directory, *, tokenizer=None, maps=None, latent=None):
    """Write ``model`` with only its kept query and key channels to ``directory``.

    ``model`` is the compressed model in the original's shapes (its dropped channels zero or
    not: only the kept ones are written); ``channels`` as :func:`kept_channels` gives them.
    For a family that normalises its heads (Gemma 3) ``model`` is the original, whose
    projections and norms are written whole, and ``maps`` (:func:`plane_maps`, optional) the
    kept planes' scaled rotations, written as each layer's ``q_turn``. With ``latent``
    (:func:`~._latent_keys.latent_maps`, and ``channels`` from
    :func:`~._latent_keys.latent_channels`), ``model`` is the original, its projections (and
    norms) written whole, and each layer's ``query_map`` and ``key_map`` beside them: the
    logits and the cache take the latent keys. The directory holds
    ``config.json`` (the original's, with ``qk_channels`` and ``auto_map``, under the model
    type ``kept_<model type>``), ``modeling_shrunk.py`` and the weights in the model's
    dtype; load it with ``AutoModel...from_pretrained(directory, trust_remote_code=True)``.
    Without ``trust_remote_code`` transformers refuses it (the stock class would load the
    latent and normalised forms' whole projections and run the original model).

    Returns
    -------
    shrunk : transformers model
        The written model, in memory.
    """
    family, layers, _ = layers_of(model)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    name, config_name, source = _modeling_source(model, family, latent is not None)
    auto_map = {"AutoConfig": f"{MODELING_FILE[:-3]}.{config_name}",
                _auto_class(model): f"{MODELING_FILE[:-3]}.{name}"}
    (directory / MODELING_FILE).write_text(source, encoding="utf-8")
    shrunk = _built(model, family, layers, channels, maps,
                    _load_modeling(directory / MODELING_FILE, name), latent)
    shrunk.config.auto_map = auto_map
    shrunk.save_pretrained(directory)
    # save_pretrained names the dynamic class; the directory's loader is auto_map's
    written = json.loads((directory / "config.json").read_text())
    written["auto_map"] = auto_map
    (directory / "config.json").write_text(json.dumps(written, indent=2, sort_keys=True) + "\n")
    if hasattr(tokenizer, "save_pretrained"):
        tokenizer.save_pretrained(directory)
    return shrunk
