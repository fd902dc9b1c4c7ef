"""LowRankAttentionRegressor: the attention-native Entropic Bound, and the estimator contract.

Sizes are tiny (d = 6 channels, n = 8 tokens, 256 training sequences, full-batch Adam) so that
every fit takes well under a second on a CPU; the margins below were measured at these sizes
and hold with room to spare (see the comments).
"""

import pickle

import numpy as np
import pytest
import torch
from sklearn import config_context
from sklearn.base import clone
from sklearn.exceptions import NotFittedError
from sklearn.metrics import r2_score
from sklearn.model_selection import GridSearchCV, KFold
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import FunctionTransformer
from sklearn.utils._param_validation import InvalidParameterError
from sklearn.utils.validation import check_is_fitted

from sklearn_ebound import energy_rank, entropy_rank
from sklearn_ebound.datasets import make_attention_task, make_static_mixing_task
from sklearn_ebound.nn import (
    LowRankAttention,
    LowRankAttentionRegressor,
    StaticTokenMixer,
    get_sequence_scorer,
    get_sequence_scorer_names,
    make_sequence_scorer,
)

D, N_TOKENS, N_TRAIN = 6, 8, 256
# Full-batch Adam: fast and deterministic at these sizes.
FAST = dict(lr=0.05, max_epochs=150, batch_size=-1)


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    # The problems here are tiny: one thread is faster than several competing for a shared CPU.
    n_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n_threads)


def _task(attention, rank, seed, n_samples=N_TRAIN, **kwargs):
    return make_attention_task(
        attention, n_samples, N_TOKENS, D, rank=rank, random_state=seed, return_params=True,
        **kwargs,
    )


def _risk(net, X, Y):
    """Held-out risk per token, summed over output channels (the noise floor's convention)."""
    return np.mean((net.predict(X) - Y) ** 2) * Y.shape[-1]


# (a) Deficiency and achievability in a rank sweep -------------------------------------------

# Measured at these sizes (seeds 0-5): risk / floor >= 29 (linear, V = I) and >= 10.8 (softmax,
# learned V) for every r < r*; between 0.986 and 1.017 for every r >= r*.
DEFICIENCY_FACTOR = 5.0
ACHIEVABILITY_TOL = 0.10


@pytest.mark.parametrize(
    "attention, value, beta",
    [("linear", "identity", 1.0), ("softmax", None, 2.0)],
)
def test_rank_sweep_deficiency_and_achievability(attention, value, beta):
    r_star = 3
    X, Y, p = _task(
        attention, r_star, 0, n_samples=2 * N_TRAIN, logit_scale=beta,
        value="identity" if value == "identity" else "random",
    )
    X_train, Y_train, X_test, Y_test = X[:N_TRAIN], Y[:N_TRAIN], X[N_TRAIN:], Y[N_TRAIN:]
    ratios = {}
    for r in range(r_star + 2):
        net = LowRankAttentionRegressor(
            r, attention=attention, value=value, logit_scale=beta, random_state=0, **FAST
        ).fit(X_train, Y_train)
        ratios[r] = _risk(net, X_test, Y_test) / p.noise_floor
    for r in range(r_star):
        assert ratios[r] > DEFICIENCY_FACTOR, (r, ratios)
    for r in (r_star, r_star + 1):
        assert abs(ratios[r] - 1) < ACHIEVABILITY_TOL, (r, ratios)
    # Each missing direction of the kernel costs risk.
    assert ratios[0] > ratios[1] > ratios[2]


# (b) Recovery by gradient descent from a small initialisation --------------------------------


