"""Reduced-rank regression: the achievability model of the static Entropic Bound.

The best rank-``r`` linear model of ``Y`` given ``X`` projects the least-squares fit onto the
top ``r`` right singular vectors of the fitted values (Izenman 1975; with a ridge, Mukherjee &
Zhu 2011): ``B_r = B V_r V_r^T``. One decomposition gives every rank, which is what
:class:`ReducedRankRegressorCV` uses to score a whole rank path per fold.
"""

from numbers import Integral, Real

import numpy as np
from sklearn.base import BaseEstimator, MultiOutputMixin, RegressorMixin, _fit_context
from sklearn.metrics import check_scoring
from sklearn.model_selection import check_cv
from sklearn.utils._param_validation import Interval
from sklearn.utils.validation import check_is_fitted, validate_data

from ._least_squares import solve_static
from ._moments import Moments, power_of_two_scale
from ._rules.cv import PATH_SCORINGS, path_scores, training_moments
from ._utils.validation import refuse_strings

__all__ = ["ReducedRankRegressor", "ReducedRankRegressorCV", "rank_path_scores"]


def _check_rank_bound(rank, n_features, n_targets, name="rank"):
    bound = min(n_features, n_targets)
    if rank > bound:
        raise ValueError(
            f"`{name}` upper bound is {bound} (min(n_features, n_targets)). Got {rank} instead. "
            f"Reduce `{name}`."
        )


class _ReducedRankBase(MultiOutputMixin, RegressorMixin, BaseEstimator):
    """Shared fitted state and prediction of the reduced-rank regressors."""

    def _fit_rank(self, X, Y, rank):
        """Fit the rank-``rank`` operator from the moments of all of ``X, Y``."""
        self._moments = Moments.from_arrays(X, Y, center=self.fit_intercept, scale=True)
        operator = solve_static(self._moments, self._scaled_alpha(self._moments))
        return self._set_operator(self._moments, operator, rank)

    def _scaled_alpha(self, moments):
        # ||Y - XB||^2 + alpha ||B||^2 with X = sx X', Y = sy Y', B = (sy / sx) B' is
        # sy^2 (||Y' - X'B'||^2 + (alpha / sx^2) ||B'||^2).
        return self.alpha / moments.scale_x / moments.scale_x if self.alpha else 0.0

    def _set_operator(self, moments, operator, rank):
        sx, sy = moments.scale_x, moments.scale_y
        with np.errstate(over="ignore", invalid="ignore"):
            # The moments are those of X / sx and Y / sy: back to the units of the data.
            coef = operator.reduced_coef(rank) * sy / sx  # p x q, Y ~ X coef
            intercept = moments.mean_y * sy - (moments.mean_x * sx) @ coef
            singular_values = operator.fitted_singular_values * sy / np.sqrt(max(moments.n, 1))
        if not (np.all(np.isfinite(coef)) and np.all(np.isfinite(intercept))):
            raise ValueError(
                "The fitted operator exceeds the float64 range in the units of the data (inputs "
                f"of scale {sx:.3g}, targets of scale {sy:.3g}); rescale X or Y.")
        self.rank_ = int(rank)
        self.coef_ = coef.T if self._y_2d else coef[:, 0]
        self.intercept_ = intercept if self._y_2d else float(intercept[0])
        self.singular_values_ = singular_values
        return self

    def predict(self, X):
        """Predict with the rank-``rank_`` operator.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        Y : ndarray of shape (n_samples, n_targets) or (n_samples,)
            Of ``X``'s dtype for float32 and float64 input.
        """
        check_is_fitted(self)
        X = validate_data(self, refuse_strings(X), reset=False,
                          dtype=[np.float64, np.float32])
        # float32 in, float32 out: the operator is rounded once to the input's precision.
        coef = self.coef_.astype(X.dtype, copy=False)
        return X @ coef.T + np.asarray(self.intercept_, dtype=X.dtype)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.single_output = True
        tags.target_tags.multi_output = True
        return tags


def _validate_xy(estimator, X, y):
    X, y = validate_data(estimator, refuse_strings(X), y, multi_output=True, y_numeric=True,
                         ensure_min_samples=2, dtype=np.float64)
    estimator._y_2d = y.ndim == 2
    return X, (y if y.ndim == 2 else y[:, None])


