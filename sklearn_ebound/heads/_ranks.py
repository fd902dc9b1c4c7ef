"""The attention-native rank of every head of a pretrained transformer.

For head ``h`` of a layer, with query map ``W_Q`` and key map ``W_K`` in column layout
(``d x d_h`` each, see :mod:`sklearn_ebound.heads._weights`), the logit between tokens ``i``
and ``j`` is ``x_i^T W x_j / sqrt(d_h)`` with the query-key kernel ``W = W_Q W_K^T`` (``d x d``,
rank at most ``d_h``). Two spectra are read per head:

* the **kernel** spectrum, the singular values of ``W``. They are computed in head space:
  with thin QR factorisations ``W_Q = Q_1 R_1`` and ``W_K = Q_2 R_2``,
  ``W = Q_1 (R_1 R_2^T) Q_2^T`` and ``Q_1``, ``Q_2`` have orthonormal columns, so the
  ``d_h x d_h`` core ``R_1 R_2^T`` has exactly the ``d_h`` leading singular values of the
  ``d x d`` kernel (the other ``d - d_h`` are zero), at ``O(d d_h^2)`` cost instead of ``O(d^3)``;
* the **logit field** spectrum, the singular values of the matrix of logits
  ``L_ij = q_i^T k_j / sqrt(d_h)`` over the tokens of real text, pooled over all tokens
  (``L = X W X^T / sqrt(d_h)``, again through a ``d_h x d_h`` core) and per sequence.
"""

import warnings
from numbers import Real

import numpy as np
from threadpoolctl import threadpool_limits

from .._spectrum import energy_rank, entropy_rank, stable_rank
from .._utils.results import ResultTable
from ._families._base import normalise
from ._inputs import (
    capture_inputs,
    config_heads,
    load_pretrained,
    require,
    rope_tables,
    rotate_half,
)
from ._weights import family_layers

__all__ = ["HeadRankResult", "head_ranks"]


def _tau_label(tau):
    return format(100 * tau, "g")


def _core_spectrum(left, right, width):
    """Singular values of ``left @ right^T`` through the QR cores, padded to ``width``.

    ``left`` and ``right`` are stacks ``(..., m, k)``; ``left @ right^T = Q_1 R_1 R_2^T Q_2^T``
    and the orthonormal factors do not change singular values.
    """
    r_left = np.linalg.qr(left, mode="r")
    r_right = np.linalg.qr(right, mode="r")
    s = np.linalg.svd(r_left @ np.swapaxes(r_right, -1, -2), compute_uv=False)
    pad = width - s.shape[-1]
    return np.concatenate([s, np.zeros(s.shape[:-1] + (pad,))], axis=-1) if pad > 0 else s


def _kernel_spectra(layer):
    """``(n_heads, d_h)``: singular values of ``W_Q[h] W_K[g(h)]^T`` for every query head
    (with a normalising family's gains, :meth:`QKLayer.kernel_weights`)."""
    w_q, w_k = layer.kernel_weights()
    return _core_spectrum(w_q, w_k[layer.kv_index], layer.head_dim)


def _model_space_spectra(layer):
    """The same spectra from the explicit ``d x d`` kernels (``O(d^3)`` per head)."""
    w_q, w_k = layer.kernel_weights()
    kernels = w_q @ np.swapaxes(w_k[layer.kv_index], -1, -2)
    return np.linalg.svd(kernels, compute_uv=False)[:, :layer.head_dim]


