"""Torch estimators and modules: attention with a rank-limited query-key kernel."""

from .._scoring import get_sequence_scorer, get_sequence_scorer_names, make_sequence_scorer
from ._callbacks import ConvergenceCheck, DivergenceCheck
from ._modules import LowRankAttention, StaticTokenMixer
from ._regressor import LowRankAttentionRegressor

__all__ = [
    "LowRankAttention",
    "StaticTokenMixer",
    "LowRankAttentionRegressor",
    "DivergenceCheck",
    "ConvergenceCheck",
    "make_sequence_scorer",
    "get_sequence_scorer",
    "get_sequence_scorer_names",
]
