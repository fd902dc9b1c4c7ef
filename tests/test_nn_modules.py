"""The torch modules compute exactly the mixing they document."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sklearn_ebound.datasets import make_attention_task, make_static_mixing_task
from sklearn_ebound.nn import LowRankAttention, StaticTokenMixer


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    # The problems here are tiny: one thread is faster than several competing for a shared CPU.
    n_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n_threads)


def _reference_attention(X, W_Q, W_K, V, attention, beta):
    """The textbook formulas, with an explicit n x n mixing matrix."""
    n, d = X.shape[-2:]
    logits = X @ W_Q @ W_K.T @ X.transpose(-2, -1)
    if attention == "linear":
        A = logits / n
    else:
        A = torch.softmax(beta * logits / math.sqrt(d), dim=-1)
    return A @ X @ V.T


@settings(max_examples=30, deadline=None)
@given(
    attention=st.sampled_from(["linear", "softmax"]),
    value=st.sampled_from([None, "identity", "array"]),
    n_tokens=st.integers(1, 9),
    n_features=st.integers(1, 6),
    data=st.data(),
    beta=st.floats(0.0, 4.0),
    seed=st.integers(0, 2**16),
)
def test_attention_forward_matches_formula(attention, value, n_tokens, n_features, data, beta,
                                           seed):
    rank = data.draw(st.integers(0, n_features))
    torch.manual_seed(seed)
    n_targets = n_features if value != "array" else data.draw(st.integers(1, 4))
    V_fixed = torch.randn(n_targets, n_features)
    module = LowRankAttention(
        n_features,
        rank=rank,
        attention=attention,
        value=V_fixed.numpy() if value == "array" else value,
        logit_scale=beta,
        init_scale=1.0,
    )
    X = torch.randn(3, n_tokens, n_features)
    if value is None:
        V = module.value_map.weight
    elif value == "identity":
        V = torch.eye(n_features)
    else:
        V = V_fixed
    with torch.no_grad():
        expected = _reference_attention(X, module.W_Q, module.W_K, V, attention, beta)
        got = module(X)
    assert got.shape == (3, n_tokens, n_targets)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    kernel = module.qk_kernel().detach().numpy()
    assert kernel.shape == (n_features, n_features)
    assert np.linalg.matrix_rank(kernel, tol=1e-5) <= rank


@pytest.mark.parametrize("attention", ["linear", "softmax"])
def test_attention_with_planted_weights_reproduces_the_task(attention):
    # The module and the generator share one convention (1/n, beta / sqrt(d), V on the right).
    X, Y, p = make_attention_task(
        attention, 10, 7, 5, rank=2, logit_scale=2.5, value="random", noise=0.0, random_state=0,
        return_params=True,
    )
    module = LowRankAttention(5, rank=2, attention=attention, value=p.V, logit_scale=2.5)
    with torch.no_grad():
        module.W_Q.copy_(torch.as_tensor(p.W_Q))
        module.W_K.copy_(torch.as_tensor(p.W_K))
        got = module(torch.as_tensor(X, dtype=torch.float32)).numpy()
    np.testing.assert_allclose(got, Y, atol=1e-4)


@pytest.mark.parametrize("attention", ["linear", "softmax"])
def test_static_mixer_reproduces_the_task(attention):
    X, Y, p = make_static_mixing_task(
        attention, 10, 6, 3, rank=2, logit_scale=0.8, noise=0.0, random_state=0, return_params=True
    )
    mixer = StaticTokenMixer(6, rank=2, attention=attention, logit_scale=0.8)
    kernel = p.mixing if attention == "linear" else p.logits
    U, s, Vt = np.linalg.svd(kernel)
    with torch.no_grad():
        mixer.A.copy_(torch.as_tensor(U[:, :2] * s[:2]))
        mixer.B.copy_(torch.as_tensor(Vt[:2].T))
        got = mixer(torch.as_tensor(X, dtype=torch.float32)).numpy()
    np.testing.assert_allclose(got, Y, atol=1e-4)
    np.testing.assert_allclose(mixer.mixing_kernel().detach().numpy(), kernel, atol=1e-5)


def test_rank_zero_softmax_is_uniform_attention():
    module = LowRankAttention(4, rank=0, attention="softmax", value="identity")
    X = torch.randn(2, 5, 4)
    torch.testing.assert_close(module(X), X.mean(dim=1, keepdim=True).expand_as(X))


def test_init_scale_sets_the_factor_size():
    torch.manual_seed(0)
    module = LowRankAttention(64, rank=64, init_scale=1e-3)
    assert module.W_Q.std().item() == pytest.approx(1e-3, rel=0.05)
    assert module.W_K.std().item() == pytest.approx(1e-3, rel=0.05)
    mixer = StaticTokenMixer(64, init_scale=1e-2)
    assert mixer.A.shape == (64, 64) and mixer.A.std().item() == pytest.approx(1e-2, rel=0.05)


def test_fixed_value_map_is_a_buffer_not_a_parameter():
    V = np.eye(3)[:2]
    module = LowRankAttention(3, value=V)
    assert {name for name, _ in module.named_parameters()} == {"W_Q", "W_K"}
    assert "value_map.weight" in dict(module.named_buffers())


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: LowRankAttention(3, attention="relu"),
         "`attention` must be 'softmax' or 'linear'"),
        (lambda: LowRankAttention(3, value="identity", n_targets=2), "needs n_targets"),
        (lambda: LowRankAttention(3, value="orthogonal"), "`value` must be 'learned'"),
        (lambda: LowRankAttention(3, value=np.ones((2, 4))), r"shape \(n_targets, n_features\)"),
        (lambda: StaticTokenMixer(4, attention="relu"),
         "`attention` must be 'linear' or 'softmax'"),
        (lambda: StaticTokenMixer(4, value=None), "`n_features` is required"),
    ],
)
def test_module_errors(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_deprecated_spellings_warn_and_still_work():
    # `kind=` and `value="learned"` are kept for one release, each with a FutureWarning.
    torch.manual_seed(0)
    with pytest.warns(FutureWarning, match="`kind` was renamed `attention`"):
        module = LowRankAttention(3, kind="linear")
    assert module.attention == "linear"
    with pytest.warns(FutureWarning, match="`kind` was renamed `attention`"):
        mixer = StaticTokenMixer(4, kind="softmax")
    assert mixer.attention == "softmax"
    with pytest.warns(FutureWarning, match="`value='learned'` is now spelt `value=None`"):
        module = LowRankAttention(3, value="learned")
    assert isinstance(module.value_map.weight, torch.nn.Parameter)
    with pytest.warns(FutureWarning, match="`value='learned'` is now spelt `value=None`"):
        mixer = StaticTokenMixer(4, n_features=2, value="learned")
    assert mixer.value_map.weight.shape == (2, 2)
