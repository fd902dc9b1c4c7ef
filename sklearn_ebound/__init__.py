"""sklearn-ebound: the Entropic Bound, the intrinsic rank a task needs, with scikit-learn.

The numpy/scipy path (moments, operators, spectra, static estimators) imports without torch;
the torch estimators in :mod:`sklearn_ebound.nn` are loaded on first use.
"""

from ._deficiency import excess_risk_curve
from ._intrinsic_rank import IntrinsicRankEstimator
from ._null_edges import optimal_hard_threshold
from ._reduced_rank import ReducedRankRegressor, ReducedRankRegressorCV, rank_path_scores
from ._scoring import get_sequence_scorer, get_sequence_scorer_names, make_sequence_scorer
from ._spectrum import energy_rank, entropy_rank, stable_rank, tail_energy, threshold_rank

__version__ = "0.1.0"

_LAZY_TORCH = {
    "LowRankAttentionRegressor": "sklearn_ebound.nn",
    "LowRankAttention": "sklearn_ebound.nn",
    "StaticTokenMixer": "sklearn_ebound.nn",
}


def __getattr__(name):
    # Torch-backed names are imported on first access so `import sklearn_ebound` stays fast.
    if name in _LAZY_TORCH:
        import importlib

        return getattr(importlib.import_module(_LAZY_TORCH[name]), name)
    raise AttributeError(f"module 'sklearn_ebound' has no attribute {name!r}")


__all__ = [
    "IntrinsicRankEstimator",
    "ReducedRankRegressor",
    "ReducedRankRegressorCV",
    "rank_path_scores",
    "excess_risk_curve",
    "energy_rank",
    "entropy_rank",
    "optimal_hard_threshold",
    "stable_rank",
    "tail_energy",
    "threshold_rank",
    "make_sequence_scorer",
    "get_sequence_scorer",
    "get_sequence_scorer_names",
    "LowRankAttentionRegressor",
    "LowRankAttention",
    "StaticTokenMixer",
]
