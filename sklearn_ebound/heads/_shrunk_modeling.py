"""Attention with query and key projections of kept widths, on a stock Hugging Face model.

Written by sklearn-ebound beside a compressed model's weights (``modeling_shrunk.py``, named
by ``auto_map`` in its ``config.json``; load it with ``trust_remote_code=True``). It needs
torch and transformers only. The config is the stock one under a model type of its own,
``kept_<model type>``, so that a loader not allowed this file refuses the directory instead
of building the stock model, which would ignore what the compression wrote (a latent or
normalised form keeps the stock projections whole). The model is the stock class of its
family; each attention block is the stock one with its query and key projections cut to
the channels the compression kept, ``config.qk_channels``:

    {"query": [layer][query head] -> channels of the head kept, in 0 .. d_h - 1,
     "key":   [layer][key head]   -> likewise}

A query head keeps as many channels as its key head. Head ``h``'s logit is
``q_h[kept] . k_g[kept] * scaling``, with ``g`` its key head and the stock attention's
scaling (``1 / sqrt(d_h)``; Gemma's ``query_pre_attn_scalar ** -0.5``): the compressed
model's logits exactly, since the dropped channels were zero. The kept channels of every
head sit side by side in the projections' outputs, and the key cache holds them as one
``(batch, 1, tokens, kept key channels)`` tensor per layer (the values keep their stock
shape). A rotary model keeps whole rotary planes (channels ``f`` and
``f + d_h / 2`` together), so its kept channels are rotated by their own rows of the rotary
tables, before they are cached, as the stock model does.

Gemma 3 and Qwen 3 normalise every query and key head (an RMS norm over its whole ``d_h``
channels, with gains) before the rotation, so their projections and norms keep their stock
shapes and weights: the kept channels are taken from the normalised heads, and only they are
rotated, enter the logits and are cached. Each kept plane of a query head may be turned and
scaled, ``q -> a q + b J q`` (``J`` the plane's quarter turn, which commutes with its
rotations), by the layer's ``q_turn`` (``(2, kept query channels)``: ``a`` then ``b`` per kept
channel): after the norm no weight of the stock model can hold it.

A rotary model may instead keep *latent keys* (``config.qk_latent``): its projections (and
norms) stay whole, every head is rotated as the stock model rotates it, and only then does each
key head ``g`` take a map ``A_g`` (``r_g x d_h``, the rows of the layer's ``key_map``) and its
query heads one map ``B_g`` (``r_g x d_h``, the rows of ``query_map``): head ``h``'s logit is
``(B_g R q_h) . (A_g R k_g) * scaling``, a rank-``r_g`` form of ``q_h . k_g`` taken after the
rotation, so that the cache holds ``A_g R k_g``, ``r_g`` channels per key head. ``qk_channels``
then lists ``0 .. r_g - 1`` for every head: the latent channels. Where it lists fewer key
heads than the layer has, each latent key head reads an equal share of the rotated key heads
side by side (``A_s`` of ``r_s x (share d_h)``; one for the whole layer: shared latent keys, as
multi-head latent attention), query head ``h`` reads the latent key head of its share, and
``B_g`` (``r_s x d_h``) is what key head ``g``'s queries meet it with.
"""

import torch
from torch import nn

# scaled_dot_product_attention takes grouped query heads (``enable_gqa``) from torch 2.5
_SDPA_GROUPS = tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (2, 5)

try:  # cache layers of preallocated keys and values of one shape
    from transformers.cache_utils import StaticLayer as _StaticLayer

    _STATIC_LAYERS = (_StaticLayer,)
except ImportError:  # an older transformers: its static caches are not layered
    _STATIC_LAYERS = ()


