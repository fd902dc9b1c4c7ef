"""LLaMA and its kin (Mistral, Qwen2, SmolLM, ...): ``q_proj`` / ``k_proj``, rotary, grouped keys.

Keys ``<prefix>layers.{i}.self_attn.q_proj.weight`` and ``k_proj.weight``, ``nn.Linear``
layout ``(n_heads * d_h, d)`` and ``(n_kv_heads * d_h, d)``, with optional biases (Qwen2 has
query and key biases); grouped-query attention when ``n_kv_heads < n_heads`` (query head
``h`` reads key head ``h // (n_heads / n_kv_heads)``, as in Hugging Face's ``repeat_kv``);
rotary position embeddings on queries and keys; causal.
"""

import re

from ._base import (
    AttentionFamily,
    QKLayer,
    Slot,
    bias_heads,
    get,
    linear_heads,
    output_heads,
)


class LlamaFamily(AttentionFamily):
    name = "llama"
    pattern = re.compile(r"^(.*?)layers\.(\d+)\.self_attn\.q_proj\.weight$")
    rotary = True
    grouped_query = True
    # (``rotary_emb.inv_freq``: the rotary base, a buffer older versions saved)
    block_parameters = frozenset({f"{m}.{p}" for m in ("q_proj", "k_proj", "v_proj", "o_proj")
                                  for p in ("weight", "bias")} | {"rotary_emb.inv_freq"})
    required_parameters = frozenset({"q_proj.weight", "k_proj.weight"})

    def attention_block(self, prefix, i):
        return f"{prefix}layers.{i}.self_attn."

    # model types whose blocks carry LLaMA's names but rotate adjacent channel pairs
    # (``rotate_half`` pairs ``f`` with ``f + d_h / 2``; these pair ``2 f`` with ``2 f + 1``)
    interleaved_rotary = frozenset({"cohere", "cohere2"})

    def config_refusal(self, config):
        """Settings that change the logits beyond LLaMA's ``R(q)^T R(k) / sqrt(d_h)`` over
        every channel: a query scale of its own (Gemma's ``query_pre_attn_scalar``, Granite's
        ``attention_multiplier``), capped logits (Gemma 2), normalised heads
        (``use_qk_norm``), rotations of part of each head (``partial_rotary_factor``, as Phi
        and StableLM have) or of other channel pairs (Cohere)."""
        unmodelled = [name for name in ("query_pre_attn_scalar", "attn_logit_softcapping",
                                        "attention_multiplier")
                      if getattr(config, name, None) is not None]
        unmodelled += [name for name in ("use_qk_norm", "qk_layernorm")
                       if getattr(config, name, False)]
        if _partial_rotary(config) not in (None, 1, 1.0):
            unmodelled.append(f"partial_rotary_factor={_partial_rotary(config)}")
        if unmodelled:
            return f"its config sets {unmodelled}, which change the logits"
        if getattr(config, "model_type", None) in self.interleaved_rotary:
            return (f"model_type {config.model_type!r} rotates adjacent channel pairs, not "
                    "LLaMA's halves")
        return ""

    def read_layer(self, state, prefix, i, n_heads, n_kv_heads):
        base = f"{prefix}layers.{i}.self_attn."

        def heads(name, n, required=True):
            w = get(state, base + name + ".weight", required)
            return None if w is None else linear_heads(w, n, base + name + ".weight")

        def bias(name, n):
            return bias_heads(get(state, base + name + ".bias", False), n)

        w_q, w_k = heads("q_proj", n_heads), heads("k_proj", n_kv_heads)
        if w_q.shape[2] != w_k.shape[2]:
            raise ValueError(
                f"Layer {i}: query heads of size {w_q.shape[2]} and key heads of size "
                f"{w_k.shape[2]} differ; check `n_heads` and `n_kv_heads`.")
        w_o = get(state, base + "o_proj.weight", False)
        return QKLayer(i, w_q, w_k, bias("q_proj", n_heads), bias("k_proj", n_kv_heads),
                       base + "q_proj", base.rstrip("."), heads("v_proj", n_kv_heads, False),
                       bias("v_proj", n_kv_heads), output_heads(w_o, n_heads, linear=True))

    def output_module(self, layer):
        return layer.attention_module + ".o_proj"

    def slots(self, layer, head, kv_head):
        d_h = layer.head_dim
        return (Slot(layer.attention_module + ".q_proj", head * d_h, True),
                Slot(layer.attention_module + ".k_proj", kv_head * d_h, True))


FAMILY = LlamaFamily()


def _partial_rotary(config):
    """The share of each head's channels the config rotates (``None`` when it does not say):
    its ``partial_rotary_factor``, or that of its ``rope_parameters`` (one dict, or one a
    layer type)."""
    factor = getattr(config, "partial_rotary_factor", None)
    if factor is not None:
        return factor
    parameters = getattr(config, "rope_parameters", None) or {}
    if "partial_rotary_factor" in parameters:
        return parameters["partial_rotary_factor"]
    factors = {entry.get("partial_rotary_factor") for entry in parameters.values()
               if isinstance(entry, dict)} - {None}
    return min(factors) if factors else None
