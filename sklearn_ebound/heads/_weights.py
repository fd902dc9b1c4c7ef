"""Query and key weights of every attention layer, per head, in one column layout.

Whatever the source (a Hugging Face model, a state dict of numpy arrays or torch tensors),
each layer becomes ``W_Q`` of shape ``(n_heads, d, d_h)`` and ``W_K`` of shape
``(n_kv_heads, d, d_h)`` such that the query of head ``h`` for a token ``x`` (a row vector of
``d`` channels) is ``x W_Q[h] + b_Q[h]``. The logit between tokens ``i`` and ``j`` is then
``x_i W_Q[h] W_K[g]^T x_j^T / sqrt(d_h)`` (``g`` the key head of query head ``h``), so the
query-key kernel of the head is ``W_Q[h] W_K[g]^T``, a ``d x d`` matrix of rank at most ``d_h``.

Naming schemes, one per model family (a state dict key is ``<prefix><pattern>``, any prefix
such as ``bert.``, ``transformer.`` or ``model.``): each is the ``name`` of an adapter of
:mod:`sklearn_ebound.heads._families`, whose module documents its keys and layout —
``"bert"`` (separate ``query`` / ``key`` ``nn.Linear``), ``"gpt2"`` (the fused ``Conv1D``
``c_attn``, columns ``[query | key | value]``), ``"llama"`` (``q_proj`` / ``k_proj``, grouped
key heads, rotary positions; Mistral and Qwen2 too).
"""

import numpy as np

from ._families import FAMILIES, QKLayer, family

__all__ = ["NAMINGS", "QKLayer", "extract_layers", "family_layers", "detect_family"]

NAMINGS = tuple(FAMILIES)


def detect_family(keys, naming=None, config=None):
    """Return ``(family, prefix, layer_indices)`` for the query weights found in ``keys``.

    ``family`` is the adapter named ``naming``, or when ``None`` the first of
    :data:`NAMINGS` that reads the model: its query weights are among ``keys``, its
    attention blocks hold no parameter it does not model and every one it needs, and it
    accepts ``config`` (the model's Hugging Face config; ``None`` for a bare state dict).
    A model no family reads is refused with each candidate's reason, never read as
    another family.
    """
    candidates = [family(naming)] if naming is not None else list(FAMILIES.values())
    keys = list(keys)
    refusals = []
    for adapter in candidates:
        found = {}
        for key in keys:
            match = adapter.pattern.match(key)
            if match:
                found.setdefault(match.group(1), []).append(int(match.group(2)))
        if len(found) > 1:
            raise ValueError(
                f"Attention weights under several prefixes {sorted(found)}; pass a state dict "
                "of one stack of layers (filter its keys by prefix).")
        if not found:
            continue
        prefix, layers = next(iter(found.items()))
        reason = _refusal(adapter, keys, prefix, sorted(layers), config)
        if not reason:
            return adapter, prefix, sorted(layers)
        refusals.append(f"not as {adapter.name!r}: {reason}")
    if refusals:
        raise ValueError("No model family reads this model's attention as it is computed, "
                         + "; ".join(refusals) + ".")
    wanted = ", ".join(adapter.pattern.pattern for adapter in candidates)
    raise ValueError(f"No attention query weights found; expected keys matching {wanted}.")


def _refusal(adapter, keys, prefix, layers, config):
    """Why ``adapter`` does not read the layers (``""`` when it does)."""
    extra, missing = adapter.unmodelled(keys, prefix, layers)
    if extra:
        blocks = sorted({b for bs in extra.values() for b in bs})
        more = f" and {len(blocks) - 1} more blocks" if len(blocks) > 1 else ""
        return (f"its attention blocks hold parameters it does not model: "
                f"{', '.join(sorted(extra))} (in `{blocks[0]}`{more})")
    if missing:
        name = sorted(missing)[0]
        return f"the state dict has no `{missing[name][0]}{name}`"
    return adapter.config_refusal(config)


def extract_layers(state, n_heads, *, n_kv_heads=None, naming=None):
    """Read the per-head query and key maps of every layer of a state dict.

    Returns the family's name and the layers; :func:`family_layers` returns the adapter.

    Parameters
    ----------
    state : mapping of str to array-like
        Parameter name to numpy array or torch tensor.
    n_heads : int
        Query heads per layer.
    n_kv_heads : int, default=None
        Key heads per layer (grouped-query attention); ``None`` means ``n_heads``. Only the
        ``"llama"`` scheme has separate key heads.
    naming : {"bert", "gpt2", "llama", "gemma3", "qwen3"}, default=None
        The naming scheme; ``None`` detects it from the keys.

    Returns
    -------
    naming : str
    layers : list of QKLayer
    """
    adapter, layers = family_layers(state, n_heads, n_kv_heads=n_kv_heads, naming=naming)
    return adapter.name, layers


def family_layers(state, n_heads, *, n_kv_heads=None, naming=None, config=None):
    """:func:`extract_layers`, returning the family's adapter instead of its name.

    ``config`` (the model's Hugging Face config) tells the family apart where its keys do
    not, and gives each layer what it computes beyond its maps (:class:`QKLayer`).
    """
    if isinstance(n_heads, bool) or not isinstance(n_heads, (int, np.integer)) or n_heads < 1:
        raise ValueError(f"`n_heads` must be a positive integer. Got {n_heads!r} instead.")
    n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
    if (isinstance(n_kv_heads, bool) or not isinstance(n_kv_heads, (int, np.integer))
            or n_kv_heads < 1 or n_heads % n_kv_heads):
        raise ValueError(f"`n_kv_heads` must be a positive divisor of n_heads={n_heads}. Got "
                         f"{n_kv_heads!r} instead.")
    adapter, prefix, indices = detect_family(list(state), naming, config)
    if not adapter.grouped_query and n_kv_heads != n_heads:
        raise ValueError(f"The {adapter.name!r} scheme has one key head per query head; "
                         f"`n_kv_heads` must equal n_heads={n_heads}.")
    return adapter, [adapter.read(state, prefix, i, n_heads, n_kv_heads, config)
                     for i in indices]
