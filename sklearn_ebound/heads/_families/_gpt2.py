"""GPT-2: one fused ``Conv1D`` ``c_attn`` for queries, keys and values.

Key ``<prefix>h.{i}.attn.c_attn.weight``, stored transposed with respect to ``nn.Linear``:
shape ``(d, 3 d)``, ``y = x W + b``, columns ``[query | key | value]``, head ``h`` in columns
``h*d_h:(h+1)*d_h`` of each third. One key head per query head, absolute positions, causal.
Writing a head changes only its columns of the query and key thirds.
"""

import re

from ._base import AttentionFamily, QKLayer, Slot, get, output_heads


class GPT2Family(AttentionFamily):
    name = "gpt2"
    pattern = re.compile(r"^(.*?)h\.(\d+)\.attn\.c_attn\.weight$")
    # (``bias`` and ``masked_bias``: the causal mask buffers older versions saved)
    block_parameters = frozenset({"c_attn.weight", "c_attn.bias", "c_proj.weight",
                                  "c_proj.bias", "bias", "masked_bias"})
    required_parameters = frozenset({"c_attn.weight"})

    def attention_block(self, prefix, i):
        return f"{prefix}h.{i}.attn."

    def read_layer(self, state, prefix, i, n_heads, n_kv_heads):
        base = f"{prefix}h.{i}.attn."
        weight = get(state, base + "c_attn.weight")
        d = weight.shape[0]
        if weight.ndim != 2 or weight.shape[1] != 3 * d or d % n_heads:
            raise ValueError(
                f"`{base}c_attn.weight` must be a Conv1D weight of shape (d, 3 d) with d "
                f"divisible by n_heads={n_heads}. Got {weight.shape} instead.")
        bias = get(state, base + "c_attn.bias", False)
        d_h = d // n_heads

        def third(t):
            # Conv1D computes y = x W + b: the columns are already the column layout.
            w = weight[:, t * d:(t + 1) * d].reshape(d, n_heads, d_h).transpose(1, 0, 2)
            b = None if bias is None else bias[t * d:(t + 1) * d].reshape(n_heads, d_h)
            return w, b

        (w_q, b_q), (w_k, b_k), (w_v, b_v) = third(0), third(1), third(2)
        w_o = get(state, base + "c_proj.weight", False)
        return QKLayer(i, w_q, w_k, b_q, b_k, base + "c_attn", base.rstrip("."), w_v, b_v,
                       output_heads(w_o, n_heads, linear=False))

    def output_module(self, layer):
        return layer.attention_module + ".c_proj"

    def slots(self, layer, head, kv_head):
        d, d_h = layer.w_q.shape[1], layer.head_dim
        name = layer.attention_module + ".c_attn"
        return Slot(name, head * d_h, False), Slot(name, d + kv_head * d_h, False)


FAMILY = GPT2Family()
