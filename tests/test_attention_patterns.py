"""Weighted masks (linear attention) and logit biases (softmax): the generator, the estimator,
both kernel solvers and the torch module apply one convention."""

import warnings

import numpy as np
import pytest
import torch
from conftest import dense_and_matrix_free_solves

from sklearn_ebound import IntrinsicRankEstimator
from sklearn_ebound._attention_operators import check_attention_pattern
from sklearn_ebound._kernel_moments import KernelMoments
from sklearn_ebound.datasets import alibi_bias, make_attention_task
from sklearn_ebound.exceptions import LackOfFitWarning, RankEstimationWarning
from sklearn_ebound.nn import LowRankAttention, LowRankAttentionRegressor

N_TOKENS = 12


def _weights(n, seed=0):
    """Non-negative weights with about 40% of the keys hidden (the diagonal always seen)."""
    rng = np.random.RandomState(seed)
    return rng.uniform(0.2, 2.0, (n, n)) * (rng.uniform(size=(n, n)) < 0.6) + np.eye(n)


def _patterns(n):
    """(attention, pattern parameters) of the planted tasks that use weights or a bias."""
    return {
        "weights, mean": ("linear", dict(mask=_weights(n), mask_normalization="mean")),
        "weights, none": ("linear", dict(mask=_weights(n) / n, mask_normalization="none")),
        "causal 1/n, none": ("linear", dict(mask=np.tril(np.ones((n, n))) / n,
                                            mask_normalization="none")),
        "bias array": ("softmax", dict(logit_bias=0.8 * np.random.RandomState(1)
                                       .standard_normal((n, n)))),
        "alibi": ("softmax", dict(logit_bias=("alibi", 0.3))),
        "causal alibi": ("softmax", dict(mask="causal", logit_bias=("alibi", 0.5))),
    }


PATTERNS = _patterns(N_TOKENS)