def _queries_keys(layer, X, rotation, bias):
    """Queries and keys ``(n_heads, T, d_h)`` of the stacked tokens ``X`` (T, d), scaled.

    ``q_i = x_i W_Q (+ b_Q)``, normalised per head where the family does so (with its
    gains), rotated by the token's rotary table when given (``R_p q = q cos +
    rotate_half(q) sin``); both carry a factor ``sqrt(s)`` (``s`` the layer's logit scale,
    ``1 / sqrt(d_h)`` by default) so that ``q_i^T k_j`` is the logit.
    """
    q = X @ layer.w_q  # (T, d) @ (n_heads, d, d_h) -> (n_heads, T, d_h)
    k = X @ layer.w_k
    if bias:
        if layer.b_q is not None:
            q = q + layer.b_q[:, None, :]
        if layer.b_k is not None:
            k = k + layer.b_k[:, None, :]
    if layer.normalised:
        q = normalise(q, layer.q_gain[:, None, :], layer.norm_eps)
        k = normalise(k, layer.k_gain[:, None, :], layer.norm_eps)
    k = k[layer.kv_index]
    if rotation is not None:
        cos, sin = rotation
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
    scale = np.sqrt(layer.scale)
    return q * scale, k * scale


def logit_fields(layer, sequences, rotations=None, *, bias=False):
    """Per-sequence logit matrices of every head: a list of ``(n_heads, n_s, n_s)`` arrays.

    ``L[h, i, j] = q_i^T k_j`` as :func:`_queries_keys` builds them: the pre-softmax scores of
    the layer before any mask (with ``bias=True`` and the model's rotary tables, exactly the
    model's own scores).
    """
    fields = []
    for s, X in enumerate(sequences):
        rotation = None if rotations is None else rotations[s]
        q, k = _queries_keys(layer, X, rotation, bias)
        fields.append(q @ np.swapaxes(k, -1, -2))
    return fields


def _field_spectra(layer, sequences, rotations, bias, taus):
    """Pooled and key-centred spectra ``(n_heads, d_h)``; per-sequence median energy ranks."""
    X = np.concatenate(sequences)
    rotation = None
    if rotations is not None:
        rotation = tuple(np.concatenate([r[i] for r in rotations]) for i in range(2))
    q, k = _queries_keys(layer, X, rotation, bias)
    # Pooled field L = Q K^T over all T tokens, through its d_h x d_h core.
    pooled = _core_spectrum(q, k, layer.head_dim)
    lengths = np.array([len(x) for x in sequences])
    n_max = lengths.max()
    rows = np.concatenate([np.arange(n) for n in lengths])
    seq = np.repeat(np.arange(len(lengths)), lengths)
    # Softmax over the keys of a sequence ignores terms constant along a row. Centring the keys
    # within each sequence, L_ij - mean_j' L_ij' = q_i^T (k_j - mean k), removes them: the
    # within-sequence blocks of the centred field are the row-centred logits.
    counts = np.bincount(seq)[:, None]
    means = np.stack([np.stack([np.bincount(seq, weights=kh[:, c]) for c in range(kh.shape[1])],
                               axis=1) / counts for kh in k])  # (n_heads, n_seq, d_h)
    centred = _core_spectrum(q, k - means[:, seq], layer.head_dim)
    # Per sequence: zero-padding a sequence to n_max adds only zero singular values.
    per_seq = {tau: np.empty(layer.n_heads) for tau in taus}
    for h in range(layer.n_heads):
        q_pad = np.zeros((len(lengths), n_max, layer.head_dim))
        k_pad = np.zeros_like(q_pad)
        q_pad[seq, rows] = q[h]
        k_pad[seq, rows] = k[h]
        s = np.linalg.svd(q_pad @ np.swapaxes(k_pad, -1, -2), compute_uv=False)
        for tau in taus:
            per_seq[tau][h] = np.median(energy_rank(s, tau, is_spectrum=True))
    return pooled, centred, per_seq


