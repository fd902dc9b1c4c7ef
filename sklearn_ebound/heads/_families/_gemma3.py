"""Gemma 3 (text): LLaMA's maps, with every query and key head normalised before its rotation.

Keys as LLaMA's (``<prefix>layers.{i}.self_attn.q_proj.weight``, ``k_proj``, ``v_proj``,
``o_proj``) plus ``q_norm.weight`` and ``k_norm.weight``, each ``(d_h,)``, shared by the heads
of the layer. Query head ``h`` of a token ``x`` is

    q = n_Q(x W_Q[h]),    n_Q(t) = t / sqrt(mean(t^2) + eps) * (1 + w_Q)

(Hugging Face's ``Gemma3RMSNorm`` multiplies by ``1 + weight``), its key ``k = n_K(x W_K[g])``
alike; both are then rotated, and the logit is ``s R_i q_i . R_j k_j`` with
``s = query_pre_attn_scalar ** -0.5`` (not ``1 / sqrt(d_h)``). ``layer_types`` says which
layers are ``"sliding_attention"`` (query ``i`` sees key ``j`` only when ``i - j <
sliding_window``) and which ``"full_attention"``; each type has its rotary base in
``rope_parameters[type]["rope_theta"]``. Causal. Only the text model (``model_type
"gemma3_text"``, ``Gemma3ForCausalLM``) is read: its config is needed for the scale, the
windows and the bases, so a bare state dict with these keys is refused.
"""

import numpy as np

from ._base import config_window, get
from ._llama import LlamaFamily


class Gemma3Family(LlamaFamily):
    name = "gemma3"
    block_parameters = LlamaFamily.block_parameters | {"q_norm.weight", "k_norm.weight"}
    required_parameters = LlamaFamily.required_parameters | {"q_norm.weight", "k_norm.weight"}
    model_types = ("gemma3_text",)
    gain_offset = 1.0  # the norms' gains are 1 + weight (Qwen 3's: the weight itself)
    title, needs = "Gemma 3", "logit scale, the sliding windows and the rotary bases"

    def config_refusal(self, config):
        refusal = super(LlamaFamily, self).config_refusal(config)
        if refusal:
            return refusal
        if getattr(config, "use_bidirectional_attention", False):
            return "its config sets use_bidirectional_attention, whose windows are not modelled"
        return ""

    def query_site(self, layer):
        # q_norm's output: the normalised queries, (b, n_heads, n, d_h), not yet rotated
        return layer.attention_module + ".q_norm", "heads_first"

    def is_causal(self, config):
        return not getattr(config, "use_bidirectional_attention", False)

    def read(self, state, prefix, i, n_heads, n_kv_heads, config=None):
        if config is None:
            raise ValueError(f"A {self.title} model's attention needs its config (the "
                             f"{self.needs}); pass the model.")
        layer = super().read(state, prefix, i, n_heads, n_kv_heads, config)
        block = self.attention_block(prefix, i)
        # x / rms(x) * (offset + weight) (Gemma3RMSNorm: 1 + weight), one for all the heads
        offset = self.gain_offset
        layer.q_gain = np.tile(offset + get(state, block + "q_norm.weight"), (n_heads, 1))
        layer.k_gain = np.tile(offset + get(state, block + "k_norm.weight"), (n_kv_heads, 1))
        if layer.q_gain.shape[1] != layer.head_dim:
            raise ValueError(f"`{block}q_norm.weight` has {layer.q_gain.shape[1]} entries, not "
                             f"the head size {layer.head_dim}.")
        return layer

    def layer_settings(self, config, i):
        layer_type = config.layer_types[i]
        rope = (getattr(config, "rope_parameters", None) or {}).get(layer_type) or {}
        theta = rope.get("rope_theta")
        return {"norm_eps": float(config.rms_norm_eps),
                "logit_scale": float(config.query_pre_attn_scalar) ** -0.5,
                "window": config_window(config, i),
                "rope_theta": None if theta is None else float(theta)}


FAMILY = Gemma3Family()
