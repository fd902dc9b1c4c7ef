"""The lack-of-fit check of the attention reading (issue 27, item 1).

Data of another attention model than the one asked for are warned about, naming what fits
better; data of the model asked for stay silent. The full table (six draws per case, the
issue's sizes) is ``benchmarks/bench_lack_of_fit.py``; here fewer draws, smaller where the
assertion allows.
"""

import warnings

import numpy as np
import pytest

from sklearn_ebound import IntrinsicRankEstimator
from sklearn_ebound._attention_operators import check_attention_pattern
from sklearn_ebound._lack_of_fit import _gain_contrast, _scores
from sklearn_ebound.datasets import make_attention_task
from sklearn_ebound.exceptions import LackOfFitWarning, RankEstimationWarning


def linear_data(seed, n_samples=800, n_tokens=24, n_features=12, rank=3, noise=0.02,
                causal_one_over_n=False):
    """Linear attention drawn by hand: ``||W||_2 = 1``, ``Y = (1/n) X W Xᵀ X + E`` (for the
    causal case the logits restricted to ``j <= i``, still divided by ``n``)."""
    rng = np.random.default_rng(seed)
    U = np.linalg.qr(rng.standard_normal((n_features, rank)))[0]
    R = np.linalg.qr(rng.standard_normal((n_features, rank)))[0]
    W = (U * np.linspace(1.0, 0.5, rank)) @ R.T
    X = rng.standard_normal((n_samples, n_tokens, n_features))
    logits = X @ W @ X.transpose(0, 2, 1)
    if causal_one_over_n:
        logits = np.tril(logits)
    return X, logits @ X / n_tokens + noise * rng.standard_normal(X.shape)


def fit(X, Y, **params):
    estimator = IntrinsicRankEstimator(operator="attention", value="identity", **params)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        estimator.fit(X, Y)
    return estimator, [w for w in caught if issubclass(w.category, LackOfFitWarning)]


@pytest.mark.parametrize("seed, sizes", [
    (0, {}), (1, {"n_samples": 400, "n_tokens": 16, "n_features": 12})])
def test_linear_data_read_as_softmax_warn_and_name_linear(seed, sizes):
    # Issue 27's first row: read with the default softmax, ranks 6-10 and no warning.
    X, Y = linear_data(seed, **sizes)
    estimator, caught = fit(X, Y, attention="softmax")
    assert estimator.rank_ == 3 or len(caught) == 1
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "softmax attention" in message and "Linear attention averaged" in message
    assert "attention='linear'" in message
    result = estimator.lack_of_fit_
    assert result["failed"] and result["p_value"] <= result["level"] == 1e-5
    assert result["model"] == "softmax" and result["better"] == "linear"
    # The model that made the data fits to the noise floor (12 outputs x 0.02^2 = 0.0048).
    assert result["held_out"]["linear"] == pytest.approx(12 * 0.02**2, rel=0.1)
    assert result["held_out"]["softmax"] > 10 * result["held_out"]["linear"]
    # Read as the check says, the rank is right and the check silent.
    estimator, caught = fit(X, Y, attention="linear")
    assert estimator.rank_ == 3 and not caught


@pytest.mark.parametrize("seed, sizes", [
    (0, {}), (1, {"n_samples": 400, "n_tokens": 16, "n_features": 8})])
def test_causal_one_over_n_read_as_averaged_warns_and_names_the_weighting(seed, sizes):
    X, Y = linear_data(seed, causal_one_over_n=True, **sizes)
    estimator, caught = fit(X, Y, attention="linear", mask="causal")
    assert len(caught) == 1
    result = estimator.lack_of_fit_
    assert result["terms"] == ["values' mean", "gain with the visible keys"]
    assert result["df"][0] == 2 and result["better"] == "linear-1/n"
    message = str(caught[0].message)
    assert "1/n_tokens per visible key" in message and "mask_normalization='none'" in message
    assert result["held_out"]["linear-1/n"] < 0.1 * result["held_out"]["linear"]