class KeptChannels(nn.Module):
    """Index tables of one attention layer's kept query and key channels.

    ``q_width[h]``/``k_width[g]``: the channels head ``h`` / key head ``g`` keeps; the
    query heads of key head ``g`` are ``g * group ... (g + 1) * group - 1``, contiguous in
    the query projection's output, each of ``k_width[g]`` channels. For rotation:
    ``*_column`` is each kept entry's channel in ``0 .. d_h - 1`` (its column of the rotary
    tables), ``*_partner`` the position of the other channel of its plane and ``*_sign`` the
    sign of ``rotate_half`` (``-1`` for the plane's first channel, ``+1`` for its second).
    """

    def __init__(self, query, key, head_dim, rotary):
        super().__init__()
        if len(query) % len(key):
            raise ValueError(f"{len(query)} query heads do not group over {len(key)} key heads.")
        self.group = len(query) // len(key)
        for h, channels in enumerate(query):
            if len(channels) != len(key[h // self.group]):
                raise ValueError(f"Query head {h} keeps {len(channels)} channels, its key head "
                                 f"{len(key[h // self.group])}.")
        self.k_width = [len(c) for c in key]
        self.q_size = sum(len(c) for c in query)
        self.k_size = sum(self.k_width)
        self.rotary = rotary
        # Plain lists, made tensors on first use on each device (buffers would be left
        # uninitialised by a loader that builds the model on the meta device).
        self._lists = ({name: self._rotation(heads, head_dim)
                        for name, heads in (("q", query), ("k", key))} if rotary else {})
        # each kept entry's place among the heads' channels side by side (h d_h + c)
        self._index = {name: [h * head_dim + c for h, channels in enumerate(heads)
                              for c in channels] for name, heads in (("q", query), ("k", key))}
        # each kept query entry's place in a zero (heads, k_size) block: head h's i-th at
        # row h, column i of its key head's channels (see _logits)
        k_start = [sum(self.k_width[:g]) for g in range(len(key))]
        self._block = [h * self.k_size + k_start[h // self.group] + i
                       for h, channels in enumerate(query) for i in range(len(channels))]
        # each kept entry's head (for the latent maps, :meth:`project`)
        self._head = {name: [h for h, channels in enumerate(heads) for _ in channels]
                      for name, heads in (("q", query), ("k", key))}
        self._heads = {"q": len(query), "k": len(key)}
        self._tables = {}

    @staticmethod
    def _rotation(heads, head_dim):
        half = head_dim // 2
        column, partner, sign, start = [], [], [], 0
        for channels in heads:
            where = {c: start + i for i, c in enumerate(channels)}
            for c in channels:
                other = c + half if c < half else c - half
                if other not in where:
                    raise ValueError(f"Channel {c} is kept without {other}, the other channel "
                                     "of its rotary plane.")
                column.append(c)
                partner.append(where[other])
                sign.append(-1.0 if c < half else 1.0)
            start += len(channels)
        return column, partner, sign

    def _table(self, name, x):
        key = (name, x.device, x.dtype)
        if key not in self._tables:
            column, partner, sign = self._lists[name]
            self._tables[key] = (torch.tensor(column, dtype=torch.long, device=x.device),
                                 torch.tensor(partner, dtype=torch.long, device=x.device),
                                 torch.tensor(sign, dtype=x.dtype, device=x.device),
                                 torch.tensor(self._index[name], dtype=torch.long,
                                              device=x.device))
        return self._tables[key]

    def rotate(self, x, cos, sin, name):
        """``x cos + rotate_half(x) sin`` on kept channels ``x`` (``(b, n, width)``)."""
        column, partner, sign, _ = self._table(name, x)
        return x * cos[..., column] + x[..., partner] * sign * sin[..., column]

    def select(self, x, name):
        """The kept channels (``(b, n, width)``) of every head's whole channels side by side
        (``(b, n, heads * d_h)``)."""
        return x[..., self._table(name, x)[3]]

    def project(self, x, rows, name, group=1):
        """``x`` (``(b, n, heads, d_h)``, every head's whole channels) mapped by ``rows``
        (``(entries, d_h)``), one block of rows for every ``group`` heads in turn (the same
        map for each head of the group): kept entry ``i`` of head ``h`` is ``rows[j_i] .
        x_h`` with ``j_i`` row ``i`` of the block of ``h // group``. Returns ``(b, n, kept
        entries)``: one batched product of each block with its heads' channels (the blocks
        padded to the widest), then the kept entries."""
        b, n, heads, d_h = x.shape
        padded, index = self._padded(rows, name, group)
        blocks = heads // group
        # (blocks, b n group, d_h) @ (blocks, d_h, widest): one bmm (an einsum's bookkeeping
        # costs more than the product at a decoding step)
        x = x.reshape(b * n, blocks, group, d_h).transpose(0, 1).reshape(blocks, -1, d_h)
        out = torch.bmm(x, padded).view(blocks, b * n, -1).transpose(0, 1).reshape(b, n, -1)
        return out if index is None else out[..., index]

    def _padded(self, rows, name, group):
        """``rows`` as ``(blocks, d_h, widest)`` (a block per ``group`` heads, zero columns
        padding the narrower) and the kept entries' places in the flattened ``(heads,
        widest)`` (``None`` where every head is as wide: they are in place); kept while
        ``rows`` is unchanged and takes no gradient."""
        key = ("padded", name, group, rows.device, rows.dtype)
        version = (rows.data_ptr(), rows._version)
        keep = not (rows.requires_grad and torch.is_grad_enabled())
        cached = self._tables.get(key)
        if keep and cached is not None and cached[0] == version:
            return cached[1:]
        head, heads = self._head[name], self._heads[name]
        width = [head.count(h) for h in range(heads)]
        widest = max(width, default=0)
        rows_at = torch.tensor([j * widest + i for j in range(heads // group)
                                for i in range(width[j * group])],
                               dtype=torch.long, device=rows.device)
        padded = rows.new_zeros(heads // group * widest, rows.shape[1]).index_copy(0, rows_at,
                                                                                  rows)
        padded = padded.view(heads // group, widest, rows.shape[1]).transpose(1, 2).contiguous()
        place = None  # every head as wide: the entries are in place
        if len(head) < heads * widest:
            start = [sum(width[:h]) for h in range(heads)]
            place = torch.tensor([h * widest + i - start[h] for i, h in enumerate(head)],
                                 dtype=torch.long, device=rows.device)
        if keep:  # a map being trained is read afresh, its gradient with it
            self._tables[key] = (version, padded, place)
        return padded, place

    def turn(self, x, a, b, name="q"):
        """``a x + b rotate_half(x)`` on kept channels ``x``, ``a`` and ``b`` one per kept
        channel (equal on the two channels of a plane): a scaled rotation of each plane."""
        _, partner, sign, _ = self._table(name, x)
        return x * a + x[..., partner] * sign * b

    # None: a latent's query map goes to the keys where :meth:`_expands` says it is cheaper;
    # True / False: always / never (to compare the two ways)
    expand = None

    def attention(self, query, key, value, attention_mask, scaling, dropout, training,
                  is_causal=True, softcap=None, weights=None, query_map=None):
        """``softmax(q_h . k_g(h) * scaling + mask) v_g(h)`` for every head (the scaled
        logits capped at ``softcap tanh(. / softcap)`` first when ``softcap`` is given).

        ``query`` ``(b, n, q_size)``, ``key`` ``(b, 1, m, k_size)`` (as cached), ``value``
        ``(b, n_kv, m, d_h)``. ``attention_mask`` is additive (float) or says which keys are
        attended (bool), or ``None``: then, as in transformers' SDPA attention, several
        queries of a causal block (``is_causal``) see the keys up to their own position and
        one query sees every key. With ``query_map`` (``(rows, group)`` of latent keys),
        ``query`` is every head's whole rotated channels ``(b, n, n_heads, d_h)``, mapped by
        :meth:`project`, or for several queries the map goes to the keys instead
        (:meth:`_expanded`). Returns ``(b, n, n_heads * d_h)`` and the weights: ``None``
        unless the logits are capped or the weights are asked for (``weights=True``, or the
        model called with ``output_attentions=True``).
        """
        n = query.shape[1]
        keys, value, mask, causal = _masking(n, key[:, 0], value, attention_mask, is_causal)
        dropout = dropout if training else 0.0
        asked = _attentions_recorded() if weights is None else weights
        fused = n > 1 and softcap is None and not asked
        if query_map is not None:
            if fused and self._expands(n, keys.shape[1], value.shape[1], value.shape[-1]):
                return self._expanded(query, keys, value, mask, causal, scaling, dropout,
                                      *query_map), None
            query = self.project(query, query_map[0], "q", query_map[1])
        if fused:
            return self._fused(query, keys, value, mask, causal, scaling, dropout), None
        if causal:
            mask = torch.ones(n, keys.shape[1], dtype=torch.bool, device=query.device).tril()
        out, weights = self._stepwise(query, keys, value, mask, scaling, dropout, softcap)
        return out, weights if asked or softcap is not None else None

    def _stepwise(self, query, keys, value, mask, scaling, dropout, softcap):
        """The logits, their softmax and the values in two batched products for all heads
        (the decoding step: torch's fused kernel takes no query-key width but the values',
        and padding the keys would copy the whole cache at every new token). Returns the
        output and the weights ``(b, heads, n, m)``."""
        b, n, _ = query.shape
        m, k_size = keys.shape[1:]
        n_kv = len(self.k_width)
        heads = self.group * n_kv
        # every head's kept query at its key head's channels of a zero (heads, k_size)
        # block: one product with all the cached keys gives every logit (the zeros add
        # nothing; a key head of width 0 gives every logit 0)
        if len(self._block) == heads * k_size:  # one key head read whole by every head
            block = query * scaling
        else:
            block = query.new_zeros(b, n, heads * k_size)
            block[..., self._block_index(query)] = query * scaling
        logits = torch.bmm(block.view(b, n * heads, k_size), keys.transpose(1, 2))
        logits = logits.view(b, n, heads, m).transpose(1, 2)
        if softcap is not None:
            logits = torch.tanh(logits / softcap) * softcap
        if mask is not None:
            logits = _masked(logits, mask)
        weights = nn.functional.softmax(logits, dim=-1, dtype=torch.float32).to(value.dtype)
        if dropout > 0:
            weights = nn.functional.dropout(weights, p=dropout)
        # each value head's values once, for its group's rows (group heads x n queries;
        # the value heads are the key heads' unless a shared latent reads several)
        out = torch.matmul(weights.reshape(b, value.shape[1], -1, m), value)
        out = out.view(b, heads, n, -1).transpose(1, 2)
        return out.reshape(b, n, -1), weights

    def _block_index(self, x):
        """:attr:`_block` as a tensor on ``x``'s device."""
        key = ("block", x.device)
        if key not in self._tables:
            self._tables[key] = torch.tensor(self._block, dtype=torch.long, device=x.device)
        return self._tables[key]

    def _expands(self, n, m, n_kv, d_v):
        """Whether ``n`` queries meet ``m`` latent keys cheaper expanded (:meth:`_expanded`),
        by the products each way: mapped, ``n n_heads d_v w`` for the query map (``w`` the
        widest latent) and ``2 n m n_heads max(w, d_v)`` for the fused kernel, which pads
        queries, keys and values to one width; expanded, ``m n_kv w d_v`` for the keys and
        ``2 n m n_heads d_v``. A prompt pass with grouped keys expands; a decoding step
        (``n = 1``) maps its query."""
        if self.expand is not None:
            return bool(self.expand)
        w, heads = max(self.k_width, default=0), self._heads["q"]
        mapped = n * heads * d_v * w + 2 * n * m * heads * max(w, d_v)
        return m * n_kv * w * d_v + 2 * n * m * heads * d_v < mapped

    def _expanded(self, query, keys, value, mask, causal, scaling, dropout, rows, group):
        """Several whole rotated queries ``(b, n, n_heads, d_h)`` against the latent keys
        expanded by each key head's query map, ``k~_g = B_g^T (A_s R k)`` (``d_h`` channels):
        the logits ``R q_h . k~_g`` are ``B_g R q_h . A_s R k``, and the fused kernel takes
        queries, keys and values of one width, however wide the latent."""
        b, m, _ = keys.shape
        padded, _ = self._padded(rows, "q", group)  # (n_kv, d_h, widest): B_g^T, zero-padded
        n_kv, _, widest = padded.shape
        latent, start = [], 0
        for width in self.k_width:  # each latent head's entries, zero-padded alike
            latent.append(nn.functional.pad(keys[..., start:start + width], (0, widest - width)))
            start += width
        # (b, latent heads, m, widest), a latent head for each key head reading it
        latent = _spread_heads(torch.stack(latent, dim=1), n_kv)
        expanded = torch.matmul(latent, padded.transpose(1, 2))  # (b, n_kv, m, d_h)
        out = _grouped_attention(query.transpose(1, 2), expanded, value, mask, causal,
                                 scaling, dropout)
        return out.transpose(1, 2).reshape(b, query.shape[1], -1)

    def _fused(self, query, keys, value, mask, causal, scaling, dropout):
        """The attention of several queries by one ``scaled_dot_product_attention`` call,
        every kept query and key zero-padded to the values' width ``d_h`` (the logits
        unchanged; the values too where a shared latent is wider), so torch's fused kernel
        takes it."""
        b, n, _ = query.shape
        d_v = value.shape[-1]
        d_h = max(d_v, *self.k_width)
        q, k, q_start, k_start = [], [], 0, 0
        for width in self.k_width:  # each key head and its group of queries
            q_group = query[..., q_start:q_start + self.group * width]
            q.append(nn.functional.pad(q_group.reshape(b, n, self.group, width),
                                       (0, d_h - width)))
            k.append(nn.functional.pad(keys[..., k_start:k_start + width], (0, d_h - width)))
            q_start, k_start = q_start + self.group * width, k_start + width
        q = torch.cat(q, dim=2).transpose(1, 2)
        k = torch.stack(k, dim=1)
        if d_h > d_v:
            value = nn.functional.pad(value, (0, d_h - d_v))
        k = _spread_heads(k, value.shape[1])  # a latent key head read by several value heads
        out = _grouped_attention(q, k, value, mask, causal, scaling, dropout)
        return out[..., :d_v].transpose(1, 2).reshape(b, n, -1)


def _grouped_attention(q, k, value, mask, causal, scaling, dropout):
    """``scaled_dot_product_attention`` of query heads ``(b, n_heads, n, d)`` in groups over
    key and value heads ``(b, n_v, m, d)``: torch's grouped-query attention where it takes
    them (no mask, as transformers asks it), else each key and value head repeated."""
    gqa = q.shape[1] > value.shape[1] and mask is None and _SDPA_GROUPS
    if not gqa:
        k, value = _spread_heads(k, q.shape[1]), _spread_heads(value, q.shape[1])
    return nn.functional.scaled_dot_product_attention(
        q, k, value, attn_mask=mask, dropout_p=dropout, scale=scaling, is_causal=causal,
        **({"enable_gqa": True} if gqa else {}))


def _spread_heads(x, n):
    """``x`` (``(b, heads, m, w)``) for ``n`` heads that read its heads in equal shares, in
    order: ``x`` itself, a view of its one head, or each head repeated."""
    if x.shape[1] == n:
        return x
    if x.shape[1] == 1:
        return x.expand(x.shape[0], n, *x.shape[2:])
    return x.repeat_interleave(n // x.shape[1], dim=1)


def _masking(n, keys, value, attention_mask, is_causal):
    """The keys, values and mask the attention of ``n`` queries uses, and whether it is
    causal without a mask: as transformers' SDPA attention, which builds no mask where
    torch's ``is_causal`` (aligned to the first key) says the same, and then cuts an empty
    static cache's tail."""
    m = keys.shape[1]
    mask = None if attention_mask is None else attention_mask[..., :m]
    causal = bool(is_causal) and n > 1 and mask is None
    if causal and m > n:
        keys, value = keys[:, :n], value[:, :, :n]
    return keys, value, mask, causal


def _masked(logits, mask):
    """``logits`` with an additive (float) mask added, or the keys a boolean mask does not
    attend set to the dtype's lowest value (as the stock eager attention does)."""
    if mask.dtype == torch.bool:
        return logits.masked_fill(~mask, torch.finfo(logits.dtype).min)
    return logits + mask


def _attentions_recorded():
    """Whether the running forward pass records the attention weights (the model called
    with ``output_attentions=True``); ``True`` when this transformers does not say."""
    try:
        from transformers.utils.output_capturing import _active_collector
    except ImportError:
        return True
    try:
        return "attentions" in (_active_collector.get() or {})
    except LookupError:  # called outside a model's forward pass
        return False


def _kept(config, layer_idx):
    channels = config.qk_channels
    return channels["query"][layer_idx], channels["key"][layer_idx]


def _cached(cache, key, value, layer_idx, kwargs):
    """The layer's key (``(b, 1, m, width)``) and values after ``cache.update``; an error for
    a cache whose layers hold keys and values of one shape (transformers' static caches)."""
    if cache is None:
        return key, value
    if hasattr(cache, "self_attention_cache"):  # an encoder-decoder cache
        cache = cache.self_attention_cache
    layers = getattr(cache, "layers", None)
    if layers is not None and layer_idx < len(layers) and isinstance(layers[layer_idx],
                                                                     _STATIC_LAYERS):
        raise ValueError(
            f"This model caches its keys at their kept width ({tuple(key.shape)}) beside "
            f"values of the stock shape ({tuple(value.shape)}); {type(layers[layer_idx]).__name__}"
            " holds keys and values of one shape. Use the default dynamic cache (no "
            "cache_implementation, or a DynamicCache).")
    return cache.update(key, value, layer_idx, kwargs=kwargs)


def _causal(module, kwargs):
    """Whether the block is causal: the ``is_causal`` passed to it, else its own."""
    return kwargs.get("is_causal", getattr(module, "is_causal", True))


def _attended(module, query, key, value, attention_mask, cache, kwargs, query_map=None):
    """A rotary block's output and weights from its kept (or latent) queries and keys: the
    keys and values through the cache, the kept attention (the logits capped when a
    ``softcap`` comes through the keywords; ``query_map`` as :meth:`KeptChannels.attention`
    takes it), the output projection."""
    key, value = _cached(cache, key, value, module.layer_idx, kwargs)
    out, weights = module.kept.attention(
        query, key, value, attention_mask, module.scaling,
        0.0 if not module.training else module.attention_dropout, module.training,
        is_causal=_causal(module, kwargs), softcap=kwargs.get("softcap"),
        query_map=query_map)
    return module.o_proj(out), weights


def _linear_like(old, out_features):
    return nn.Linear(old.in_features, out_features, bias=old.bias is not None,
                     dtype=old.weight.dtype, device=old.weight.device)


def rotary_attention(stock):
    """A LLaMA-style attention class (``q_proj``/``k_proj``/``v_proj``/``o_proj``, rotary
    embeddings, grouped keys) with kept query and key channels."""

    class KeptRotaryAttention(stock):
        def __init__(self, config, layer_idx):
            super().__init__(config, layer_idx)
            query, key = _kept(config, layer_idx)
            self.kept = KeptChannels(query, key, self.head_dim, rotary=True)
            self.q_proj = _linear_like(self.q_proj, self.kept.q_size)
            self.k_proj = _linear_like(self.k_proj, self.kept.k_size)

        def forward(self, hidden_states, position_embeddings=None, attention_mask=None,
                    cache=None, past_key_values=None, **kwargs):
            cache = past_key_values if cache is None else cache
            b, n = hidden_states.shape[:-1]
            value = self.v_proj(hidden_states).view(b, n, -1, self.head_dim).transpose(1, 2)
            cos, sin = position_embeddings
            query = self.kept.rotate(self.q_proj(hidden_states), cos, sin, "q")
            key = self.kept.rotate(self.k_proj(hidden_states), cos, sin, "k")[:, None]
            return _attended(self, query, key, value, attention_mask, cache, kwargs)

    return KeptRotaryAttention


def normalised_attention(stock):
    """An attention with normalised heads, Gemma 3's or Qwen 3's (``q_proj``/``k_proj``/
    ``v_proj``/``o_proj``, per-head ``q_norm`` and ``k_norm``, rotary embeddings of the
    layer's type, grouped keys), with kept query and key channels: the projections and norms
    are the stock ones, the kept channels of the normalised heads are turned by ``q_turn``
    (queries), rotated, and alone enter the logits and the cache. The sliding window is in
    ``attention_mask``, as the stock model builds it per layer type; a ``softcap`` passed
    through the keywords caps the logits as the stock eager attention does."""

    class KeptNormalisedAttention(stock):
        def __init__(self, config, layer_idx):
            super().__init__(config, layer_idx)
            query, key = _kept(config, layer_idx)
            self.kept = KeptChannels(query, key, self.head_dim, rotary=True)
            # a (row 0) and b (row 1) of each kept query channel: the identity unless fitted
            self.q_turn = nn.Parameter(torch.cat([torch.ones(1, self.kept.q_size),
                                                  torch.zeros(1, self.kept.q_size)]).to(
                self.q_proj.weight.dtype))

        def forward(self, hidden_states, position_embeddings=None, attention_mask=None,
                    cache=None, past_key_values=None, **kwargs):
            cache = past_key_values if cache is None else cache
            b, n = hidden_states.shape[:-1]
            query, key, value = _whole_heads(self, hidden_states)
            query, key = query.reshape(b, n, -1), key.reshape(b, n, -1)
            query = self.kept.turn(self.kept.select(query, "q"), self.q_turn[0],
                                   self.q_turn[1])
            cos, sin = position_embeddings
            query = self.kept.rotate(query, cos, sin, "q")
            key = self.kept.rotate(self.kept.select(key, "k"), cos, sin, "k")[:, None]
            return _attended(self, query, key, value, attention_mask, cache, kwargs)

    return KeptNormalisedAttention


def _whole_heads(module, hidden_states):
    """Every query and key head's whole channels, ``(b, n, heads, d_h)``, normalised by the
    block's ``q_norm`` and ``k_norm`` where it has them (on each head's channels, in this
    layout as in the stock ``(b, heads, n, d_h)``: the same per-head numbers), and the values
    ``(b, kv heads, n, d_h)``."""
    shape = (*hidden_states.shape[:-1], -1, module.head_dim)
    query = module.q_proj(hidden_states).view(shape)
    key = module.k_proj(hidden_states).view(shape)
    if hasattr(module, "q_norm"):
        query, key = module.q_norm(query), module.k_norm(key)
    return query, key, module.v_proj(hidden_states).view(shape).transpose(1, 2)


def _rotation_tables(cos, sin):
    """The stock rotary tables ``(b, n, d_h)`` as :func:`_rotated` takes them: ``cos`` and
    ``sin`` signed for the rolled channels (``rotate_half(x) = roll(x, d_h / 2)`` with the
    first half negated), each ``(b, n, 1, d_h)`` to broadcast over the heads."""
    half = cos.shape[-1] // 2
    signed = torch.cat((-sin[..., :half], sin[..., half:]), -1)
    return cos.unsqueeze(-2), signed.unsqueeze(-2)


def _rotated(x, cos, signed):
    """``x cos + rotate_half(x) sin`` on every head of ``x`` (``(b, n, heads, d_h)``), the
    stock rotation, with the tables of :func:`_rotation_tables`."""
    return x * cos + x.roll(x.shape[-1] // 2, -1) * signed


def latent_attention(stock):
    """A rotary attention class (LLaMA-style, or Gemma 3's or Qwen 3's with per-head ``q_norm``
    and ``k_norm``) with latent keys: the stock projections, norms and rotation, then each latent
    key head's ``key_map`` rows (on its share of the key heads) and each key head's
    ``query_map`` rows on its query heads, so that only the latent channels enter the logits
    and the cache. A prompt pass expands the latent keys by the query maps instead, back to
    each key head's ``d_h`` channels (:meth:`KeptChannels._expanded`: fewer products under
    grouped keys, and no padding for a latent wider than a head). A ``softcap`` passed
    through the keywords caps the logits as the stock eager attention does."""

    class LatentKeyAttention(stock):
        def __init__(self, config, layer_idx):
            super().__init__(config, layer_idx)
            query, key = _kept(config, layer_idx)
            self.kept = KeptChannels(query, key, self.head_dim, rotary=False)
            n_kv = self.k_proj.out_features // self.head_dim
            if n_kv % len(key):
                raise ValueError(f"{len(key)} latent key heads do not share {n_kv} key heads.")
            self.latent_heads = len(key)  # each reads n_kv / latent_heads key heads
            self.group = len(query) // n_kv  # the query heads of a key head share its map
            dtype = self.q_proj.weight.dtype
            # the identity on the first channels until the fitted maps are loaded
            self.query_map = nn.Parameter(_first_channels(query[::self.group],
                                                          self.head_dim).to(dtype))
            self.key_map = nn.Parameter(_first_channels(
                key, n_kv // len(key) * self.head_dim).to(dtype))

        def forward(self, hidden_states, position_embeddings=None, attention_mask=None,
                    cache=None, past_key_values=None, **kwargs):
            cache = past_key_values if cache is None else cache
            query, key, value = _whole_heads(self, hidden_states)
            cos, signed = _rotation_tables(*position_embeddings)
            key = _rotated(key, cos, signed)
            key = key.reshape(*key.shape[:2], self.latent_heads, -1)  # a share side by side
            key = self.kept.project(key, self.key_map, "k")[:, None]
            return _attended(self, _rotated(query, cos, signed), key, value, attention_mask,
                             cache, kwargs, query_map=(self.query_map, self.group))

    return LatentKeyAttention


def _first_channels(heads, width):
    """Rows picking channel ``c`` of each head (``width`` channels) for its kept entries
    ``c`` (zero where ``c`` is past the head's channels: a shared latent may be wider)."""
    rows = torch.zeros(sum(len(c) for c in heads), width)
    entries = [(i, c) for i, c in enumerate(c for kept in heads for c in kept) if c < width]
    if entries:
        row, column = zip(*entries, strict=True)
        rows[torch.tensor(row, dtype=torch.long), torch.tensor(column, dtype=torch.long)] = 1.0
    return rows


def gpt2_attention(stock):
    """GPT-2's attention (one ``Conv1D`` ``c_attn`` for queries, keys and values) with kept
    query and key channels: ``c_attn`` is ``[kept queries | kept keys | values]``."""

    class KeptGPT2Attention(stock):
        def __init__(self, config, is_cross_attention=False, layer_idx=None):
            super().__init__(config, is_cross_attention=is_cross_attention, layer_idx=layer_idx)
            if is_cross_attention:
                raise ValueError("Cross-attention blocks are not compressed.")
            query, key = _kept(config, layer_idx)
            self.kept = KeptChannels(query, key, self.head_dim, rotary=False)
            conv = type(self.c_attn)
            self.c_attn = conv(self.kept.q_size + self.kept.k_size + self.embed_dim,
                               self.embed_dim)
            self.split_sizes = [self.kept.q_size, self.kept.k_size, self.embed_dim]

        def forward(self, hidden_states, cache=None, attention_mask=None,
                    encoder_hidden_states=None, encoder_attention_mask=None,
                    output_attentions=False, past_key_values=None, **kwargs):
            cache = past_key_values if cache is None else cache
            kwargs.pop("use_cache", None)
            b, n = hidden_states.shape[:-1]
            query, key, value = self.c_attn(hidden_states).split(self.split_sizes, dim=2)
            value = value.view(b, n, -1, self.head_dim).transpose(1, 2)
            key, value = _cached(cache, key[:, None], value, self.layer_idx, kwargs)
            out, weights = self.kept.attention(
                query, key, value, attention_mask, self.scaling,
                self.attn_dropout.p if self.training else 0.0, self.training,
                is_causal=_causal(self, kwargs), weights=output_attentions or None)
            return self.resid_dropout(self.c_proj(out)), weights

    return KeptGPT2Attention


def bert_attention(stock):
    """BERT's self-attention (``query``/``key``/``value``) with kept query and key channels."""

    class KeptBertSelfAttention(stock):
        def __init__(self, config, is_causal=False, layer_idx=None):
            super().__init__(config, is_causal=is_causal, layer_idx=layer_idx)
            query, key = _kept(config, layer_idx)
            self.kept = KeptChannels(query, key, self.attention_head_size, rotary=False)
            self.query = _linear_like(self.query, self.kept.q_size)
            self.key = _linear_like(self.key, self.kept.k_size)

        def forward(self, hidden_states, attention_mask=None, cache=None,
                    past_key_values=None, **kwargs):
            cache = past_key_values if cache is None else cache
            b, n = hidden_states.shape[:-1]
            value = self.value(hidden_states).view(b, n, -1, self.attention_head_size)
            key, value = _cached(cache, self.key(hidden_states)[:, None],
                                 value.transpose(1, 2), self.layer_idx, kwargs)
            return self.kept.attention(
                self.query(hidden_states), key, value, attention_mask, self.scaling,
                self.dropout.p if self.training else 0.0, self.training,
                is_causal=_causal(self, kwargs))

    return KeptBertSelfAttention


def kept_config(stock_config):
    """``stock_config`` under the model type ``kept_<its model type>``, unknown to
    transformers: the directory then loads only with this file."""

    class KeptConfig(stock_config):
        model_type = "kept_" + stock_config.model_type

    KeptConfig.__name__ = KeptConfig.__qualname__ = "Kept" + stock_config.__name__
    return KeptConfig


def kept_model(stock_model, stock_attention, make_attention, config_class):
    """``stock_model`` whose ``stock_attention`` blocks are ``make_attention(stock_attention)``,
    configured by ``config_class`` (:func:`kept_config` of the stock config).

    The blocks are replaced after the stock constructor, each with its own layer index. The
    model builds its masks as for the stock SDPA attention (none where causality alone
    says which keys a query sees), or as for the eager one when loaded with
    ``attn_implementation="eager"``; :meth:`KeptChannels.attention` takes either. Flash and
    flex attention are refused (the kept widths are not their kernels' shapes).
    """
    kept_attention = make_attention(stock_attention)

    class KeptModel(stock_model):
        _supports_sdpa = True
        _supports_flash_attn = False
        _supports_flex_attn = False
        _supports_attention_backend = False

        def __init__(self, config, *args, **kwargs):
            super().__init__(config, *args, **kwargs)
            for name, module in list(self.named_modules()):
                if type(module) is not stock_attention:
                    continue
                if getattr(module, "is_cross_attention", False):
                    continue
                options = {}
                if hasattr(module, "is_causal") and stock_attention.__name__.startswith(
                        "Bert"):
                    options["is_causal"] = module.is_causal
                self.set_submodule(name, kept_attention(config, layer_idx=module.layer_idx,
                                                        **options))
            self.post_init()

    KeptModel.__name__ = KeptModel.__qualname__ = "Kept" + stock_model.__name__
    KeptModel.config_class = config_class
    return KeptModel
