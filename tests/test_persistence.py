"""Every fitted estimator round-trips through pickle, joblib and skops unchanged."""

import pickle
import warnings

import joblib
import numpy as np
import pytest

skops_io = pytest.importorskip("skops.io")

from sklearn_ebound import (  # noqa: E402
    IntrinsicRankEstimator,
    ReducedRankRegressor,
    ReducedRankRegressorCV,
)
from sklearn_ebound.datasets import make_attention_task, make_static_task  # noqa: E402

_X, _Y = make_static_task(200, 6, rank=2, noise=0.3, random_state=0)
_XL, _YL = make_attention_task("linear", 200, 8, 4, rank=1, noise=0.05, random_state=0)
_XS, _YS = make_attention_task("softmax", 200, 8, 4, rank=2, noise=0.05, random_state=0)

_CASES = {
    "static": (lambda: IntrinsicRankEstimator(), (_X, _Y)),
    "static-cv": (lambda: IntrinsicRankEstimator(criterion="cv", cv=3), (_X, _Y)),
    "inputs-only": (lambda: IntrinsicRankEstimator(), (_X,)),
    "attention-value-known": (
        lambda: IntrinsicRankEstimator("attention", attention="linear", value="identity"),
        (_XL, _YL)),
    "attention-value-unknown": (
        lambda: IntrinsicRankEstimator("attention", attention="softmax"), (_XS, _YS)),
    "reduced-rank": (lambda: ReducedRankRegressor(rank=2), (_X, _Y)),
    "reduced-rank-cv": (lambda: ReducedRankRegressorCV(cv=3), (_X, _Y)),
}


def _fit(make, data):
    with warnings.catch_warnings():
        # A RankEstimationWarning on these small tasks is not what is tested here.
        warnings.simplefilter("ignore")
        return make().fit(*data)


def _output(est, X):
    return est.transform(X) if hasattr(est, "transform") else est.predict(X)


def _assert_same(a, b, name):
    if isinstance(a, dict):
        assert a.keys() == b.keys(), name
        for key in a:
            _assert_same(a[key], b[key], f"{name}[{key!r}]")
    elif isinstance(a, (np.ndarray, list, tuple)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=name)
    else:
        assert a == b or (a != a and b != b), name  # nan == nan


def _roundtrip(est, how, tmp_path):
    path = tmp_path / f"model.{how}"
    if how == "pickle":
        return pickle.loads(pickle.dumps(est))
    if how == "joblib":
        joblib.dump(est, path)
        return joblib.load(path)
    skops_io.dump(est, path)
    untrusted = skops_io.get_untrusted_types(file=path)
    return skops_io.load(path, trusted=untrusted)


@pytest.mark.parametrize("how", ["pickle", "joblib", "skops"])
@pytest.mark.parametrize("case", list(_CASES))
def test_static_estimators_roundtrip(case, how, tmp_path):
    make, data = _CASES[case]
    est = _fit(make, data)
    loaded = _roundtrip(est, how, tmp_path)
    assert type(loaded) is type(est)
    np.testing.assert_array_equal(_output(loaded, data[0]), _output(est, data[0]))
    assert loaded.rank_ == est.rank_
    fitted = {k: v for k, v in vars(est).items() if k.endswith("_") and not k.startswith("_")}
    for key, value in fitted.items():
        _assert_same(value, getattr(loaded, key), key)


@pytest.mark.parametrize("case", list(_CASES))
def test_skops_lists_only_package_types(case, tmp_path):
    # Loading needs the caller to trust only this package's own classes: no builtins, no
    # callables that skops would have to run.
    est = _fit(*_CASES[case])
    untrusted = skops_io.get_untrusted_types(data=skops_io.dumps(est))
    assert f"{type(est).__module__}.{type(est).__qualname__}" in untrusted
    assert all(t.startswith("sklearn_ebound.") for t in untrusted), untrusted
    with pytest.raises(skops_io.exceptions.UntrustedTypesFoundException):
        skops_io.loads(skops_io.dumps(est))


# The torch regressor ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def net():
    from sklearn_ebound.nn import LowRankAttentionRegressor

    return LowRankAttentionRegressor(attention="linear", max_epochs=5, batch_size=-1, lr=0.05,
                                     random_state=0).fit(_XL, _YL)


@pytest.mark.parametrize("how", ["pickle", "joblib", "skops"])
def test_attention_regressor_roundtrips(net, how, tmp_path):
    loaded = _roundtrip(net, how, tmp_path)
    np.testing.assert_array_equal(loaded.predict(_XL), net.predict(_XL))
    np.testing.assert_array_equal(loaded.qk_kernel_, net.qk_kernel_)
    assert loaded.effective_rank_ == net.effective_rank_
    np.testing.assert_array_equal(loaded.history_[:, "train_loss"],
                                  net.history_[:, "train_loss"])
    # Still trainable after loading.
    loaded.partial_fit(_XL, _YL, epochs=1)


def test_skops_cannot_audit_the_torch_state(net):
    """Documented behaviour: skops loads the regressor, but not through its audit alone.

    skorch pickles the torch module, criterion and optimizer itself (``__getstate__``) and
    skops stores that as opaque bytes, which skorch unpickles on load. The module's class is
    therefore missing from the listing although it is restored: a skops file of this
    regressor is as safe to load as a pickle, no safer.
    """
    from sklearn_ebound.nn import LowRankAttention

    data = skops_io.dumps(net)
    untrusted = skops_io.get_untrusted_types(data=data)
    assert "sklearn_ebound.nn._regressor.LowRankAttentionRegressor" in untrusted
    loaded = skops_io.loads(data, trusted=untrusted)
    assert isinstance(loaded.module_, LowRankAttention)
    assert not any("LowRankAttention" == t.rsplit(".", 1)[-1] for t in untrusted)
