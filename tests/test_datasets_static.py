"""The planted static task carries the ground truth it claims."""

import numpy as np
import pytest
from scipy.linalg import sqrtm

from sklearn_ebound.datasets import make_static_task


@pytest.mark.parametrize("input_correlation", [0.0, 0.7])
def test_planted_spectrum_and_rank(input_correlation):
    sv = [3.0, 2.0, 0.5]
    X, Y, params = make_static_task(
        50, 8, 6, rank=3, singular_values=sv, input_correlation=input_correlation,
        random_state=0, return_params=True,
    )
    assert X.shape == (50, 8) and Y.shape == (50, 6)
    assert np.linalg.matrix_rank(params.coef) == params.rank == 3
    # The planted spectrum is that of Sigma_X^{1/2} B.
    s = np.linalg.svd(np.real(sqrtm(params.input_covariance)) @ params.coef, compute_uv=False)
    np.testing.assert_allclose(s[:3], sv, rtol=1e-10)
    assert np.all(s[3:] < 1e-10)
    np.testing.assert_allclose(params.singular_values, [3.0, 2.0, 0.5, 0, 0, 0])
    assert params.noise_floor == pytest.approx(0.1**2 * 6)


def test_noise_and_input_covariances_are_realised():
    X, Y, params = make_static_task(
        40000, 4, 3, rank=1, noise=0.5, input_correlation=0.6, noise_correlation=-0.4,
        random_state=1, return_params=True,
    )
    np.testing.assert_allclose(np.cov(X.T), params.input_covariance, atol=0.03)
    E = Y - X @ params.coef
    np.testing.assert_allclose(np.cov(E.T), params.noise_covariance, atol=0.01)
    assert params.noise_covariance[0, 1] == pytest.approx(0.25 * -0.4)
    assert np.mean(np.sum(E**2, axis=1)) == pytest.approx(params.noise_floor, rel=0.02)


def test_same_seed_same_task_and_pure_noise():
    a = make_static_task(30, 5, rank=2, random_state=3)
    b = make_static_task(30, 5, rank=2, random_state=3)
    np.testing.assert_array_equal(a[1], b[1])
    X, Y, params = make_static_task(30, 5, rank=0, random_state=3, return_params=True)
    assert not np.any(params.coef)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"rank": 7}, "rank"),
        ({"rank": -1}, "rank"),
        ({"noise": -1.0}, "noise"),
        ({"input_correlation": 1.0}, "input_correlation"),
        ({"noise_correlation": -1.0}, "noise_correlation"),
        ({"singular_values": [1.0, 2.0]}, "singular_values"),
        ({"decay": 0.0}, "decay"),
        ({"n_samples": 0}, "n_samples"),
    ],
)
def test_bad_parameters(kwargs, match):
    params = {"n_samples": 20, "n_features": 5, "rank": 3} | kwargs
    with pytest.raises(ValueError, match=match):
        make_static_task(**params)
