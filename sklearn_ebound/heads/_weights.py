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


def detect_family(keys, naming=None):
    """Return ``(family, prefix, layer_indices)`` for the query weights found in ``keys``.

    ``family`` is the adapter named ``naming``, or when ``None`` the first of
    :data:`NAMINGS` whose query weights are among ``keys``.
    """
    candidates = [family(naming)] if naming is not None else list(FAMILIES.values())
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
        if found:
            prefix, layers = next(iter(found.items()))
            return adapter, prefix, sorted(layers)
    wanted = ", ".join(adapter.pattern.pattern for adapter in candidates)
    raise ValueError(f"No attention query weights found; expected keys matching {wanted}.")


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
    naming : {"bert", "gpt2", "llama"}, default=None
        The naming scheme; ``None`` detects it from the keys.

    Returns
    -------
    naming : str
    layers : list of QKLayer
    """
    adapter, layers = family_layers(state, n_heads, n_kv_heads=n_kv_heads, naming=naming)
    return adapter.name, layers


def family_layers(state, n_heads, *, n_kv_heads=None, naming=None):
    """:func:`extract_layers`, returning the family's adapter instead of its name."""
    if isinstance(n_heads, bool) or not isinstance(n_heads, (int, np.integer)) or n_heads < 1:
        raise ValueError(f"`n_heads` must be a positive integer. Got {n_heads!r} instead.")
    n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
    if (isinstance(n_kv_heads, bool) or not isinstance(n_kv_heads, (int, np.integer))
            or n_kv_heads < 1 or n_heads % n_kv_heads):
        raise ValueError(f"`n_kv_heads` must be a positive divisor of n_heads={n_heads}. Got "
                         f"{n_kv_heads!r} instead.")
    adapter, prefix, indices = detect_family(list(state), naming)
    if not adapter.grouped_query and n_kv_heads != n_heads:
        raise ValueError(f"The {adapter.name!r} scheme has one key head per query head; "
                         f"`n_kv_heads` must equal n_heads={n_heads}.")
    return adapter, [adapter.read_layer(state, prefix, i, n_heads, n_kv_heads)
                     for i in indices]