def _lengths(n_samples, n_tokens, seed):
    return np.random.RandomState(seed).randint(n_tokens // 2, n_tokens + 1, size=n_samples)


# --- the convention, written out ---------------------------------------------------------------

def _attend(attention, X, W, V, weights=None, normalization="mean", bias=None, beta=1.0):
    """One sequence, token by token: the documented formulas, independent of the package."""
    n, d = X.shape
    Y = np.zeros((n, V.shape[0]))
    for i in range(n):
        logits = np.array([X[i] @ W @ X[j] for j in range(n)])
        if attention == "linear":
            m = np.ones(n) if weights is None else weights[i]
            a = m / m.sum() if normalization == "mean" else m
            Y[i] = sum(a[j] * logits[j] * (V @ X[j]) for j in range(n))
        else:
            z = beta * logits / np.sqrt(d) + (0.0 if bias is None else bias[i])
            e = np.exp(z - z.max())
            Y[i] = (e / e.sum()) @ X @ V.T
    return Y


@pytest.mark.parametrize("normalization", ["mean", "none"])
def test_generator_mixes_by_the_stated_linear_weights(normalization):
    n, d = 7, 4
    weights = _weights(n, 3)
    X, Y, params = make_attention_task("linear", 3, n, d, rank=2, value="random", noise=0.0,
                                       mask=weights, mask_normalization=normalization,
                                       random_state=0, return_params=True)
    for s in range(3):
        expected = _attend("linear", X[s], params.W, params.V, weights, normalization)
        np.testing.assert_allclose(Y[s], expected, rtol=1e-10, atol=1e-12)
    assert params.mask_normalization == normalization
    np.testing.assert_array_equal(params.mask, weights > 0)
    np.testing.assert_array_equal(params.mask_weights, weights)


def test_generator_adds_the_logit_bias_to_the_scaled_logits():
    n, d = 7, 4
    bias = np.random.RandomState(2).standard_normal((n, n))
    X, Y, params = make_attention_task("softmax", 3, n, d, rank=2, logit_scale=2.0, noise=0.0,
                                       logit_bias=bias, random_state=0, return_params=True)
    for s in range(3):
        expected = _attend("softmax", X[s], params.W, params.V, bias=bias, beta=2.0)
        np.testing.assert_allclose(Y[s], expected, rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(params.logit_bias, bias)


def test_alibi_slopes_and_the_unnormalised_sums():
    np.testing.assert_array_equal(alibi_bias(4, 0.5)[3], [-1.5, -1.0, -0.5, 0.0])
    np.testing.assert_array_equal(alibi_bias(4, 0.5), alibi_bias(4, 0.5).T)
    # ("alibi", m) is alibi_bias(n, m); with mask="causal" the visible keys get -m (i - j).
    kw = dict(noise=0.0, random_state=4)
    _, Y = make_attention_task("softmax", 5, 6, 3, mask="causal", logit_bias=("alibi", 0.4), **kw)
    _, Y2 = make_attention_task("softmax", 5, 6, 3, mask="causal", logit_bias=alibi_bias(6, 0.4),
                                **kw)
    np.testing.assert_array_equal(Y, Y2)
    _, flat = make_attention_task("softmax", 5, 6, 3, mask="causal", **kw)
    assert not np.allclose(Y, flat)
    # 0/1 masks read as before: "mean" is the default's average over the allowed keys; "none"
    # of the causal mask is n_tokens times the average of the last token.
    _, causal = make_attention_task("linear", 5, 6, 3, mask="causal", **kw)
    _, mean = make_attention_task("linear", 5, 6, 3, mask="causal", mask_normalization="mean",
                                  **kw)
    _, summed = make_attention_task("linear", 5, 6, 3, mask="causal", mask_normalization="none",
                                    **kw)
    np.testing.assert_array_equal(mean, causal)
    np.testing.assert_allclose(summed, causal * np.arange(1, 7)[None, :, None], rtol=1e-12)


# --- the estimator and the two solvers ---------------------------------------------------------

@pytest.mark.parametrize("name", list(PATTERNS))
@pytest.mark.parametrize("d, rank, seed", [(6, 1, 0), (8, 3, 1)])
def test_planted_rank_is_read_exactly_with_weights_or_a_bias(name, d, rank, seed):
    attention, pattern = PATTERNS[name]
    X, Y, params = make_attention_task(attention, 300, N_TOKENS, d, rank=rank, value="random",
                                       noise=0.1, random_state=seed, return_params=True,
                                       **pattern)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RankEstimationWarning)  # and silently
        est = IntrinsicRankEstimator("attention", attention=attention, value=params.V,
                                     **pattern).fit(X, Y)
    assert est.rank_ == rank
    # The kernel itself, in the generator's units (times beta / sqrt(d) for softmax).
    W = params.W if attention == "linear" else params.W / np.sqrt(d)
    assert np.linalg.norm(est.qk_kernel_ - W) < 0.05 * np.linalg.norm(W)


def test_the_wrong_normalisation_is_a_different_model():
    # The unnormalised causal data read as the causal average (the default) fit worse and
    # leave spurious directions: why the convention is a parameter.
    n, d = 24, 12
    weights = np.tril(np.ones((n, n))) / n
    X, Y = make_attention_task("linear", 800, n, d, rank=3, noise=0.02, mask=weights,
                               mask_normalization="none", random_state=0)
    right = IntrinsicRankEstimator("attention", attention="linear", value="identity",
                                   mask=weights, mask_normalization="none").fit(X, Y)
    # ... and the lack-of-fit check says so, naming the weights as given.
    with pytest.warns(LackOfFitWarning, match="mask_normalization='none'"):
        wrong = IntrinsicRankEstimator("attention", attention="linear", value="identity",
                                       mask="causal").fit(X, Y)
    assert right.rank_ == 3 and wrong.rank_ > 3
    assert not right.lack_of_fit_["failed"] and wrong.lack_of_fit_["better"] == "linear-1/n"
    assert right.noise_variance_ < 1.5 * 0.02**2 < wrong.noise_variance_
    # With the value map unknown the per-token reading takes the weights' row sums too.
    unknown = IntrinsicRankEstimator("attention", attention="linear", mask=weights,
                                     mask_normalization="none").fit(X, Y)
    assert unknown.rank_ == 3


def test_partial_fit_and_an_unknown_value_map_take_the_pattern():
    attention, pattern = PATTERNS["weights, none"]
    X, Y, params = make_attention_task(attention, 300, N_TOKENS, 6, rank=2, value="random",
                                       random_state=7, return_params=True, **pattern)
    est = IntrinsicRankEstimator("attention", attention=attention, value=params.V, **pattern)
    whole = est.fit(X, Y).qk_kernel_
    chunked = IntrinsicRankEstimator("attention", attention=attention, value=params.V,
                                     **pattern).partial_fit(X[:100], Y[:100]).partial_fit(
                                         X[100:], Y[100:])
    np.testing.assert_allclose(chunked.qk_kernel_, whole, atol=1e-6 * np.abs(whole).max())
    assert chunked.rank_ == 2
    # The per-token reading (value map unknown) centres under the bias's weights.
    attention, pattern = PATTERNS["bias array"]
    X, Y = make_attention_task(attention, 400, N_TOKENS, 8, rank=3, value="random",
                               random_state=8, **pattern)
    with pytest.warns(RankEstimationWarning, match="full-rank systematic term"):  # n = 12
        assert IntrinsicRankEstimator("attention", **pattern).fit(X, Y).rank_ == 3
    # Statistics of different patterns do not merge.
    a = KernelMoments(params.V, "linear", mask="causal").update(X[:5, :, :6], Y[:5, :, :6])
    b = KernelMoments(params.V, "linear", mask="causal", mask_normalization="none")
    with pytest.raises(ValueError, match="different attention patterns"):
        a.merge(b.update(X[5:10, :, :6], Y[5:10, :, :6]))


@pytest.mark.parametrize("name", list(PATTERNS))
@pytest.mark.parametrize("padded", [False, True])
def test_matrix_free_solve_equals_the_dense_solve_with_weights_or_a_bias(name, padded):
    attention, pattern = PATTERNS[name]
    lengths = _lengths(60, N_TOKENS, 2) if padded else None
    X, Y, params = make_attention_task(attention, 60, N_TOKENS, 6, rank=2, value="random",
                                       lengths=lengths, random_state=3, return_params=True,
                                       **pattern)
    dense, _ = dense_and_matrix_free_solves(params.V, attention, X, Y, lengths, **pattern)
    # Not the kernel of uniform weights: the pattern entered both.
    plain = KernelMoments(params.V, attention, solver="dense", refine=False).update(
        X, Y, lengths).solve()
    assert not np.allclose(plain.kernel, dense.kernel, rtol=1e-3)


def test_softmax_fit_with_a_bias_refines_to_the_same_kernel_from_either_solver():
    attention, pattern = PATTERNS["causal alibi"]
    X, Y, params = make_attention_task(attention, 150, N_TOKENS, 6, rank=2, logit_scale=2.0,
                                       noise=0.05, random_state=5, return_params=True,
                                       **pattern)
    fits = [KernelMoments(params.V, attention, solver=solver, **pattern).update(X, Y).solve()
            for solver in ("dense", "cg")]
    assert all(f.converged and f.gauss_newton_steps > 0 for f in fits)
    np.testing.assert_allclose(fits[1].kernel, fits[0].kernel,
                               atol=1e-5 * np.abs(fits[0].kernel).max())
    assert fits[0].rank == fits[1].rank == 2


# --- the torch module and the regressor --------------------------------------------------------

@pytest.mark.parametrize("name", list(PATTERNS))
@pytest.mark.parametrize("padded", [False, True])
def test_module_applies_the_pattern_of_the_generator(name, padded):
    attention, pattern = PATTERNS[name]
    lengths = _lengths(10, N_TOKENS, 0) if padded else None
    X, Y, params = make_attention_task(attention, 10, N_TOKENS, 5, rank=2, noise=0.0,
                                       logit_scale=2.0, lengths=lengths, random_state=0,
                                       return_params=True, **pattern)
    module = LowRankAttention(5, rank=2, attention=attention, value="identity", logit_scale=2.0,
                              **pattern)
    with torch.no_grad():
        module.W_Q.copy_(torch.as_tensor(params.W_Q))
        module.W_K.copy_(torch.as_tensor(params.W_K))
        out = module(torch.as_tensor(X, dtype=torch.float32),
                     None if lengths is None else torch.as_tensor(lengths)).numpy()
    np.testing.assert_allclose(out, Y, atol=1e-5 * np.abs(Y).max())


@pytest.mark.parametrize("name", ["causal 1/n, none", "causal alibi"])
def test_regressor_trains_on_a_patterned_task_with_the_generators_convention(name):
    torch.set_num_threads(1)
    attention, pattern = PATTERNS[name]
    n, d = 8, 6
    pattern = _patterns(n)[name][1]
    X, Y, params = make_attention_task(attention, 256, n, d, rank=2, noise=0.05,
                                       logit_scale=2.0, random_state=0, return_params=True,
                                       **pattern)
    net = LowRankAttentionRegressor(attention=attention, value="identity", logit_scale=2.0,
                                    lr=0.05, max_epochs=150, batch_size=-1, random_state=0,
                                    **pattern).fit(X, Y)
    losses = net.history[:, "train_loss"]
    assert losses[0] > 2 * losses[-1]
    assert net.effective_rank_ == 2 and net.score(X, Y) > 0.9
    # The fitted module with the planted factors (zero columns beyond the rank, k = d)
    # reproduces the generator's noise-free output.
    _, clean = make_attention_task(attention, 256, n, d, rank=2, noise=0.0, logit_scale=2.0,
                                   random_state=0, **pattern)
    with torch.no_grad():
        for factor, planted in [(net.module_.W_Q, params.W_Q), (net.module_.W_K, params.W_K)]:
            factor.zero_()
            factor[:, :2] = torch.as_tensor(planted)
    np.testing.assert_allclose(net.predict(X), clean, atol=1e-5 * np.abs(clean).max())


# --- bad input ---------------------------------------------------------------------------------

@pytest.mark.parametrize("attention, kwargs, message", [
    ("linear", dict(mask=_weights(8)), "mask_normalization='mean'"),
    ("softmax", dict(mask=_weights(8), mask_normalization="mean"),
     "applies to attention='linear'.*logit_bias"),
    ("linear", dict(mask=-_weights(8), mask_normalization="none"), "non-negative"),
    ("linear", dict(mask=np.full((8, 8), np.nan), mask_normalization="none"), "finite"),
    ("linear", dict(mask=_weights(8) * np.tri(8, k=-1), mask_normalization="none"),
     "at least one key"),
    ("softmax", dict(mask_normalization="none"), "mask_normalization='none'.*'linear'"),
    ("linear", dict(logit_bias=np.zeros((8, 8))), "`logit_bias`.*attention='softmax'"),
    ("softmax", dict(logit_bias=np.zeros((8, 7))), r"`logit_bias`.*shape.*\(8, 8\)"),
    ("softmax", dict(logit_bias=np.full((8, 8), -np.inf)), "`logit_bias` must be finite"),
    ("softmax", dict(logit_bias=("alibi", -0.5)), "slope"),
    ("softmax", dict(logit_bias=("rotary", 0.5)), r"\('alibi', slope\)"),
    ("softmax", dict(logit_bias="alibi"), "logit_bias.* must be None"),
])
def test_bad_patterns_are_refused_naming_the_parameter(attention, kwargs, message):
    X, Y = make_attention_task(attention, 20, 8, 4, rank=1, random_state=0)
    with pytest.raises(ValueError, match=message):
        check_attention_pattern(kwargs.get("mask"), 8, attention,
                                kwargs.get("mask_normalization"), kwargs.get("logit_bias"))
    with pytest.raises(ValueError, match=message):
        make_attention_task(attention, 20, 8, 4, rank=1, **kwargs)
    with pytest.raises(ValueError, match=message):
        IntrinsicRankEstimator("attention", attention=attention, value="identity",
                               **kwargs).fit(X, Y)
    with pytest.raises(ValueError, match=message):
        LowRankAttentionRegressor(attention=attention, max_epochs=1, **kwargs).fit(X, Y)
    with pytest.raises(ValueError, match=message):
        LowRankAttention(4, attention=attention, **kwargs)(torch.zeros(2, 8, 4))


def test_bad_pattern_parameters_and_sizes_are_refused():
    X, Y = make_attention_task("softmax", 20, 8, 4, rank=1, random_state=0)
    with pytest.raises(ValueError, match="mask_normalization"):
        IntrinsicRankEstimator("attention", mask_normalization="sum").fit(X, Y)
    with pytest.raises(ValueError, match="mask_normalization"):
        make_attention_task("linear", 20, 8, 4, mask_normalization="sum")
    with pytest.raises(ValueError, match="apply only to operator='attention'"):
        IntrinsicRankEstimator(logit_bias=("alibi", 0.5)).fit(X[:, 0], Y[:, 0])
    with pytest.raises(ValueError, match="`logit_bias` applies to attention='softmax' or"):
        LowRankAttentionRegressor(attention="static", logit_bias=("alibi", 0.5),
                                  max_epochs=1).fit(X, Y)
    with pytest.raises(ValueError, match="slope"):
        alibi_bias(8, float("nan"))
    module = LowRankAttention(4, logit_bias=np.zeros((6, 6)))
    with pytest.raises(ValueError, match=r"logit bias is \(6, 6\) but the sequences have 8"):
        module(torch.zeros(2, 8, 4))
    module = LowRankAttention(4, attention="linear", mask=_weights(6), mask_normalization="mean")
    with pytest.raises(ValueError, match=r"\(6, 6\) but the sequences have 8"):
        module(torch.zeros(2, 8, 4))
