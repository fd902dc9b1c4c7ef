"""scikit-learn's estimator checks on every public estimator."""

from sklearn.utils.estimator_checks import parametrize_with_checks

from sklearn_ebound import IntrinsicRankEstimator, ReducedRankRegressor, ReducedRankRegressorCV

ESTIMATORS = [
    ReducedRankRegressor(),
    ReducedRankRegressor(rank=1, alpha=0.5),
    ReducedRankRegressorCV(cv=3),
    IntrinsicRankEstimator(),
    IntrinsicRankEstimator(criterion="energy"),
]


def _expected_failed_checks(estimator):
    return {}


@parametrize_with_checks(ESTIMATORS, expected_failed_checks=_expected_failed_checks)
def test_sklearn_compatible(estimator, check):
    check(estimator)
