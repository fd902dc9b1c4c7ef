"""Reduced-rank regression: deficiency, achievability, the rank path and its CV."""

import numpy as np
import pytest
from sklearn.model_selection import GridSearchCV, KFold

from sklearn_ebound import ReducedRankRegressor, ReducedRankRegressorCV, excess_risk_curve
from sklearn_ebound.datasets import make_static_task


def _planted(seed, n=40000, p=12, q=10, sv=(2.0, 1.5, 1.0, 0.6), corr=0.5):
    X, Y, params = make_static_task(
        n, p, q, rank=len(sv), singular_values=sv, noise=0.5, input_correlation=corr,
        noise_correlation=0.3, random_state=seed, return_params=True,
    )
    return X, Y, params


@pytest.mark.parametrize("seed", [0, 1])
def test_deficiency_and_achievability(seed):
    X, Y, params = _planted(seed)
    # Held-out rows: fresh draws of inputs and noise through the same planted operator.
    rng = np.random.default_rng(100 + seed)
    X_test = rng.multivariate_normal(np.zeros(12), params.input_covariance, size=40000)
    E = rng.multivariate_normal(np.zeros(10), params.noise_covariance, size=40000)
    Y_test = X_test @ params.coef + E
    # Floor measured on the same held-out noise, so the excess isolates the model error.
    floor = np.mean(np.sum(E**2, axis=1))
    curve = excess_risk_curve(X, Y, X_test=X_test, y_test=Y_test, noise_floor=floor,
                              singular_values=params.singular_values)
    r_star = params.rank
    below = curve.ranks < r_star
    ratio = curve.excess_risk[below] / curve.bound[below]
    # Deficiency: within 10% of T(r), never meaningfully below it.
    assert np.all(np.abs(ratio - 1) < 0.10), ratio
    assert np.all(ratio > 0.97), ratio
    # Achievability: at r* the excess risk is under 2% of T(r* - 1).
    at = curve.excess_risk[curve.ranks == r_star][0]
    assert at < 0.02 * curve.bound[curve.ranks == r_star - 1][0], at


def test_rank_zero_predicts_the_mean_and_full_rank_is_least_squares():
    X, Y = make_static_task(200, 6, 4, rank=2, random_state=0)
    np.testing.assert_allclose(ReducedRankRegressor(rank=0).fit(X, Y).predict(X),
                               np.tile(Y.mean(axis=0), (200, 1)))
    from sklearn.linear_model import LinearRegression

    np.testing.assert_allclose(ReducedRankRegressor().fit(X, Y).predict(X),
                               LinearRegression().fit(X, Y).predict(X), atol=1e-10)
    model = ReducedRankRegressor(rank=2).fit(X, Y)
    assert np.linalg.matrix_rank(model.coef_) == 2
    assert model.coef_.shape == (4, 6)


def test_single_target_keeps_one_dimensional_predictions():
    X, Y = make_static_task(100, 5, 1, rank=1, random_state=0)
    model = ReducedRankRegressor(rank=1).fit(X, Y[:, 0])
    assert model.predict(X).shape == (100,)
    assert model.coef_.shape == (5,)


def test_grid_search_shows_the_deficiency_curve():
    X, Y = make_static_task(2000, 8, rank=3, singular_values=[2, 1, 0.5], noise=0.2,
                            random_state=0)
    search = GridSearchCV(ReducedRankRegressor(), {"rank": range(1, 9)}, cv=3).fit(X, Y)
    scores = search.cv_results_["mean_test_score"]
    assert search.best_params_["rank"] >= 3
    assert np.all(np.diff(scores[:3]) > 0.02)  # every rank below r* costs
    assert np.ptp(scores[2:]) < 0.01  # flat from r* on


@pytest.mark.parametrize("scoring", [None, "neg_mean_squared_error", "neg_mean_absolute_error"])
def test_cv_path_equals_grid_search(scoring):
    X, Y = make_static_task(600, 10, 7, rank=3, noise=0.5, random_state=1)
    cv = KFold(5, shuffle=True, random_state=0)
    ranks = list(range(0, 8))
    path = ReducedRankRegressorCV(ranks=ranks, cv=cv, scoring=scoring).fit(X, Y)
    grid = GridSearchCV(ReducedRankRegressor(), {"rank": ranks}, cv=cv, scoring=scoring).fit(X, Y)
    np.testing.assert_allclose(path.cv_results_["mean_test_score"],
                               grid.cv_results_["mean_test_score"], rtol=1e-8)
    assert path.rank_ == grid.best_params_["rank"]
    np.testing.assert_allclose(path.predict(X), grid.predict(X), atol=1e-10)


def test_ridge_path_matches_refits():
    X, Y = make_static_task(300, 10, 6, rank=2, noise=1.0, random_state=2)
    cv = KFold(4)
    path = ReducedRankRegressorCV(ranks=[1, 2, 3], cv=cv, alpha=5.0).fit(X, Y)
    grid = GridSearchCV(ReducedRankRegressor(alpha=5.0), {"rank": [1, 2, 3]}, cv=cv).fit(X, Y)
    np.testing.assert_allclose(path.cv_results_["mean_test_score"],
                               grid.cv_results_["mean_test_score"], rtol=1e-8)


def test_rank_upper_bound_is_checked():
    X, Y = make_static_task(50, 6, 3, rank=1, random_state=0)
    with pytest.raises(ValueError, match=r"`rank` upper bound is 3"):
        ReducedRankRegressor(rank=4).fit(X, Y)
    with pytest.raises(ValueError, match="`ranks` upper bound is 3"):
        ReducedRankRegressorCV(ranks=[1, 5]).fit(X, Y)
    with pytest.raises(ValueError, match="ranks"):
        ReducedRankRegressorCV(ranks=[-1, 2]).fit(X, Y)


def test_excess_risk_curve_keeps_the_old_target_keyword_for_one_release():
    X, Y = make_static_task(300, 6, 4, rank=2, noise=0.5, random_state=0)
    new = excess_risk_curve(X[:200], Y[:200], X_test=X[200:], y_test=Y[200:])
    with pytest.warns(FutureWarning, match="`Y_test` was renamed `y_test`"):
        old = excess_risk_curve(X[:200], Y[:200], X_test=X[200:], Y_test=Y[200:])
    np.testing.assert_array_equal(old.risk, new.risk)
