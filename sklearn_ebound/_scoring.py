"""Scorers for sequence targets of shape ``(n_samples, n_tokens, n_targets)``.

scikit-learn's metrics accept at most 2-D targets, so its named scorers (``scoring="r2"``)
reject sequence data. These scorers flatten the targets and predictions of every sequence
into one column of ``n_tokens * n_targets`` entries per sample before applying the metric, so
each sample still counts as one row (cross-validation splits stay sequence-wise).

Use them wherever scikit-learn takes ``scoring``::

    GridSearchCV(LowRankAttentionRegressor(), {"rank": [1, 2, 4]},
                 scoring=get_sequence_scorer("neg_mean_squared_error"))
    cross_validate(est, X, Y, scoring={"r2": get_sequence_scorer("r2"),
                                       "mse": get_sequence_scorer("neg_mean_squared_error")})
"""

from functools import partial

import numpy as np
from sklearn import metrics
from sklearn.metrics import make_scorer

__all__ = ["make_sequence_scorer", "get_sequence_scorer", "get_sequence_scorer_names"]

# name -> (metric on flattened targets, greater_is_better)
_SEQUENCE_METRICS = {
    "r2": (metrics.r2_score, True),
    "explained_variance": (metrics.explained_variance_score, True),
    "neg_mean_squared_error": (metrics.mean_squared_error, False),
    "neg_root_mean_squared_error": (metrics.root_mean_squared_error, False),
    "neg_mean_absolute_error": (metrics.mean_absolute_error, False),
    "neg_median_absolute_error": (metrics.median_absolute_error, False),
}


def _flat_metric(y_true, y_pred, *, score_func, **kwargs):
    # Every entry of every sequence is one observation: r2 and the mean errors are then taken
    # over all tokens and channels at once.
    y_true, y_pred = np.asarray(y_true), np.asarray(y_pred)
    return score_func(y_true.reshape(-1), y_pred.reshape(-1), **kwargs)


def make_sequence_scorer(score_func, *, greater_is_better=True, **kwargs):
    """Make a scorer from a regression metric, for targets with any number of axes.

    Parameters
    ----------
    score_func : callable
        ``score_func(y_true, y_pred, **kwargs)`` on 1-D arrays, e.g.
        :func:`sklearn.metrics.r2_score`.
    greater_is_better : bool, default=True
        Whether ``score_func`` is a score (``True``) or a loss (``False``, the scorer then
        returns its negative, as scikit-learn's ``neg_*`` scorers do).
    **kwargs
        Passed on to ``score_func``.

    Returns
    -------
    scorer : callable
        ``scorer(estimator, X, Y)``, usable as ``scoring`` in scikit-learn's model selection;
        picklable, so it works with ``n_jobs > 1``.

    Examples
    --------
    >>> from sklearn.metrics import mean_absolute_error
    >>> from sklearn_ebound.nn import make_sequence_scorer
    >>> scorer = make_sequence_scorer(mean_absolute_error, greater_is_better=False)
    """
    return make_scorer(
        partial(_flat_metric, score_func=score_func),
        greater_is_better=greater_is_better,
        **kwargs,
    )


def get_sequence_scorer_names():
    """Names accepted by :func:`get_sequence_scorer`."""
    return sorted(_SEQUENCE_METRICS)


def get_sequence_scorer(scoring):
    """Named scorer for sequence targets, the counterpart of :func:`sklearn.metrics.get_scorer`.

    Parameters
    ----------
    scoring : str
        One of :func:`get_sequence_scorer_names`: ``"r2"``, ``"explained_variance"``,
        ``"neg_mean_squared_error"``, ``"neg_root_mean_squared_error"``,
        ``"neg_mean_absolute_error"``, ``"neg_median_absolute_error"``.

    Returns
    -------
    scorer : callable
        See :func:`make_sequence_scorer`.

    Examples
    --------
    >>> from sklearn_ebound.nn import get_sequence_scorer
    >>> scorer = get_sequence_scorer("neg_mean_squared_error")
    """
    if scoring not in _SEQUENCE_METRICS:
        raise ValueError(
            f"`scoring` must be one of {get_sequence_scorer_names()}. Got {scoring!r} instead."
        )
    score_func, greater_is_better = _SEQUENCE_METRICS[scoring]
    return make_sequence_scorer(score_func, greater_is_better=greater_is_better)
