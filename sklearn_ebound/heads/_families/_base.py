"""What every family adapter shares: the per-layer query/key record and the read/write helpers.

A family adapter (one module of this package per family) knows four things about a model of
its family: where its query and key maps sit in the state dict and how they are laid out
(:meth:`AttentionFamily.read_layer`, :meth:`AttentionFamily.slots`), whether its attention is
causal (the mask), whether its positions are rotary, and where its language-model head is.
Everything else in :mod:`sklearn_ebound.heads` asks the adapter instead of testing the
family's name.
"""

from dataclasses import dataclass

import numpy as np

__all__ = ["AttentionFamily", "QKLayer", "Slot"]


@dataclass
class QKLayer:
    """Query and key maps of one attention layer in column layout.

    The query of head ``h`` for a token ``x`` (a row vector of ``d`` channels) is
    ``x W_Q[h] + b_Q[h]``; ``W_Q`` is ``(n_heads, d, d_h)``, ``W_K`` ``(n_kv_heads, d, d_h)``.
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
    q_gain: np.ndarray | None = None  # (n_heads, d_h): gains of the normalised queries
    k_gain: np.ndarray | None = None  # (n_kv_heads, d_h): gains of the normalised keys
    norm_eps: float = 0.0
    logit_scale: float | None = None  # None: 1 / sqrt(d_h)
    window: int | None = None  # query i attends to key j only when i - j < window
    rope_theta: float | None = None  # this layer's rotary base (None: the model's)

    @property
    def normalised(self):
        """Whether each query and key head is RMS-normalised (with gains) before rotation."""
        return self.q_gain is not None

    @property
    def scale(self):
        """``s`` of the logits ``s q_i^T k_j``: ``1 / sqrt(d_h)`` unless the family sets it."""
        return self.head_dim ** -0.5 if self.logit_scale is None else float(self.logit_scale)

    def kernel_weights(self):
        """``(W_Q, W_K)`` of the query-key kernel the logits are a form of.

        ``W_Q W_K^T`` in general; with normalised heads ``W_Q D_Q (W_K D_K)^T``, ``D`` the
        diagonal gains: the logit at offset 0 is then ``x_i W_Q D_Q D_K W_K^T x_j^T`` over
        ``rms(x_i W_Q) rms(x_j W_K)``, the kernel up to one positive number per token.
        """
        if not self.normalised:
            return self.w_q, self.w_k
        return self.w_q * self.q_gain[:, None, :], self.w_k * self.k_gain[:, None, :]

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


@dataclass(frozen=True)
class Slot:
    """Where one head's query (or key) map sits in a projection of the model.

    ``module`` is the projection's dotted name; its weight entries ``start : start + d_h``
    along the head axis are the head's map, and so are the same entries of its bias. The
    head axis is the rows of an ``nn.Linear`` weight (``(n_heads d_h, d)``, ``y = x W^T``:
    ``linear=True``) or the columns of a ``Conv1D`` weight (``(d, n_heads d_h)``,
    ``y = x W``).
    """

    module: str
    start: int
    linear: bool

    def index(self, width):
        """Index of the first ``width`` entries of the head in the weight."""
        span = slice(self.start, self.start + width)
        return span if self.linear else (slice(None), span)

    def bias_index(self, width):
        return slice(self.start, self.start + width)


def normalise(t, gain, eps):
    """``t / rms(t) * gain`` over the last axis (``rms(t) = sqrt(mean(t^2) + eps)``); ``t``
    unchanged when ``gain`` is None. Numpy arrays and torch tensors alike."""
    if gain is None:
        return t
    if hasattr(t, "detach"):
        import torch

        return t * torch.rsqrt((t * t).mean(-1, keepdim=True) + eps) * torch.as_tensor(
            gain, dtype=t.dtype)
    return t / np.sqrt((t * t).mean(-1, keepdims=True) + eps) * gain


def config_window(config, i):
    """Layer ``i``'s sliding window from a Hugging Face config (``None``: none)."""
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if window is None or (types is not None and types[i] != "sliding_attention"):
        return None
    return int(window)


def to_numpy(value):
    """A numpy array or a torch tensor (any dtype, any device) as float64 numpy."""
    if hasattr(value, "detach"):  # torch: bfloat16 has no numpy dtype, go through float32
        value = value.detach().to("cpu").float().numpy()
    return np.asarray(value, dtype=np.float64)