@pytest.mark.parametrize(
    "attention",
    ["linear", "softmax", "static", "static_softmax"],
)
def test_gradient_descent_recovers_the_planted_rank(attention):
    r_star, hits = 3, []
    for seed in range(10):
        if attention in ("static", "static_softmax"):
            mixing = "linear" if attention == "static" else "softmax"
            X, Y = make_static_mixing_task(mixing, N_TRAIN, N_TOKENS, D, rank=r_star,
                                           random_state=seed)
            value, beta = "identity", 1.0
        else:
            beta = 2.0 if attention == "softmax" else 1.0
            X, Y, _ = _task(attention, r_star, seed, logit_scale=beta, value="random")
            value = None
        # Full width: rank=None gives k = d (attention) or k = n (static).
        net = LowRankAttentionRegressor(
            attention=attention, value=value, logit_scale=beta, init_scale=1e-2,
            random_state=seed, **FAST,
        ).fit(X, Y)
        assert net.module_.rank == (N_TOKENS if attention.startswith("static") else D)
        hits.append(net.effective_rank_ == r_star)
    # Measured: 10 of 10 seeds for each of the four variants (and 20 of 20 on seeds 10-29).
    assert sum(hits) >= 9, hits


# (c) Energy vs entropy rank over the logit scale ---------------------------------------------


def test_energy_rank_is_stable_where_entropy_rank_drifts():
    r_star, betas = 2, [0.5, 2.0, 8.0]
    energy, entropy, attention_entropy = [], [], []
    for beta in betas:
        X, Y, p = _task("softmax", r_star, 0, logit_scale=beta)
        net = LowRankAttentionRegressor(
            attention="softmax", value="identity", logit_scale=beta, random_state=0, **FAST
        ).fit(X, Y)
        energy.append(net.effective_rank_)
        entropy.append(entropy_rank(net.qk_kernel_))
        # The learned attention maps softmax(beta X W X^T / sqrt(d)), one per sequence.
        with torch.no_grad():
            logits = torch.as_tensor(X @ net.qk_kernel_ @ X.transpose(0, 2, 1))
            maps = torch.softmax(beta * logits / np.sqrt(D), dim=-1).numpy()
        attention_entropy.append(float(np.mean(entropy_rank(maps))))
    # The energy rank reads r* at every scale.
    assert energy == [r_star] * len(betas), energy
    assert energy_rank(p.W) == r_star and entropy_rank(p.W) == pytest.approx(r_star)
    # The entropy rank of the same kernels is never r* and moves with the scale. Measured
    # (seeds 0, 1, 2): 2.26-2.30 -> 2.07-2.12 -> 2.03-2.05, falling towards r* as the noise
    # directions shrink relative to the signal. The entropy rank of the attention maps the
    # kernels produce rises as the softmax sharpens: 2.24-2.28 -> 3.74-3.76 -> 4.15-4.22.
    assert all(e > r_star + 0.02 for e in entropy), entropy
    assert entropy[0] - entropy[-1] > 0.15, entropy
    assert np.all(np.diff(entropy) < 0), entropy
    assert np.all(np.diff(attention_entropy) > 0.2), attention_entropy


# (d) Reproducibility -------------------------------------------------------------------------


def test_same_random_state_gives_the_same_kernel():
    X, Y, _ = _task("softmax", 2, 0, n_samples=128)
    # Mini-batches of 32, shuffled: the seed covers the initialisation and the batch order.
    params = dict(attention="softmax", lr=0.02, max_epochs=5, batch_size=32)
    outer_state = torch.get_rng_state()
    first = LowRankAttentionRegressor(random_state=7, **params).fit(X, Y)
    # The global torch generator is left as it was.
    assert torch.equal(torch.get_rng_state(), outer_state)
    second = LowRankAttentionRegressor(random_state=7, **params).fit(X, Y)
    np.testing.assert_allclose(first.qk_kernel_, second.qk_kernel_, atol=1e-6, rtol=0)
    np.testing.assert_allclose(first.predict(X), second.predict(X), atol=1e-6, rtol=0)
    other = LowRankAttentionRegressor(random_state=8, **params).fit(X, Y)
    assert np.abs(first.qk_kernel_ - other.qk_kernel_).max() > 1e-4
    # A RandomState instance is accepted too.
    LowRankAttentionRegressor(random_state=np.random.RandomState(0), **params).fit(X, Y)


