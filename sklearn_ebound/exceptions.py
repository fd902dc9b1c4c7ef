"""Warnings and errors raised by sklearn-ebound."""

__all__ = ["LackOfFitWarning", "RankEstimationWarning", "TrainingDivergedError"]


class RankEstimationWarning(UserWarning):
    """A rank was estimated under assumptions the data strain; the answer is uncertain."""


class LackOfFitWarning(RankEstimationWarning):
    """The attention model a rank was read with does not fit the data; another one may.

    Raised by :class:`~sklearn_ebound.IntrinsicRankEstimator` on attention data when the
    residuals of the fitted attention model (its kernel with a known value map, its per-token
    operator without) are still explained by the inputs (a test at level 1e-5), so that the
    rank read need not be the task's. The message names the misfit and, from a held-out
    comparison, the attention model that fits better; the fitted ``lack_of_fit_`` holds the
    numbers. A subclass of :class:`RankEstimationWarning`: filters
    of that class catch it too.
    """


class TrainingDivergedError(ValueError):
    """Training produced a non-finite loss or non-finite weights: a parameter is out of range.

    Raised by :class:`~sklearn_ebound.nn.DivergenceCheck`, a default callback of
    :class:`~sklearn_ebound.nn.LowRankAttentionRegressor`. The message names the epoch, the
    loss and the parameters to lower (``lr``, ``init_scale``).

    It subclasses :class:`ValueError`, as scikit-learn's own divergence error does
    (:class:`~sklearn.linear_model.SGDRegressor` raises ``ValueError`` on floating-point
    overflow): a learning rate that diverges is a parameter value out of range. In model
    selection nothing special is needed: with ``error_score=np.nan``,
    :class:`~sklearn.model_selection.GridSearchCV` scores the diverged candidate ``nan``,
    warns with a :class:`~sklearn.exceptions.FitFailedWarning` that quotes this message, and
    fits the others; with ``error_score="raise"`` (the default) it propagates.
    """
