"""The planned heads fitted again on all the text: the final fit after a plan was judged.

:func:`head_deficiency` splits its text: the calibration part fits the rank-``r`` forms and
trained pairs, the evaluation part measures them, and the plan is chosen and judged on
what the split shows. Once the plan is fixed, the split has done its work; the model to
keep is the same fit on every text, as a grid search refits its best estimator on all the
data after cross-validation. :func:`refit_heads` does that fit: layer by layer, the
original model's inputs to the layer on all of ``texts`` give the data-aware metric, each
planned head's rank-``r`` form is read in it (:class:`HeadForms`) and, with
``train_steps``, trained from there (:func:`train_head`), and the result is written into a
copy of the model. The split's measure of the same procedure is then an estimate of the
refit model's on new text.
"""

import copy
from numbers import Integral

from ._compression import checked_plan
from ._deficiency import rank_factors, train_head
from ._head_forms import (
    HeadBatches,
    HeadForms,
    augmented_weights,
    check_texts,
    data_metric_roots,
    layers_of,
    model_source,
)
from ._inputs import capture_inputs, require

__all__ = ["refit_heads"]


def _check_refit(train_steps, shrinkage, train_weighting, max_length, batch_size, progress):
    if isinstance(train_steps, bool) or not isinstance(train_steps, Integral) or train_steps < 0:
        raise ValueError(f"`train_steps` must be a non-negative integer. Got {train_steps!r}.")
    if isinstance(shrinkage, bool) or not 0 <= shrinkage <= 1:
        raise ValueError(f"`shrinkage` must be a float in [0, 1]. Got {shrinkage!r}.")
    if train_weighting not in ("tokens", "texts"):
        raise ValueError(f"`train_weighting` must be 'tokens' or 'texts'. Got "
                         f"{train_weighting!r}.")
    for name, value in (("max_length", max_length), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
            raise ValueError(f"`{name}` must be a positive integer. Got {value!r}.")
    if progress is not None and not callable(progress):
        raise TypeError(f"`progress` must be callable or None. Got {type(progress).__name__}.")


def refit_heads(model, plan, texts, *, tokenizer=None, train_steps=15, shrinkage=0.0,
                train_weighting="tokens", max_length=64, batch_size=32, progress=None):
    """A copy of ``model`` whose planned heads are fitted at their ranks on all of ``texts``.

    The same fit as :func:`head_deficiency` followed by :func:`compress_heads`, with no
    evaluation part: the data-aware metric of each layer is read from every text, each
    head of ``plan`` gets its rank-``r`` form in it and, with ``train_steps > 0``, the pair
    trained from that form (``train_steps`` L-BFGS iterations on the head's output over all
    the texts; kept as it started if training does not lower the error). Rotary heads keep
    the form (their query map; the trained step does not take them, as in
    :func:`head_deficiency`). Only the query and key projections change; every other weight
    is the original's bit for bit. Memory holds one layer's activations.

    Use it once a plan has been chosen and judged on a split of the text (its fit on the
    calibration part, its measure on the evaluation part, which then estimates what the
    refit model keeps on new text): the refit sees twice the text of a half split.

    Parameters
    ----------
    model : transformers model or path
        The original model (or the directory of a saved one).
    plan : ResultTable or mapping
        A :func:`plan_ranks` table or ``{(layer, head): rank}``; heads it leaves out keep
        their weights.
    texts : list of str
        The text to fit on: every text counts. Never the text the refit model is judged on.
    tokenizer : transformers tokenizer, default=None
        Needed unless ``model`` is a directory holding one.
    train_steps : int, default=15
        L-BFGS iterations per planned pair; ``0`` writes the data-aware forms.
    shrinkage : float, default=0.0
        As in :func:`head_deficiency`: the metric shrunk towards the weights' own.
    train_weighting : {"tokens", "texts"}, default="tokens"
        As in :func:`head_deficiency`.
    max_length : int, default=64
        Tokens per text at most.
    batch_size : int, default=32
        Texts per forward pass.
    progress : callable, default=None
        Called as ``progress(done, total)`` after each planned head.

    Returns
    -------
    refit : transformers model

    See Also
    --------
    head_deficiency : the split fit whose measure the refit stands on.
    refine_compressed : re-fits a compressed model's pairs on its own inputs.

    Examples
    --------
    >>> import torch
    >>> from sklearn_ebound.heads import docstring_sentences, make_tiny_transformer, refit_heads
    >>> model, tokenizer = make_tiny_transformer("bert")
    >>> texts = docstring_sentences(["json"])[:8]
    >>> refit = refit_heads(model, {(0, 0): 2, (0, 1): 3}, texts, tokenizer=tokenizer,
    ...                     train_steps=2)
    >>> int(torch.linalg.matrix_rank(refit.encoder.layer[0].attention.self.query.weight[:8]))
    2
    """
    torch = require("torch")
    model, tokenizer = model_source(model, tokenizer)
    texts = check_texts(texts, "texts")
    _check_refit(train_steps, shrinkage, train_weighting, max_length, batch_size, progress)
    family, layers, _ = layers_of(model)
    todo = checked_plan(plan, layers)
    by_index = {layer.index: layer for layer in layers}
    causal = family.is_causal(model.config)
    refit = copy.deepcopy(model)
    total, done = sum(len(heads) for heads in todo.values()), 0
    for layer_index in sorted(todo):
        layer = by_index[layer_index]
        seqs, _ = capture_inputs(model, [layer], texts, tokenizer, rotary=False,
                                 max_length=max_length, batch_size=batch_size,
                                 stop_early=True)
        batches = HeadBatches(seqs[0], None, causal, torch.float64)
        roots = data_metric_roots([batches], shrinkage)
        wq, wk, wv = augmented_weights(layer)
        for head, rank in todo[layer_index]:
            g = int(layer.kv_index[head])
            forms = HeadForms(wq[head], wk[g], family.rotary, *roots)
            pair = None
            if train_steps and not family.rotary and 1 <= rank < layer.head_dim:
                pair = train_head(batches, None, wq[head], wk[g], wv[g], forms, rank,
                                  layer.head_dim, train_steps, weighting=train_weighting)[2:]
            new_q, new_k = rank_factors(wq[head], wk[g], forms, rank, pair)
            family.write_head(refit, layer, head, g, new_q, new_k)
            done += 1
            if progress is not None:
                progress(done, total)
        del seqs, batches
    return refit
