"""Query and key weights of every attention layer, per head, in one column layout.

Whatever the source (a Hugging Face model, a state dict of numpy arrays or torch tensors),
each layer becomes ``W_Q`` of shape ``(n_heads, d, d_h)`` and ``W_K`` of shape
``(n_kv_heads, d, d_h)`` such that the query of head ``h`` for a token ``x`` (a row vector of
``d`` channels) is ``x W_Q[h] + b_Q[h]``. The logit between tokens ``i`` and ``j`` is then
``x_i W_Q[h] W_K[g]^T x_j^T / sqrt(d_h)`` (``g`` the key head of query head ``h``), so the
query-key kernel of the head is ``W_Q[h] W_K[g]^T``, a ``d x d`` matrix of rank at most ``d_h``.

Naming schemes (a state dict key is ``<prefix><pattern>``, any prefix such as ``bert.``,
``transformer.`` or ``model.``):

``"bert"``
    ``encoder.layer.{i}.attention.self.query.weight`` and ``...key.weight`` (plus optional
    ``.bias``): ``torch.nn.Linear`` layout ``(n_heads * d_h, d)``, head ``h`` in rows
    ``h*d_h:(h+1)*d_h``.
``"gpt2"``
    ``h.{i}.attn.c_attn.weight``: the fused ``Conv1D`` of GPT-2, whose weight is stored
    transposed with respect to ``nn.Linear``, shape ``(d, 3 d)``, ``y = x W + b``, columns
    ``[query | key | value]``.
``"llama"``
    ``layers.{i}.self_attn.q_proj.weight`` and ``k_proj.weight``: ``nn.Linear`` layout,
    ``(n_heads * d_h, d)`` and ``(n_kv_heads * d_h, d)``; grouped-query attention when
    ``n_kv_heads < n_heads`` (query head ``h`` reads key head ``h // (n_heads / n_kv_heads)``,
    as in Hugging Face's ``repeat_kv``), rotary position embeddings on queries and keys.
"""

import re
from dataclasses import dataclass

import numpy as np

__all__ = ["NAMINGS", "QKLayer", "extract_layers"]

# Each scheme: the regex of its query weight key (prefix, layer index) and how to read a layer.
_PATTERNS = {
    "bert": re.compile(r"^(.*?)encoder\.layer\.(\d+)\.attention\.self\.query\.weight$"),
    "gpt2": re.compile(r"^(.*?)h\.(\d+)\.attn\.c_attn\.weight$"),
    "llama": re.compile(r"^(.*?)layers\.(\d+)\.self_attn\.q_proj\.weight$"),
}
NAMINGS = tuple(_PATTERNS)


@dataclass
class QKLayer:
    """Query and key maps of one attention layer in column layout (see the module docstring).

    ``module`` is the dotted name of the query projection in the model (used to capture the
    hidden states that enter it); ``attention_module`` the name of the attention block.
    ``w_v`` and ``b_v`` are the value maps in the same column layout (value of head ``h`` for
    a token ``x``: ``x W_V[g] + b_V[g]``, ``g`` its key head), ``None`` when the state dict
    holds no value weights. ``w_o`` is each head's block of the output projection, in row
    layout: the head's output ``O_h`` (``n x d_h``) enters the residual stream as
    ``O_h w_o[h]``.
    """

    index: int
    w_q: np.ndarray  # (n_heads, d, d_h)
    w_k: np.ndarray  # (n_kv_heads, d, d_h)
    b_q: np.ndarray | None  # (n_heads, d_h)
    b_k: np.ndarray | None  # (n_kv_heads, d_h)
    module: str
    attention_module: str
    w_v: np.ndarray | None = None  # (n_kv_heads, d, d_h): value maps, when the state has them
    b_v: np.ndarray | None = None  # (n_kv_heads, d_h)
    w_o: np.ndarray | None = None  # (n_heads, d_h, d): head h adds O_h @ w_o[h] to the stream

    @property
    def n_heads(self):
        return self.w_q.shape[0]

    @property
    def n_kv_heads(self):
        return self.w_k.shape[0]

    @property
    def head_dim(self):
        return self.w_q.shape[2]

    @property
    def kv_index(self):
        """Key head read by each query head: ``h // (n_heads / n_kv_heads)``."""
        return np.arange(self.n_heads) // (self.n_heads // self.n_kv_heads)