def test_softmax_data_read_as_linear_warn_and_name_softmax():
    X, Y = make_attention_task("softmax", 400, 16, 6, rank=2, noise=0.02, random_state=0)
    estimator, caught = fit(X, Y, attention="linear")
    assert len(caught) == 1 and estimator.lack_of_fit_["better"] == "softmax"
    assert "attention='softmax'" in str(caught[0].message)


@pytest.mark.parametrize("attention", ["linear", "softmax"])
@pytest.mark.parametrize("mask", [None, "causal"])
@pytest.mark.parametrize("shape, noise, seed", [
    ((800, 24, 12, 3), 0.02, 0), ((300, 12, 6, 2), 0.1, 1), ((400, 16, 8, 1), 0.5, 2)])
def test_planted_tasks_read_with_their_model_stay_silent(attention, mask, shape, noise, seed):
    N, n, d, rank = shape
    X, Y = make_attention_task(attention, N, n, d, rank=rank, noise=noise, mask=mask,
                               random_state=seed)
    estimator, caught = fit(X, Y, attention=attention, mask=mask)
    assert not caught
    assert estimator.rank_ == rank
    result = estimator.lack_of_fit_
    assert not result["failed"] and result["better"] is None and "held_out" not in result
    assert 0 < result["p_value"] <= 1


def test_null_p_values_are_not_small_too_often():
    # The test is conservative (the residuals are the noise projected off the model's
    # tangent space): p-values of data of the model asked for are not concentrated below 0.1.
    p_values = []
    for seed in range(40):
        X, Y = make_attention_task("linear", 200, 8, 4, rank=1, noise=0.3, random_state=seed)
        p_values.append(fit(X, Y, attention="linear")[0].lack_of_fit_["p_value"])
    p_values = np.array(p_values)
    assert np.mean(p_values <= 0.1) <= 0.25
    assert np.mean(p_values > 0.5) >= 0.3  # not degenerate at 1 either: the test can vary


def test_padded_planted_tasks_stay_silent():
    lengths = np.random.default_rng(0).integers(6, 17, size=400)
    X, Y = make_attention_task("linear", 400, 16, 6, rank=2, noise=0.05, lengths=lengths,
                               random_state=3)
    estimator = IntrinsicRankEstimator(operator="attention", attention="linear",
                                       value="identity")
    with warnings.catch_warnings():
        warnings.simplefilter("error", LackOfFitWarning)
        estimator.fit(X, Y, lengths=lengths)
    assert estimator.rank_ == 2 and estimator.lack_of_fit_["df"][0] == 2