class HeadRankResult(ResultTable):
    """Ranks of the query-key kernel and the logit field of every head; see :func:`head_ranks`.

    One row per (layer, head). Metadata (also attributes): ``naming``, ``n_layers``,
    ``n_heads``, ``n_kv_heads``, ``head_dim``, ``d_model``, ``rotary``, ``bias``, ``taus``,
    ``kernel_spectra`` (``n_layers x n_heads x d_h``), and with inputs ``field_spectra``,
    ``n_sequences``, ``n_tokens``. :class:`~sklearn_ebound.display.HeadRankDisplay` draws a
    rank column as a heat map, :class:`~sklearn_ebound.display.HeadSpectrumDisplay` the
    spectra of one head.
    """

    def grid(self, column):
        """One column as a ``(n_layers, n_heads)`` array (layers down, heads across)."""
        if column not in self.columns:
            raise ValueError(f"`column` must be one of {self.columns}. Got {column!r} instead.")
        grid = np.full((self.n_layers, self.n_heads), np.nan)
        layers = {layer: i for i, layer in enumerate(sorted(set(self.column("layer"))))}
        for row in self.rows:
            value = row[column]
            grid[layers[row["layer"]], row["head"]] = np.nan if value is None else value
        return grid

    def summary(self, tau=0.9):
        """Per layer: min / median / max over heads of the kernel and field energy ranks.

        Returns
        -------
        summary : ResultTable
            Columns ``layer``, ``kernel_min``, ``kernel_median``, ``kernel_max`` and, with
            inputs, ``field_min``, ``field_median``, ``field_max``, ``ratio_median``.
        """
        label = _tau_label(tau)
        kernel = self.grid(f"kernel_energy_rank_{label}")
        has_field = f"field_energy_rank_{label}" in self.columns
        field = self.grid(f"field_energy_rank_{label}") if has_field else None
        rows = []
        for i, layer in enumerate(sorted(set(self.column("layer")))):
            row = {"layer": int(layer), "kernel_min": int(kernel[i].min()),
                   "kernel_median": float(np.median(kernel[i])),
                   "kernel_max": int(kernel[i].max())}
            if has_field:
                row.update(field_min=int(field[i].min()),
                           field_median=float(np.median(field[i])),
                           field_max=int(field[i].max()),
                           ratio_median=float(np.median(kernel[i] / field[i])))
            rows.append(row)
        return ResultTable(rows, tau=tau, head_dim=self.head_dim)

    def plot_heatmap(self, column, ax=None):
        """Draw one column as a layers x heads heat map; returns the matplotlib axes.

        Deprecated: use :meth:`sklearn_ebound.display.HeadRankDisplay.from_result`.
        """
        from ..display import HeadRankDisplay

        warnings.warn("`HeadRankResult.plot_heatmap` is deprecated and will be removed; use "
                      "`sklearn_ebound.display.HeadRankDisplay.from_result(result, column)` "
                      "instead.", FutureWarning, stacklevel=2)
        return HeadRankDisplay.from_result(self, column, ax=ax).ax_

    def plot_spectrum(self, layer, head, ax=None):
        """Normalised kernel (and field) spectra of one head, log scale; returns the axes.

        Deprecated: use :meth:`sklearn_ebound.display.HeadSpectrumDisplay.from_result`.
        """
        from ..display import HeadSpectrumDisplay

        warnings.warn("`HeadRankResult.plot_spectrum` is deprecated and will be removed; use "
                      "`sklearn_ebound.display.HeadSpectrumDisplay.from_result(result, layer, "
                      "head)` instead.", FutureWarning, stacklevel=2)
        return HeadSpectrumDisplay.from_result(self, layer, head, ax=ax).ax_


def _check_taus(taus):
    taus = tuple(taus) if not isinstance(taus, Real) else (taus,)
    if not taus or any(isinstance(t, bool) or not isinstance(t, Real) or not 0 < t <= 1
                       for t in taus):
        raise ValueError(f"`taus` must be numbers in (0, 1]. Got {taus!r} instead.")
    return taus


