"""The compressed model, and what it keeps of the original's behaviour.

:func:`compress_heads` writes a plan's rank-``r`` query-key pairs into a copy of the model
(every other weight bit-identical); :func:`refine_compressed` re-fits those pairs layer by
layer on the inputs the compressed model itself gives them; :func:`distill_compressed` trains
them all at once on the model's end-to-end output against the original's;
:func:`embedding_fidelity` (an encoder's sentence embeddings), :func:`perplexity` and
:func:`next_token_kl` (a causal language model's next-token distributions) and
:func:`compression_frontier` measure it against the original on held-out text.
"""

import copy
import warnings
from contextlib import contextmanager
from numbers import Integral, Real

import numpy as np

from .._utils.results import ResultTable
from ..exceptions import RankEstimationWarning
from ._deficiency import train_head
from ._head_forms import (
    METHODS,
    HeadBatches,
    augmented_weights,
    check_texts,
    family_of,
    layers_of,
    model_source,
)
from ._inputs import capture_inputs, require, token_batches
from ._planning import plan_curves, plan_ranks

__all__ = ["compress_heads", "refine_compressed", "distill_compressed", "embedding_fidelity",
           "perplexity", "next_token_kl", "compression_frontier", "is_language_model"]


def compress_heads(model, result, plan, *, method="trained"):
    """A copy of ``model`` whose heads have the query-key ranks of ``plan``.

    Only the query and key projections change: head ``h`` at rank ``r`` gets
    ``W~_Q' = [W_Q'; b_Q']`` and ``W~_K'`` of the same shapes, whose product on ``[x, 1]`` is
    the rank-``r`` form of ``method`` (:meth:`HeadDeficiencyResult.factors`; columns beyond
    ``r`` are zero). Every other weight is the original's, bit for bit. Save it with
    ``save_pretrained``: it is a standard Hugging Face model.

    Parameters
    ----------
    model : transformers model
        The model ``result`` was measured on (its query and key weights unchanged since), or a
        model with the same attention weights (for example the causal-LM class around it).
    result : HeadDeficiencyResult
    plan : ResultTable or mapping
        A :func:`plan_ranks` table, or ``{(layer, head): rank}``.
    method : {"trained", "data", "weight"}, default="trained"
        Whose rank-``r`` forms: ``"trained"`` uses the trained pair where one was trained at
        that rank and the data-aware one elsewhere.

    Returns
    -------
    compressed : transformers model
    """
    if method not in METHODS:
        raise ValueError(f"`method` must be one of {list(METHODS)}. Got {method!r}.")
    ranks = ({(row["layer"], row["head"]): row["rank"] for row in plan.rows}
             if isinstance(plan, ResultTable) else dict(plan))
    family, layers, _ = layers_of(model)
    if family.name != result.naming:
        raise ValueError(f"The model is {family.name}-style, the result "
                         f"{result.naming}-style.")
    by_index = {layer.index: layer for layer in layers}
    compressed = copy.deepcopy(model)
    positions = {v: i for i, v in enumerate(result.layer_indices)}
    for (layer_index, head), rank in ranks.items():
        if layer_index not in positions or head not in result.heads:
            raise ValueError(f"The plan's head {layer_index}.{head} is not in the result.")
        if not 0 <= rank <= result.head_dim:
            raise ValueError(f"Rank {rank} of head {layer_index}.{head} is outside [0, "
                             f"{result.head_dim}].")
        li = positions[layer_index]
        layer = by_index[layer_index]
        new_q, new_k = result.factors(li, head, int(rank), method)
        family.write_head(compressed, layer, head, int(layer.kv_index[head]), new_q, new_k)
    return compressed


def _plan_ranks_of(plan, name="plan"):
    if isinstance(plan, ResultTable):
        return {(row["layer"], row["head"]): row["rank"] for row in plan.rows}
    try:
        return dict(plan)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"`{name}` must be a plan_ranks table or a mapping {{(layer, head): "
                        f"rank}}. Got {type(plan).__name__} instead.") from exc


def checked_plan(plan, layers):
    """``{layer index: [(head, rank), ...]}`` of ``plan`` (every rank, 0 and ``d_h``
    included), each key and rank checked against the model's ``layers``."""
    ranks = _plan_ranks_of(plan)
    indices = sorted(layer.index for layer in layers)
    d_h, n_heads = layers[0].head_dim, layers[0].n_heads
    todo = {}
    for key, rank in ranks.items():
        try:
            layer_index, head = (int(k) for k in key)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"`plan` keys must be (layer, head) pairs. Got {key!r}.") from exc
        if layer_index not in indices or not 0 <= head < n_heads:
            raise ValueError(f"`plan` names head {layer_index}.{head}, which the model does "
                             f"not have (layers {indices}, heads 0..{n_heads - 1}).")
        if isinstance(rank, bool) or not isinstance(rank, Integral) or not (
                0 <= rank <= d_h):
            raise ValueError(f"`plan`: rank {rank!r} of head {layer_index}.{head} is not an "
                             f"integer in [0, {d_h}].")
        todo.setdefault(layer_index, []).append((head, int(rank)))
    return todo


