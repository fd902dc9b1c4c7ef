"""The whole compression in one call: curves, plan, compressed model, its measure, its files.

:func:`compress_model` chains what ``ebound heads --compress`` does: the deficiency curves of
every head on half of the text (:func:`head_deficiency`, resumable from a checkpoint folder),
a plan under a budget or a tolerance (:func:`plan_ranks`, priced for a causal language model
by each head's Fisher weight, :func:`head_sensitivity`), the compressed model
(:func:`compress_heads`, or whole rotary planes per key head, :mod:`._shrink`), the optional
training, refinement and refit steps, and the end-to-end measure on the other half: the
perplexity and next-token KL of a causal language model, the sentence-embedding cosine of
any other model. The report is a :class:`CompressionReport`.
"""

from dataclasses import dataclass
from numbers import Integral, Real
from pathlib import Path

import numpy as np

from .._compress_defaults import ENCODER_AUTO, LANGUAGE_MODEL_AUTO
from .._utils.results import ResultTable
from ._compression import (
    compress_heads,
    distill_compressed,
    embedding_fidelity,
    is_language_model,
    next_token_kl,
    perplexity,
    refine_compressed,
)
from ._deficiency import head_deficiency
from ._head_forms import check_texts, layers_of, model_source
from ._latent_keys import fit_latent_keys, latent_channels, latent_widths, shared_widths
from ._planning import plan_ranks
from ._refit import refit_heads
from ._sensitivity import head_sensitivity
from ._shrink import (
    check_shrinkable,
    fold_plane_maps,
    kept_channels,
    plane_maps,
    plane_plan,
    qk_sizes,
    save_shrunk,
    shrunk_model,
    zero_dropped,
)

__all__ = ["CompressionReport", "compress_model", "ENCODER_AUTO", "LANGUAGE_MODEL_AUTO"]


ALLOCATIONS = ("auto", "greedy", "fisher", "taylor", "uniform")
REFINES = ("auto", "none", "sequential", "distill")
REFITS = ("auto", "all", "none")
FORMS = ("shrunk", "latent", "latent-shared", "query", "auto")
LATENT_FORMS = ("latent", "latent-shared")  # the projections whole, maps after the rotation
DEFAULT_BUDGET = 0.4


class CompressionReport(ResultTable):
    """What :func:`compress_model` did and measured.

    One row per head: ``layer``, ``head``, the eps-ranks of every measured method
    (``{method}_rank_{eps}``), ``plan_rank``, ``plan_error`` (the planned form's relative
    output error on the evaluation half) and, when pairs were trained, ``plan_error_trained``.

    Metadata (also attributes): ``deficiency`` (the :class:`HeadDeficiencyResult`), ``plan``
    (the :func:`plan_ranks` table), ``fidelity`` (a dict: ``measure`` and, for a causal
    language model, ``original``, ``compressed``, ``ratio`` of the perplexities, ``mean_kl``,
    ``max_kl``; for any other model the cosine ``mean`` and ``min``; ``refit_lines`` when the
    written model was fitted again on every line), ``language_model``, ``methods`` (the
    curves measured), ``budget``, ``eps``, ``allocation`` (as resolved), ``train_steps``,
    ``refine``, ``refit``, ``form``, ``fit_planes`` (whether the kept planes' scaled rotations
    were fitted), ``kept`` (``{"curves": n, "trained pairs": n}``, layers
    read back from ``checkpoint``), ``measured_distillation`` and ``written_distillation``
    (the distillation histories, ``None`` without one), ``channels`` (the query and key
    channels each layer keeps, :func:`~._shrink.kept_channels`), ``qk_parameters`` and
    ``key_cache_channels`` (``{"original": n, "compressed": n}``: query and key weights and
    biases, and key channels cached per token, summed over the layers), ``out`` (the
    directory written, or ``None``).
    """


def _choice(value, choices, name):
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"`{name}` must be one of {list(choices)}. Got {value!r}.")
    return value


