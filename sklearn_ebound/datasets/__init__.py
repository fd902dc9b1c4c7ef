"""Planted-rank tasks: data whose intrinsic rank is known."""

from ._static import make_static_task

__all__ = ["make_static_task"]