def _source(model_or_weights, n_heads, n_kv_heads, tokenizer):
    """``(state, model, tokenizer, n_heads, n_kv_heads, rope_theta)`` from any accepted source."""
    import os
    from collections.abc import Mapping

    model = None
    theta = None
    if isinstance(model_or_weights, (str, os.PathLike)):
        model, loaded = load_pretrained(model_or_weights)
        tokenizer = loaded if tokenizer is None else tokenizer
    elif hasattr(model_or_weights, "state_dict"):
        model = model_or_weights
    elif not isinstance(model_or_weights, Mapping):
        raise TypeError("`model_or_weights` must be a Hugging Face model, a torch module, a "
                        "directory of a saved model or a state dict (mapping of arrays). Got "
                        f"{type(model_or_weights).__name__} instead.")
    if model is not None:
        state = model.state_dict()
        config = getattr(model, "config", None)
        if config is not None:
            c_heads, c_kv, theta = config_heads(config)
            n_heads = c_heads if n_heads is None else n_heads
            n_kv_heads = c_kv if n_kv_heads is None else n_kv_heads
    else:
        state = model_or_weights
    if n_heads is None:
        raise ValueError("`n_heads` is required for a state dict or a model without a config.")
    return state, model, tokenizer, n_heads, n_kv_heads, theta


def _as_sequences(value, d, name):
    """Hidden states of one layer: an array (N, n, d) or (n, d), or a list of (n_s, d)."""
    if isinstance(value, np.ndarray) or hasattr(value, "detach"):
        array = np.asarray(value.detach().cpu().float() if hasattr(value, "detach") else value,
                           dtype=np.float64)
        value = list(array) if array.ndim == 3 else [array]
    sequences = [np.asarray(x, dtype=np.float64) for x in value]
    for x in sequences:
        if x.ndim != 2 or x.shape[1] != d or x.shape[0] < 1:
            raise ValueError(f"`{name}` must hold (n_tokens, {d}) token vectors. Got a sequence "
                             f"of shape {x.shape}.")
        if not np.all(np.isfinite(x)):
            raise ValueError(f"`{name}` contains NaN or infinity.")
    if not sequences:
        raise ValueError(f"`{name}` holds no sequence.")
    return sequences


