"""One adapter per model family: how its attention is stored, masked and positioned.

Each module holds one family (``FAMILY``, an :class:`~._base.AttentionFamily`): BERT
(:mod:`._bert`), GPT-2 (:mod:`._gpt2`), LLaMA and its kin — Mistral, Qwen2 with its query and
key biases (:mod:`._llama`), Gemma 3 and Qwen 3 with their normalised query and key
heads (:mod:`._gemma3`, :mod:`._qwen3`). A family is told by its query weights' keys, its
attention blocks' parameters (a block with one the family does not model is not of that
family) and, where it says so, the config's ``model_type``. Adding a family is one module
with its ``FAMILY`` and a line in ``FAMILIES`` below (the order is the order of detection),
and a tiny-model test.
"""

from . import _bert, _gemma3, _gpt2, _llama, _qwen3
from ._base import AttentionFamily, QKLayer, Slot

__all__ = ["FAMILIES", "AttentionFamily", "QKLayer", "Slot", "family"]

FAMILIES = {module.FAMILY.name: module.FAMILY for module in (_bert, _gpt2, _llama, _gemma3,
                                                            _qwen3)}


def family(naming):
    """The adapter named ``naming`` (one of :data:`FAMILIES`)."""
    try:
        return FAMILIES[naming]
    except KeyError:
        raise ValueError(f"`naming` must be one of {list(FAMILIES)} or None. "
                         f"Got {naming!r}.") from None
