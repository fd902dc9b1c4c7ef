"""The attention-native rank of pretrained transformers, head by head.

:func:`head_ranks` reads the query-key kernel ``W_Q W_K^T`` of every head of a Hugging Face
model (BERT-, GPT-2- and LLaMA-style, grouped-query attention and rotary embeddings included)
or of a plain state dict, and, given text, the logit field the head produces on it. Running
models needs the optional ``heads`` extra (``transformers``, ``safetensors``); state dicts of
numpy arrays need nothing more than numpy. :class:`~sklearn_ebound.display.HeadRankDisplay`
and :class:`~sklearn_ebound.display.HeadSpectrumDisplay` draw the result.
"""

from ._ranks import HeadRankResult, head_ranks
from ._weights import NAMINGS

__all__ = ["HeadRankResult", "head_ranks", "NAMINGS"]