def head_ranks(model_or_weights, *, n_heads=None, n_kv_heads=None, naming=None, inputs=None,
               tokenizer=None, taus=(0.9, 0.99), bias=False, model_space=False,
               rope_theta=None, max_length=128, batch_size=32):
    """Rank of the query-key kernel ``W_Q W_K^T`` and of its logit field, for every head.

    For each layer and head, the kernel ``W = W_Q W_K^T`` (the bilinear form of the attention
    logits ``x_i^T W x_j / sqrt(d_h)``) is read through its singular values: energy ranks at
    each ``tau``, entropy effective rank and stable rank. Given text (or hidden states), the
    same is done for the **logit field**, the matrix of logits the head actually produces on
    those tokens, and the ratio of the two energy ranks is reported.

    Parameters
    ----------
    model_or_weights : transformers model, torch module, path or mapping
        A Hugging Face model object (BERT-, GPT-2-, LLaMA- or Gemma 3-style; head counts,
        rotary bases and, for Gemma 3, the logit scale, the sliding windows and the query and
        key gains are read from its config and weights), a directory holding a saved Hugging
        Face model (loaded offline), or a state dict of numpy arrays or torch tensors (for
        example from ``safetensors.numpy.load_file``), which needs ``n_heads``.
    n_heads : int, default=None
        Query heads per layer; read from the model config when there is one.
    n_kv_heads : int, default=None
        Key heads per layer for grouped-query attention (``"llama"`` scheme); defaults to the
        config's ``num_key_value_heads``, else ``n_heads``.
    naming : {"bert", "gpt2", "llama", "gemma3", "qwen3"}, default=None
        Parameter naming scheme, detected from the keys (and the config) when ``None``:

        * ``"bert"``: ``encoder.layer.{i}.attention.self.query.weight`` / ``key.weight``
          (``nn.Linear`` layout ``(n_heads * d_h, d)``, head ``h`` in rows
          ``h*d_h:(h+1)*d_h``);
        * ``"gpt2"``: ``h.{i}.attn.c_attn.weight``, the fused ``Conv1D`` of shape ``(d, 3 d)``
          that computes ``x W + b`` (transposed with respect to ``nn.Linear``), columns
          ``[query | key | value]``;
        * ``"llama"``: ``layers.{i}.self_attn.q_proj.weight`` / ``k_proj.weight``, with
          ``n_kv_heads`` key heads and rotary embeddings;
        * ``"gemma3"``: LLaMA's keys and ``q_norm.weight`` / ``k_norm.weight``, each query
          and key head RMS-normalised with the gains ``1 + w`` before its rotation (a
          Gemma 3 model with its config only): the kernel is ``W_Q D_Q (W_K D_K)^T`` and
          the logit field is taken on the normalised queries and keys;
        * ``"qwen3"``: the same with the gains ``w`` themselves and the ``1 / sqrt(d_h)``
          scale (a Qwen 3 model with its config only).

        Any prefix before these names (``bert.``, ``transformer.``, ``model.``) is accepted.
        An attention block holding a parameter its family does not model (such as
        ``q_norm.weight`` in a LLaMA-named state dict without a Gemma 3 config) is refused
        with its name.
    inputs : list of str, or list of array-like, default=None
        Text to run the model on (needs a model and a tokenizer), or the hidden states entering
        the query/key projections of each layer given directly: a list with one entry per
        layer, each an array ``(n_sequences, n_tokens, d)`` or a list of ``(n_s, d)`` arrays.
        ``None`` reports the kernels only.
    tokenizer : transformers tokenizer, default=None
        Tokenizer for text inputs; loaded with the model when ``model_or_weights`` is a
        directory.
    taus : sequence of float, default=(0.9, 0.99)
        Energy levels of the energy ranks.
    bias : bool, default=False
        Add the query and key biases to the logit field. The kernel is always bias-free: the
        biases add ``x_i^T W_Q b_K`` (constant along each row, so softmax ignores it),
        ``b_Q^T W_K^T x_j`` (a rank-one term ``1 u^T``) and a constant to the logits, at most
        one softmax-relevant direction; they are not part of ``W``.
    model_space : bool, default=False
        Also take the SVD of each explicit ``d x d`` kernel and report its ranks
        (``model_*`` columns). They equal the head-space ones (a check, at ``O(d^3)`` per
        head).
    rope_theta : float, default=None
        Rotary base for hidden states given directly to a ``"llama"`` layout (default: the
        config's, else 10000). With text inputs the model's own rotary tables are used.
    max_length : int, default=128
        Tokens per text at most (longer texts are truncated).
    batch_size : int, default=32
        Texts per forward pass.

    Returns
    -------
    result : HeadRankResult
        One row per (layer, head) with columns ``layer``, ``head``, ``kv_head``,
        ``kernel_energy_rank_{90,99}`` (one per tau), ``kernel_entropy_rank``,
        ``kernel_stable_rank`` and with inputs ``field_energy_rank_*`` (pooled field over all
        tokens), ``field_entropy_rank``, ``field_stable_rank``,
        ``centred_field_energy_rank_*`` (the pooled field with the keys centred within each
        sequence, which removes the row-constant terms softmax ignores),
        ``seq_field_energy_rank_*``
        (median over sequences of the per-sequence ``n_s x n_s`` field) and
        ``rank_ratio_*`` (kernel energy rank / pooled field energy rank).

    Notes
    -----
    **Layout.** Weights are turned into column maps ``W_Q, W_K`` of shape ``d x d_h`` per head
    (query ``q = x W_Q`` for a token row ``x``), so the kernel is ``W_Q W_K^T`` (``d x d``),
    science's ``W``. With ``nn.Linear`` weights ``A_Q = W_Q^T`` of shape ``d_h x d`` the same
    matrix is written ``A_Q^T A_K``, the form used in the literature. The ``d_h x d_h``
    product ``W_Q^T W_K`` of the column maps is a different matrix (it measures how the query
    and key subspaces overlap and can vanish while ``W`` has full rank ``d_h``), so it is not
    used. Instead the kernel spectrum is computed in head space from the ``d_h x d_h`` core
    ``R_Q R_K^T`` of thin QR factorisations ``W_Q = Q_Q R_Q``, ``W_K = Q_K R_K``, which has
    the same singular values as the ``d x d`` kernel (see ``model_space``).

    **Grouped-query attention.** Query head ``h`` reads key head
    ``h // (n_heads / n_kv_heads)``; its kernel is ``W_Q^h W_K^{g(h)T}``.

    **Rotary embeddings.** With rotary position embeddings the logit between positions ``i``
    and ``j`` is ``x_i^T W_Q R_{j-i} W_K^T x_j``: the rotation ``R_p`` turns the coordinate
    pairs ``(k, k + d_h/2)`` of each head by angles ``p * theta^(-2k/d_h)``, so the kernel
    depends on the relative offset. The static ``W_Q W_K^T`` reported here is the kernel at
    offset 0 (``R_0 = I``); since ``R_{j-i}`` is orthogonal, each offset's kernel has the
    same rank bound ``d_h`` but its own spectrum. The logit field is computed with the
    model's rotations applied, so it is the field the model really produces.

    **Logit field.** The field uses the tokens entering the query projection (after the layer
    norm of pre-norm models), all of them (special tokens included, padding excluded), scaled
    by ``1/sqrt(d_h)``, before any causal mask. Its rank is at most ``d_h`` (and at most
    ``n_s`` per sequence): the pooled field over all tokens is not limited by sentence length.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_ebound.heads import head_ranks
    >>> rng = np.random.default_rng(0)
    >>> d, n_heads, d_h = 16, 2, 8
    >>> # q/k weights whose heads have rank-2 kernels, in the BERT naming
    >>> q = np.zeros((n_heads * d_h, d)); q[[0, 1, 8, 9]] = rng.normal(size=(4, d))
    >>> state = {"encoder.layer.0.attention.self.query.weight": q,
    ...          "encoder.layer.0.attention.self.key.weight": rng.normal(size=(16, d))}
    >>> result = head_ranks(state, n_heads=n_heads, taus=(1.0,))
    >>> result.column("kernel_energy_rank_100").tolist()
    [2, 2]
    """
    taus = _check_taus(taus)
    state, model, tokenizer, n_heads, n_kv_heads, theta = _source(
        model_or_weights, n_heads, n_kv_heads, tokenizer)
    family, layers = family_layers(state, n_heads, n_kv_heads=n_kv_heads, naming=naming,
                                   config=getattr(model, "config", None))
    rotary = family.rotary
    theta = float(rope_theta if rope_theta is not None else theta or 10000.0)
    d_model = layers[0].w_q.shape[1]

    sequences, rotations = _layer_inputs(inputs, model, tokenizer, layers, rotary, theta,
                                         max_length, batch_size)

    # The spectra are many small factorisations: one BLAS thread is fastest, and several
    # spin against torch's OpenMP workers after a forward pass (a 100x slowdown measured).
    with threadpool_limits(limits=1, user_api="blas"):
        rows, kernel_all, field_all = _table(layers, sequences, rotations, taus, bias,
                                             model_space)
    meta = dict(naming=family.name, n_layers=len(layers), n_heads=n_heads,
                n_kv_heads=layers[0].n_kv_heads, head_dim=layers[0].head_dim, d_model=d_model,
                rotary=rotary, bias=bias, taus=list(taus), kernel_spectra=np.stack(kernel_all))
    if sequences is not None:
        meta.update(field_spectra=np.stack(field_all), n_sequences=len(sequences[0]),
                    n_tokens=int(sum(len(x) for x in sequences[0])))
    return HeadRankResult(rows, **meta)