# (e) Bad input fails before any training -----------------------------------------------------

_X, _Y, _ = _task("linear", 2, 0, n_samples=20)
_X_nan = _X.copy()
_X_nan[3, 2, 1] = np.nan
_Y_inf = _Y.copy()
_Y_inf[0, 0, 0] = np.inf


@pytest.mark.parametrize(
    "params, X, Y, match",
    [
        ({}, _X[:, :, 0], _Y, r"`X` must be a 3-D array .* Got an array of shape \(20, 8\)"),
        ({}, _X, _Y[:, :, 0], r"`y` must be a 3-D array .* Got an array of shape \(20, 8\)"),
        ({}, _X[:, 0], _Y[:, 0], r"`X` must be a 3-D array"),
        ({}, _X, _Y[:10], r"same n_samples and n_tokens as `X` \(20, 8\)\. Got \(10, 8, 6\)"),
        ({}, _X, _Y[:, :5], r"same n_samples and n_tokens as `X` \(20, 8\)\. Got \(20, 5, 6\)"),
        ({}, _X_nan, _Y, "Input X contains NaN"),
        ({}, _X, _Y_inf, "Input y contains infinity"),
        ({"rank": 7}, _X, _Y, r"`rank` upper bound is 6 \(n_features\)\. Got 7 instead\."),
        (
            {"rank": 9, "attention": "static"}, _X, _Y,
            r"`rank` upper bound is 8 \(n_tokens\)\. Got 9 instead\.",
        ),
        ({"rank": -1}, _X, _Y,
         r"'rank' parameter of LowRankAttentionRegressor must be an int in the range \[0, inf\) "
         r"or None\. Got -1 instead"),
        ({"attention": "relu"}, _X, _Y, "'attention' parameter .* must be a str among .*'linear'"
                                         ".* Got 'relu' instead"),
        ({"value": "identity"}, _X, _Y[:, :, :2], "`value='identity'` needs `y` with n_targets"),
        ({"value": "orthogonal"}, _X, _Y, "'value' parameter .* must be a str among .*'identity'"
                                          ".*, None or an array-like. Got 'orthogonal' instead"),
        ({"value": np.ones((6, 5))}, _X, _Y, r"\(n_targets, n_features\) = \(6, 6\)"),
        ({"init_scale": 0.0}, _X, _Y,
         r"'init_scale' parameter .* must be a float in the range \(0\.0, inf\)\. Got 0\.0"),
        ({"logit_scale": -1.0}, _X, _Y,
         r"'logit_scale' parameter .* must be a float in the range \[0\.0, inf\)\. Got -1\.0"),
    ],
)
def test_bad_input_is_rejected_before_training(params, X, Y, match):
    net = LowRankAttentionRegressor(max_epochs=1, **params)
    with pytest.raises(ValueError, match=match):
        net.fit(X, Y)
    assert not net.initialized_ and not hasattr(net, "module_")


def test_wrong_parameter_type_is_a_type_error():
    # scikit-learn's convention: a wrong type is a TypeError, a wrong value a ValueError.
    net = LowRankAttentionRegressor(rank=2.5, max_epochs=1)
    with pytest.raises(TypeError, match=r"'rank' parameter .* must be an int .*Got 2\.5 instead"):
        net.fit(_X, _Y)
    assert not net.initialized_


def test_parameters_are_checked_by_their_declared_constraints():
    # scikit-learn's message names the parameter and its accepted forms; a parameter is
    # checked before the data, so a bad one fails even on data of the wrong shape.
    net = LowRankAttentionRegressor(logit_scale="high", max_epochs=1)
    with pytest.raises(InvalidParameterError,
                       match=r"The 'logit_scale' parameter of LowRankAttentionRegressor must "
                             r"be a float in the range \[0\.0, inf\)\. Got 'high' instead"):
        net.fit(_X[:, :, 0], _Y)
    with pytest.raises(InvalidParameterError, match="The 'random_state' parameter"):
        LowRankAttentionRegressor(random_state="seed", max_epochs=1).fit(_X, _Y)
    assert set(LowRankAttentionRegressor._parameter_constraints) == {
        "rank", "attention", "value", "init_scale", "logit_scale", "mask", "mask_normalization",
        "logit_bias", "random_state"}
    # scikit-learn's switch turns the check off, as for its own estimators.
    with config_context(skip_parameter_validation=True):
        LowRankAttentionRegressor(logit_scale=-1.0, max_epochs=0).fit(_X, _Y)


