"""The attention-native rank of pretrained transformers, head by head.

:func:`head_ranks` reads the query-key kernel ``W_Q W_K^T`` of every head of a Hugging Face
model (BERT-, GPT-2-, LLaMA- and Gemma 3-style, grouped-query attention, rotary embeddings,
sliding windows and Gemma 3's normalised query and key heads included) or of a plain state
dict, and, given text, the logit field the head produces on it. A model whose attention
blocks hold parameters no family models is refused by name.
:func:`head_deficiency` measures how much query-key rank each head needs on its own output
(weight-space, data-aware and trained rank-``r`` forms, at every rank);
:func:`head_sensitivity` prices each head's output error in a causal language model's loss
(its Fisher weight, and the loss's first-order change along each head's truncation);
:func:`compress_model` does the whole job in one call (curves, plan, compressed model, its
measure, a directory of the kept widths);
:func:`head_predictors` and :func:`predictor_agreement` set the rank predictors against those
needs; :func:`plan_ranks` and :func:`compress_heads` turn the
curves into a compressed model (:func:`refit_heads` fits the planned heads again on all the
text once a split has judged the plan, :func:`refine_compressed` re-fits its pairs layer by
layer on its own inputs,
:func:`distill_compressed` trains them end to end against the original's output),
:func:`compression_frontier`, :func:`embedding_fidelity` (an encoder), :func:`perplexity`
and :func:`next_token_kl` (a causal language model, :func:`is_language_model`) measure it end
to end. Running models needs the optional ``heads`` extra (``transformers``,
``safetensors``, and ``gguf`` and ``accelerate`` for the GGUF files :func:`load_pretrained`
reads); state dicts of numpy arrays need nothing more than numpy.
:func:`make_tiny_transformer` builds the tiny random model the examples run on.
:class:`~sklearn_ebound.display.HeadRankDisplay`,
:class:`~sklearn_ebound.display.HeadSpectrumDisplay` and
:class:`~sklearn_ebound.display.HeadDeficiencyDisplay` draw the results.
"""

from ._compression import (
    compress_heads,
    compression_frontier,
    distill_compressed,
    embedding_fidelity,
    is_language_model,
    next_token_kl,
    perplexity,
    refine_compressed,
)
from ._deficiency import HeadDeficiencyResult, head_deficiency
from ._inputs import load_pretrained
from ._planning import plan_ranks
from ._predictors import head_predictors, predictor_agreement
from ._ranks import HeadRankResult, head_ranks
from ._refit import refit_heads
from ._sensitivity import HeadSensitivityResult, head_sensitivity
from ._text import (
    CALIBRATION_MODULES,
    HELD_OUT_MODULES,
    WIDE_CALIBRATION_MODULES,
    docstring_sentences,
    manual_sentences,
)
from ._tiny_model import make_tiny_transformer
from ._weights import NAMINGS
from ._workflow import ENCODER_AUTO, LANGUAGE_MODEL_AUTO, CompressionReport, compress_model

__all__ = [
    "HeadRankResult",
    "head_ranks",
    "NAMINGS",
    "HeadDeficiencyResult",
    "head_deficiency",
    "head_predictors",
    "predictor_agreement",
    "HeadSensitivityResult",
    "head_sensitivity",
    "plan_ranks",
    "compress_model",
    "CompressionReport",
    "ENCODER_AUTO",
    "LANGUAGE_MODEL_AUTO",
    "compress_heads",
    "refine_compressed",
    "refit_heads",
    "distill_compressed",
    "compression_frontier",
    "embedding_fidelity",
    "perplexity",
    "next_token_kl",
    "is_language_model",
    "docstring_sentences",
    "manual_sentences",
    "CALIBRATION_MODULES",
    "HELD_OUT_MODULES",
    "WIDE_CALIBRATION_MODULES",
    "load_pretrained",
    "make_tiny_transformer",
]