def _planned_heads(model, compressed, plan):
    """Check ``compressed`` against ``model`` and ``plan``; the heads at ``1 <= r < d_h``.

    Returns the family adapter, ``{layer index: (layer, compressed layer)}`` and ``{layer index:
    [(head, rank), ...]}``.
    """
    if not (hasattr(compressed, "state_dict") and hasattr(compressed, "config")):
        raise TypeError("`compressed` must be a Hugging Face model (the compress_heads copy). "
                        f"Got {type(compressed).__name__} instead.")
    _plan_ranks_of(plan)  # a plan of the wrong type is named before the models are read
    family, layers, _ = layers_of(model)
    family_c, c_layers, _ = layers_of(compressed)
    if family_c is not family or len(c_layers) != len(layers) or any(
            a.w_q.shape != b.w_q.shape for a, b in zip(layers, c_layers, strict=True)):
        raise ValueError("`compressed` does not have the attention layers of `model` (is it "
                         "the compress_heads copy of this model?).")
    by_index = {layer.index: (layer, c_layer) for layer, c_layer in
                zip(layers, c_layers, strict=True)}
    d_h = layers[0].head_dim
    todo = {}
    for layer_index, heads in checked_plan(plan, layers).items():
        inner = [(head, rank) for head, rank in heads if 1 <= rank < d_h]
        if inner:
            todo[layer_index] = inner
    if family.rotary:  # rotary forms map the whole query, not its first columns
        return family, by_index, todo
    for layer_index in sorted(todo):
        layer, c_layer = by_index[layer_index]
        cq, ck, _ = augmented_weights(c_layer)
        for head, rank in todo[layer_index]:
            g = int(c_layer.kv_index[head])
            if np.any(cq[head][:, rank:] != 0) or np.any(ck[g][:, rank:] != 0):
                raise ValueError(f"Head {layer_index}.{head} of `compressed` has query or key "
                                 f"columns beyond its planned rank {rank}: is `plan` the plan "
                                 "it was compressed with?")
    return family, by_index, todo


