"""What every rank rule returns: a :class:`RankReading`."""

from dataclasses import dataclass, field

import numpy as np

__all__ = ["RankReading", "NotEnoughData", "fitted_spectrum"]


class NotEnoughData(ValueError):
    """Too few samples so far to read a rank (``partial_fit`` waits for more)."""


@dataclass(frozen=True)
class RankReading:
    """A rank and the spectrum it was read from.

    Attributes
    ----------
    rank : int
    singular_values : ndarray
        The spectrum the rule compared with its cut.
    threshold : float or None
        The cut, in the units of ``singular_values``; ``None`` for rules without one.
    unit : {"x", "y", "kernel"} or None
        Units of ``singular_values`` and ``threshold``: those of the inputs, of the targets, of
        the query–key kernel (inverse squared inputs), or none (canonical correlations).
    noise_variance : float or None
        Noise variance per target entry, in squared target units, where the rule estimated it.
    cv_results : dict or None
        Per-rank cross-validation scores (:func:`.cv.cv_rule`).
    caveats : tuple of str
        Assumptions the data strain, for the estimator to warn about.
    noise_model : str or None
        The calibration of the test (a key of :data:`.._resampled_null.NOISE_MODELS`).
    diagnostics : dict or None
        The residual diagnostics (:func:`.._diagnostics.diagnose_residuals`).
    p_values : ndarray or None
        P-value of each tested direction (sequential tests only).
    rank_interval : tuple of int or None
        ``(low, high)``, the ranks the tests cannot tell apart.
    detection_limit : float or None
        Smallest detectable population singular value, in the units of ``singular_values``.
    """

    rank: int
    singular_values: np.ndarray
    threshold: float | None = None
    unit: str | None = "y"
    noise_variance: float | None = None
    cv_results: dict | None = None
    caveats: tuple = field(default=())
    noise_model: str | None = None
    diagnostics: dict | None = None
    p_values: np.ndarray | None = None
    rank_interval: tuple | None = None
    detection_limit: float | None = None


def fitted_spectrum(operator):
    """Singular values of the fitted values that can carry signal: ``min(rank(X), q)``."""
    n_targets = operator.output_directions.shape[0]
    return operator.fitted_singular_values[: min(operator.input_rank, n_targets)]
