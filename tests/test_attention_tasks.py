"""Planted-rank sequence tasks: shapes, the planted rank, the model equations, the noise floor."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import softmax

from sklearn_ebound.datasets import make_attention_task, make_static_mixing_task


@pytest.mark.parametrize("make", [make_attention_task, make_static_mixing_task])
@pytest.mark.parametrize("attention", ["linear", "softmax"])
def test_shapes_and_params(make, attention):
    X, Y, params = make(attention, 30, 7, 5, rank=2, random_state=0, return_params=True)
    assert X.shape == (30, 7, 5) and Y.shape == (30, 7, 5)
    assert params.rank == 2 and params.attention == attention
    assert params.noise_floor == pytest.approx(0.1**2 * 5)
    X2, Y2 = make(attention, 30, 7, 5, rank=2, random_state=0)
    np.testing.assert_array_equal(X, X2)
    np.testing.assert_array_equal(Y, Y2)


@settings(max_examples=25, deadline=None)
@given(
    attention=st.sampled_from(["linear", "softmax"]),
    n_features=st.integers(1, 7),
    data=st.data(),
    seed=st.integers(0, 2**16),
)
def test_attention_kernel_has_planted_rank(attention, n_features, data, seed):
    rank = data.draw(st.integers(0, n_features))
    _, _, p = make_attention_task(
        attention, 3, 4, n_features, rank=rank, random_state=seed, return_params=True
    )
    assert p.W_Q.shape == p.W_K.shape == (n_features, rank)
    np.testing.assert_allclose(p.W, p.W_Q @ p.W_K.T)
    assert np.linalg.matrix_rank(p.W) == rank
    # W = U S R^T: its singular values are the planted ones.
    np.testing.assert_allclose(np.linalg.svd(p.W, compute_uv=False), p.singular_values, atol=1e-12)


@settings(max_examples=25, deadline=None)
@given(n_tokens=st.integers(2, 9), data=st.data(), seed=st.integers(0, 2**16))
def test_static_mixing_has_planted_rank(n_tokens, data, seed):
    rank = data.draw(st.integers(1, n_tokens))
    _, _, lin = make_static_mixing_task(
        "linear", 3, n_tokens, 2, rank=rank, random_state=seed, return_params=True
    )
    assert np.linalg.matrix_rank(lin.mixing) == rank
    _, _, soft = make_static_mixing_task(
        "softmax", 3, n_tokens, 2, rank=rank, logit_scale=0.7, random_state=seed,
        return_params=True,
    )
    assert np.linalg.matrix_rank(soft.logits) == rank
    # Unit root-mean-square logit, rows of the mixing sum to one.
    assert np.linalg.norm(soft.logits) == pytest.approx(n_tokens)
    np.testing.assert_allclose(soft.mixing.sum(axis=1), 1.0)
    # Row-centred log mixing = beta L (I - 1 1^T / n): the rank comes back.
    log_mixing = np.log(soft.mixing)
    centred = log_mixing - log_mixing.mean(axis=1, keepdims=True)
    expected = 0.7 * (soft.logits - soft.logits.mean(axis=1, keepdims=True))
    np.testing.assert_allclose(centred, expected, atol=1e-10)


@pytest.mark.parametrize("attention", ["linear", "softmax"])
@pytest.mark.parametrize("value", ["identity", "random"])
def test_attention_targets_follow_the_model(attention, value):
    beta, n, d = 1.7, 6, 4
    X, Y, p = make_attention_task(
        attention, 20, n, d, rank=2, logit_scale=beta, value=value, noise=0.0, random_state=1,
        return_params=True,
    )
    for Xs, Ys in zip(X, Y, strict=True):
        logits = Xs @ p.W @ Xs.T
        A = logits / n if attention == "linear" else softmax(beta * logits / np.sqrt(d), axis=1)
        np.testing.assert_allclose(Ys, A @ Xs @ p.V.T, atol=1e-12)


@pytest.mark.parametrize("attention", ["linear", "softmax"])
def test_static_targets_follow_the_model(attention):
    X, Y, p = make_static_mixing_task(
        attention, 20, 6, 3, rank=2, noise=0.0, random_state=1, return_params=True
    )
    np.testing.assert_allclose(Y, p.mixing @ X @ p.V.T, atol=1e-12)


@pytest.mark.parametrize("make", [make_attention_task, make_static_mixing_task])
def test_noise_floor_is_the_risk_of_the_true_model(make):
    # The noise is drawn last, so the same seed with noise=0 gives the clean targets.
    X, Y, p = make("softmax", 2000, 8, 3, n_targets=5, value="random", noise=0.2,
                   random_state=3, return_params=True)
    X0, Y0 = make("softmax", 2000, 8, 3, n_targets=5, value="random", noise=0.0, random_state=3)
    np.testing.assert_array_equal(X, X0)
    per_token_risk = ((Y - Y0) ** 2).sum(axis=-1).mean()
    assert p.noise_floor == pytest.approx(0.2**2 * 5)
    # 80000 squared N(0, 0.04) entries: relative standard error 0.5%.
    assert per_token_risk == pytest.approx(p.noise_floor, rel=0.03)


def test_value_maps():
    _, _, p = make_attention_task(
        "linear", 2, 3, 5, rank=3, value="low_rank", random_state=0, return_params=True
    )
    # The weakest key direction is annihilated by V: invisible through the values.
    np.testing.assert_allclose(p.V @ p.W_K[:, -1], 0.0, atol=1e-12)
    assert np.linalg.matrix_rank(p.V) == 4
    _, Y, p = make_attention_task(
        "linear", 2, 3, 5, n_targets=3, value="random", random_state=0, return_params=True
    )
    assert Y.shape == (2, 3, 3)
    np.testing.assert_allclose(np.linalg.svd(p.V, compute_uv=False), 1.0)
    V = np.arange(10.0).reshape(2, 5)
    _, Y, p = make_attention_task("linear", 2, 3, 5, value=V, random_state=0, return_params=True)
    assert Y.shape == (2, 3, 2) and p.noise_floor == pytest.approx(0.02)
    np.testing.assert_array_equal(p.V, V)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(attention="relu"), "`attention` must be 'linear' or 'softmax'"),
        (dict(rank=6), "rank == 6, must be <= 5"),
        (dict(n_tokens=0), "n_tokens == 0, must be >= 1"),
        (dict(noise=-1.0), "noise == -1.0, must be >= 0"),
        (dict(n_targets=3), "`value='identity'` needs `n_targets` == `n_features` = 5"),
        (dict(value="orthogonal"), "`value` must be one of"),
        (dict(value=np.ones((3, 4))), r"shape \(n_targets, n_features=5\)"),
        (dict(value=np.ones((3, 5)), n_targets=2), "disagrees with the 3 rows"),
        (dict(singular_values=[1.0, -1.0]), "`singular_values` must hold `rank`=2 positive"),
    ],
)
def test_attention_task_errors(kwargs, match):
    params = dict(attention="linear", n_samples=4, n_tokens=3, n_features=5, rank=2) | kwargs
    with pytest.raises(ValueError, match=match):
        make_attention_task(**params)


def test_static_mixing_errors():
    with pytest.raises(ValueError, match="rank == 7, must be <= 6"):
        make_static_mixing_task("linear", 4, 6, 2, rank=7)
    with pytest.raises(ValueError, match="rank == 0, must be >= 1"):
        make_static_mixing_task("softmax", 4, 6, 2, rank=0)


@pytest.mark.parametrize("make", [make_attention_task, make_static_mixing_task])
def test_deprecated_kind_keyword(make):
    # `kind=` is kept for one release, with a FutureWarning.
    with pytest.warns(FutureWarning, match="`kind` was renamed `attention`"):
        X, Y, params = make(kind="softmax", n_samples=5, n_tokens=4, n_features=3,
                            random_state=0, return_params=True)
    X2, Y2 = make("softmax", 5, 4, 3, random_state=0)
    np.testing.assert_array_equal(Y, Y2)
    assert params.attention == "softmax"
    with pytest.raises(ValueError, match="`attention` must be 'linear' or 'softmax'"):
        with pytest.warns(FutureWarning):
            make(kind="relu")