def test_value_learned_is_the_deprecated_spelling_of_none():
    params = dict(attention="linear", max_epochs=3, random_state=0)
    with pytest.warns(FutureWarning, match="`value='learned'` is now spelt `value=None`"):
        old = LowRankAttentionRegressor(value="learned", **params).fit(_X, _Y)
    new = LowRankAttentionRegressor(**params).fit(_X, _Y)
    assert new.value is None and isinstance(new.module_.value_map.weight, torch.nn.Parameter)
    np.testing.assert_array_equal(old.qk_kernel_, new.qk_kernel_)


def test_predict_checks_the_fitted_sizes():
    net = LowRankAttentionRegressor(attention="static", max_epochs=1).fit(_X, _Y)
    with pytest.raises(ValueError, match="fitted with n_features=6"):
        net.predict(_X[:, :, :4])
    with pytest.raises(ValueError, match="fitted with n_tokens=8"):
        net.predict(_X[:, :5])
    with pytest.raises(ValueError, match="fitted with n_targets=6"):
        net.score(_X, _Y[:, :, :2])
    # Attention itself takes any sequence length.
    net = LowRankAttentionRegressor(attention="softmax", max_epochs=1).fit(_X, _Y)
    assert net.predict(_X[:, :5]).shape == (20, 5, 6)


# (f) The scikit-learn contract ---------------------------------------------------------------


def test_not_fitted():
    net = LowRankAttentionRegressor()
    with pytest.raises(NotFittedError):
        check_is_fitted(net)
    with pytest.raises(NotFittedError):
        net.predict(_X)
    with pytest.raises(NotFittedError):
        net.score(_X, _Y)


def test_params_reach_the_module_and_survive_clone():
    value = np.eye(D)
    net = LowRankAttentionRegressor(
        2, attention="linear", value=value, init_scale=0.1, logit_scale=3.0, max_epochs=2
    )
    params = net.get_params()
    for name, expected in [("rank", 2), ("attention", "linear"), ("init_scale", 0.1),
                           ("logit_scale", 3.0), ("max_epochs", 2), ("train_split", None),
                           ("verbose", 0), ("device", "cpu"), ("random_state", None)]:
        assert params[name] == expected, name
    assert params["value"] is value and params["optimizer"] is torch.optim.Adam
    cloned = clone(net)
    assert cloned.get_params()["rank"] == 2 and cloned.get_params()["value"] is not value
    cloned.set_params(rank=4, attention="softmax")
    cloned.fit(_X, _Y)
    assert isinstance(cloned.module_, LowRankAttention)
    assert (cloned.module_.rank, cloned.module_.attention, cloned.module_.logit_scale) == (
        4, "softmax", 3.0)
    assert cloned.qk_kernel_.shape == (D, D) and cloned.qk_kernel_.dtype == np.float64
    static = clone(net).set_params(attention="static", rank=None).fit(_X, _Y)
    assert isinstance(static.module_, StaticTokenMixer)
    assert static.qk_kernel_.shape == (N_TOKENS, N_TOKENS)
    # skorch's prefixed parameters reach the module too.
    net = LowRankAttentionRegressor(module__init_scale=5.0, max_epochs=0).fit(_X, _Y)
    assert net.module_.W_Q.abs().max().item() > 1.0