def _to_numpy(value):
    """A numpy array or a torch tensor (any dtype, any device) as float64 numpy."""
    if hasattr(value, "detach"):  # torch: bfloat16 has no numpy dtype, go through float32
        value = value.detach().to("cpu").float().numpy()
    return np.asarray(value, dtype=np.float64)


def _linear_heads(weight, n_heads, name):
    """``nn.Linear`` weight ``(n_heads * d_h, d)`` to per-head column maps ``(n_heads, d, d_h)``.

    Row block ``h`` of the weight is ``W_h`` with ``q_h = W_h x``; in column layout the map
    is ``W_h^T``.
    """
    if weight.ndim != 2 or weight.shape[0] % n_heads:
        raise ValueError(f"`{name}` of shape {weight.shape} does not split into {n_heads} heads.")
    d_h = weight.shape[0] // n_heads
    return weight.reshape(n_heads, d_h, weight.shape[1]).transpose(0, 2, 1)


def _bias_heads(bias, n_heads):
    return None if bias is None else bias.reshape(n_heads, -1)


def _get(state, key, required=True):
    if key in state:
        return _to_numpy(state[key])
    if required:
        raise ValueError(f"The state dict has no `{key}`.")
    return None


def _read_layer(state, naming, prefix, i, n_heads, n_kv_heads):
    if naming == "bert":
        base = f"{prefix}encoder.layer.{i}.attention.self."
        w_q = _linear_heads(_get(state, base + "query.weight"), n_heads, base + "query.weight")
        w_k = _linear_heads(_get(state, base + "key.weight"), n_heads, base + "key.weight")
        b_q = _bias_heads(_get(state, base + "query.bias", False), n_heads)
        b_k = _bias_heads(_get(state, base + "key.bias", False), n_heads)
        w_v = _get(state, base + "value.weight", False)
        w_v = None if w_v is None else _linear_heads(w_v, n_heads, base + "value.weight")
        b_v = _bias_heads(_get(state, base + "value.bias", False), n_heads)
        w_o = _get(state, f"{prefix}encoder.layer.{i}.attention.output.dense.weight", False)
        return QKLayer(i, w_q, w_k, b_q, b_k, base + "query", base.rstrip("."), w_v, b_v,
                       _output_heads(w_o, n_heads, linear=True))
    if naming == "gpt2":
        base = f"{prefix}h.{i}.attn."
        weight = _get(state, base + "c_attn.weight")
        d = weight.shape[0]
        if weight.ndim != 2 or weight.shape[1] != 3 * d or d % n_heads:
            raise ValueError(
                f"`{base}c_attn.weight` must be a Conv1D weight of shape (d, 3 d) with d "
                f"divisible by n_heads={n_heads}. Got {weight.shape} instead.")
        # Conv1D computes y = x W + b: the columns are already the column layout.
        # Column block [:, h*d_h:(h+1)*d_h] of the query third is head h.
        d_h = d // n_heads
        w_q = weight[:, :d].reshape(d, n_heads, d_h).transpose(1, 0, 2)
        w_k = weight[:, d:2 * d].reshape(d, n_heads, d_h).transpose(1, 0, 2)
        bias = _get(state, base + "c_attn.bias", False)
        b_q = None if bias is None else bias[:d].reshape(n_heads, d_h)
        b_k = None if bias is None else bias[d:2 * d].reshape(n_heads, d_h)
        w_v = weight[:, 2 * d:].reshape(d, n_heads, d_h).transpose(1, 0, 2)
        b_v = None if bias is None else bias[2 * d:].reshape(n_heads, d_h)
        w_o = _get(state, base + "c_proj.weight", False)
        return QKLayer(i, w_q, w_k, b_q, b_k, base + "c_attn", base.rstrip("."), w_v, b_v,
                       _output_heads(w_o, n_heads, linear=False))
    base = f"{prefix}layers.{i}.self_attn."
    w_q = _linear_heads(_get(state, base + "q_proj.weight"), n_heads, base + "q_proj.weight")
    w_k = _linear_heads(_get(state, base + "k_proj.weight"), n_kv_heads,
                        base + "k_proj.weight")
    if w_q.shape[2] != w_k.shape[2]:
        raise ValueError(
            f"Layer {i}: query heads of size {w_q.shape[2]} and key heads of size "
            f"{w_k.shape[2]} differ; check `n_heads` and `n_kv_heads`.")
    b_q = _bias_heads(_get(state, base + "q_proj.bias", False), n_heads)
    b_k = _bias_heads(_get(state, base + "k_proj.bias", False), n_kv_heads)
    w_v = _get(state, base + "v_proj.weight", False)
    w_v = None if w_v is None else _linear_heads(w_v, n_kv_heads, base + "v_proj.weight")
    b_v = _bias_heads(_get(state, base + "v_proj.bias", False), n_kv_heads)
    w_o = _get(state, base + "o_proj.weight", False)
    return QKLayer(i, w_q, w_k, b_q, b_k, base + "q_proj", base.rstrip("."), w_v, b_v,
                   _output_heads(w_o, n_heads, linear=True))