def get(state, key, required=True):
    """``state[key]`` as float64 numpy; ``None`` (or an error if ``required``) when absent."""
    if key in state:
        return to_numpy(state[key])
    if required:
        raise ValueError(f"The state dict has no `{key}`.")
    return None


def linear_heads(weight, n_heads, name):
    """``nn.Linear`` weight ``(n_heads * d_h, d)`` to per-head column maps ``(n_heads, d, d_h)``.

    Row block ``h`` of the weight is ``W_h`` with ``q_h = W_h x``; in column layout the map
    is ``W_h^T``.
    """
    if weight.ndim != 2 or weight.shape[0] % n_heads:
        raise ValueError(f"`{name}` of shape {weight.shape} does not split into {n_heads} heads.")
    d_h = weight.shape[0] // n_heads
    return weight.reshape(n_heads, d_h, weight.shape[1]).transpose(0, 2, 1)


def bias_heads(bias, n_heads):
    return None if bias is None else bias.reshape(n_heads, -1)


def output_heads(weight, n_heads, linear):
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


class AttentionFamily:
    """The adapter of one family of models: how its attention is stored, masked and placed.

    A family module subclasses this and sets the class attributes; the methods below are
    what the rest of :mod:`sklearn_ebound.heads` calls.

    Attributes
    ----------
    name : str
        The family's name, the ``naming`` of the results (``"bert"``, ``"gpt2"``, ...).
    pattern : re.Pattern
        Regex of the query weight's state-dict key; group 1 is the prefix (``"model."``,
        ``"transformer."``, ``""`` ...), group 2 the layer index.
    rotary : bool
        Queries and keys are rotated by position (rotary embeddings).
    grouped_query : bool
        A key head may serve several query heads (``n_kv_heads < n_heads``).
    block_parameters : frozenset of str
        Every parameter of a layer's attention block (names under
        :meth:`attention_block`) whose role in the heads' outputs the family models. A
        block holding any other is not of this family (:meth:`unmodelled`): what the extra
        parameter does to the logits is unknown, so no rank read without it would be right.
    required_parameters : frozenset of str
        Those of ``block_parameters`` every block of the family has.
    model_types : tuple of str or None
        The config ``model_type`` values of the family (``None``: any, the family being told
        by its parameters alone).
    """

    name = None
    pattern = None
    rotary = False
    grouped_query = False
    block_parameters = frozenset()
    required_parameters = frozenset()
    model_types = None

    def __repr__(self):
        return f"<{self.name} attention family>"

    def attention_block(self, prefix, i):
        """Dotted prefix (``"...self_attn."``) of layer ``i``'s attention block's parameters."""
        raise NotImplementedError

    def unmodelled(self, keys, prefix, indices):
        """``(extra, missing)``: each ``{parameter name: blocks}``, the attention blocks'
        parameters the family does not model and those it needs that are absent (names
        relative to the block, blocks as :meth:`attention_block` names them)."""
        keys = set(keys)
        extra, missing = {}, {}
        for i in indices:
            block = self.attention_block(prefix, i)
            names = {k[len(block):] for k in keys if k.startswith(block)}
            for name in names - self.block_parameters:
                extra.setdefault(name, []).append(block)
            for name in self.required_parameters - names:
                missing.setdefault(name, []).append(block)
        return extra, missing

    def config_refusal(self, config):
        """Why this family does not describe a model of ``config`` (``""`` when it may).

        ``config`` is ``None`` for a bare state dict: then only a family told by its
        parameters alone (``model_types = None``) may read it. A config class derived from
        one of the family's (a written model's ``kept_<model type>``) is of the family.
        """
        if self.model_types is None:
            return ""
        model_type = getattr(config, "model_type", None)
        inherited = {getattr(c, "model_type", None) for c in type(config).__mro__}
        if not inherited & set(self.model_types):
            return (f"its attention is read only for a config of model_type in "
                    f"{list(self.model_types)} (got {model_type!r})")
        return ""

    def layer_settings(self, config, i):
        """What layer ``i``'s attention computes beyond its maps: a dict of the optional
        fields of :class:`QKLayer` (gains, ``norm_eps``, ``logit_scale``, ``window``,
        ``rope_theta``). By default the sliding window of the config, if any: the layers
        whose ``layer_types`` entry is ``"sliding_attention"``, or every layer when the
        config has a ``sliding_window`` and no ``layer_types`` (Mistral)."""
        return {"window": config_window(config, i)}

    def read(self, state, prefix, i, n_heads, n_kv_heads, config=None):
        """:meth:`read_layer` with the layer's settings from ``config`` (if any)."""
        layer = self.read_layer(state, prefix, i, n_heads, n_kv_heads)
        if config is not None:
            for name, value in self.layer_settings(config, i).items():
                setattr(layer, name, value)
        return layer

    def read_layer(self, state, prefix, i, n_heads, n_kv_heads):
        """The :class:`QKLayer` of layer ``i`` of a state dict whose keys start with ``prefix``."""
        raise NotImplementedError

    def slots(self, layer, head, kv_head):
        """``(query slot, key slot)`` of query head ``head`` and key head ``kv_head``."""
        raise NotImplementedError

    def query_site(self, layer):
        """``(module, layout)``: the module whose output holds the layer's queries where
        a rank-``r`` form acts on them (after any normalisation, before the rotation).

        ``layout``: ``"slots"``, the output is ``(b, n, ...)`` with head ``h`` in the
        entries of its query slot (:meth:`slots`); ``"heads_first"``, ``(b, n_heads, n,
        d_h)``; ``"heads_last"``, ``(b, n, n_heads, d_h)``.
        """
        return self.slots(layer, 0, 0)[0].module, "slots"

    def is_causal(self, config):
        """Whether a token attends only to itself and the tokens before it."""
        return True

    def output_module(self, layer):
        """Dotted name of the layer's attention output projection, whose input holds the
        heads' outputs side by side (head ``h`` in entries ``h d_h : (h + 1) d_h``)."""
        raise NotImplementedError

    def lm_head(self, model):
        """The model's language-model head (a module), or ``None`` for a bare encoder/decoder."""
        getter = getattr(model, "get_output_embeddings", None)
        return None if getter is None else getter()

    def is_language_model(self, model):
        """A causal model with a language-model head: its measure is the next-token one."""
        return self.lm_head(model) is not None and self.is_causal(getattr(model, "config",
                                                                          None))

    def write_head(self, model, layer, head, kv_head, new_q, new_k):
        """Write one head's ``W~_Q'`` and ``W~_K'`` (``(d + 1) x d_h``, bias last) in place.

        Refused for normalised heads: a map written into the query projection acts before
        the normalisation, which then rescales the mapped query token by token, so the
        written head would not be the rank-``r`` form measured on the normalised queries.
        """
        import torch

        if layer.normalised:
            raise ValueError(
                f"The {self.name!r} family normalises each query and key head before its "
                f"rotation ({layer.attention_module}); a rank-r map written into the query "
                "projection would act before that normalisation, which rescales it token by "
                "token, so it is not the form that was measured. Writing a compressed model "
                f"of this family is not supported yet.")

        d = new_q.shape[0] - 1
        for slot, new in zip(self.slots(layer, head, kv_head), (new_q, new_k), strict=True):
            module = model.get_submodule(slot.module)
            weight, bias = module.weight, getattr(module, "bias", None)
            if bias is None and np.any(new[d] != 0):
                raise ValueError(f"`{slot.module}` has no bias but the rank-r form needs one.")
            with torch.no_grad():
                w = torch.as_tensor(new[:d], dtype=weight.dtype)
                weight[slot.index(new.shape[1])] = w.T if slot.linear else w
                if bias is not None:
                    bias[slot.bias_index(new.shape[1])] = torch.as_tensor(new[d],
                                                                          dtype=bias.dtype)

    def column_masks(self, model, layer, heads):
        """``{parameter name: bool mask}`` of the first ``rank`` query/key columns of ``heads``.

        ``heads`` is a list of ``(head, rank)``; the masks cover the weights and the biases.
        """
        import torch

        params = dict(model.named_parameters())
        masks = {}
        for head, rank in heads:
            for slot in self.slots(layer, head, int(layer.kv_index[head])):
                for suffix, index in ((".weight", slot.index(rank)),
                                      (".bias", slot.bias_index(rank))):
                    if slot.module + suffix not in params:
                        continue
                    p = params[slot.module + suffix]
                    mask = masks.setdefault(slot.module + suffix,
                                            torch.zeros_like(p, dtype=torch.bool))
                    mask[index] = True
        return masks
