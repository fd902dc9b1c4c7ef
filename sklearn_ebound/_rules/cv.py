"""``criterion="cv"``: K-fold cross-validation over the reduced-rank path.

One decomposition per fold scores every rank (as scikit-learn's ``RidgeCV`` scores every
penalty): :func:`path_scores` is the machinery that
:class:`~sklearn_ebound.ReducedRankRegressorCV` and :func:`~sklearn_ebound.rank_path_scores`
share.
"""

from numbers import Integral

import numpy as np
from sklearn.model_selection import GroupKFold, check_cv

from .._least_squares import path_squared_errors, solve_static
from .._moments import Moments
from .reading import RankReading, fitted_spectrum

__all__ = ["PATH_SCORINGS", "cv_rule", "path_scores", "training_moments"]

# The scores computed in closed form from the path.
PATH_SCORINGS = ("r2", "neg_mean_squared_error")


def _one_standard_error_rank(ranks, scores):
    """Smallest rank whose mean score is within one standard error of the best mean."""
    mean = scores.mean(axis=0)
    sem = scores.std(axis=0, ddof=1) / np.sqrt(scores.shape[0]) if scores.shape[0] > 1 else 0 * mean
    best = int(np.argmax(mean))
    return int(ranks[np.flatnonzero(mean >= mean[best] - sem[best])[0]])


def cv_rule(moments, operator, X, Y, groups=None, *, cv, fit_intercept):
    """K-fold cross-validation over the reduced-rank path of ``(X, Y)`` (the data the moments
    were taken of), smallest rank within one standard error of the best. With ``groups`` an
    integer ``cv`` is :class:`~sklearn.model_selection.GroupKFold` (no group on both sides of
    a split), and a splitter gets them."""
    n_features, n_targets = moments.xy.shape
    ranks = np.arange(min(n_features, n_targets) + 1)
    if groups is not None and isinstance(cv, Integral):
        cv = GroupKFold(n_splits=cv)
    splits = list(check_cv(cv).split(X, Y, groups))
    scores = path_scores(X, Y, ranks, splits, scoring="neg_mean_squared_error",
                         fit_intercept=fit_intercept)
    cv_results = {"rank": ranks, "mean_test_score": scores.mean(axis=0),
                  "std_test_score": scores.std(axis=0)}
    return RankReading(_one_standard_error_rank(ranks, scores),
                       fitted_spectrum(operator) / np.sqrt(moments.n), cv_results=cv_results)


def _r2_from_sse(sse, Y_test):
    """``r2_score(..., multioutput="uniform_average")`` for each row of ``sse``."""
    sst = ((Y_test - Y_test.mean(axis=0)) ** 2).sum(axis=0)
    nonconstant = sst > 0
    r2 = np.where(nonconstant, 1 - sse / np.where(nonconstant, sst, 1), 0.0)
    # scikit-learn's convention for constant targets: perfect predictions score 1, others 0.
    r2 = np.where(~nonconstant & (sse == 0), 1.0, r2)
    return r2.mean(axis=1)


def training_moments(X, Y, splits, fit_intercept):
    """``moments(i)``: the moments of the training rows of split ``i``.

    When the test folds partition the samples and every training set is the complement of its
    test fold (K-fold), the data are read once: each fold's moments are computed, and the
    training moments of fold ``i`` are the merge of the others (moments add up exactly).
    Otherwise each training set is read on its own.
    """
    n = X.shape[0]
    tests = [np.asarray(test) for _, test in splits]
    counts = np.bincount(np.concatenate(tests), minlength=n) if tests else np.zeros(n)
    partition = np.all(counts == 1) and all(
        len(train) + len(test) == n for train, test in splits)
    if not partition:
        return lambda i: Moments.from_arrays(X[splits[i][0]], Y[splits[i][0]],
                                             center=fit_intercept)
    folds = [Moments.from_arrays(X[test], Y[test], center=fit_intercept) for test in tests]

    def moments(i):
        total = Moments.empty(X.shape[1], Y.shape[1], center=fit_intercept)
        for j, fold in enumerate(folds):
            if j != i:
                total.merge(fold)
        return total

    return moments


def path_scores(X, Y, ranks, splits, *, scoring=None, alpha=0.0, fit_intercept=True):
    """Held-out score of every rank of ``ranks`` (an int array) on each of ``splits``, in
    closed form from one decomposition per fold: R^2 (``scoring=None`` or ``"r2"``) or
    ``"neg_mean_squared_error"``; an array of shape ``(n_splits, len(ranks))``."""
    scores = np.empty((len(splits), len(ranks)))
    train_moments = training_moments(X, Y, splits, fit_intercept)
    for i, (_, test) in enumerate(splits):
        moments = train_moments(i)
        operator = solve_static(moments, alpha)
        sse = path_squared_errors(operator, moments, X[test], Y[test])[ranks]
        if scoring == "neg_mean_squared_error":
            scores[i] = -sse.sum(axis=1) / Y[test].size
        else:
            scores[i] = _r2_from_sse(sse, Y[test])
    return scores