def test_fit_predict_score_and_history():
    X, Y, _ = _task("linear", 2, 0, n_samples=200)
    net = LowRankAttentionRegressor(attention="linear", random_state=0, **FAST)
    assert net.fit(X.tolist(), Y) is net
    Y_pred = net.predict(X)
    assert Y_pred.shape == Y.shape and isinstance(Y_pred, np.ndarray)
    assert net.score(X, Y) == pytest.approx(r2_score(Y.ravel(), Y_pred.ravel()), abs=1e-6)
    assert net.score(X, Y) > 0.9
    # sample_weight weighs whole sequences.
    w = np.r_[np.ones(100), np.zeros(100)]
    assert net.score(X, Y, sample_weight=w) == pytest.approx(net.score(X[:100], Y[:100]))
    losses = net.history_[:, "train_loss"]
    assert len(losses) == FAST["max_epochs"] and losses[0] > 2 * losses[-1]
    assert (net.n_features_in_, net.n_tokens_in_, net.n_outputs_) == (D, N_TOKENS, D)
    assert net.effective_rank_ == energy_rank(net.qk_kernel_, tau=0.99)
    # partial_fit continues from the fitted module.
    kernel = net.qk_kernel_.copy()
    net.set_params(max_epochs=3).partial_fit(X, Y)
    assert len(net.history_) == FAST["max_epochs"] + 3
    assert not np.allclose(kernel, net.qk_kernel_)


def test_skorch_validation_split_and_loader_options():
    from skorch.dataset import ValidSplit

    X, Y, _ = _task("linear", 2, 0, n_samples=64)
    net = LowRankAttentionRegressor(
        attention="linear", train_split=ValidSplit(4), max_epochs=2, batch_size=16,
        random_state=0,
    ).fit(X, Y)
    # 48 training sequences in batches of 16, then the 16 held out in one batch.
    assert len(net.history_[-1, "batches"]) == 3 + 1 and "valid_loss" in net.history_[-1]
    # Loader options beyond batch size and shuffling go through skorch's own DataLoader.
    fast = LowRankAttentionRegressor(attention="linear", max_epochs=2, random_state=0,
                                     iterator_train__shuffle=False).fit(X, Y)
    plain = LowRankAttentionRegressor(attention="linear", max_epochs=2, random_state=0,
                                      iterator_train__shuffle=False,
                                      iterator_train__num_workers=0).fit(X, Y)
    np.testing.assert_allclose(fast.qk_kernel_, plain.qk_kernel_, atol=1e-6)


def test_lazy_top_level_import():
    import sklearn_ebound

    assert sklearn_ebound.LowRankAttentionRegressor is LowRankAttentionRegressor


@pytest.fixture(scope="module")
def grid_task():
    X, Y, _ = _task("linear", 2, 0)
    return X, Y


GRID = dict(attention="linear", value="identity", random_state=0, lr=0.05, max_epochs=60,
            batch_size=-1)


def test_grid_search_default_scoring_picks_the_planted_rank(grid_task):
    X, Y = grid_task
    search = GridSearchCV(LowRankAttentionRegressor(**GRID), {"rank": [1, 2]}, cv=2).fit(X, Y)
    assert search.best_params_ == {"rank": 2}
    assert search.best_estimator_.module_.rank == 2
    scores = search.cv_results_["mean_test_score"]
    assert scores[1] > 0.95 and scores[1] > scores[0] + 0.1, scores


@pytest.mark.parametrize("n_jobs", [None, 2])
def test_grid_search_named_scoring(grid_task, n_jobs):
    X, Y = grid_task
    search = GridSearchCV(
        LowRankAttentionRegressor(**GRID),
        {"rank": [1, 2]},
        cv=KFold(2),
        scoring={"mse": get_sequence_scorer("neg_mean_squared_error"),
                 "r2": get_sequence_scorer("r2")},
        refit="mse",
        n_jobs=n_jobs,
    ).fit(X, Y)
    assert search.best_params_ == {"rank": 2}
    # At r = r* the held-out MSE per entry is the noise variance 0.01.
    mse = -search.cv_results_["mean_test_mse"]
    assert mse[1] == pytest.approx(0.01, rel=0.1) and mse[0] > 5 * mse[1], mse