class ReducedRankRegressor(_ReducedRankBase):
    """Reduced-rank (ridge) regression: the best linear model of rank at most ``rank``.

    It solves ``min ||Y - X B||_F^2 + alpha ||B||_F^2`` subject to ``rank(B) <= rank`` in closed
    form. With ``alpha=0`` its population excess risk at rank ``r`` is the tail energy
    ``T(r) = sum_{k>r} s_k^2`` of ``Sigma_X^{1/2} B`` (the Entropic Bound's deficiency), and
    zero from the intrinsic rank on (achievability).

    Parameters
    ----------
    rank : int or None, default=None
        Maximum rank of the operator, in ``[0, min(n_features, n_targets)]``. ``None`` means no
        constraint (least squares or ridge). Rank 0 predicts the mean.
    alpha : float, default=0.0
        Ridge penalty (Mukherjee & Zhu's reduced-rank ridge regression).
    fit_intercept : bool, default=True
        Centre ``X`` and ``Y`` and fit an intercept.

    Attributes
    ----------
    coef_ : ndarray of shape (n_targets, n_features) or (n_features,)
        The rank-constrained operator, in scikit-learn's orientation (``B^T``).
    intercept_ : ndarray of shape (n_targets,) or float
    rank_ : int
        The rank used.
    singular_values_ : ndarray of shape (n_targets,)
        Singular values of the unconstrained fitted values divided by ``sqrt(n_samples)``, the
        sample estimate of the spectrum of ``Sigma_X^{1/2} B``.
    n_features_in_ : int
    feature_names_in_ : ndarray of str
        Only when ``X`` has string feature names.

    See Also
    --------
    ReducedRankRegressorCV : Selects the rank by cross-validation over the rank path.
    IntrinsicRankEstimator : Reads the intrinsic rank from data before any fit of a model.

    References
    ----------
    Izenman, "Reduced-rank regression for the multivariate linear model", J. Multivariate
    Anal., 1975. Mukherjee & Zhu, "Reduced rank ridge regression and its kernel extensions",
    Stat. Anal. Data Min., 2011.

    Examples
    --------
    >>> from sklearn_ebound import ReducedRankRegressor
    >>> from sklearn_ebound.datasets import make_static_task
    >>> X, Y = make_static_task(500, 8, rank=2, noise=0.01, random_state=0)
    >>> model = ReducedRankRegressor(rank=2).fit(X, Y)
    >>> round(model.score(X, Y), 3)
    1.0
    """

    _parameter_constraints = {
        "rank": [Interval(Integral, 0, None, closed="left"), None],
        "alpha": [Interval(Real, 0, None, closed="left")],
        "fit_intercept": ["boolean"],
    }

    def __init__(self, rank=None, *, alpha=0.0, fit_intercept=True):
        self.rank = rank
        self.alpha = alpha
        self.fit_intercept = fit_intercept

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y):
        """Fit the rank-constrained operator.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : array-like of shape (n_samples, n_targets) or (n_samples,)

        Returns
        -------
        self : object
        """
        X, Y = _validate_xy(self, X, y)
        rank = min(X.shape[1], Y.shape[1]) if self.rank is None else self.rank
        _check_rank_bound(rank, X.shape[1], Y.shape[1])
        return self._fit_rank(X, Y, rank)

    def partial_fit(self, X, y):
        """Add a chunk of rows and refit from the moments of everything seen so far.

        Equal (to rounding) to one :meth:`fit` on all the chunks, with memory independent of
        the number of rows; chunks of any size work, a single row included.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : array-like of shape (n_samples, n_targets) or (n_samples,)

        Returns
        -------
        self : object
        """
        first = getattr(self, "_moments", None) is None
        if first:
            self._validate_params()
        X, y = validate_data(self, refuse_strings(X), y, reset=first, multi_output=True,
                             y_numeric=True, dtype=np.float64)
        Y = y if y.ndim == 2 else y[:, None]
        if first:
            self._y_2d = y.ndim == 2
            rank = min(X.shape[1], Y.shape[1]) if self.rank is None else self.rank
            _check_rank_bound(rank, X.shape[1], Y.shape[1])
            self._moments = Moments.empty(X.shape[1], Y.shape[1], center=self.fit_intercept,
                                          scale_x=power_of_two_scale(X),
                                          scale_y=power_of_two_scale(Y))
        elif Y.shape[1] != self._moments.xy.shape[1]:
            raise ValueError(f"y has {Y.shape[1]} targets, but {type(self).__name__} was fitted "
                             f"with {self._moments.xy.shape[1]}.")
        self._moments.update(X, Y)
        rank = min(X.shape[1], Y.shape[1]) if self.rank is None else self.rank
        operator = solve_static(self._moments, self._scaled_alpha(self._moments))
        return self._set_operator(self._moments, operator, rank)


