"""Hidden states entering each attention layer, read by running a model on text.

The logit field of a head is evaluated on the token vectors that enter its query and key
projections. They are captured with forward pre-hooks on the query projection, so they are
exactly what the model multiplies by ``W_Q`` and ``W_K`` (after the layer norm in pre-norm
models such as GPT-2 and LLaMA, the residual stream in post-norm BERT). For rotary models the
``(cos, sin)`` tables the attention block receives are captured too, so the rotation applied
is the model's own (any rotary variant, including scaled ones).
"""

import importlib
import importlib.util

import numpy as np

__all__ = ["require", "load_pretrained", "config_heads", "capture_inputs", "rope_tables",
           "rotate_half"]


def require(module):
    """Import an optional dependency or say which extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"This needs `{module}`, an optional dependency of sklearn_ebound.heads. Install it "
            'with `pip install "sklearn-ebound[heads]"`.') from exc


def _is_gguf(path):
    return path.suffix.lower() == ".gguf"


def _causal_lm_class(config, transformers):
    """Whether ``config`` describes a causal language model (its LM head included).

    A saved directory says so in ``config.architectures`` (a ``*ForCausalLM`` or
    ``*LMHeadModel`` class); a GGUF file's config names no class, and its model is a causal
    LM whenever transformers has a causal-LM class for its ``model_type``.
    """
    names = getattr(config, "architectures", None) or []
    if names:
        return any(n.endswith(("ForCausalLM", "LMHeadModel")) for n in names)
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return getattr(config, "model_type", None) in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES


def _gguf_loading(options, transformers):
    """Options that make transformers dequantise a GGUF file's weights to float32."""
    if "gguf_file" not in options:
        return {}
    torch = require("torch")
    if hasattr(transformers, "GgufConfig"):  # transformers 5 may keep quantised blocks
        return {"dtype": torch.float32,
                "quantization_config": transformers.GgufConfig(dequantize=True)}
    return {"torch_dtype": torch.float32}  # earlier versions always dequantise


def load_pretrained(model_dir):
    """Load a Hugging Face model and its tokenizer (if any), offline.

    Parameters
    ----------
    model_dir : str or path-like
        A directory saved by ``save_pretrained`` (``config.json`` and weights), or a
        ``.gguf`` file (the format of llama.cpp and other local runtimes), read through
        transformers' GGUF support: its weights are dequantised to float32 and its tokenizer
        is rebuilt from the file's metadata. GGUF needs the ``gguf`` and ``accelerate``
        packages (both in the ``heads`` extra).

    Returns
    -------
    model : transformers.PreTrainedModel
        The causal-LM class (``*ForCausalLM``, ``*LMHeadModel``: the language-model head
        included) when the config's ``architectures`` names one, and always for a GGUF
        file of a language model; the base model (``AutoModel``) otherwise.
    tokenizer : tokenizer or None
        ``None`` when the directory holds no tokenizer.

    Raises
    ------
    ValueError
        For a directory whose model runs code of its own (``auto_map``, ``trust_remote_code``),
        such as the one :func:`compress_model` writes: it is not loaded as a stock class.
    """
    transformers = require("transformers")
    from pathlib import Path

    path = Path(model_dir)
    options = {"local_files_only": True}
    if _is_gguf(path):
        if not path.is_file():
            raise ValueError(f"`{model_dir}` is not a GGUF file.")
        for module in ("gguf", "accelerate"):
            if importlib.util.find_spec(module) is None:
                raise ImportError(
                    f"Reading the GGUF file `{model_dir}` needs `{module}`. Install it with "
                    f'`pip install {module}` or `pip install "sklearn-ebound[heads]"`.')
        # transformers reads a GGUF file by its name inside a directory
        options["gguf_file"], path = path.name, path.parent
    elif not (path / "config.json").is_file():
        raise ValueError(f"`{model_dir}` is neither a directory with a Hugging Face "
                         "config.json nor a .gguf file.")
    options["trust_remote_code"] = False  # a stock class, never code from the directory
    try:
        config = transformers.AutoConfig.from_pretrained(str(path), **options)
    except ValueError as error:
        if "trust_remote_code" not in str(error):
            raise
        config = None
    if config is None or hasattr(config, "qk_channels"):
        # a directory of custom code (a compressed model written by this package among
        # them): its stock class, if any, would ignore what the code adds and run another model
        raise ValueError(
            f"`{model_dir}` holds a model of its own code (config.json's auto_map; a model "
            "compress_model wrote is one): load_pretrained reads stock transformers models "
            "only. Load it with transformers' AutoModel...from_pretrained(model_dir, "
            "trust_remote_code=True) if you trust the code.")
    auto = (transformers.AutoModelForCausalLM if _causal_lm_class(config, transformers)
            else transformers.AutoModel)
    model = auto.from_pretrained(str(path), **options, **_gguf_loading(options, transformers))
    if "gguf_file" in options and getattr(model, "hf_quantizer", None) is not None:
        # dequantised: a plain dense model from here on, which save_pretrained writes
        model.hf_quantizer.remove_quantization_config(model)
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(path), **options)
    except (OSError, ValueError, TypeError):
        tokenizer = None
    if getattr(tokenizer, "vocab_size", None) == 0:
        # transformers builds an empty tokenizer of the model's class from a directory
        # without tokenizer files, rather than failing
        tokenizer = None
    return model, tokenizer