def _check_options(budget, eps, allocation, train_steps, refine, refit, calibration,
                   max_length, form, fit_planes):
    if budget is not None and eps is not None:
        raise ValueError("Give one of `budget` and `eps`, not both.")
    if eps is None:
        budget = DEFAULT_BUDGET if budget is None else budget
        if isinstance(budget, bool) or not isinstance(budget, Real) or not 0 < budget <= 1:
            raise ValueError(f"`budget` must be a number in (0, 1]. Got {budget!r}.")
    elif isinstance(eps, bool) or not isinstance(eps, Real) or not 0 < eps < 1:
        raise ValueError(f"`eps` must be a number in (0, 1). Got {eps!r}.")
    _choice(allocation, ALLOCATIONS, "allocation")
    if train_steps != "auto" and (isinstance(train_steps, bool) or not isinstance(
            train_steps, Integral) or train_steps < 0):
        raise ValueError(f"`train_steps` must be 'auto' or an integer >= 0. Got "
                         f"{train_steps!r}.")
    _choice(refine, REFINES, "refine")
    _choice(refit, REFITS, "refit")
    _choice(form, FORMS, "form")
    if not isinstance(fit_planes, bool):
        raise ValueError(f"`fit_planes` must be True or False. Got {fit_planes!r}.")
    if isinstance(calibration, bool) or not isinstance(calibration, Real) or not (
            0 < calibration < 1):
        raise ValueError(f"`calibration` must be a number in (0, 1). Got {calibration!r}.")
    if isinstance(max_length, bool) or not isinstance(max_length, Integral) or max_length < 1:
        raise ValueError(f"`max_length` must be a positive integer. Got {max_length!r}.")
    return budget


def _stage(progress, label):
    """The per-step callback of ``label`` from a ``progress`` factory (``None`` without)."""
    return None if progress is None else progress(label)