def rank_path_scores(X, Y, ranks, *, cv=5, scoring=None, alpha=0.0, fit_intercept=True,
                     groups=None):
    """Cross-validated score of every rank, one decomposition per fold.

    Parameters
    ----------
    X : ndarray of shape (n_samples, n_features)
    Y : ndarray of shape (n_samples, n_targets)
    ranks : sequence of int
        Ranks to score, each in ``[0, min(n_features, n_targets)]``.
    cv : int, cross-validation generator or iterable, default=5
        As in :func:`sklearn.model_selection.check_cv`.
    scoring : str, callable or None, default=None
        ``None`` or ``"r2"`` (the regressor's ``score``) and ``"neg_mean_squared_error"`` are
        computed in closed form from the path; any other scorer is called on the rank-``r``
        model built from the same decomposition.
    alpha, fit_intercept : see :class:`ReducedRankRegressor`.
    groups : array-like of shape (n_samples,), default=None
        Group labels for a group splitter ``cv``.

    Returns
    -------
    scores : ndarray of shape (n_splits, len(ranks))
    """
    ranks = np.asarray(ranks, dtype=int)
    splits = list(check_cv(cv).split(X, Y, groups))
    if scoring is None or (isinstance(scoring, str) and scoring in PATH_SCORINGS):
        return path_scores(X, Y, ranks, splits, scoring=scoring, alpha=alpha,
                           fit_intercept=fit_intercept)
    scorer = check_scoring(ReducedRankRegressor(), scoring=scoring)
    scores = np.empty((len(splits), len(ranks)))
    train_moments = training_moments(X, Y, splits, fit_intercept)
    for i, (_, test) in enumerate(splits):
        moments = train_moments(i)
        operator = solve_static(moments, alpha)
        for j, rank in enumerate(ranks):
            model = ReducedRankRegressor(rank=rank, alpha=alpha, fit_intercept=fit_intercept)
            model.n_features_in_, model._y_2d = X.shape[1], True
            model._set_operator(moments, operator, rank)
            scores[i, j] = scorer(model, X[test], Y[test])
    return scores


class ReducedRankRegressorCV(_ReducedRankBase):
    """Reduced-rank regression with the rank chosen by K-fold cross-validation.

    In the manner of :class:`~sklearn.linear_model.RidgeCV`: each fold is decomposed once and
    every candidate rank is scored from that decomposition, instead of one refit per rank. The
    scores equal those of ``GridSearchCV(ReducedRankRegressor(), {"rank": ranks})`` on the same
    splits; the rank with the best mean score is refitted on all the data.

    Parameters
    ----------
    ranks : array-like of int, default=None
        Candidate ranks; ``None`` means ``0, 1, ..., min(n_features, n_targets)``.
    cv : int, cross-validation generator or iterable, default=5
        Splitting strategy, as in :func:`sklearn.model_selection.check_cv`.
    scoring : str, callable or None, default=None
        ``None`` uses R^2 (the estimator's ``score``); see :func:`rank_path_scores`.
    alpha : float, default=0.0
        Ridge penalty.
    fit_intercept : bool, default=True

    Attributes
    ----------
    rank_ : int
        The selected rank.
    best_score_ : float
        Mean cross-validated score of ``rank_``.
    cv_results_ : dict of ndarray
        ``"rank"``, ``"mean_test_score"``, ``"std_test_score"`` and ``"split{k}_test_score"``.
    coef_, intercept_, singular_values_ : see :class:`ReducedRankRegressor`.
    n_features_in_ : int

    Examples
    --------
    >>> from sklearn_ebound import ReducedRankRegressorCV
    >>> from sklearn_ebound.datasets import make_static_task
    >>> X, Y = make_static_task(600, 10, rank=3, noise=0.1, random_state=0)
    >>> ReducedRankRegressorCV().fit(X, Y).rank_
    3
    """

    _parameter_constraints = {
        "ranks": ["array-like", None],
        "cv": ["cv_object"],
        "scoring": [str, callable, None],
        "alpha": [Interval(Real, 0, None, closed="left")],
        "fit_intercept": ["boolean"],
    }

    def __init__(self, ranks=None, *, cv=5, scoring=None, alpha=0.0, fit_intercept=True):
        self.ranks = ranks
        self.cv = cv
        self.scoring = scoring
        self.alpha = alpha
        self.fit_intercept = fit_intercept

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y):
        """Score the rank path on each fold, then refit the best rank on all the data.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : array-like of shape (n_samples, n_targets) or (n_samples,)

        Returns
        -------
        self : object
        """
        X, Y = _validate_xy(self, X, y)
        bound = min(X.shape[1], Y.shape[1])
        ranks = np.arange(bound + 1) if self.ranks is None else np.asarray(self.ranks)
        if ranks.ndim != 1 or ranks.size == 0 or ranks.dtype.kind not in "iu":
            raise ValueError(
                f"`ranks` must be a non-empty 1-D sequence of integers. Got {self.ranks!r}.")
        if ranks.min() < 0:
            raise ValueError(f"`ranks` must be non-negative. Got {self.ranks!r}.")
        _check_rank_bound(int(ranks.max()), X.shape[1], Y.shape[1], name="ranks")
        scores = rank_path_scores(
            X, Y, ranks, cv=self.cv, scoring=self.scoring, alpha=self.alpha,
            fit_intercept=self.fit_intercept,
        )
        mean = scores.mean(axis=0)
        best = int(np.argmax(mean))
        self.cv_results_ = {"rank": ranks.copy(), "mean_test_score": mean,
                            "std_test_score": scores.std(axis=0)}
        for k, split in enumerate(scores):
            self.cv_results_[f"split{k}_test_score"] = split
        self.best_score_ = float(mean[best])
        return self._fit_rank(X, Y, int(ranks[best]))