def config_heads(config):
    """``(n_heads, n_kv_heads, rope_theta)`` from a Hugging Face config."""
    n_heads = getattr(config, "num_attention_heads", None) or getattr(config, "n_head", None)
    n_kv = getattr(config, "num_key_value_heads", None) or n_heads
    theta = getattr(config, "rope_theta", None)
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    if theta is None and isinstance(params, dict):
        theta = params.get("rope_theta")
    return n_heads, n_kv, 10000.0 if theta is None else float(theta)


def rotate_half(x):
    """``[x_1, x_2] -> [-x_2, x_1]`` on the last axis: Hugging Face's rotary convention.

    Rotary embeddings rotate the pairs of coordinates ``(k, k + d_h/2)`` of a query or key at
    position ``p`` by the angle ``p * theta^(-2k/d_h)``: ``R_p q = q cos + rotate_half(q) sin``.
    """
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def rope_tables(n_tokens, head_dim, theta=10000.0):
    """``(cos, sin)`` of the default rotary embedding at positions ``0 .. n_tokens - 1``."""
    inv_freq = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    angles = np.outer(np.arange(n_tokens), inv_freq)
    angles = np.concatenate([angles, angles], axis=-1)
    return np.cos(angles), np.sin(angles)


def token_batches(tokenizer, texts, max_length, batch_size):
    """Yield token batches; one text per batch when the tokenizer has no padding token."""
    padding = getattr(tokenizer, "pad_token", None) is not None
    if not padding:  # (transformers refuses to pad without a padding token, even one text)
        batch_size = 1
    for start in range(0, len(texts), batch_size):
        yield tokenizer(list(texts[start:start + batch_size]), padding=padding, truncation=True,
                        max_length=max_length, return_tensors="pt")


class _Captured(Exception):
    """Raised by a hook once the last requested layer's input is kept: the rest is not needed."""