def compress_model(model, texts, *, tokenizer=None, budget=None, eps=None, allocation="auto",
                   train_steps="auto", refine="auto", refit="auto", form="auto",
                   fit_planes=True, calibration=0.5, max_length=128, random_state=0,
                   checkpoint=None, out=None, progress=None, on_layer=None):
    """Compress a model's query-key maps under a budget and measure what it keeps.

    The texts are split at random into a calibration half and an evaluation half. The
    deficiency curves of every head are measured on the evaluation half (data-aware forms
    calibrated on the other; the weight-space forms too unless the model is a causal
    language model, whose plan never uses them); :func:`plan_ranks` spends ``budget`` (or
    gives each head its ``eps``-rank); the compressed model takes the planned ranks
    (optionally trained pairs, a refinement, a refit on every line); it is measured against
    the original on the evaluation half, and written to ``out``.

    Parameters
    ----------
    model : transformers model or path
        A Hugging Face model (BERT-, GPT-2-, LLaMA-style or Gemma 3) or the directory of a
        saved one. It is not modified.
    texts : list of str
        Real text, one sentence or passage per entry; at least 4 non-empty.
    tokenizer : transformers tokenizer, default=None
        Needed unless ``model`` is a directory holding one.
    budget : float, default=None
        Total query-key rank kept, a fraction in ``(0, 1]`` of the full rank; ``None``: 0.4
        unless ``eps`` is given.
    eps : float, default=None
        Tolerance in ``(0, 1)`` instead of a budget: each head at its smallest rank of
        relative output error ``<= eps``.
    allocation : {"auto", "greedy", "fisher", "taylor", "uniform"}, default="auto"
        How the budget is shared (:func:`plan_ranks`); ``"auto"``: ``"fisher"`` for a causal
        language model (its Fisher weights read on the calibration half), ``"greedy"``
        otherwise. ``"fisher"`` and ``"taylor"`` need a causal language model.
    train_steps : int or "auto", default="auto"
        L-BFGS steps training the planned pairs in a second pass (0: none); ``"auto"``: 15
        for an encoder, 0 for a causal language model (:data:`ENCODER_AUTO`,
        :data:`LANGUAGE_MODEL_AUTO`).
    refine : {"auto", "none", "sequential", "distill"}, default="auto"
        :func:`refine_compressed` (layer by layer) or :func:`distill_compressed` (end to
        end) before measuring; ``"auto"``: ``"distill"`` for an encoder, ``"none"`` for a
        causal language model. A rotary model's shrunk form takes ``"distill"`` (its kept
        planes trained on the calibration half, the dropped ones staying zero; not for heads
        normalised before their rotation) or ``"none"``.
    refit : {"auto", "all", "none"}, default="auto"
        ``"all"``: once measured, the plan's heads are fitted again (and refined) on every
        line, and that model is returned and written; ``"auto"``: ``"all"`` for an encoder,
        ``"none"`` for a causal language model.
    form : {"shrunk", "latent", "latent-shared", "query", "auto"}, default="auto"
        ``"shrunk"``: forms whose written tensors are smaller. A head without rotary
        embeddings keeps query and key maps of width ``r`` (the plan's rank-``r`` factors);
        a rotary head keeps whole rotary planes per key head, shared by its query group
        (:func:`~._shrink.plane_plan`), of its normalised queries and keys where the family
        normalises them (Gemma 3: the projections and norms stay whole, the kept channels are
        taken after the norm); ``out`` then holds a model of the kept widths.
        ``"latent"`` (rotary heads only): as many key channels as the planes, but any
        subspace of the rotated keys (:mod:`~._latent_keys`): the projections (and norms)
        stay whole, each key head caches ``A_g R k`` and its query heads meet it with ``B_g R
        q``, maps fitted on the calibration half (more of the model kept at the same key
        cache, for ``2 d_h`` numbers per latent channel). ``"latent-shared"``: one latent per
        layer shared by all its heads (multi-head latent attention: ``A`` reads every rotated
        key head side by side, so what the key heads have in common is cached once), the
        planes' key cache shared among the layers by the fitted, Fisher-priced error, each
        query head's logits a product of the whole latent's width.
        ``"query"``: the forms of :func:`compress_heads` in the original shapes (a rotary
        head's rank-``r`` map on its query; nothing shrinks in the key cache). ``"auto"``:
        ``"shrunk"`` for heads without rotary embeddings (the same model in smaller tensors),
        ``"latent-shared"`` for rotary heads with several key heads a layer (it keeps more of
        the model than ``"query"`` at half the key cache on SmolLM2-135M), ``"latent"`` for
        one (Gemma 3 270M), ``"query"`` for a family without a shrunk form.
    fit_planes : bool, default=True
        With ``form="shrunk"`` on a rotary model: each kept plane of every query head takes
        the scaled rotation ``a I + b J`` (it commutes with the plane's rotations, so it folds
        into the query map, or after a norm is the written attention's ``q_turn``) that best
        makes up, on the calibration half, for the planes dropped
        (:func:`~._shrink.plane_maps`); ``False`` keeps the planes as they are.
    calibration : float, default=0.5
        Fraction of the texts in the calibration half.
    max_length : int, default=128
        Tokens per text at most.
    random_state : int, default=0
        The split of the texts and the distillation's shuffling.
    checkpoint : path, default=None
        Folder keeping each finished layer of the curves (``deficiency_layers/``) and of the
        trained pass (``trained_layers/``): a rerun with the same arguments resumes from
        them.
    out : path, default=None
        Directory the compressed model (and the tokenizer) is written to: with
        ``form="shrunk"`` a directory of the kept widths loaded with
        ``trust_remote_code=True`` (:func:`~._shrink.save_shrunk`), with ``"query"`` the
        model's own class (``save_pretrained``).
    progress, on_layer : callable, default=None
        Factories called with a stage's name (``"deficiency curves"``, ``"training heads"``,
        ``"refining heads"``, ``"distilling (epochs)"``, ``"refitting heads"``) that return
        that stage's ``progress(done, total)`` and (for the curves) ``on_layer(info)``
        callbacks, as :func:`head_deficiency` takes them.

    Returns
    -------
    compressed : transformers model
        The compressed model in the original's class and shapes (the query and key columns
        it drops are zero), the one written to ``out``; for a family that normalises its
        heads before the rotation (Gemma 3), whose stock class cannot drop a channel after
        the norm, and for latent keys (``form="latent"``, ``"latent-shared"``), which no
        stock class holds, the model of the kept channels that ``out`` holds
        (:func:`~._shrink.shrunk_model`).
    report : CompressionReport
    """
    budget = _check_options(budget, eps, allocation, train_steps, refine, refit, calibration,
                            max_length, form, fit_planes)
    model, tokenizer = model_source(model, tokenizer)
    texts = check_texts(texts, "texts")
    if len(texts) < 4:
        raise ValueError(f"`texts` must hold at least 4 non-empty texts. Got {len(texts)}.")
    language_model = is_language_model(model)
    allocation, train_steps, refine, refit = _resolve_auto(language_model, allocation,
                                                           train_steps, refine, refit)
    form = _resolve_form(form, model)
    rotary_shrunk, whole = _rotary_shrunk(model, form, train_steps, refine, refit)
    epsilons = (0.01, 0.05, 0.1) if eps is None else tuple(sorted({0.01, 0.05, 0.1, eps}))
    job = _Job(model, tokenizer, texts, language_model, train_steps, refine, max_length,
               random_state, progress, on_layer, checkpoint,
               common=dict(tokenizer=tokenizer, calibration=calibration, epsilons=epsilons,
                           max_length=max_length, random_state=random_state))
    methods = ("data",) if language_model else ("weight", "data")
    result = _curves(job, "deficiency_layers", "deficiency curves", methods=methods)
    kept = {"curves": len(result.resumed_layers)}
    calibration_texts = [texts[i] for i in result.calibration_index]
    plan, sensitivity = _plan(job, result, calibration_texts, budget, eps, allocation)
    method = "data"
    if train_steps:
        # Second pass: the planned ranks trained, so that the compressed heads are the
        # achievable pairs at those ranks.
        result = _curves(job, "trained_layers", "training heads", train_at=plan,
                         train_steps=train_steps)
        kept["trained pairs"] = len(result.resumed_layers)
        method = "trained"
    compressed, channels, maps = _compressed(job, result, plan, method, sensitivity,
                                             calibration_texts, rotary_shrunk, whole,
                                             fit_planes, form)
    evaluation = [texts[i] for i in result.evaluation_index]
    fidelity = _fidelity(model, compressed, evaluation, tokenizer, max_length, language_model)
    written = compressed
    if refit == "all":  # the same fit on every line, now that the split has judged it
        written = _refined(job, refit_heads(model, plan, texts, tokenizer=tokenizer,
                                            train_steps=train_steps, max_length=max_length,
                                            progress=_stage(progress, "refitting heads")),
                           plan, texts)
        fidelity["refit_lines"] = len(texts)
    if out is not None:
        _write(model if whole else written, channels, Path(out), form, tokenizer, maps)
    sizes = qk_sizes(model, channels, latent=form in LATENT_FORMS)
    return written, CompressionReport(
        _per_head(result, plan, train_steps), deficiency=result, plan=plan, fidelity=fidelity,
        language_model=language_model, methods=methods, budget=budget, eps=eps,
        allocation=plan.allocation, train_steps=train_steps, refine=refine, refit=refit,
        form=form, fit_planes=fit_planes and rotary_shrunk and form == "shrunk", kept=kept,
        channels=channels,
        out=None if out is None else str(out),
        measured_distillation=getattr(compressed, "distillation_", None),
        written_distillation=getattr(written, "distillation_", None), **sizes)