def _layer_inputs(inputs, model, tokenizer, layers, rotary, theta, max_length, batch_size):
    """``(sequences, rotations)`` of every layer from ``inputs``; ``(None, None)`` without.

    Text is run through ``model`` (its own rotary tables captured); hidden states are taken
    as given, with the default rotary tables at positions ``0 .. n_s - 1`` for a rotary
    layout.
    """
    if inputs is None:
        return None, None
    d_model = layers[0].w_q.shape[1]
    inputs = list(inputs)
    if inputs and all(isinstance(x, str) for x in inputs):
        if model is None:
            raise ValueError("Text inputs need a model to run, not a state dict; pass the "
                             "model or the hidden states of each layer.")
        if tokenizer is None:
            raise ValueError("Text inputs need a `tokenizer`.")
        require("transformers")
        sequences, rotations = capture_inputs(model, layers, inputs, tokenizer,
                                              rotary=rotary, max_length=max_length,
                                              batch_size=batch_size)
    else:
        if len(inputs) != len(layers):
            raise ValueError(f"`inputs` must hold the hidden states of each of the "
                             f"{len(layers)} layers. Got {len(inputs)} entries.")
        sequences = [_as_sequences(x, d_model, f"inputs[{i}]")
                     for i, x in enumerate(inputs)]
        rotations = [None] * len(layers)
    if rotary:
        # Default rotary tables at positions 0..n_s-1 where the model passed none.
        rotations = [[rot if rot is not None else rope_tables(
                          len(x), layer.head_dim, theta if layer.rope_theta is None
                          else layer.rope_theta)
                      for x, rot in zip(seqs, rots or [None] * len(seqs), strict=True)]
                     for layer, seqs, rots in zip(layers, sequences, rotations, strict=True)]
    else:
        rotations = [None] * len(layers)
    return sequences, rotations


