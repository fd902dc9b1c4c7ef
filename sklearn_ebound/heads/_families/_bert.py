"""BERT and its kin (RoBERTa, MiniLM, ...): separate ``query`` / ``key`` ``nn.Linear`` maps.

Keys ``<prefix>encoder.layer.{i}.attention.self.query.weight`` and ``...key.weight`` (plus
optional ``.bias``), layout ``(n_heads * d_h, d)``, head ``h`` in rows ``h*d_h:(h+1)*d_h``;
one key head per query head, absolute positions, bidirectional unless the config says
``is_decoder``.
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


class BertFamily(AttentionFamily):
    name = "bert"
    pattern = re.compile(r"^(.*?)encoder\.layer\.(\d+)\.attention\.self\.query\.weight$")
    block_parameters = frozenset(f"{m}.{p}" for m in ("query", "key", "value")
                                 for p in ("weight", "bias"))
    required_parameters = frozenset({"query.weight", "key.weight"})

    def attention_block(self, prefix, i):
        return f"{prefix}encoder.layer.{i}.attention.self."

    def read_layer(self, state, prefix, i, n_heads, n_kv_heads):
        base = f"{prefix}encoder.layer.{i}.attention.self."

        def heads(name, required=True):
            w = get(state, base + name + ".weight", required)
            return None if w is None else linear_heads(w, n_heads, base + name + ".weight")

        def bias(name):
            return bias_heads(get(state, base + name + ".bias", False), n_heads)

        w_o = get(state, f"{prefix}encoder.layer.{i}.attention.output.dense.weight", False)
        return QKLayer(i, heads("query"), heads("key"), bias("query"), bias("key"),
                       base + "query", base.rstrip("."), heads("value", False), bias("value"),
                       output_heads(w_o, n_heads, linear=True))

    def output_module(self, layer):  # attention.self -> attention.output.dense
        return layer.attention_module.rsplit(".", 1)[0] + ".output.dense"

    def slots(self, layer, head, kv_head):
        d_h = layer.head_dim
        return (Slot(layer.attention_module + ".query", head * d_h, True),
                Slot(layer.attention_module + ".key", kv_head * d_h, True))

    def is_causal(self, config):
        return bool(getattr(config, "is_decoder", False))


FAMILY = BertFamily()