def _rotary_shrunk(model, form, train_steps, refine, refit):
    """``(rotary shrunk or latent form, its projections written whole)``, and an error for
    the steps that form takes not. The projections stay whole for latent keys and for heads
    normalised before their rotation."""
    if form in LATENT_FORMS and not check_shrinkable(model):
        raise ValueError(f"form={form!r} is a form of rotary heads; a head without rotary "
                         "embeddings keeps query and key maps of width r (form='shrunk').")
    rotary_shrunk = form in ("shrunk", *LATENT_FORMS) and check_shrinkable(model)
    whole = rotary_shrunk and (form in LATENT_FORMS
                               or check_shrinkable(model, normalised=True))
    if rotary_shrunk and (train_steps or refine == "sequential" or refit != "none"
                          or (whole and refine != "none")):
        raise ValueError("A rotary model's shrunk and latent forms are fitted on the original "
                         "maps: they take no trained pairs, sequential refinement nor refit "
                         "(`train_steps=0`, `refine='none'` or `'distill'` (not for heads "
                         "normalised before their rotation, nor for latent keys), "
                         "`refit='none'`; or `form='query'`).")
    return rotary_shrunk, whole


def _resolve_auto(language_model, allocation, train_steps, refine, refit):
    """``(allocation, train_steps, refine, refit)`` with ``"auto"`` read for the model's kind
    (``LANGUAGE_MODEL_AUTO``, ``ENCODER_AUTO``; the Fisher allocation for a language model)."""
    auto = LANGUAGE_MODEL_AUTO if language_model else ENCODER_AUTO
    train_steps = auto["train_steps"] if train_steps == "auto" else int(train_steps)
    refine = auto["refine"] if refine == "auto" else refine
    refit = auto["refit"] if refit == "auto" else refit
    if allocation == "auto":
        allocation = "fisher" if language_model else "greedy"
    if allocation in ("fisher", "taylor") and not language_model:
        raise ValueError(f"`allocation={allocation!r}` prices the heads by a next-token loss: "
                         "it needs a causal language model with its head (use 'greedy' or "
                         "'uniform').")
    return allocation, train_steps, refine, refit


