"""Dask: moments as dask reductions on a LocalCluster, and sweeps on joblib's dask backend."""

import numpy as np
import pytest

dask = pytest.importorskip("dask")
da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")

from joblib import parallel_backend  # noqa: E402
from sklearn.model_selection import GridSearchCV  # noqa: E402

from sklearn_ebound import IntrinsicRankEstimator, ReducedRankRegressor  # noqa: E402
from sklearn_ebound.datasets import make_attention_task, make_static_task  # noqa: E402
from sklearn_ebound.experiments import rank_sweep  # noqa: E402


@pytest.fixture(scope="module")
def client():
    # A real multi-process cluster on the loopback interface, started and stopped here.
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       host="127.0.0.1", dashboard_address=None)
    with distributed.Client(cluster) as client:
        yield client
    cluster.close()


def test_dask_fit_equals_in_memory_fit(client):
    X, Y = make_static_task(3000, 12, 8, rank=3, noise=0.3, input_correlation=0.5,
                            random_state=0)
    dX, dY = da.from_array(X, chunks=(700, 5)), da.from_array(Y, chunks=(1000, 8))
    for criterion in ["threshold", "rsc", "energy"]:
        local = IntrinsicRankEstimator(criterion=criterion).fit(X, Y)
        remote = IntrinsicRankEstimator(criterion=criterion).fit(dX, dY)
        assert remote.rank_ == local.rank_ == 3
        np.testing.assert_allclose(remote.singular_values_, local.singular_values_, rtol=1e-10)
    assert remote.n_features_in_ == 12


def test_dask_sequences(client):
    X, Y = make_attention_task("linear", 200, 16, 4, rank=2, noise=0.05, random_state=0)
    dX, dY = da.from_array(X, chunks=(45, 16, 4)), da.from_array(Y, chunks=(60, 8, 4))
    for kwargs in [{"value": "identity"}, {}]:
        local = IntrinsicRankEstimator("attention", attention="linear", **kwargs).fit(X, Y)
        remote = IntrinsicRankEstimator("attention", attention="linear", **kwargs).fit(dX, dY)
        assert remote.rank_ == local.rank_ == 2
        assert getattr(remote, "noise_model_", None) == getattr(local, "noise_model_", None)
        if getattr(local, "noise_model_", "gaussian") == "gaussian":
            np.testing.assert_allclose(remote.singular_values_, local.singular_values_,
                                       rtol=1e-9)
        else:
            # A resampled null reads the rows of the first block (dask) or of all (in
            # memory): its balanced spectrum is close, not equal.
            np.testing.assert_allclose(remote.singular_values_[:2], local.singular_values_[:2],
                                       rtol=0.2)


def test_dask_input_is_validated(client):
    X = np.ones((100, 3))
    X[50, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        IntrinsicRankEstimator().fit(da.from_array(X, chunks=30), da.ones((100, 2), chunks=30))
    with pytest.raises(ValueError, match="criterion='cv'"):
        IntrinsicRankEstimator(criterion="cv").fit(da.ones((10, 3)), da.ones((10, 2)))
    with pytest.raises(ValueError, match="inconsistent numbers of samples"):
        IntrinsicRankEstimator().fit(da.ones((10, 3)), da.ones((9, 2)))


def test_sweeps_on_the_dask_backend(client):
    X, Y = make_static_task(600, 6, rank=2, noise=0.2, random_state=0)
    local = GridSearchCV(ReducedRankRegressor(), {"rank": [1, 2, 3]}, cv=3).fit(X, Y)
    with parallel_backend("dask"):
        remote = GridSearchCV(ReducedRankRegressor(), {"rank": [1, 2, 3]}, cv=3,
                              n_jobs=-1).fit(X, Y)
        sweep = rank_sweep(ReducedRankRegressor(), X, Y, [0, 1, 2, 3], n_jobs=-1)
    np.testing.assert_allclose(remote.cv_results_["mean_test_score"],
                               local.cv_results_["mean_test_score"])
    assert sweep.knee == 2


def test_attention_sweep_on_the_dask_backend(client):
    from sklearn_ebound.nn import LowRankAttentionRegressor

    X, Y, params = make_attention_task("linear", 240, 8, 4, rank=2, value="identity",
                                       noise=0.05, random_state=0, return_params=True)
    net = LowRankAttentionRegressor(attention="linear", value="identity", lr=0.05,
                                    max_epochs=80, batch_size=-1, random_state=0)
    local = rank_sweep(net, X, Y, [1, 2, 3], cv=3, noise_floor=params.noise_floor)
    with parallel_backend("dask"):
        remote = rank_sweep(net, X, Y, [1, 2, 3], cv=3, n_jobs=-1,
                            noise_floor=params.noise_floor)
    assert remote.knee == local.knee == 2
    np.testing.assert_allclose(remote.column("risk"), local.column("risk"), rtol=1e-5)


def test_dask_groups_keep_the_first_block_for_the_diagnostics(client):
    import warnings

    from sklearn_ebound.exceptions import RankEstimationWarning

    rng = np.random.default_rng(0)
    n, p, q = 1500, 8, 20
    groups = np.repeat(np.arange(n // 15), 15)
    # Rows of a group share a random effect in the inputs and in the noise.
    X = rng.standard_normal((n, p)) + rng.standard_normal((n // 15, p))[groups]
    Y = rng.standard_normal((n, q)) + 1.5 * rng.standard_normal((n // 15, q))[groups]
    dX, dY = da.from_array(X, chunks=(600, p)), da.from_array(Y, chunks=(600, q))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RankEstimationWarning)
        local = IntrinsicRankEstimator(random_state=0).fit(X, Y, groups=groups)
        remote = IntrinsicRankEstimator(random_state=0).fit(dX, dY, groups=groups)
    assert remote.noise_model_ == local.noise_model_ == "group-bootstrap"
    assert remote.diagnostics_["n_rows"] == 600  # the first block's rows
    assert remote.rank_ == local.rank_ == 0
    # In memory the fitted values are balanced by the resampled noise of all the rows; from a
    # block's rows they are not: the spectra are close, not equal.
    np.testing.assert_allclose(remote.singular_values_, local.singular_values_, rtol=0.3)
    with pytest.raises(ValueError, match="one label per sample"):
        IntrinsicRankEstimator().fit(dX, dY, groups=groups[:-1])
