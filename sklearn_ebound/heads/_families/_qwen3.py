"""Qwen 3: LLaMA's maps, every query and key head normalised before its rotation.

Keys as LLaMA's (``<prefix>layers.{i}.self_attn.q_proj.weight``, ``k_proj``, ``v_proj``,
``o_proj``, biases where ``attention_bias`` is set) plus ``q_norm.weight`` and
``k_norm.weight``, each ``(d_h,)``, shared by the heads of the layer. Query head ``h`` of a
token ``x`` is

    q = n_Q(x W_Q[h]),    n_Q(t) = t / sqrt(mean(t^2) + eps) * w_Q

(Hugging Face's ``Qwen3RMSNorm`` multiplies by its weight, Gemma's by ``1 + weight``), its key
``k = n_K(x W_K[g])`` alike; both are then rotated by the model's one rotary base, and the
logit is ``R_i q_i . R_j k_j / sqrt(d_h)``. Layers whose ``layer_types`` entry is
``"sliding_attention"`` see the last ``sliding_window`` keys only. Causal. Read only for a
config of ``model_type "qwen3"`` or ``"qwen3_moe"`` (its mixture of experts, the same
attention), which says the norms are there and how they scale.
"""

from ._base import AttentionFamily, config_window
from ._gemma3 import Gemma3Family
from ._llama import LlamaFamily


class Qwen3Family(Gemma3Family):
    name = "qwen3"
    model_types = ("qwen3", "qwen3_moe")  # the mixture of experts: the same attention
    gain_offset = 0.0
    title, needs = "Qwen 3", "norms' epsilon and the sliding windows"

    def config_refusal(self, config):
        # the model type, then what would change LLaMA's logits beyond the norms
        return (AttentionFamily.config_refusal(self, config)
                or LlamaFamily.config_refusal(self, config))

    def query_site(self, layer):
        # q_norm's output: the normalised queries, (b, n, n_heads, d_h) (Qwen 3 normalises
        # the heads before it moves them first), not yet rotated
        return layer.attention_module + ".q_norm", "heads_last"

    def layer_settings(self, config, i):
        return {"norm_eps": float(config.rms_norm_eps), "window": config_window(config, i)}


FAMILY = Qwen3Family()