def test_unmasked_linear_shortcut_equals_the_token_by_token_scores():
    X, Y = make_attention_task("softmax", 50, 7, 4, rank=2, noise=0.1, random_state=4)
    kernel = np.random.default_rng(0).standard_normal((4, 4))
    V = np.random.default_rng(1).standard_normal((3, 4))
    Y = Y[:, :, :3]
    shortcut = _scores("linear", X, Y, kernel, V, check_attention_pattern(None, 7, "linear"),
                       None, False)
    # An all-ones mask takes the token-by-token path (its gain term is then zero).
    full = _scores("linear", X, Y, kernel, V,
                   check_attention_pattern(np.ones((7, 7), dtype=bool), 7, "linear"), None, True)
    np.testing.assert_allclose(shortcut[:, 0], full[:, 0], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(full[:, 1], 0.0, atol=1e-10)


def test_scale_of_the_data_does_not_change_the_check():
    X, Y = linear_data(0, n_samples=200, n_tokens=12, n_features=6, rank=2)
    small, caught_small = fit(X, Y, attention="softmax")
    large, caught_large = fit(X * 2.0**40, Y * 2.0**40, attention="linear")
    plain, _ = fit(X, Y, attention="linear")
    assert len(caught_small) == 1 and not caught_large
    # Linear attention is cubic in X: Y * 2^40 with X * 2^40 is another kernel, same p-value.
    Xs, Ys = X * 2.0**40, Y * 2.0**120
    scaled, _ = fit(Xs, Ys, attention="linear")
    assert scaled.lack_of_fit_["p_value"] == pytest.approx(plain.lack_of_fit_["p_value"],
                                                           rel=1e-6)


def test_switched_off_and_partial_fit_run_no_check():
    X, Y = linear_data(0, n_samples=200, n_tokens=12, n_features=6, rank=2)
    estimator, caught = fit(X, Y, attention="softmax", lack_of_fit=False)
    assert not caught and not hasattr(estimator, "lack_of_fit_")
    estimator = IntrinsicRankEstimator(operator="attention", attention="linear",
                                       value="identity").fit(X, Y)
    assert hasattr(estimator, "lack_of_fit_")
    estimator.partial_fit(X, Y)
    assert not hasattr(estimator, "lack_of_fit_")
    # The per-token reading (value map unknown) is checked too, and switched off alike.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RankEstimationWarning)  # short sequences' caveat
        assert IntrinsicRankEstimator().fit(X, Y).lack_of_fit_["reading"] == "per-token"
        assert not hasattr(IntrinsicRankEstimator(lack_of_fit=False).fit(X, Y),
                           "lack_of_fit_")


def test_warning_is_a_rank_estimation_warning_and_the_input_is_untouched():
    assert issubclass(LackOfFitWarning, RankEstimationWarning)
    X, Y = linear_data(1, n_samples=200, n_tokens=12, n_features=6, rank=2)
    X0, Y0 = X.copy(), Y.copy()
    with pytest.warns(RankEstimationWarning, match="does not explain these data"):
        IntrinsicRankEstimator(operator="attention", value="identity").fit(X, Y)
    np.testing.assert_array_equal(X, X0)
    np.testing.assert_array_equal(Y, Y0)


# Weighted masks and logit biases: the check reads the pattern the estimator was given.

_N_TOKENS = 16
_ICL = dict(mask=np.tril(np.ones((_N_TOKENS, _N_TOKENS))) / _N_TOKENS,
            mask_normalization="none")
_DECAY = dict(mask=np.tril(0.8 ** np.subtract.outer(np.arange(_N_TOKENS), np.arange(_N_TOKENS))),
              mask_normalization="mean")


@pytest.mark.parametrize("attention, pattern", [
    ("linear", _ICL), ("linear", _DECAY),
    ("linear", dict(_DECAY, mask_normalization="none")),
    ("softmax", dict(logit_bias=("alibi", 0.5))),
    ("softmax", dict(mask="causal", logit_bias=("alibi", 0.3))),
    ("softmax", dict(logit_bias=np.random.default_rng(5).normal(size=(_N_TOKENS, _N_TOKENS)))),
], ids=["1/n-causal", "decay-mean", "decay-as-given", "alibi", "causal-alibi", "bias-array"])
def test_planted_tasks_with_a_pattern_are_right_and_silent(attention, pattern):
    for seed in range(2):
        X, Y = make_attention_task(attention, 400, _N_TOKENS, 8, rank=2, value="identity",
                                   noise=0.05, random_state=seed, **pattern)
        estimator, caught = fit(X, Y, attention=attention, **pattern)
        assert estimator.rank_ == 2 and not caught, estimator.lack_of_fit_
        assert estimator.lack_of_fit_["p_value"] > 1e-3


def test_weights_read_with_the_wrong_normalisation_warn_and_name_the_right_one():
    # Data of the weights as given, read as their average, and the other way round.
    for made, read, better in [("none", "mean", "linear-1/n"), ("mean", "none", "linear")]:
        X, Y = make_attention_task("linear", 400, _N_TOKENS, 8, rank=2, value="identity",
                                   noise=0.02, random_state=3,
                                   **dict(_DECAY, mask_normalization=made))
        estimator, caught = fit(X, Y, attention="linear",
                                **dict(_DECAY, mask_normalization=read))
        assert len(caught) == 1 and estimator.lack_of_fit_["better"] == better
        assert estimator.lack_of_fit_["model"] == ("linear-1/n" if read == "none" else "linear")


def test_softmax_data_with_a_bias_read_as_linear_name_softmax_with_the_bias():
    alibi = dict(mask="causal", logit_bias=("alibi", 0.3))
    X, Y = make_attention_task("softmax", 400, _N_TOKENS, 6, rank=2, value="identity",
                               noise=0.02, random_state=0, **alibi)
    # Linear attention on the bias's own weights exp(b) (averaged): the nearest linear model.
    weights = np.tril(np.exp(-0.3 * np.subtract.outer(np.arange(_N_TOKENS),
                                                      np.arange(_N_TOKENS))))
    estimator, caught = fit(X, Y, attention="linear", mask=weights, mask_normalization="mean")
    assert len(caught) == 1 and estimator.lack_of_fit_["better"] == "softmax"


# The per-token reading (value map unknown): the same check on the per-token operator.


def fit_per_token(X, Y, lengths=None, **params):
    estimator = IntrinsicRankEstimator(operator="attention", **params)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        estimator.fit(X, Y, lengths=lengths)
    return estimator, [w for w in caught if issubclass(w.category, LackOfFitWarning)]


@pytest.mark.parametrize("seed", [0, 1])
def test_per_token_one_over_n_read_as_averaged_warns_and_names_the_weighting(seed):
    X, Y = linear_data(seed, n_samples=400, n_tokens=16, n_features=8, causal_one_over_n=True)
    estimator, caught = fit_per_token(X, Y, attention="linear", mask="causal")
    assert len(caught) == 1
    result = estimator.lack_of_fit_
    assert result["reading"] == "per-token" and result["model"] == "linear"
    assert result["terms"] == ["gain with the visible keys", "the other keys' mean"]
    assert result["p_value"] <= 1e-5 and result["better"] == "linear-1/n"
    message = str(caught[0].message)
    assert "per-token reading (value map unknown)" in message
    assert "mask_normalization='none'" in message
    # Read as the warning says, the check is silent.
    weights = np.tril(np.ones((16, 16))) / 16
    estimator, caught = fit_per_token(X, Y, attention="linear", mask=weights,
                                      mask_normalization="none")
    assert not caught and estimator.lack_of_fit_["model"] == "linear-1/n"


@pytest.mark.parametrize("mask", [None, "causal"])
def test_per_token_softmax_read_as_linear_warns_and_names_softmax(mask):
    X, Y = make_attention_task("softmax", 400, 16, 6, rank=2, noise=0.02, mask=mask,
                               random_state=0)
    estimator, caught = fit_per_token(X, Y, attention="linear", mask=mask)
    assert len(caught) == 1 and estimator.lack_of_fit_["better"] == "softmax"
    assert "attention='softmax'" in str(caught[0].message)
    held_out = estimator.lack_of_fit_["held_out"]
    assert held_out["softmax"] < 0.5 * held_out["linear"]
    estimator, caught = fit_per_token(X, Y, attention="softmax", mask=mask)
    assert not caught and estimator.rank_ == 2


_PER_TOKEN_PATTERNS = [
    ("linear", {}), ("linear", dict(mask="causal")), ("softmax", {}),
    ("softmax", dict(mask="causal")), ("linear", _ICL), ("linear", _DECAY),
    ("softmax", dict(mask="causal", logit_bias=("alibi", 0.3))),
]


@pytest.mark.parametrize("attention, pattern", _PER_TOKEN_PATTERNS,
                         ids=["linear", "linear-causal", "softmax", "softmax-causal",
                              "1/n-causal", "decay-mean", "causal-alibi"])
def test_per_token_planted_tasks_stay_silent(attention, pattern):
    for seed in range(2):
        X, Y = make_attention_task(attention, 400, _N_TOKENS, 8, rank=2, noise=0.05,
                                   random_state=seed, **pattern)
        estimator, caught = fit_per_token(X, Y, attention=attention, **pattern)
        assert not caught, estimator.lack_of_fit_
        assert estimator.lack_of_fit_["p_value"] > 1e-3


def test_per_token_padded_planted_task_stays_silent():
    lengths = np.random.default_rng(0).integers(6, 17, size=400)
    X, Y = make_attention_task("linear", 400, 16, 6, rank=2, noise=0.05, lengths=lengths,
                               random_state=3)
    estimator, caught = fit_per_token(X, Y, lengths=lengths, attention="linear")
    assert not caught and "gain with the visible keys" in estimator.lack_of_fit_["terms"]


def test_per_token_null_p_values_are_not_small_too_often():
    p_values = []
    for seed in range(30):
        X, Y = make_attention_task("linear", 200, 8, 4, rank=1, noise=0.3, mask="causal",
                                   random_state=seed)
        p_values.append(fit_per_token(X, Y, attention="linear", mask="causal")[0]
                        .lack_of_fit_["p_value"])
    p_values = np.array(p_values)
    assert np.mean(p_values <= 0.1) <= 0.25 and np.mean(p_values > 0.5) >= 0.25


def test_gain_contrast_leaves_out_the_finite_key_profile():
    keys = np.tile(np.arange(1.0, 13.0), 5)  # causal: |K_i| = i + 1
    energy = keys / 12
    # A gain in the profile of the per-token operator's own finite-key error: none left.
    assert _gain_contrast(0.3 + 2.0 / keys, 1 / keys, 1 / keys, energy) is None
    contrast = _gain_contrast(keys / 12, 1 / keys, 1 / keys, energy)
    assert contrast is not None and np.linalg.norm(contrast) > 0.1
    for profile in (np.ones_like(keys), 1 / keys):  # weighted-orthogonal to the profile
        assert abs(np.sum(energy * contrast * profile)) < 1e-10


def test_per_token_softmax_without_a_pattern_has_nothing_to_test():
    # Centred on each sequence, the softmax features hold no values' mean and no gain.
    X, Y = linear_data(0, n_samples=200, n_tokens=12, n_features=6, rank=2)
    estimator, caught = fit_per_token(X, Y, attention="softmax")
    assert not caught and estimator.lack_of_fit_["terms"] == []
    assert estimator.lack_of_fit_["p_value"] == 1.0 and estimator.rank_ == 2


def test_per_token_check_does_not_depend_on_the_scale():
    X, Y = make_attention_task("softmax", 200, 12, 6, rank=2, noise=0.05, mask="causal",
                               random_state=1)
    plain, _ = fit_per_token(X, Y, attention="linear", mask="causal")
    for factor in (2.0**-70, 2.0**80):
        scaled, _ = fit_per_token(X * factor, Y * factor, attention="linear", mask="causal")
        assert scaled.lack_of_fit_["statistic"] == pytest.approx(
            plain.lack_of_fit_["statistic"], rel=1e-6)
        assert scaled.lack_of_fit_["better"] == plain.lack_of_fit_["better"] == "softmax"
        assert scaled.lack_of_fit_["held_out"]["softmax"] == pytest.approx(
            plain.lack_of_fit_["held_out"]["softmax"] * factor**2, rel=1e-6)


def test_per_token_vocabulary_of_the_model_asked_for_is_not_warned():
    # A finite, skewed vocabulary leaves a systematic part in the per-token residuals that
    # the score test finds; no other model fits the held-out sequences materially better.
    X, Y = make_attention_task("linear", 800, 24, 12, rank=3, noise=0.02, random_state=1,
                               vocabulary_size=64, vocabulary_law="skewed")
    estimator, caught = fit_per_token(X, Y, attention="linear")
    result = estimator.lack_of_fit_
    assert result["rejected"] and not result["failed"] and not caught
    assert result["better"] is None
    assert result["held_out"]["softmax"] > 0.98 * result["held_out"]["linear"]


def test_per_token_check_block_by_block_equals_the_whole(monkeypatch):
    from sklearn_ebound import _lack_of_fit

    lengths = np.random.default_rng(1).integers(4, 13, size=150)
    X, Y = make_attention_task("softmax", 150, 12, 5, rank=2, noise=0.05, mask="causal",
                               lengths=lengths, random_state=2)
    whole = _lack_of_fit.per_token_lack_of_fit(X, Y, "linear", "causal", lengths)
    monkeypatch.setattr(_lack_of_fit, "_TOKEN_VALUES", 12 * 64 * 7)  # 7 sequences a block
    blocked = _lack_of_fit.per_token_lack_of_fit(X, Y, "linear", "causal", lengths)
    assert whole["failed"] and whole["better"] == blocked["better"] == "softmax"
    assert blocked["statistic"] == pytest.approx(whole["statistic"], rel=1e-9)
    for model, error in whole["held_out"].items():
        assert blocked["held_out"][model] == pytest.approx(error, rel=1e-9)
