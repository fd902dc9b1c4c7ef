"""Planted-rank tasks: data whose intrinsic rank is known."""

from ._attention import alibi_bias, make_attention_task, make_static_mixing_task
from ._static import make_static_task

__all__ = ["make_static_task", "make_attention_task", "make_static_mixing_task", "alibi_bias"]