def capture_inputs(model, layers, texts, tokenizer, *, rotary, max_length=128, batch_size=32,
                   stop_early=False):
    """Run ``model`` on ``texts`` and collect what enters each layer's query projection.

    Parameters
    ----------
    model : torch.nn.Module
        A Hugging Face model whose module names match the state dict the layers came from.
    layers : list of QKLayer
    texts : sequence of str
    tokenizer : callable
        A Hugging Face tokenizer.
    rotary : bool
        Capture the ``(cos, sin)`` rotary tables passed to the attention blocks.
    stop_early : bool, default=False
        Stop each forward pass once the inputs of the last of ``layers`` (in model order) are
        kept: the layers above it are not run. Capturing one layer at a time this way keeps
        only that layer's activations in memory.

    Returns
    -------
    sequences : list of list of ndarray
        ``sequences[l][s]`` is the ``(n_s, d)`` input of layer ``l`` on text ``s`` (padding
        removed).
    rotations : list of list of tuple or None
        ``rotations[l][s] = (cos, sin)``, each ``(n_s, d_h)``; ``None`` without rotary.
    """
    torch = require("torch")
    captured = [[] for _ in layers]
    tables = [[] for _ in layers]
    hooks = []

    def kept(t):  # float32 at least, float64 kept as it is
        t = t.detach()
        return t if t.dtype == torch.float64 else t.float()

    def keep_input(store, last=False):
        def hook(module, args):
            store.append(kept(args[0]))
            if last:
                raise _Captured
        return hook

    def keep_rotation(store):
        def hook(module, args, kwargs):
            pair = kwargs.get("position_embeddings")
            if pair is None and len(args) > 1:
                pair = args[1]
            store.append(None if pair is None else tuple(kept(t) for t in pair))
        return hook

    try:
        deepest = max(layer.index for layer in layers)
        for layer, store, table in zip(layers, captured, tables, strict=True):
            hooks.append(model.get_submodule(layer.module).register_forward_pre_hook(
                keep_input(store, stop_early and layer.index == deepest)))
            if rotary:
                hooks.append(model.get_submodule(layer.attention_module).register_forward_pre_hook(
                    keep_rotation(table), with_kwargs=True))
        masks = []
        was_training = model.training
        model.eval()  # no dropout
        try:
            with torch.no_grad():
                for batch in token_batches(tokenizer, texts, max_length, batch_size):
                    masks.append(batch["attention_mask"].bool())
                    try:
                        model(**batch)
                    except _Captured:
                        pass
        finally:
            model.train(was_training)
    finally:
        for handle in hooks:
            handle.remove()

    sequences, rotations = [], []
    for store, table, layer in zip(captured, tables, layers, strict=True):
        seqs, rots = [], []
        for b, mask in enumerate(masks):
            for row in range(mask.shape[0]):
                keep = mask[row]
                seqs.append(store[b][row][keep].numpy().astype(np.float64))
                if rotary:
                    rots.append(_rotation(table[b], row, keep, seqs[-1].shape[0], layer))
        sequences.append(seqs)
        rotations.append(rots if rotary else None)
    return sequences, rotations


def _rotation(pair, row, keep, n_tokens, layer):
    if pair is None:  # not passed by the model: the default tables at positions 0..n-1
        return None
    cos, sin = pair
    # (batch, n, d_h), or (1, n, d_h) broadcast over the batch
    cos = cos[row if cos.shape[0] > 1 else 0][keep].numpy().astype(np.float64)
    sin = sin[row if sin.shape[0] > 1 else 0][keep].numpy().astype(np.float64)
    if cos.shape != (n_tokens, layer.head_dim):
        raise ValueError(f"Layer {layer.index}: rotary tables of shape {cos.shape} do not match "
                         f"{n_tokens} tokens of head size {layer.head_dim} (partial rotary "
                         "embeddings are not supported).")
    return cos, sin


def attention_inputs(model, layers, texts, tokenizer, visit, max_length=128, batch_size=8):
    """Run ``model`` on ``texts`` and call ``visit(layer, x, cos, sin, valid)`` with what enters
    each layer's attention block: the hidden states ``x`` ``(b, n, d)`` and the layer's own
    rotary tables ``(b, n, d_h)`` (float64), and the real tokens ``valid`` ``(b, n)``."""
    torch = require("torch")
    state, hooks = {}, []

    def hook_for(layer):
        def hook(module, args, kwargs):
            x = (args[0] if args else kwargs["hidden_states"]).detach().double()
            cos, sin = (t.detach().double() for t in kwargs["position_embeddings"])
            if cos.dim() == 2:
                cos, sin = cos[None], sin[None]
            visit(layer, x, cos, sin, state["valid"])
        return hook

    for layer in layers:
        hooks.append(model.get_submodule(layer.attention_module).register_forward_pre_hook(
            hook_for(layer), with_kwargs=True))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for batch in token_batches(tokenizer, texts, max_length, batch_size):
                state["valid"] = batch["attention_mask"].bool()
                model(**batch)
    finally:
        model.train(was_training)
        for handle in hooks:
            handle.remove()


def augmented_tokens(x):
    """``[x, 1]``: the tokens of :class:`HeadModel`."""
    torch = require("torch")
    return torch.cat([x, torch.ones_like(x[..., :1])], -1)
