"""The Entropic Bound as experiments: rank sweeps, the interpolation ladder, recovery by
gradient descent and the predictability frontier. Each returns a plain result table with
``to_dict``, ``to_json`` and ``to_csv`` exports."""

from .._utils.results import ResultTable
from ._frontier import FrontierResult, conditioned_value_map, predictability_frontier
from ._ladder import LadderResult, interpolation_ladder
from ._recovery import RecoveryResult, recovery_experiment
from ._sweep import RankSweepResult, rank_sweep

__all__ = [
    "ResultTable",
    "RankSweepResult",
    "rank_sweep",
    "LadderResult",
    "interpolation_ladder",
    "RecoveryResult",
    "recovery_experiment",
    "FrontierResult",
    "predictability_frontier",
    "conditioned_value_map",
]