def _table(layers, sequences, rotations, taus, bias, model_space):
    """Rows of :func:`head_ranks` and the kernel and field spectra of every layer."""
    rows, kernel_all, field_all = [], [], []
    for li, layer in enumerate(layers):
        kernel = _kernel_spectra(layer)
        kernel_all.append(kernel)
        columns = {f"kernel_energy_rank_{_tau_label(t)}": energy_rank(kernel, t, is_spectrum=True)
                   for t in taus}
        columns["kernel_entropy_rank"] = entropy_rank(kernel, is_spectrum=True)
        columns["kernel_stable_rank"] = stable_rank(kernel, is_spectrum=True)
        if model_space:
            full = _model_space_spectra(layer)
            for t in taus:
                columns[f"model_energy_rank_{_tau_label(t)}"] = energy_rank(full, t,
                                                                             is_spectrum=True)
            columns["model_entropy_rank"] = entropy_rank(full, is_spectrum=True)
            columns["model_stable_rank"] = stable_rank(full, is_spectrum=True)
        if sequences is not None:
            field, centred, per_seq = _field_spectra(layer, sequences[li], rotations[li],
                                                     bias, taus)
            field_all.append(field)
            for t in taus:
                columns[f"field_energy_rank_{_tau_label(t)}"] = energy_rank(field, t,
                                                                             is_spectrum=True)
            columns["field_entropy_rank"] = entropy_rank(field, is_spectrum=True)
            columns["field_stable_rank"] = stable_rank(field, is_spectrum=True)
            for t in taus:
                columns[f"centred_field_energy_rank_{_tau_label(t)}"] = energy_rank(
                    centred, t, is_spectrum=True)
            for t in taus:
                columns[f"seq_field_energy_rank_{_tau_label(t)}"] = per_seq[t]
            for t in taus:
                label = _tau_label(t)
                kernel_rank = columns[f"kernel_energy_rank_{label}"].astype(float)
                field_rank = columns[f"field_energy_rank_{label}"].astype(float)
                columns[f"rank_ratio_{label}"] = np.divide(
                    kernel_rank, field_rank, out=np.full_like(kernel_rank, np.nan),
                    where=field_rank > 0)
        for h in range(layer.n_heads):
            row = {"layer": layer.index, "head": h, "kv_head": int(layer.kv_index[h])}
            row.update({name: values[h].item() for name, values in columns.items()})
            rows.append(row)
    return rows, kernel_all, field_all