@dataclass(frozen=True)
class _Job:
    """What the steps of one :func:`compress_model` call share: the model and its text,
    the settings as resolved, the callbacks, and the options every curve is measured with."""

    model: object
    tokenizer: object
    texts: list
    language_model: bool
    train_steps: int
    refine: str
    max_length: int
    random_state: object
    progress: object
    on_layer: object
    checkpoint: object
    common: dict


def _curves(job, folder, label, **kwargs):
    """:func:`head_deficiency` on the job's text, resumable from ``checkpoint/folder``."""
    return head_deficiency(job.model, job.texts, progress=_stage(job.progress, label),
                           on_layer=_stage(job.on_layer, label),
                           checkpoint=None if job.checkpoint is None else
                           Path(job.checkpoint) / folder, **job.common, **kwargs)


def _plan(job, result, calibration_texts, budget, eps, allocation):
    """The plan of the measured curves, and the Fisher weights it was priced by (``None``
    unless ``allocation`` is ``"fisher"`` or ``"taylor"``)."""
    if eps is not None:
        return plan_ranks(result, eps=eps, method="data"), None
    sensitivity = None
    if allocation in ("fisher", "taylor"):
        # The Fisher weights from the calibration half only: the evaluation half judges.
        sensitivity = head_sensitivity(job.model, calibration_texts, tokenizer=job.tokenizer,
                                       max_length=job.max_length)
    plan = plan_ranks(result, budget=budget, method="data", allocation=allocation,
                      sensitivity=sensitivity)
    return plan, sensitivity


def _refined(job, compressed, plan, lines, channels=None):
    """``compressed`` after the job's refinement on ``lines``: re-fitted layer by layer
    (``"sequential"``), distilled end to end (``"distill"``; a shrunk form's kept
    ``channels``), or as it is."""
    if job.refine == "sequential":
        return refine_compressed(job.model, compressed, plan, lines, tokenizer=job.tokenizer,
                                 train_steps=job.train_steps or 15, max_length=job.max_length,
                                 progress=_stage(job.progress, "refining heads"))
    if job.refine != "distill":
        return compressed
    bar = _stage(job.progress, "distilling (epochs)")
    # Kept planes start at the original's values and are few: larger, more frequent steps
    # (SmolLM2-135M at 50%, 120 lines in batches of 16: held-out KL 0.229 after 1 epoch at
    # 1e-4, 0.204 at 1e-3, 0.181 after 10; batches of 8 keep as many steps on the
    # calibration half).
    steps = dict(learning_rate=1e-3, batch_size=8) if channels is not None else {}
    distilled = distill_compressed(
        job.model, compressed, plan, lines, tokenizer=job.tokenizer, channels=channels,
        objective="next_token" if job.language_model else "embedding",
        max_length=job.max_length, random_state=job.random_state, progress=bar, **steps)
    if bar is not None:
        bar(1, 1)  # early stopping may end before the last epoch
    return distilled


def _resolve_form(form, model):
    """``form="auto"``: ``"shrunk"`` where it is the same model in smaller tensors (heads
    without rotary embeddings); for rotary heads the latent keys, which keep more of the model
    than whole planes at the same key cache, and as fast: ``"latent-shared"`` where a layer
    has several key heads (SmolLM2-135M at 50%: next-token KL 0.038, against 0.106 with a
    latent per key head, 0.260 with planes, 0.051 with the query form, which saves nothing),
    ``"latent"`` where it has one (Gemma 3 270M at 60%: 0.050, against 0.076 with the
    channels pooled among the layers, 0.089 with planes); ``"query"`` for a family without a
    shrunk form."""
    if form != "auto":
        return form
    try:
        rotary = check_shrinkable(model)
    except ValueError:  # a family without a shrunk form
        return "query"
    if not rotary:
        return "shrunk"
    grouped = any(layer.n_kv_heads > 1 for layer in layers_of(model)[1])
    return "latent-shared" if grouped else "latent"


