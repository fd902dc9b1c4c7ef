"""Bad input to the static estimators: a clear error naming the parameter, nothing mutated."""

import numpy as np
import pytest

from sklearn_ebound import (
    IntrinsicRankEstimator,
    ReducedRankRegressor,
    ReducedRankRegressorCV,
    excess_risk_curve,
)

ESTIMATORS = [ReducedRankRegressor, ReducedRankRegressorCV, IntrinsicRankEstimator]


def _data(n=40, p=5, q=3, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, p)), rng.standard_normal((n, q))


@pytest.mark.parametrize("Estimator", ESTIMATORS)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("where", ["X", "Y"])
def test_non_finite_values(Estimator, bad, where):
    X, Y = _data()
    (X if where == "X" else Y)[3, 1] = bad
    with pytest.raises(ValueError, match="NaN|infinity"):
        Estimator().fit(X, Y)


# scikit-learn's own refusal of strings where numbers are expected (check_array, dtype="numeric").
STRINGS = "dtype='numeric' is not compatible with arrays of bytes/strings"


@pytest.mark.parametrize("Estimator", ESTIMATORS)
@pytest.mark.parametrize("form", ["str", "bytes", "list"])
def test_numeric_strings_are_refused_as_scikit_learn_does(Estimator, form):
    X, Y = _data()
    strings = {"str": X.astype(str), "bytes": X.astype(bytes), "list": X.astype(str).tolist()}
    with pytest.raises(ValueError, match=STRINGS):
        Estimator().fit(strings[form], Y)
    fitted = Estimator().fit(X, Y)
    with pytest.raises(ValueError, match=STRINGS):
        (fitted.transform if hasattr(fitted, "transform") else fitted.predict)(strings[form])


@pytest.mark.filterwarnings("ignore::sklearn_ebound.exceptions.RankEstimationWarning")
def test_numeric_strings_in_sequences_are_refused():
    from sklearn_ebound.datasets import make_attention_task

    X, Y = make_attention_task("linear", 30, 4, 3, rank=1, random_state=0)
    with pytest.raises(ValueError, match=STRINGS):
        IntrinsicRankEstimator().fit(X.astype(str), Y)
    with pytest.raises(ValueError, match=STRINGS):
        IntrinsicRankEstimator().fit(X, Y.astype(str))
    fitted = IntrinsicRankEstimator().fit(X, Y)
    with pytest.raises(ValueError, match=STRINGS):
        fitted.transform(X.astype(str))


@pytest.mark.parametrize("Estimator", ESTIMATORS)
def test_wrong_number_of_dimensions(Estimator):
    X, Y = _data()
    with pytest.raises(ValueError, match="2D array"):
        Estimator().fit(X[:, 0], Y)
    # 3-D X is sequence data: it needs 3-D targets (static estimators refuse it outright).
    with pytest.raises(ValueError, match="dim|3-D"):
        Estimator().fit(X[:, :, None], Y)


def test_four_dimensional_input_names_the_accepted_forms():
    X, Y = _data()
    for args in ((X.reshape(40, 5, 1, 1), Y), (X[:, :, None], Y.reshape(40, 3, 1, 1))):
        with pytest.raises(ValueError, match="2-D .* or 3-D sequences.*Got a 4-D array"):
            IntrinsicRankEstimator().fit(*args)


@pytest.mark.parametrize("Estimator", ESTIMATORS)
def test_mismatched_sample_counts(Estimator):
    X, Y = _data()
    with pytest.raises(ValueError, match="inconsistent numbers of samples"):
        Estimator().fit(X, Y[:-1])


@pytest.mark.parametrize("Estimator", ESTIMATORS)
def test_too_few_samples(Estimator):
    X, Y = _data()
    with pytest.raises(ValueError, match="minimum of 2 is required"):
        Estimator().fit(X[:1], Y[:1])


@pytest.mark.parametrize(
    "estimator, match",
    [
        (ReducedRankRegressor(rank=-1), "'rank' parameter"),
        (ReducedRankRegressor(rank=2.5), "'rank' parameter"),
        (ReducedRankRegressor(alpha=-1.0), "'alpha' parameter"),
        (ReducedRankRegressor(rank=4), "`rank` upper bound is 3"),
        (ReducedRankRegressorCV(ranks=[9]), "`ranks` upper bound is 3"),
        (ReducedRankRegressorCV(cv=1), "cv"),
        (IntrinsicRankEstimator(tau=0.0), "'tau' parameter"),
        (IntrinsicRankEstimator(tau=1.5), "'tau' parameter"),
        (IntrinsicRankEstimator(significance=0.0), "'significance' parameter"),
        (IntrinsicRankEstimator(significance=1e-300), "'significance' parameter"),
        (IntrinsicRankEstimator(significance=0.5), "'significance' parameter"),
        (IntrinsicRankEstimator(criterion="best"), "'criterion' parameter"),
        (IntrinsicRankEstimator(operator="dynamic"), "'operator' parameter"),
    ],
)
def test_parameters_out_of_range(estimator, match):
    X, Y = _data()
    with pytest.raises(ValueError, match=match):
        estimator.fit(X, Y)


@pytest.mark.parametrize("Estimator", ESTIMATORS)
def test_inputs_are_not_mutated(Estimator):
    X, Y = _data()
    X0, Y0 = X.copy(), Y.copy()
    Estimator().fit(X, Y)
    np.testing.assert_array_equal(X, X0)
    np.testing.assert_array_equal(Y, Y0)


def test_transform_checks_the_feature_count():
    X, Y = _data()
    est = IntrinsicRankEstimator().fit(X, Y)
    with pytest.raises(ValueError, match="features"):
        est.transform(X[:, :4])


def test_excess_risk_curve_bad_ranks():
    X, Y = _data()
    with pytest.raises(ValueError, match="`ranks` must be integers in \\[0, 3\\]"):
        excess_risk_curve(X, Y, ranks=[0, 7])