def refine_compressed(model, compressed, plan, texts, *, tokenizer=None, train_steps=15,
                      train_weighting="tokens", max_length=64, batch_size=32, progress=None):
    """Re-fit a compressed model's query-key pairs layer by layer, on its own inputs.

    :func:`compress_heads` writes pairs fitted on the *original* model's inputs to each layer;
    in the compressed model, layer ``l`` sees inputs already changed by the compressed layers
    below it, for which no pair was fitted, and the errors compound through the layers. This
    is the sequential fix of post-training compression: for each layer in turn, the inputs of
    layer ``l`` are captured from the model refined so far (the layers below already
    replaced), and each planned head's rank-``r`` pair, started from the compressed model's,
    is trained (L-BFGS, as the trained pairs of :func:`head_deficiency`) so that the head's
    output on those inputs reproduces the *original* head's output on the original inputs;
    its value map, the output projection and every other weight stay fixed. Then the layer's
    pairs are written in and the next layer is refined. Memory holds one layer's
    activations (of both models).

    Parameters
    ----------
    model : transformers model or path
        The original model (or the directory of a saved one).
    compressed : transformers model
        Its compressed copy (:func:`compress_heads` with ``plan``); it is not modified.
    plan : ResultTable or mapping
        The plan ``compressed`` was made with: a :func:`plan_ranks` table or ``{(layer,
        head): rank}``. Each head at rank ``1 <= r < d_h`` is refined; its query and key
        columns beyond ``r`` must be zero in ``compressed``.
    texts : list of str
        Calibration text. Never the text the refined model is evaluated on.
    tokenizer : transformers tokenizer, default=None
        Needed unless ``model`` is a directory holding one.
    train_steps : int, default=15
        L-BFGS iterations per pair. The pair is kept as it was if training does not lower its
        error.
    train_weighting : {"tokens", "texts"}, default="tokens"
        The loss: the output error summed over tokens, or every text's relative error alike
        (as in :func:`head_deficiency`).
    max_length : int, default=64
        Tokens per text at most.
    batch_size : int, default=32
        Texts per forward pass of the models.
    progress : callable, default=None
        Called as ``progress(done, total)`` after each refined head.

    Returns
    -------
    refined : transformers model
        A copy of ``compressed`` in which only the refined heads' query and key projection
        weights (and biases) differ. Rotary models are returned unrefined, with a
        :class:`~sklearn_ebound.exceptions.RankEstimationWarning` (their rank-``r`` forms
        act on the query before its rotation and are not trained here).

    Examples
    --------
    >>> from sklearn_ebound.heads import (compress_heads, docstring_sentences,
    ...                                   head_deficiency, make_tiny_transformer, plan_ranks,
    ...                                   refine_compressed)
    >>> model, tokenizer = make_tiny_transformer("bert", n_layers=2)
    >>> texts = docstring_sentences(["json"])[:8]
    >>> result = head_deficiency(model, texts, tokenizer=tokenizer, methods=("data",))
    >>> plan = plan_ranks(result, budget=0.5, method="data")
    >>> compressed = compress_heads(model, result, plan, method="data")
    >>> refined = refine_compressed(model, compressed, plan, texts, tokenizer=tokenizer,
    ...                             train_steps=3)
    >>> type(refined).__name__
    'BertModel'
    """
    model, tokenizer = model_source(model, tokenizer)
    texts = check_texts(texts, "texts")
    for name, value in (("train_steps", train_steps), ("max_length", max_length),
                        ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
            raise ValueError(f"`{name}` must be a positive integer. Got {value!r}.")
    if train_weighting not in ("tokens", "texts"):
        raise ValueError(f"`train_weighting` must be 'tokens' or 'texts'. Got "
                         f"{train_weighting!r}.")
    if progress is not None and not callable(progress):
        raise TypeError(f"`progress` must be callable or None. Got {type(progress).__name__}.")
    family, by_index, todo = _planned_heads(model, compressed, plan)
    refined = copy.deepcopy(compressed)
    if family.rotary:
        warnings.warn("Rotary heads are not refined (their rank-r forms act on the query "
                      "before its rotation; distill_compressed trains them): the compressed "
                      "model is returned as it is.", RankEstimationWarning, stacklevel=2)
        return refined
    torch = require("torch")
    causal = family.is_causal(model.config)
    d_h = next(iter(by_index.values()))[0].head_dim
    total, done = sum(len(v) for v in todo.values()), 0
    for layer_index in sorted(todo):
        layer, c_layer = by_index[layer_index]
        batches = []
        for source in (model, refined):  # the original's inputs, then the refined model's
            seqs, _ = capture_inputs(source, [layer], texts, tokenizer, rotary=False,
                                     max_length=max_length, batch_size=batch_size,
                                     stop_early=True)
            batches.append(HeadBatches(seqs[0], None, causal, torch.float64))
        reference, inputs = batches
        wq, wk, wv = augmented_weights(layer)
        cq, ck, _ = augmented_weights(c_layer)
        for head, rank in todo[layer_index]:
            g = int(layer.kv_index[head])
            _, _, new_q, new_k = train_head(
                inputs, None, wq[head], wk[g], wv[g], None, rank, d_h, train_steps,
                start=(cq[head][:, :rank], ck[g][:, :rank]), reference={"cal": reference},
                weighting=train_weighting)
            out_q, out_k = np.zeros_like(wq[head]), np.zeros_like(wk[g])
            out_q[:, :rank], out_k[:, :rank] = new_q, new_k
            family.write_head(refined, layer, head, g, out_q, out_k)
            done += 1
            if progress is not None:
                progress(done, total)
        del batches, reference, inputs
    return refined


OBJECTIVES = ("embedding", "hidden", "layers", "next_token")


def _trainable_masks(model, family, by_index, todo):
    """``({parameter name: bool mask}, projectors)``: what the distillation may move.

    In a head without rotary positions the planned columns of its query and key maps. A
    rotary head's rank-``r`` query map is ``W~_Q' = F A^T`` with ``A`` (``d_h x r``) fixed by
    its form and its (shared) keys whole: every query entry of the head is trainable, and
    after each step the head's block is projected back onto the span of ``A``
    (``projectors``: ``{parameter name: [(row slice, P)]}``, ``P = A A^+``), so that its
    rank stays ``r`` and no key of another head moves.
    """
    if family.rotary:
        return _rotary_trainable(model, family, by_index, todo)
    masks = {}
    for layer_index, heads in todo.items():
        for name, mask in family.column_masks(model, by_index[layer_index][0], heads).items():
            masks[name] = masks[name] | mask if name in masks else mask
    return masks, {}


def _kept_trainable(model, compressed, channels):
    """Masks of the kept query and key channels of a shrunk form in the original's shapes."""
    from ._shrink import channel_masks, check_dropped_are_zero

    if not (hasattr(compressed, "state_dict") and hasattr(compressed, "config")):
        raise TypeError("`compressed` must be a Hugging Face model (the shrunk form in the "
                        f"original's shapes). Got {type(compressed).__name__} instead.")
    family, layers, _ = layers_of(model)
    family_c, c_layers, _ = layers_of(compressed)
    if family_c is not family or [a.w_q.shape for a in layers] != [
            b.w_q.shape for b in c_layers]:
        raise ValueError("`compressed` does not have the attention layers of `model` (is it "
                         "the shrunk form of this model in its shapes, zero_dropped's?).")
    if any(layer.normalised for layer in layers):
        raise ValueError("A family that normalises its heads keeps its projections whole: "
                         "its shrunk form is not trained here.")
    if not isinstance(channels, (list, tuple)) or not all(
            isinstance(e, dict) and {"layer", "query", "key"} <= set(e) for e in channels):
        raise ValueError("`channels` must be a list of {'layer', 'query', 'key'} dicts, as "
                         f"kept_channels returns it. Got {type(channels).__name__}.")
    check_dropped_are_zero({layer.index: layer for layer in c_layers}, channels)
    return channel_masks(compressed, channels)


def _rotary_trainable(model, family, by_index, todo):
    """Masks of the planned rotary heads' whole query blocks, and their rank-``r`` projectors."""
    torch = require("torch")
    params = dict(model.named_parameters())
    masks, projectors = {}, {}
    for layer_index, heads in todo.items():
        c_layer = by_index[layer_index][1]
        cq, _, _ = augmented_weights(c_layer)
        for head, rank in heads:
            slot = family.slots(c_layer, head, int(c_layer.kv_index[head]))[0]
            if not slot.linear:
                raise ValueError(f"`{slot.module}`: rotary heads are trained in nn.Linear "
                                 "projections only.")
            # The span of the head's rank-r query map: its top right singular vectors.
            basis = np.linalg.svd(cq[head], full_matrices=False)[2][:rank].T
            rows = slot.index(c_layer.head_dim)
            for suffix in (".weight", ".bias"):
                if slot.module + suffix not in params:
                    continue
                p = params[slot.module + suffix]
                mask = masks.setdefault(slot.module + suffix,
                                        torch.zeros_like(p, dtype=torch.bool))
                mask[rows] = True
                projectors.setdefault(slot.module + suffix, []).append(
                    (rows, torch.as_tensor(basis @ basis.T, dtype=p.dtype)))
    return masks, projectors


def _project(params, projectors):
    """Each rotary head's query block back onto its rank-``r`` span (in place)."""
    for name, blocks in projectors.items():
        p = params[name]
        for rows, P in blocks:
            p[rows] = P @ p[rows]


def _distillation_loss(objective, student, teacher, mask):
    """The objective on one batch; ``student``, ``teacher``: tuples of hidden states.

    The last entry is the last hidden state; for ``"layers"``, entry ``l >= 1`` is layer
    ``l``'s output (entry 0, the embeddings, is frozen and skipped).
    """
    torch = require("torch")
    if objective == "next_token":  # mean over predicted positions of KL(p_t || q_t)
        keep = (mask[:, :-1] & mask[:, 1:]).bool()
        log_q = torch.log_softmax(student[-1][:, :-1][keep].float(), -1)
        log_p = teacher[-1][:, :-1][keep]
        return (log_p.exp() * (log_p - log_q)).sum(-1).mean()
    m = mask[..., None].to(student[-1].dtype)
    if objective == "embedding":
        def pool(h):
            return torch.nn.functional.normalize((h * m).sum(1) / m.sum(1).clamp(min=1), dim=-1)
        return 1.0 - (pool(student[-1]) * pool(teacher[-1])).sum(-1).mean()
    pairs = zip(student[1:], teacher[1:], strict=True) if objective == "layers" else [
        (student[-1], teacher[-1])]
    losses = [(((s - t) * m) ** 2).sum() / ((t * m) ** 2).sum().clamp(min=1e-30)
              for s, t in pairs]
    return sum(losses) / len(losses)


def distill_compressed(model, compressed, plan, texts, *, tokenizer=None, channels=None,
                       objective="embedding", max_epochs=10, learning_rate=1e-4,
                       validation=0.2, patience=2, lr_backoff=None, token_noise=0.0,
                       max_length=64, batch_size=32, random_state=0, progress=None):
    """Train a compressed model's planned query-key columns end to end against the original.

    The rank-``r`` pairs of :func:`compress_heads` (and of :func:`refine_compressed`) are
    fitted head by head (or layer by layer); here every planned head's query and key columns
    ``:r`` (weights and biases) are trained at once, by Adam on the whole model's output
    against the original's on the same texts (knowledge distillation), every other weight
    frozen: the columns beyond each head's rank stay zero, the heads at rank 0 or ``d_h``,
    the value maps, output projections, feed-forward layers and embeddings stay bit for bit
    those of ``compressed``. A share ``validation`` of ``texts`` is held out for early
    stopping: after each epoch the objective on it is measured, the best state is kept, and
    training stops after ``patience`` epochs without improvement. If no epoch improves on the
    start, ``compressed``'s weights are returned as they are.

    Parameters
    ----------
    model : transformers model or path
        The original model (or the directory of a saved one).
    compressed : transformers model
        Its compressed copy (:func:`compress_heads` with ``plan``, possibly refined); it is
        not modified.
    plan : ResultTable, mapping or None
        The plan ``compressed`` was made with: a :func:`plan_ranks` table or ``{(layer,
        head): rank}``. Each head at rank ``1 <= r < d_h`` is trained; its query and key
        columns beyond ``r`` must be zero in ``compressed``. Not read (``None`` will do)
        when ``channels`` is given.
    texts : list of str
        Calibration text, split into training and validation texts. Never the text the
        distilled model is evaluated on.
    tokenizer : transformers tokenizer, default=None
        Needed unless ``model`` is a directory holding one.
    channels : list of dict, default=None
        The channels a shrunk form keeps (:func:`~._shrink.kept_channels`): ``compressed``
        is then that form in the original's shapes (:func:`~._shrink.zero_dropped`, or
        :func:`compress_model`'s ``form="shrunk"``, its dropped channels zero), and the
        trained entries are the kept query and key channels of every head that drops some
        (for a rotary head its whole kept planes, queries and shared keys alike); the
        dropped ones stay zero, so :func:`~._shrink.save_shrunk` writes the result.
    objective : {"embedding", "hidden", "layers", "next_token"}, default="embedding"
        The loss against the original, averaged over the texts of a batch:
        ``"embedding"``, one minus the cosine of the mean-pooled normalised last hidden
        states (the sentence embedding); ``"hidden"``, the relative squared error of the last
        hidden state over the batch's tokens; ``"layers"``, that relative error averaged over
        every layer's output (layer-wise distillation); ``"next_token"`` (a causal language
        model, :func:`is_language_model`), the mean over the predicted positions of the KL
        divergence of the next-token distributions to the original's, the measure of
        :func:`next_token_kl`.
    max_epochs : int, default=10
        Passes over the training texts at most.
    learning_rate : float, default=1e-4
        Adam's step size.
    validation : float, default=0.2
        Share of ``texts`` held out for early stopping, in ``(0, 1)``; at least one text.
    patience : int, default=2
        Epochs without a lower validation objective before training stops.
    lr_backoff : float, default=None
        If given (in ``(0, 1)``), an epoch without a lower validation objective sends the
        columns back to the best state so far and multiplies the learning rate by this
        factor before the next epoch (``patience`` still counts those epochs), so that one
        learning rate serves models whose start is far from or close to the original's.
        ``None``: training goes on from where the epoch left it, at the same rate.
    token_noise : float, default=0.0
        If positive, every training step also distils on a copy of the batch in which each
        token (padding and special tokens apart) is replaced, with this probability, by a
        token drawn uniformly from the vocabulary, fresh at every step; the loss is the mean
        of the two. The original labels nothing, so any input is training data: the noise
        shows the pairs words and contexts the calibration text lacks. The validation
        texts stay clean.
    max_length : int, default=64
        Tokens per text at most.
    batch_size : int, default=32
        Texts per step.
    random_state : int, RandomState instance or None, default=0
        The validation split and the order of the batches.
    progress : callable, default=None
        Called as ``progress(epoch, max_epochs)`` after each epoch.

    Returns
    -------
    distilled : transformers model
        A copy of ``compressed`` in which only the planned query and key columns differ. It
        carries ``distillation_`` (a dict): ``train_loss`` and ``validation_loss`` per epoch
        (the objective on the clean training and validation texts, entry 0 before training,
        entry ``e`` after epoch ``e``), ``learning_rate`` (of each epoch), ``best_epoch``,
        ``objective``. In a rotary head the trained entries are its query map, kept at rank
        ``r`` on the span its form chose (projected back after each step); its keys, shared
        by the heads of a group, stay as they are.

    See Also
    --------
    refine_compressed : re-fits each head's own output, layer by layer.

    Examples
    --------
    >>> from sklearn_ebound.heads import (compress_heads, distill_compressed,
    ...                                   docstring_sentences, head_deficiency,
    ...                                   make_tiny_transformer, plan_ranks)
    >>> model, tokenizer = make_tiny_transformer("bert", n_layers=2)
    >>> texts = docstring_sentences(["json"])[:10]
    >>> result = head_deficiency(model, texts, tokenizer=tokenizer, methods=("data",))
    >>> plan = plan_ranks(result, budget=0.5, method="data")
    >>> compressed = compress_heads(model, result, plan, method="data")
    >>> distilled = distill_compressed(model, compressed, plan, texts, tokenizer=tokenizer,
    ...                                max_epochs=2, batch_size=4)
    >>> len(distilled.distillation_["validation_loss"])
    3
    """
    from sklearn.utils import check_random_state

    model, tokenizer = model_source(model, tokenizer)
    texts = check_texts(texts, "texts")
    n_val = _check_distillation(objective, max_epochs, learning_rate, validation, patience,
                                token_noise, max_length, batch_size, progress, len(texts))
    if lr_backoff is not None and (isinstance(lr_backoff, bool) or not isinstance(
            lr_backoff, Real) or not 0 < lr_backoff < 1):
        raise ValueError(f"`lr_backoff` must be a float in (0, 1) or None. Got "
                         f"{lr_backoff!r}.")
    if objective == "next_token" and not (is_language_model(model)
                                           and is_language_model(compressed)):
        raise ValueError("objective='next_token' needs causal language models (with their "
                         f"language-model heads). Got {type(model).__name__}.")
    if channels is None:
        family, by_index, todo = _planned_heads(model, compressed, plan)
        masks, projectors = _trainable_masks(compressed, family, by_index, todo)
    else:
        masks, projectors = _kept_trainable(model, compressed, channels), {}
    distilled = copy.deepcopy(compressed)
    rng = check_random_state(random_state)
    order = rng.permutation(len(texts))
    val_texts = [texts[i] for i in np.sort(order[:n_val])]
    train_texts = [texts[i] for i in order[n_val:]]
    was_training = model.training
    model.eval()
    distilled.eval()  # no dropout: the objective is the deterministic model's
    noise = _TokenNoise(model, tokenizer, token_noise, rng) if token_noise else None
    teacher = _Teacher(model, tokenizer, objective, max_length, batch_size)
    train, val = teacher.batches(train_texts), teacher.batches(val_texts)
    with _only_trainable(distilled, masks) as params:
        history, best_epoch = _distill_epochs(
            distilled, params, (masks, projectors), train, val, teacher, noise,
            dict(lr=float(learning_rate), max_epochs=max_epochs, patience=patience,
                 backoff=lr_backoff), rng,
            progress)
    model.train(was_training)
    distilled.distillation_ = dict(history, best_epoch=best_epoch, objective=objective)
    return distilled


def _check_distillation(objective, max_epochs, learning_rate, validation, patience,
                        token_noise, max_length, batch_size, progress, n_texts):
    """Check :func:`distill_compressed`'s options; the number of validation texts."""
    if objective not in OBJECTIVES:
        raise ValueError(f"`objective` must be one of {list(OBJECTIVES)}. Got {objective!r}.")
    for name, value in (("max_epochs", max_epochs), ("patience", patience),
                        ("max_length", max_length), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
            raise ValueError(f"`{name}` must be a positive integer. Got {value!r}.")
    if isinstance(learning_rate, bool) or not isinstance(learning_rate, Real) or not (
            0 < learning_rate < np.inf):
        raise ValueError(f"`learning_rate` must be a positive float. Got {learning_rate!r}.")
    if isinstance(validation, bool) or not isinstance(validation, Real) or not (
            0 < validation < 1):
        raise ValueError(f"`validation` must be a float in (0, 1). Got {validation!r}.")
    if isinstance(token_noise, bool) or not isinstance(token_noise, Real) or not (
            0 <= token_noise < 1):
        raise ValueError(f"`token_noise` must be a float in [0, 1). Got {token_noise!r}.")
    n_val = int(round(validation * n_texts))
    if not 1 <= n_val < n_texts:
        raise ValueError(f"`validation`={validation} leaves {n_val} of the {n_texts} texts "
                         "for validation; it needs at least one, and one to train on.")
    if progress is not None and not callable(progress):
        raise TypeError(f"`progress` must be callable or None. Got {type(progress).__name__}.")
    return n_val


class _Teacher:
    """The original model's targets for the distillation objective, batch by batch."""

    def __init__(self, model, tokenizer, objective, max_length, batch_size):
        self.model, self.tokenizer, self.objective = model, tokenizer, objective
        self.max_length, self.batch_size = max_length, batch_size

    def targets(self, batch):
        """The hidden states the objective compares: the last one, or all for ``"layers"``."""
        torch = require("torch")
        with torch.no_grad():
            if self.objective == "next_token":  # the log-probabilities of the next token
                return (torch.log_softmax(self.model(**batch).logits.float(), -1),)
            hidden = self.model(**batch, output_hidden_states=True).hidden_states
        keep = hidden if self.objective == "layers" else hidden[-1:]
        return tuple(t.detach() for t in keep)

    def batches(self, texts):
        """``[(batch, targets), ...]`` of ``texts``."""
        return [(dict(batch), self.targets(dict(batch))) for batch in
                token_batches(self.tokenizer, texts, self.max_length, self.batch_size)]


class _TokenNoise:
    """Copies of a batch in which a share of the tokens is drawn uniformly from the vocabulary.

    Padding and special tokens are kept; the draws come from ``rng``, fresh at every call.
    """

    def __init__(self, model, tokenizer, share, rng):
        torch = require("torch")
        everything = np.arange(int(model.config.vocab_size))
        self.vocabulary = np.setdiff1d(
            everything, list(getattr(tokenizer, "all_special_ids", None) or []))
        self.special = torch.as_tensor(np.setdiff1d(everything, self.vocabulary))
        self.share, self.rng = share, rng

    def __call__(self, batch):
        torch = require("torch")
        ids = batch["input_ids"]
        keep = (batch["attention_mask"] == 0) | torch.isin(ids, self.special)
        draw = torch.as_tensor(self.rng.random_sample(ids.shape) < self.share) & ~keep
        new = torch.as_tensor(self.vocabulary[self.rng.randint(len(self.vocabulary),
                                                               size=ids.shape)],
                              dtype=ids.dtype)
        return dict(batch, input_ids=torch.where(draw, new, ids))


@contextmanager
def _only_trainable(model, masks):
    """Gradients only for the masked parameters while inside; ``{name: parameter}`` of all."""
    params = dict(model.named_parameters())
    flags = {name: p.requires_grad for name, p in params.items()}
    for name, p in params.items():
        p.requires_grad_(name in masks)
    try:
        yield params
    finally:
        for name, p in params.items():
            p.requires_grad_(flags[name])


def _objective(student, teacher, batch, target):
    """The distillation objective of ``student`` on one batch against the teacher's target."""
    if teacher.objective == "next_token":
        return _distillation_loss("next_token", (student(**batch).logits,), target,
                                  batch["attention_mask"])
    hidden = student(**batch, output_hidden_states=True).hidden_states
    return _distillation_loss(teacher.objective, hidden, target, batch["attention_mask"])


def _mean_objective(student, teacher, part):
    """The objective over batches ``part``, weighted by their texts."""
    torch = require("torch")
    with torch.no_grad():
        losses = [float(_objective(student, teacher, b, t)) * len(b["input_ids"])
                  for b, t in part]
    return sum(losses) / sum(len(b["input_ids"]) for b, _ in part)


def _distill_step(student, params, trainable, frozen, optimizer, teacher, noise, batch,
                  target):
    """One Adam step on one batch (and its noisy copy); entries outside the masks are reset
    and the rotary heads projected back onto their rank."""
    torch = require("torch")
    optimizer.zero_grad()
    loss = _objective(student, teacher, batch, target)
    if noise is not None:
        noisy = noise(batch)
        loss = 0.5 * (loss + _objective(student, teacher, noisy, teacher.targets(noisy)))
    loss.backward()
    masks, projectors = trainable
    for name, p in params.items():
        if name in masks and p.grad is not None:
            p.grad.mul_(masks[name])
    optimizer.step()
    with torch.no_grad():  # every entry outside the planned columns as it was
        for name in masks:
            params[name].copy_(torch.where(masks[name], params[name], frozen[name]))
        _project(params, projectors)


def _distill_epochs(student, params, trainable, train, val, teacher, noise, schedule, rng,
                    progress):
    """Epochs of :func:`_distill_step` with early stopping; the best state is left in place.

    Returns the history (``train_loss``, ``validation_loss``, entry 0 before training;
    ``learning_rate``, the rate of each epoch) and the best epoch (0 when none improved on
    the start). With ``schedule["backoff"]``, an epoch that does not improve sends the
    columns back to the best state and the next epoch runs at the rate times the factor.
    """
    torch = require("torch")
    masks = trainable[0]

    def snapshot():
        return {name: params[name].detach().clone() for name in masks}

    frozen = snapshot()
    lr = schedule["lr"]
    optimizer = torch.optim.Adam([params[name] for name in masks], lr=lr)
    history = {"train_loss": [_mean_objective(student, teacher, train)],
               "validation_loss": [_mean_objective(student, teacher, val)],
               "learning_rate": []}
    best, best_epoch, stale, best_state = history["validation_loss"][0], 0, 0, snapshot()
    for epoch in range(1, schedule["max_epochs"] + 1):
        history["learning_rate"].append(lr)
        for i in rng.permutation(len(train)):
            _distill_step(student, params, trainable, frozen, optimizer, teacher, noise,
                          *train[i])
        history["train_loss"].append(_mean_objective(student, teacher, train))
        history["validation_loss"].append(_mean_objective(student, teacher, val))
        if progress is not None:
            progress(epoch, schedule["max_epochs"])
        if history["validation_loss"][-1] < best:
            best, best_epoch, stale = history["validation_loss"][-1], epoch, 0
            best_state = snapshot()
        else:
            stale += 1
            if stale >= schedule["patience"]:
                break
            if schedule.get("backoff") is not None:  # back to the best, at a smaller rate
                with torch.no_grad():
                    for name in masks:
                        params[name].copy_(best_state[name])
                lr *= schedule["backoff"]
                optimizer = torch.optim.Adam([params[name] for name in masks], lr=lr)
    with torch.no_grad():
        for name in masks:
            params[name].copy_(best_state[name])
    return history, best_epoch


def _embeddings(model, texts, tokenizer, max_length, batch_size):
    torch = require("torch")
    out = []
    model.eval()
    with torch.no_grad():
        for batch in token_batches(tokenizer, texts, max_length, batch_size):
            hidden = model(**batch)[0]  # the last hidden state
            mask = batch["attention_mask"][..., None].to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)
            out.append(torch.nn.functional.normalize(pooled.double(), dim=-1).numpy())
    return np.concatenate(out)


def embedding_fidelity(original, compressed, texts, tokenizer, *, max_length=128,
                       batch_size=32):
    """Cosine of the mean-pooled, normalised embeddings of two models, text by text.

    Returns
    -------
    table : ResultTable
        Rows ``text`` (index) and ``cosine``; metadata ``mean_cosine``, ``min_cosine``.
    """
    texts = check_texts(texts, "texts")
    a = _embeddings(original, texts, tokenizer, max_length, batch_size)
    b = _embeddings(compressed, texts, tokenizer, max_length, batch_size)
    cos = np.sum(a * b, axis=1)
    return ResultTable([{"text": i, "cosine": float(c)} for i, c in enumerate(cos)],
                       mean_cosine=float(cos.mean()), min_cosine=float(cos.min()),
                       n_texts=len(texts))


def _causal_inputs(model, batch):
    """A token batch as a causal LM's inputs, and the positions whose next token is scored.

    Position ``t`` of a row predicts token ``t + 1``; it is scored when both are real tokens
    (``keep``, ``(b, n - 1)``), whichever side the tokenizer pads: a left-padded row's last
    pad position, followed by its first real token, is not. Each row's positions count its
    real tokens only (``cumsum(mask) - 1``), so a text scores alike alone and padded on
    either side, whether its model's positions are absolute or rotary.
    """
    import inspect

    mask = batch["attention_mask"].bool()
    inputs = dict(batch)
    if "position_ids" in inspect.signature(model.forward).parameters:
        inputs["position_ids"] = (mask.long().cumsum(-1) - 1).clamp(min=0)
    return inputs, mask[:, :-1] & mask[:, 1:]


def perplexity(model, texts, tokenizer, *, max_length=128, batch_size=8):
    """Perplexity of a causal language model on ``texts`` (token-weighted, padding excluded).

    ``exp`` of the mean negative log-probability of every real token after a text's first,
    given the real tokens before it: the same with the tokenizer padding on the left or the
    right, and the same as one text at a time (see :func:`_causal_inputs`).
    """
    torch = require("torch")
    texts = check_texts(texts, "texts")
    total, count = 0.0, 0
    model.eval()
    with torch.no_grad():
        for batch in token_batches(tokenizer, texts, max_length, batch_size):
            inputs, keep = _causal_inputs(model, batch)
            if not bool(keep.any()):
                continue
            logits = model(**inputs).logits
            for row in range(keep.shape[0]):  # one text at a time: (n, V) in float64
                log_p = torch.log_softmax(logits[row, :-1][keep[row]].double(), -1)
                target = batch["input_ids"][row, 1:][keep[row]]
                total -= float(log_p.gather(-1, target[:, None]).sum())
                count += int(keep[row].sum())
    if count == 0:
        raise ValueError("`texts` hold no token to predict (each needs at least two tokens).")
    return float(np.exp(total / count))


def next_token_kl(original, compressed, texts, tokenizer, *, max_length=128, batch_size=8):
    """Mean KL divergence of a model's next-token distributions to the original's, per token.

    At every position ``t`` of a text that has a next token, the original predicts ``p_t``
    and the compressed model ``q_t`` (softmax of their logits over the vocabulary);
    ``KL(p_t || q_t) = sum_v p_t(v) (log p_t(v) - log q_t(v))`` in nats, zero if and only if
    the two distributions agree. Beside the perplexity, which only scores the probability of
    the token that came, it measures how much of the whole distribution the compression
    kept: a model can keep its perplexity while moving mass among the tokens that did not
    come.

    Parameters
    ----------
    original, compressed : transformers causal language models
        Models with a language-model head over the same vocabulary (``...ForCausalLM``).
    texts : list of str
        Held-out text (not the text the compression was calibrated on).
    tokenizer : transformers tokenizer
    max_length : int, default=128
        Tokens per text at most.
    batch_size : int, default=8
        Texts per forward pass.

    Returns
    -------
    table : ResultTable
        Rows ``text`` (index), ``kl`` (mean over the text's predicted positions, NaN for a
        one-token text) and ``n_tokens``; metadata ``mean_kl`` (the mean over all predicted
        positions of all texts, token-weighted as the perplexity is), ``max_kl`` (the worst
        text's mean), ``n_texts``, ``n_tokens``.

    Examples
    --------
    >>> from sklearn_ebound.heads import make_tiny_transformer, next_token_kl
    >>> model, tokenizer = make_tiny_transformer("gpt2")
    >>> texts = ["one two three four", "five six seven eight"]
    >>> next_token_kl(model, model, texts, tokenizer).mean_kl
    0.0
    """
    torch = require("torch")
    texts = check_texts(texts, "texts")
    for name, value in (("original", original), ("compressed", compressed)):
        if not is_language_model(value):
            raise TypeError(f"`{name}` must be a causal language model (a model with a "
                            f"language-model head). Got {type(value).__name__} instead.")
    for name, value in (("max_length", max_length), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
            raise ValueError(f"`{name}` must be a positive integer. Got {value!r}.")
    sums, counts = [], []
    modes = original.training, compressed.training
    original.eval()
    compressed.eval()
    try:
        with torch.no_grad():
            for batch in token_batches(tokenizer, texts, max_length, batch_size):
                inputs, keep_all = _causal_inputs(original, batch)
                p_logits = original(**inputs).logits
                q_logits = compressed(**_causal_inputs(compressed, batch)[0]).logits
                if p_logits.shape != q_logits.shape:
                    raise ValueError("`original` and `compressed` predict over different "
                                     f"vocabularies ({p_logits.shape[-1]} and "
                                     f"{q_logits.shape[-1]} tokens).")
                for row in range(keep_all.shape[0]):  # one text at a time: (n, V) in float64
                    keep = keep_all[row]  # position t predicts token t + 1, both real
                    log_p = torch.log_softmax(p_logits[row, :-1][keep].double(), -1)
                    log_q = torch.log_softmax(q_logits[row, :-1][keep].double(), -1)
                    kl = (log_p.exp() * (log_p - log_q)).sum(-1)
                    sums.append(float(kl.sum()))
                    counts.append(int(keep.sum()))
    finally:
        original.train(modes[0])
        compressed.train(modes[1])
    total = sum(counts)
    if total == 0:
        raise ValueError("`texts` hold no token to predict (each needs at least two tokens).")
    per_text = [s / n if n else float("nan") for s, n in zip(sums, counts, strict=True)]
    return ResultTable([{"text": i, "kl": kl, "n_tokens": n}
                        for i, (kl, n) in enumerate(zip(per_text, counts, strict=True))],
                       mean_kl=float(sum(sums) / total), max_kl=float(np.nanmax(per_text)),
                       n_texts=len(texts), n_tokens=total)


def is_language_model(model):
    """Whether ``model`` is a causal language model: a causal family with an LM head.

    Its end-to-end measure is then the next-token one (:func:`perplexity`,
    :func:`next_token_kl`); otherwise (an encoder, a bare decoder without its head) the
    sentence embedding (:func:`embedding_fidelity`).
    """
    if not (hasattr(model, "state_dict") and hasattr(model, "config")):
        return False
    try:
        family = family_of(model)
    except ValueError:  # attention of no known family
        return False
    return family.is_language_model(model)


STRATEGIES = {"uniform": ("data", "uniform"), "weight": ("weight", "tolerance"),
              "data": ("data", "tolerance"), "plan": ("trained", "greedy")}


def compression_frontier(model, result, texts, tokenizer, *, budgets=(0.2, 0.3, 0.4, 0.5),
                         strategies=tuple(STRATEGIES), max_length=128, batch_size=32):
    """End-to-end fidelity of compressed models against the budget, for several strategies.

    ``"uniform"``: the same rank for every head (data-aware forms); ``"weight"``: one
    tolerance on the weight-space curves, weight-space forms; ``"data"``: one tolerance on the
    data-aware curves, data-aware forms; ``"plan"``: the package's plan, greedy by marginal
    error on the achievable curves, with the trained pairs where there are any.

    For a sentence-embedding model (no language-model head) the measure is the cosine of
    the mean-pooled normalised embeddings to the original's (mean and min over ``texts``);
    for a causal language model (:func:`is_language_model`), the perplexity on ``texts``
    and the mean KL divergence of the next-token distributions to the original's
    (:func:`next_token_kl`).

    Returns
    -------
    frontier : ResultTable
        Rows ``strategy``, ``budget``, ``budget_used`` and ``mean_cosine``, ``min_cosine`` or
        ``perplexity``, ``kl``; metadata ``measure`` and, for a language model,
        ``perplexity_original``.
    """
    texts = check_texts(texts, "texts")
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown:
        raise ValueError(f"`strategies` must be among {list(STRATEGIES)}. Got {unknown}.")
    lm = is_language_model(model)
    meta = {"measure": "perplexity" if lm else "cosine"}
    reference = None
    if lm:
        meta["perplexity_original"] = perplexity(model, texts, tokenizer, max_length=max_length)
    else:
        reference = _embeddings(model, texts, tokenizer, max_length, batch_size)
    rows = []
    for strategy in strategies:
        method, allocation = STRATEGIES[strategy]
        if np.isnan(plan_curves(result, "data" if method == "trained" else method)).all():
            continue
        for budget in budgets:
            plan = plan_ranks(result, budget=budget, method=method, allocation=allocation)
            compressed = compress_heads(model, result, plan, method=method)
            row = {"strategy": strategy, "budget": float(budget),
                   "budget_used": plan.budget_used}
            if lm:
                row["perplexity"] = perplexity(compressed, texts, tokenizer,
                                               max_length=max_length)
                row["kl"] = next_token_kl(model, compressed, texts, tokenizer,
                                          max_length=max_length).mean_kl
            else:
                cos = np.sum(reference * _embeddings(compressed, texts, tokenizer, max_length,
                                                     batch_size), axis=1)
                row.update(mean_cosine=float(cos.mean()), min_cosine=float(cos.min()))
            rows.append(row)
            del compressed
    return ResultTable(rows, **meta)