def _compressed(job, result, plan, method, sensitivity, calibration_texts, rotary_shrunk,
                whole, fit_planes, form):
    """The compressed model, the channels it keeps (``None`` for ``form="query"``) and the
    maps its written attention holds (``None`` but where the projections stay ``whole``):
    whole rotary planes per key head (their scaled rotations fitted with ``fit_planes``),
    latent keys of as many channels, or each head's planned rank-``r`` form, refined on the
    calibration half. Where the projections stay whole (latent keys; a family that
    normalises its heads before the rotation), the model of the kept channels itself."""
    model, tokenizer = job.model, job.tokenizer
    if rotary_shrunk:
        planes = plane_plan(model, plan, calibration_texts, tokenizer=tokenizer,
                            sensitivity=sensitivity, max_length=job.max_length)
        if form in LATENT_FORMS:  # as many key channels as the planes, after the rotation
            # the planes' key cache; a shared latent's pooled among the layers by the fitted
            # error (pooled among the key heads, the latent per key head lost at 30% on
            # SmolLM2-135M: perplexity 1.162x against 1.134x)
            shared = form == "latent-shared"
            widths, fitted = fit_latent_keys(
                model, (shared_widths if shared else latent_widths)(planes),
                calibration_texts, tokenizer=tokenizer, sensitivity=sensitivity, pool=shared,
                max_length=job.max_length)
            channels = latent_channels(model, widths)
            return shrunk_model(model, channels, latent=fitted), channels, fitted
        channels = kept_channels(model, planes=planes)
        fitted = plane_maps(model, planes, calibration_texts, tokenizer=tokenizer,
                            max_length=job.max_length) if fit_planes else None
        if whole:
            return shrunk_model(model, channels, maps=fitted), channels, fitted
        compressed = zero_dropped(model, channels)
        if fitted is not None:
            fold_plane_maps(compressed, planes, fitted)
        return _refined(job, compressed, plan, calibration_texts, channels), channels, None
    compressed = _refined(job, compress_heads(model, result, plan, method=method), plan,
                          calibration_texts)
    return compressed, kept_channels(model, plan=plan) if form == "shrunk" else None, None


def _write(written, channels, target, form, tokenizer, maps=None):
    """Write the model and its tokenizer to ``target``: shrunk to the kept widths (with the
    plane ``maps`` of a normalised family, ``written`` then the original), or in the model's
    own class."""
    if form in LATENT_FORMS:
        save_shrunk(written, channels, target, tokenizer=tokenizer, latent=maps)
    elif form == "shrunk":
        save_shrunk(written, channels, target, tokenizer=tokenizer, maps=maps)
    else:
        target.mkdir(parents=True, exist_ok=True)
        written.save_pretrained(target)
        tokenizer.save_pretrained(target)


def _per_head(result, plan, train_steps):
    """The per-head rows: eps-ranks, the planned rank and its error (trained, if any)."""
    trained_curves = result.curves("trained")
    planned = {(r["layer"], r["head"]): r for r in plan.rows}
    rows = []
    for row in result.eps_ranks().rows:
        entry = {k: v for k, v in row.items() if not k.startswith("trained_")}
        rank = planned[(row["layer"], row["head"])]["rank"]
        entry["plan_rank"] = rank
        entry["plan_error"] = planned[(row["layer"], row["head"])]["error"]
        if train_steps:
            li = result.layer_indices.index(row["layer"])
            trained = trained_curves[li, result.heads.index(row["head"]), rank]
            entry["plan_error_trained"] = float(min(trained, entry["plan_error"])) if \
                np.isfinite(trained) else entry["plan_error"]
        rows.append(entry)
    return rows


def _fidelity(model, compressed, texts, tokenizer, max_length, language_model):
    """The end-to-end measure that fits the model, on ``texts`` (a dict).

    A causal language model (an LM head on causal attention) is measured by what it predicts:
    the perplexity, its ratio to the original's and the mean next-token KL divergence to the
    original; any other model (an encoder, a decoder without its head) by the cosine of its
    mean-pooled sentence embeddings to the original's.
    """
    if language_model:
        original = perplexity(model, texts, tokenizer, max_length=max_length)
        value = perplexity(compressed, texts, tokenizer, max_length=max_length)
        kl = next_token_kl(model, compressed, texts, tokenizer, max_length=max_length)
        return {"measure": "perplexity and next-token KL", "original": original,
                "compressed": value, "ratio": value / original, "mean_kl": kl.mean_kl,
                "max_kl": kl.max_kl}
    table = embedding_fidelity(model, compressed, texts, tokenizer, max_length=max_length)
    return {"measure": "cosine", "mean": table.mean_cosine, "min": table.min_cosine}