def _output_heads(weight, n_heads, linear):
    """Output projection to per-head row maps ``(n_heads, d_h, d_out)``; None if absent.

    ``nn.Linear`` stores ``(d_out, n_heads d_h)`` (``y = x W^T``), GPT-2's ``Conv1D``
    ``(n_heads d_h, d_out)`` (``y = x W``).
    """
    if weight is None:
        return None
    rows = weight.T if linear else weight
    if rows.shape[0] % n_heads:
        return None
    return rows.reshape(n_heads, rows.shape[0] // n_heads, rows.shape[1])


def detect_naming(keys, naming=None):
    """Return ``(naming, prefix, layer_indices)`` for the query weights found in ``keys``."""
    if naming is not None and naming not in _PATTERNS:
        raise ValueError(f"`naming` must be one of {list(NAMINGS)} or None. Got {naming!r}.")
    for name in [naming] if naming else NAMINGS:
        found = {}
        for key in keys:
            match = _PATTERNS[name].match(key)
            if match:
                found.setdefault(match.group(1), []).append(int(match.group(2)))
        if len(found) > 1:
            raise ValueError(
                f"Attention weights under several prefixes {sorted(found)}; pass a state dict "
                "of one stack of layers (filter its keys by prefix).")
        if found:
            prefix, layers = next(iter(found.items()))
            return name, prefix, sorted(layers)
    wanted = ", ".join(p.pattern for p in ([_PATTERNS[naming]] if naming else _PATTERNS.values()))
    raise ValueError(f"No attention query weights found; expected keys matching {wanted}.")


def extract_layers(state, n_heads, *, n_kv_heads=None, naming=None):
    """Read the per-head query and key maps of every layer of a state dict.

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
    if isinstance(n_heads, bool) or not isinstance(n_heads, (int, np.integer)) or n_heads < 1:
        raise ValueError(f"`n_heads` must be a positive integer. Got {n_heads!r} instead.")
    n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
    if (isinstance(n_kv_heads, bool) or not isinstance(n_kv_heads, (int, np.integer))
            or n_kv_heads < 1 or n_heads % n_kv_heads):
        raise ValueError(f"`n_kv_heads` must be a positive divisor of n_heads={n_heads}. Got "
                         f"{n_kv_heads!r} instead.")
    naming, prefix, indices = detect_naming(list(state), naming)
    if naming != "llama" and n_kv_heads != n_heads:
        raise ValueError(f"The {naming!r} scheme has one key head per query head; "
                         f"`n_kv_heads` must equal n_heads={n_heads}.")
    layers = [_read_layer(state, naming, prefix, i, n_heads, n_kv_heads) for i in indices]
    return naming, layers