def test_pipeline(grid_task):
    X, Y = grid_task
    pipe = make_pipeline(FunctionTransformer(), LowRankAttentionRegressor(**GRID))
    search = GridSearchCV(pipe, {"lowrankattentionregressor__rank": [1, 2]}, cv=2).fit(X, Y)
    assert search.best_params_ == {"lowrankattentionregressor__rank": 2}
    assert search.predict(X).shape == Y.shape


def test_sequence_scorers():
    X, Y, _ = _task("linear", 2, 0, n_samples=50)
    net = LowRankAttentionRegressor(attention="linear", max_epochs=5).fit(X, Y)
    Y_pred = net.predict(X)
    mse = get_sequence_scorer("neg_mean_squared_error")(net, X, Y)
    assert mse == pytest.approx(-np.mean((Y - Y_pred) ** 2), rel=1e-5)
    assert get_sequence_scorer("r2")(net, X, Y) == pytest.approx(net.score(X, Y), abs=1e-12)
    mae = make_sequence_scorer(lambda a, b: np.abs(a - b).max(), greater_is_better=False)
    assert mae(net, X, Y) == pytest.approx(-np.abs(Y - Y_pred).max(), rel=1e-5)
    assert "neg_mean_squared_error" in get_sequence_scorer_names()
    pickle.loads(pickle.dumps(get_sequence_scorer("r2")))
    with pytest.raises(ValueError, match="`scoring` must be one of"):
        get_sequence_scorer("accuracy")


def test_pickle_roundtrip():
    net = LowRankAttentionRegressor(attention="linear", max_epochs=3, random_state=0).fit(_X, _Y)
    loaded = pickle.loads(pickle.dumps(net))
    np.testing.assert_array_equal(loaded.predict(_X), net.predict(_X))
    np.testing.assert_array_equal(loaded.qk_kernel_, net.qk_kernel_)


# (g) CUDA ------------------------------------------------------------------------------------

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")


@needs_cuda
def test_cuda_fit_agrees_with_cpu():
    X, Y, _ = _task("softmax", 2, 0)
    params = dict(attention="softmax", random_state=0, **FAST)
    cpu = LowRankAttentionRegressor(**params).fit(X, Y)
    gpu = LowRankAttentionRegressor(device="cuda", **params).fit(X, Y)
    assert next(gpu.module_.parameters()).device.type == "cuda"
    assert isinstance(gpu.qk_kernel_, np.ndarray)
    # Same seed, same initialisation (drawn on the CPU): only kernel round-off differs.
    scale = np.abs(cpu.qk_kernel_).max()
    np.testing.assert_allclose(gpu.qk_kernel_, cpu.qk_kernel_, atol=1e-2 * scale)
    assert gpu.effective_rank_ == cpu.effective_rank_ == 2
    np.testing.assert_allclose(gpu.predict(X), cpu.predict(X), atol=1e-2)


@needs_cuda
def test_cuda_model_loads_on_cpu(monkeypatch):
    from skorch.exceptions import DeviceWarning

    X, Y, _ = _task("softmax", 2, 0, n_samples=64)
    gpu = LowRankAttentionRegressor(device="cuda", random_state=0, max_epochs=3).fit(X, Y)
    expected = gpu.predict(X)
    blob = pickle.dumps(gpu)
    # Unpickle as a machine without CUDA would: skorch maps the tensors to the CPU.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.warns(DeviceWarning, match="no CUDA devices"):
        cpu = pickle.loads(blob)
    assert cpu.device == "cpu"
    assert next(cpu.module_.parameters()).device.type == "cpu"
    np.testing.assert_allclose(cpu.predict(X), expected, atol=1e-5)
    np.testing.assert_array_equal(cpu.qk_kernel_, gpu.qk_kernel_)
