"""The edge of the noise in the fitted values, for white and correlated noise, and the noise
covariance estimate it uses."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sklearn_ebound import IntrinsicRankEstimator
from sklearn_ebound._operators import (
    null_edge_correlated,
    null_edge_white,
    shrunk_noise_covariance,
)
from sklearn_ebound.datasets import make_static_task
from sklearn_ebound.datasets._static import ar1_covariance


def _largest_squared_singular_values(eigenvalues, n_rows, draws, seed=0):
    rng = np.random.default_rng(seed)
    Z = rng.standard_normal((draws, n_rows, len(eigenvalues))) * np.sqrt(eigenvalues)
    return np.linalg.svd(Z, compute_uv=False)[:, 0] ** 2


@settings(max_examples=40, deadline=None)
@given(n_rows=st.integers(1, 300), n_cols=st.integers(1, 300))
def test_equal_eigenvalues_give_the_white_edge(n_rows, n_cols):
    assert null_edge_correlated(np.ones(n_cols), n_rows) == pytest.approx(
        null_edge_white(n_rows, n_cols), rel=1e-9)


@settings(max_examples=30, deadline=None)
@given(eigenvalues=st.lists(st.floats(0.01, 100.0), min_size=1, max_size=40),
       n_rows=st.integers(1, 100), scale=st.floats(1e-3, 1e3), bump=st.floats(0.1, 10.0))
def test_edge_is_scale_equivariant_and_grows_with_the_noise(eigenvalues, n_rows, scale, bump):
    t = np.array(eigenvalues)
    edge = null_edge_correlated(t, n_rows)
    assert null_edge_correlated(scale * t, n_rows) == pytest.approx(scale * edge, rel=1e-7)
    louder = t.copy()
    louder[0] += bump
    assert null_edge_correlated(louder, n_rows) > edge
    assert null_edge_correlated(t, n_rows + 1) > edge


@pytest.mark.parametrize("eigenvalues, n_rows", [
    (np.linalg.eigvalsh(ar1_covariance(30, 0.3)), 30),
    (np.linalg.eigvalsh(ar1_covariance(60, 0.7)), 20),
    (np.linspace(0.1, 3.0, 40), 120),
])
def test_correlated_edge_is_the_999_quantile(eigenvalues, n_rows):
    largest = _largest_squared_singular_values(eigenvalues, n_rows, draws=4000)
    edge = null_edge_correlated(eigenvalues, n_rows)
    # The Tracy-Widom approximation, against the Monte Carlo 99.9% quantile.
    assert edge == pytest.approx(np.quantile(largest, 0.999), rel=0.05)
    assert np.mean(largest > edge) < 0.005


def test_edge_without_noise_or_rows_is_zero():
    assert null_edge_correlated(np.zeros(5), 10) == 0.0
    assert null_edge_correlated(np.ones(5), 0) == 0.0


def _residual(covariance, dof, seed=0):
    rng = np.random.default_rng(seed)
    E = rng.standard_normal((dof, len(covariance))) @ np.linalg.cholesky(covariance).T
    return E.T @ E


def test_shrinkage_removes_the_spread_of_white_noise():
    q, dof = 50, 60
    residual = _residual(np.eye(q), dof)
    before = residual.copy()
    values, vectors = shrunk_noise_covariance(residual, dof)
    np.testing.assert_array_equal(residual, before)  # the input is not mutated
    sample = np.linalg.eigvalsh(residual / dof)
    # Marchenko-Pastur spreads the sample eigenvalues over about [0.01, 3.7]; shrinkage pulls
    # them back to the true 1, and keeps the trace.
    assert sample.max() / sample.min() > 20
    assert values.max() / values.min() < 1.5
    assert values.sum() == pytest.approx(sample.sum(), rel=1e-10)
    np.testing.assert_allclose(vectors.T @ vectors, np.eye(q), atol=1e-10)


def test_shrinkage_keeps_a_strong_noise_direction():
    q, dof, spike = 100, 130, 10.0
    u = np.ones(q) / np.sqrt(q)
    covariance = np.eye(q) + spike * np.outer(u, u)
    values, vectors = shrunk_noise_covariance(_residual(covariance, dof), dof)
    top = np.argmax(values)
    # The spiked-model inversion restores the population variance 11 along the spike,
    # which shrinkage alone would pull halfway to the mean.
    assert values[top] == pytest.approx(1 + spike, rel=0.25)
    assert abs(vectors[:, top] @ u) > 0.9


def _noise_only(n, p, q, covariance, seed):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, p))
    return X, rng.standard_normal((n, q)) @ np.linalg.cholesky(covariance).T


@pytest.mark.parametrize("covariance", [
    ar1_covariance(60, 0.9),
    np.eye(60) + 20 * np.full((60, 60), 1 / 60),  # one strong noise direction
], ids=["ar1-0.9", "spike"])
def test_correlated_noise_alone_reads_rank_zero(covariance):
    ranks = [IntrinsicRankEstimator().fit(*_noise_only(200, 30, 60, covariance, seed)).rank_
             for seed in range(10)]
    assert ranks.count(0) >= 9, ranks


def test_signal_where_the_noise_is_weak_is_found_by_whitening():
    # Strongly correlated noise leaves some output directions almost noise-free; the planted
    # directions are random, so part of their signal lies there. Only a test that whitens
    # the noise (the canonical correlations) sees it.
    ranks = [IntrinsicRankEstimator().fit(*make_static_task(
        1000, 100, 100, rank=2, noise=1.0, noise_correlation=0.8, random_state=seed)).rank_
        for seed in range(3)]
    assert ranks == [2, 2, 2]


def test_many_noise_dimensions_per_sample_keep_their_power():
    # N = 400, p = q = 100, noise correlation 0.3, rank 3 at the edge of detectability:
    # whitening with the 100 x 100 sample noise covariance (300 residual degrees of freedom)
    # costs most of the power; the shrunk-covariance edge keeps it.
    rng = np.random.default_rng(0)
    found = 0
    for _ in range(5):
        X, Y, params = make_static_task(400, 100, 100, rank=3, noise=1.0, input_correlation=0.5,
                                        noise_correlation=0.3, random_state=rng.integers(2**31),
                                        return_params=True)
        signal, noise = X @ params.coef, Y - X @ params.coef
        # Smallest signal singular value at 0.6 times the noise's spectral norm.
        signal *= 0.6 * np.linalg.norm(noise, 2) / np.linalg.svd(signal, compute_uv=False)[2]
        found += IntrinsicRankEstimator().fit(X, signal + noise).rank_ == 3
    assert found >= 4
