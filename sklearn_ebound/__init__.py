"""sklearn-ebound: the Entropic Bound, the intrinsic rank a task needs, with scikit-learn.

Every public name is loaded on first use (PEP 562): ``import sklearn_ebound`` imports neither
scikit-learn, scipy nor torch, so the ``ebound`` command line starts fast, and
``from sklearn_ebound import IntrinsicRankEstimator`` imports only what that estimator needs.
The numpy/scipy path (moments, operators, spectra, static estimators) never imports torch; the
torch estimators of :mod:`sklearn_ebound.nn` load with the first of their names.
"""

import importlib

__version__ = "0.1.0"

# Public name -> the module that defines it, relative to this package.
_HOMES = {
    "IntrinsicRankEstimator": "._intrinsic_rank",
    "ReducedRankRegressor": "._reduced_rank",
    "ReducedRankRegressorCV": "._reduced_rank",
    "rank_path_scores": "._reduced_rank",
    "excess_risk_curve": "._deficiency",
    "energy_rank": "._spectrum",
    "entropy_rank": "._spectrum",
    "optimal_hard_threshold": "._spectrum",
    "stable_rank": "._spectrum",
    "tail_energy": "._spectrum",
    "threshold_rank": "._spectrum",
    "make_sequence_scorer": "._scoring",
    "get_sequence_scorer": "._scoring",
    "get_sequence_scorer_names": "._scoring",
    "LowRankAttentionRegressor": ".nn",
    "LowRankAttention": ".nn",
    "StaticTokenMixer": ".nn",
}

# The public subpackages, reachable as attributes (``sklearn_ebound.datasets``) without their
# own import statement, as ``exceptions`` was when this module imported the estimators.
_SUBPACKAGES = ("cli", "datasets", "display", "exceptions", "experiments", "heads", "nn")

__all__ = list(_HOMES)


def __getattr__(name):
    if name in _HOMES:
        value = getattr(importlib.import_module(_HOMES[name], __name__), name)
    elif name in _SUBPACKAGES:
        value = importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__():
    return sorted({*globals(), *__all__, *_SUBPACKAGES})
