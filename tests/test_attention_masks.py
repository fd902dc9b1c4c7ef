"""Masked and padded attention, the matrix-free solver, the softmax fit and lazy partial_fit."""

import pickle
import warnings

import numpy as np
import pytest
import torch
from conftest import dense_and_matrix_free_solves
from sklearn.base import clone
from sklearn.utils import Bunch
from sklearn.utils.validation import check_is_fitted

from sklearn_ebound import IntrinsicRankEstimator, _attention_solver
from sklearn_ebound._attention_solver import NormalOperator, normal_matrix, solve_kernel
from sklearn_ebound._kernel_moments import KernelMoments
from sklearn_ebound._kernel_rank import kernel_threshold_rank
from sklearn_ebound.datasets import make_attention_task
from sklearn_ebound.exceptions import RankEstimationWarning
from sklearn_ebound.nn import LowRankAttention, LowRankAttentionRegressor


def _lengths(n_samples, n_tokens, seed):
    return np.random.RandomState(seed).randint(n_tokens // 2, n_tokens + 1, size=n_samples)


@pytest.mark.parametrize("mask", ["sideways", np.ones((3, 4)), np.full((8, 8), 2),
                                  np.triu(np.ones((8, 8)))[::-1] * 0])
def test_bad_masks_are_refused_with_the_expected_form(mask):
    X, Y = make_attention_task("linear", 20, 8, 4, rank=1, random_state=0)
    with pytest.raises(ValueError, match="mask"):
        make_attention_task("linear", 20, 8, 4, rank=1, mask=mask)
    with pytest.raises(ValueError, match="mask"):
        IntrinsicRankEstimator("attention", value="identity", mask=mask).fit(X, Y)
    with pytest.raises(ValueError, match="mask"):
        LowRankAttentionRegressor(attention="linear", mask=mask, max_epochs=1).fit(X, Y)


def test_bad_lengths_and_masks_on_static_data_are_refused():
    X, Y = make_attention_task("linear", 20, 8, 4, rank=1, random_state=0)
    est = IntrinsicRankEstimator("attention", value="identity")
    with pytest.raises(ValueError, match="lengths"):
        est.fit(X, Y, lengths=np.full(19, 4))
    with pytest.raises(ValueError, match=r"lengths.*\[1, n_tokens=8\]"):
        est.fit(X, Y, lengths=np.full(20, 9))
    with pytest.raises(ValueError, match="apply only to operator='attention'"):
        IntrinsicRankEstimator(mask="causal").fit(X[:, 0], Y[:, 0])


@pytest.mark.parametrize("attention", ["linear", "softmax"])
def test_module_applies_the_mask_of_the_generator(attention):
    mask = np.tril(np.ones((8, 8)), 1)  # each token also sees the next one
    for given in ["causal", mask]:
        X, Y, params = make_attention_task(attention, 10, 8, 5, rank=2, mask=given, noise=0.0,
                                           logit_scale=2.0, random_state=0, return_params=True)
        module = LowRankAttention(5, rank=2, attention=attention, value="identity",
                                  logit_scale=2.0, mask=given)
        with torch.no_grad():
            module.W_Q.copy_(torch.as_tensor(params.W_Q))
            module.W_K.copy_(torch.as_tensor(params.W_K))
            out = module(torch.as_tensor(X, dtype=torch.float32)).numpy()
        np.testing.assert_allclose(out, Y, atol=1e-5)


@pytest.mark.parametrize("attention", ["linear", "softmax"])
@pytest.mark.parametrize("masking", ["causal", "padded", "both"])
def test_matrix_free_solve_equals_the_dense_solve(attention, masking):
    n, d = 10, 7
    lengths = _lengths(60, n, 0) if masking != "causal" else None
    mask = None if masking == "padded" else "causal"
    X, Y, params = make_attention_task(attention, 60, n, d, rank=2, mask=mask, lengths=lengths,
                                       value="random", random_state=1, return_params=True)
    # The helper asserts that the two solvers agree on the kernel and its spectrum.
    dense_and_matrix_free_solves(params.V, attention, X, Y, lengths, mask=mask)


@pytest.mark.parametrize("value", ["identity", "random"])
@pytest.mark.parametrize("n_tokens, squares", [(12, False), (16, True), (40, True)])
def test_products_through_the_kept_moments_equal_the_dense_normal_matrix(value, n_tokens,
                                                                         squares):
    # Unmasked linear attention keeps the moments S_s when d <= n, and T_s = S_s Vᵀ V S_s
    # beside them when 2 d <= n (two GEMMs a product instead of three): both products, and the
    # solves through them, equal the dense normal matrix's. Chunks of 7 and 5 sequences make
    # several kept blocks, regrouped before the solve.
    d = 8
    X, Y, params = make_attention_task("linear", 60, n_tokens, d, rank=2, value=value,
                                       noise=0.1, random_state=3, return_params=True)
    dense = KernelMoments(params.V, "linear", solver="dense").update(X, Y)
    free = KernelMoments(params.V, "linear", solver="cg")
    for start, stop in [(0, 7), (7, 12), (12, 60)]:
        free.update(X[start:stop], Y[start:stop])
    assert free.C is None and not free.blocks and len(free.moment_blocks) == 3
    assert len(free.square_blocks) == (3 if squares else 0)
    D = np.random.default_rng(0).standard_normal((d, d))
    expected = (normal_matrix(dense) @ D.ravel()).reshape(d, d)
    free.consolidate()
    assert len(free.square_blocks) == (len(free.moment_blocks) if squares else 0)
    operator = NormalOperator(free)
    np.testing.assert_allclose(operator.apply(D), expected, rtol=1e-12,
                               atol=1e-12 * np.abs(expected).max())
    single = operator.apply_single(D)
    assert single.dtype == np.float64
    np.testing.assert_allclose(single, expected, atol=1e-5 * np.abs(expected).max())
    assert not np.array_equal(single, operator.apply(D))  # float32 products indeed
    np.testing.assert_allclose(free.rhs, dense.rhs, rtol=1e-12, atol=1e-12 * np.abs(
        dense.rhs).max())
    np.testing.assert_allclose(free.T_sum, dense.T_sum, rtol=1e-12)
    exact, solved = dense.solve(), free.solve(tol=1e-13)
    assert (exact.solver, solved.solver) == ("dense", "cg")
    # On kept moments the products run in float32, refined on float64 residuals to 1e-13.
    assert solved.n_single_products > 0
    np.testing.assert_allclose(solved.kernel, exact.kernel,
                               atol=1e-8 * np.abs(exact.kernel).max())
    np.testing.assert_allclose(solved.singular_values, exact.singular_values, rtol=1e-8)
    assert solved.rank == exact.rank == 2
    # Merged statistics keep both lists in step.
    half = KernelMoments(params.V, "linear", solver="cg").update(X[:30], Y[:30])
    half.merge(KernelMoments(params.V, "linear", solver="cg").update(X[30:], Y[30:]))
    np.testing.assert_allclose(NormalOperator(half).apply(D), expected, rtol=1e-12,
                               atol=1e-12 * np.abs(expected).max())


def test_float32_products_refined_in_float64_reach_the_float64_solution(monkeypatch):
    # Noise-free data (the stop relative to the noise never passes before float64
    # resolution) and the default stop: the refined solve ends at the planted kernel as a
    # float64 solve would. A float32 product at half the operator (a stand-in for an operator
    # that float32 cannot resolve: a round overshoots to -R) stalls the refinement, which then
    # finishes in float64.
    d, n = 8, 20
    X, Y, params = make_attention_task("linear", 80, n, d, rank=2, value="identity",
                                       noise=0.0, random_state=4, return_params=True)
    fit = KernelMoments(np.eye(d), "linear", solver="cg").update(X, Y).solve()
    assert fit.n_single_products > 0 and fit.rank == 2
    np.testing.assert_allclose(fit.kernel, params.W, atol=1e-9 * np.abs(params.W).max())
    X, Y, params = make_attention_task("linear", 80, n, d, rank=2, value="identity",
                                       noise=0.1, random_state=4, return_params=True)
    exact = KernelMoments(np.eye(d), "linear", solver="dense").update(X, Y).solve()
    original = NormalOperator.apply_single
    monkeypatch.setattr(NormalOperator, "apply_single", lambda self, D: 0.5 * original(self, D))
    stalled = KernelMoments(np.eye(d), "linear", solver="cg").update(X, Y).solve(tol=1e-13)
    assert 0 < stalled.n_single_products < 50  # handed over after the first stalled round
    np.testing.assert_allclose(stalled.kernel, exact.kernel,
                               atol=1e-8 * np.abs(exact.kernel).max())
    np.testing.assert_allclose(stalled.singular_values, exact.singular_values, rtol=1e-8)


def test_padded_chunks_among_unpadded_ones_are_solved_in_float64():
    # Padded chunks keep their sequences beside the unpadded chunks' moments: the float32
    # products (over the moments alone) would miss them, so the solve stays in float64.
    d, n = 8, 20
    X, Y, params = make_attention_task("linear", 80, n, d, rank=2, value="identity",
                                       noise=0.1, random_state=5, return_params=True)
    lengths = _lengths(40, n, 2)
    for k, i in enumerate(range(40, 80)):  # the padding tokens' values are ignored
        X[i, lengths[k]:] = 0.0
    free, dense = (KernelMoments(np.eye(d), "linear", solver=solver) for solver in ("cg",
                                                                                    "dense"))
    for moments in (free, dense):
        moments.update(X[:40], Y[:40]).update(X[40:], Y[40:], lengths)
    assert free.moment_blocks and free.blocks
    solved, exact = free.solve(tol=1e-13), dense.solve()
    assert solved.n_single_products == 0
    np.testing.assert_allclose(solved.kernel, exact.kernel,
                               atol=1e-8 * np.abs(exact.kernel).max())


def test_the_solver_is_chosen_by_size():
    X, Y = make_attention_task("linear", 30, 8, 50, rank=2, random_state=0)
    big = KernelMoments(np.eye(50), "linear").update(X, Y)
    assert big.C is None and big.solve().solver == "cg"  # no d^4 / 4 statistic at d > 48
    small = KernelMoments(np.eye(8), "linear").update(*make_attention_task(
        "linear", 30, 8, 8, rank=2, random_state=0))
    assert small.C is not None and not small.blocks


def test_the_rank_is_cut_from_the_solved_spectrum_apart_from_the_solve():
    X, Y, params = make_attention_task("linear", 200, 12, 8, rank=2, value="random",
                                       noise=0.1, random_state=1, return_params=True)
    moments = KernelMoments(params.V, "linear").update(X, Y)
    fit, direction_noise = solve_kernel(moments)
    assert not {"rank", "threshold", "kronecker_rank", "local_noise"} & set(fit)
    cut = kernel_threshold_rank(fit, direction_noise)
    solved = moments.solve()
    assert cut.rank == solved.rank == 2 and cut.threshold == solved.threshold
    assert cut.local_noise == solved.local_noise
    # A spectrum with one value on either side of the cut t, within a factor 2 of it: each
    # is checked against t times the root of the noise ratio along its own direction.
    t = cut.threshold
    near = Bunch(**{**fit, "singular_values": np.array([20, 1.3, 0.8, 0.1, 0, 0, 0, 0]) * t})
    plain = kernel_threshold_rank(near, lambda k: 1.0)
    assert plain.threshold == t and plain.rank == plain.kronecker_rank == 2
    assert set(plain.local_noise) == {1, 2}  # 1.3 t stays in, 0.8 t stays out
    noisy = kernel_threshold_rank(near, lambda k: 4.0)  # the cut of each doubles: 1.3 t falls
    assert (noisy.rank, noisy.kronecker_rank, noisy.local_noise) == (1, 2, {1: 4.0})
    quiet = kernel_threshold_rank(near, lambda k: 0.5)  # the cut of each is 0.71 t: 0.8 t in
    assert (quiet.rank, quiet.kronecker_rank) == (3, 2)
    unidentified = kernel_threshold_rank(Bunch(**{**near, "identified": False}),
                                         lambda k: 4.0)
    assert unidentified.rank == 2 and not unidentified.local_noise  # the plain cut alone


CELLS = [("linear", "causal", 8, 3, 16, True), ("softmax", "causal", 8, 3, 16, True),
         ("linear", "padded", 8, 1, 16, True), ("softmax", "padded", 16, 3, 16, True),
         ("linear", "causal", 8, 3, 64, False), ("softmax", "causal", 8, 1, 64, False),
         ("softmax", "padded", 8, 3, 64, False)]


@pytest.mark.parametrize("attention, masking, d, rank, n, known", CELLS)
def test_causal_and_padded_data_read_the_planted_rank(attention, masking, d, rank, n, known):
    # A fast corner of benchmarks/bench_attention_masks.py's grid.
    lengths = _lengths(400, n, rank) if masking == "padded" else None
    mask = "causal" if masking == "causal" else None
    X, Y, params = make_attention_task(attention, 400, n, d, rank=rank, mask=mask,
                                       lengths=lengths, value="random", noise=0.1,
                                       random_state=rank + d, return_params=True)
    est = IntrinsicRankEstimator("attention", attention=attention, mask=mask,
                                 value=params.V if known else None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RankEstimationWarning)  # the short-sequence caveat
        assert est.fit(X, Y, lengths=lengths).rank_ == rank


def test_padding_values_are_ignored():
    lengths = _lengths(200, 12, 0)
    X, Y, params = make_attention_task("softmax", 200, 12, 6, rank=2, lengths=lengths,
                                       random_state=0, return_params=True)
    est = IntrinsicRankEstimator("attention", value="identity").fit(X, Y, lengths=lengths)
    padding = np.arange(12)[None, :] >= lengths[:, None]
    X2, Y2 = X.copy(), Y.copy()
    X2[padding], Y2[padding] = 5.0, -3.0
    other = IntrinsicRankEstimator("attention", value="identity").fit(X2, Y2, lengths=lengths)
    np.testing.assert_allclose(other.qk_kernel_, est.qk_kernel_, rtol=1e-8, atol=1e-12)
    assert est.rank_ == 2


def test_causal_regressor_recovers_the_rank_from_a_small_initialisation():
    torch.set_num_threads(1)
    X, Y = make_attention_task("softmax", 256, 8, 6, rank=2, mask="causal", noise=0.05,
                               logit_scale=2.0, random_state=0)
    net = LowRankAttentionRegressor(attention="softmax", value="identity", mask="causal",
                                    logit_scale=2.0, init_scale=1e-2, random_state=0, lr=0.05,
                                    max_epochs=150, batch_size=-1).fit(X, Y)
    assert net.effective_rank_ == 2 and net.score(X, Y) > 0.9


@pytest.mark.parametrize("attention", ["softmax", "linear"])
def test_padded_regressor_ignores_the_padding_and_recovers_the_rank(attention):
    torch.set_num_threads(1)
    lengths = _lengths(256, 12, 1)
    X, Y = make_attention_task(attention, 256, 12, 6, rank=2, mask="causal", lengths=lengths,
                               noise=0.05, logit_scale=2.0, random_state=1)
    padding = np.arange(12)[None, :] >= lengths[:, None]
    X2, Y2 = X.copy(), Y.copy()
    X2[padding], Y2[padding] = 5.0, -3.0
    fits = [LowRankAttentionRegressor(attention=attention, value="identity", mask="causal",
                                      logit_scale=2.0, random_state=0, lr=0.05, max_epochs=150,
                                      batch_size=64).fit(A, B, lengths=lengths)
            for A, B in [(X, Y), (X2, Y2)]]
    # What the padding holds changes nothing: not the kernel, not the real tokens' outputs.
    np.testing.assert_allclose(fits[1].qk_kernel_, fits[0].qk_kernel_, rtol=1e-5, atol=1e-7)
    predicted = fits[1].predict(X2, lengths=lengths)
    assert np.all(predicted[padding] == 0)
    np.testing.assert_allclose(predicted[~padding], fits[0].predict(X, lengths=lengths)[~padding],
                               atol=1e-5)
    assert fits[0].effective_rank_ == 2 and fits[1].score(X2, Y2, lengths=lengths) > 0.9


def test_regressor_refuses_bad_lengths_with_the_expected_form():
    X, Y = make_attention_task("linear", 20, 8, 4, rank=1, random_state=0)
    with pytest.raises(ValueError, match=r"lengths.*\[1, n_tokens=8\]"):
        LowRankAttentionRegressor(attention="linear", max_epochs=1).fit(X, Y, lengths=[9] * 20)
    with pytest.raises(ValueError, match="`lengths` must be an array of 20 integers"):
        LowRankAttentionRegressor(attention="linear", max_epochs=1).fit(X, Y, lengths=[4] * 19)
    with pytest.raises(ValueError, match="`lengths` applies to attention='softmax' or 'linear'"):
        LowRankAttentionRegressor(attention="static", max_epochs=1).fit(X, Y, lengths=[4] * 20)


@pytest.mark.parametrize("law, size, scale", [("gaussian", 16, 0.3), ("gaussian", 256, 0.5),
                                              ("symmetric", 16, 0.5), ("skewed", 32, 0.5)])
def test_vocabulary_tokens_under_softmax_read_the_planted_rank(law, size, scale):
    # The linearisation around uniform weights leaked into spurious directions for tokens
    # of a vocabulary (4-6 for a planted 3); the softmax fit has no Gaussian identity to fail.
    X, Y = make_attention_task("softmax", 400, 32, 12, rank=3, logit_scale=scale, noise=0.1,
                               vocabulary_size=size, vocabulary_law=law, random_state=size)
    assert IntrinsicRankEstimator("attention", value="identity").fit(X, Y).rank_ == 3


@pytest.mark.parametrize("scale", [3.0, 6.0])
def test_logit_rms_tracks_the_planted_logit_scale(scale):
    X, Y, params = make_attention_task("softmax", 300, 24, 12, rank=3, logit_scale=scale,
                                       noise=0.1, random_state=0, return_params=True)
    planted = scale * np.linalg.norm(params.singular_values) / np.sqrt(12)
    est = IntrinsicRankEstimator("attention", value="identity").fit(X, Y)
    assert abs(est.logit_rms_ - planted) < 0.2 * planted and est.rank_ == 3


def test_partial_fit_sets_the_fitted_attributes_from_all_the_chunks(monkeypatch):
    X, Y = make_attention_task("linear", 300, 16, 6, rank=2, mask="causal", random_state=0)
    solves = []
    original = KernelMoments.solve
    monkeypatch.setattr(KernelMoments, "solve",
                        lambda self, *a, **k: solves.append(1) or original(self, *a, **k))
    est = IntrinsicRankEstimator("attention", attention="linear", value="identity",
                                 mask="causal")
    for i, start in enumerate(range(0, 300, 100)):
        est.partial_fit(X[start:start + 100], Y[start:start + 100])
        # Each chunk is read at once: the attributes are set, not computed when first read.
        assert len(solves) == i + 1 and "rank_" in vars(est) and "qk_kernel_" in vars(est)
    check_is_fitted(est)
    copy = pickle.loads(pickle.dumps(est))
    assert clone(est).get_params() == est.get_params()
    assert est.rank_ == 2 and est.components_.shape == (2, 6) and len(solves) == 3
    full = IntrinsicRankEstimator("attention", attention="linear", value="identity",
                                  mask="causal").fit(X, Y)
    np.testing.assert_allclose(est.qk_kernel_, full.qk_kernel_, rtol=1e-8, atol=1e-12)
    assert copy.rank_ == 2 and vars(copy)["rank_"] == 2  # pickled as set
    before = len(solves)
    est.partial_fit(X[:10], Y[:10])
    assert len(solves) == before + 1 and "rank_" in vars(est)


def test_partial_fit_with_solve_false_only_accumulates(monkeypatch):
    X, Y = make_attention_task("linear", 300, 16, 6, rank=2, random_state=0)
    solves = []
    original = KernelMoments.solve
    monkeypatch.setattr(KernelMoments, "solve",
                        lambda self, *a, **k: solves.append(1) or original(self, *a, **k))
    est = IntrinsicRankEstimator("attention", attention="linear", value="identity")
    est.partial_fit(X[:100], Y[:100])
    assert "rank_" in vars(est) and len(solves) == 1
    for start in (100, 200):
        est.partial_fit(X[start:start + 100], Y[start:start + 100], solve=False)
    # An earlier reading no longer describes the chunks seen: it is removed, not kept stale.
    assert len(solves) == 1 and "rank_" not in vars(est) and est.n_samples_seen_ == 300
    assert est.partial_fit() is est and len(solves) == 2
    full = IntrinsicRankEstimator("attention", attention="linear", value="identity").fit(X, Y)
    assert est.rank_ == full.rank_ == 2
    np.testing.assert_allclose(est.qk_kernel_, full.qk_kernel_, rtol=1e-8, atol=1e-12)


def test_partial_fit_without_data_before_any_chunk_is_refused():
    with pytest.raises(ValueError, match="partial_fit\\(\\) without data.*Pass X"):
        IntrinsicRankEstimator().partial_fit()


def test_partial_fit_without_enough_data_has_no_rank_yet():
    X, Y = make_attention_task("linear", 5, 8, 3, rank=1, random_state=0)
    est = IntrinsicRankEstimator().partial_fit(X[:, 0], Y[:, 0])
    est.partial_fit(X[:1, 0], Y[:1, 0])
    assert hasattr(est, "n_samples_seen_")
    assert not hasattr(IntrinsicRankEstimator().partial_fit(X[:1, 0], Y[:1, 0]), "rank_")


def test_kernel_outside_the_tokens_span_is_not_fitted():
    # 8 embeddings and their negatives span 8 of 12 directions: only the kernel on that span
    # acts on the data, and the fit leaves the rest at zero.
    X, Y, params = make_attention_task("linear", 300, 16, 12, rank=2, vocabulary_size=16,
                                       vocabulary_law="symmetric", random_state=0,
                                       return_params=True)
    est = IntrinsicRankEstimator("attention", attention="linear", value="identity").fit(X, Y)
    basis = np.linalg.svd(params.vocabulary, full_matrices=True)[2]
    outside = basis[8:]
    assert np.abs(outside @ est.qk_kernel_).max() < 1e-8 * np.abs(est.qk_kernel_).max()
    assert np.abs(est.qk_kernel_ @ outside.T).max() < 1e-8 * np.abs(est.qk_kernel_).max()


def test_noise_free_softmax_beyond_the_dense_width_converges_in_few_products():
    # Noise-free outputs: a stop relative to the noise would never pass (the residual is
    # rounding). The Levenberg-Marquardt fit ends at float64 resolution in a few steps, each
    # of a bounded number of products, and reads the planted rank.
    X, Y, params = make_attention_task("softmax", 300, 16, 56, 16, rank=3, value="random",
                                       noise=0.0, random_state=0, return_params=True)
    fit = KernelMoments(params.V, "softmax").update(X, Y).solve()
    assert fit.solver == "cg" and fit.identified and fit.converged and fit.exact
    assert fit.rank == 3
    assert fit.gauss_newton_steps <= 8 and fit.n_products <= 200
    np.testing.assert_allclose(fit.kernel, params.W * params.logit_scale / np.sqrt(56),
                               atol=1e-8 * np.abs(params.W).max())


@pytest.mark.parametrize("mask", [None, "causal"])
def test_too_few_equations_on_the_kernel_warn_and_are_not_refined(mask):
    # 12 sequences of 16 tokens through a rank-8 value map: each query constrains at most
    # min(8, keys - 1) numbers of the 56^2 kernel entries, so the least squares is one exact
    # fit of many (the minimum-norm one read 56 without a warning).
    X, Y, params = make_attention_task("softmax", 12, 16, 56, 8, rank=3, value="random",
                                       mask=mask, noise=0.0, random_state=0,
                                       return_params=True)
    fit = KernelMoments(params.V, "softmax", mask=mask).update(X, Y).solve()
    keys = np.full(16, 16) if mask is None else np.arange(1, 17)
    assert fit.n_equations == 12 * np.minimum(8, keys - 1).sum()
    assert not fit.identified and fit.gauss_newton_steps == 0 and not fit.exact
    with pytest.warns(RankEstimationWarning, match="not identified"):
        IntrinsicRankEstimator("attention", value=params.V, mask=mask).fit(X, Y)
    # With enough sequences the same task is identified, and reads its rank silently.
    X, Y = make_attention_task("softmax", 400, 16, 56, 8, rank=3, value=params.V,
                               mask=mask, noise=0.01, random_state=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RankEstimationWarning)
        assert IntrinsicRankEstimator("attention", value=params.V, mask=mask).fit(X, Y).rank_ == 3


@pytest.mark.filterwarnings("ignore:The fitted attention logits")  # also strained, and said
def test_a_softmax_fit_stopped_before_converging_warns(monkeypatch):
    X, Y, params = make_attention_task("softmax", 300, 16, 6, rank=2, logit_scale=8.0,
                                       noise=0.05, random_state=0, return_params=True)
    original = _attention_solver._gauss_newton
    monkeypatch.setattr(_attention_solver, "_gauss_newton",
                        lambda moments, operator, A, span=None: original(
                            moments, operator, A, span, max_steps=1))
    with pytest.warns(RankEstimationWarning, match="before converging"):
        IntrinsicRankEstimator("attention", value="identity").fit(X, Y)


@pytest.mark.parametrize("seed", [1, 5])
def test_saturated_softmax_on_a_symmetric_vocabulary_checks_every_counted_direction(seed):
    # 6 +- pairs at logit rms 3: saturated weights leave kernel directions whose noise is
    # far above the Kronecker whitening's (ratios up to 2e4 measured at d = 16). Checked only
    # within a factor 2 of the plain cut, these draws read 4 for a planted 3 without a
    # warning; checked against their own noise the extra direction falls, and the
    # correction is said.
    beta = 3.0 / np.sqrt(3 / 12)
    X, Y = make_attention_task("softmax", 200, 16, 12, rank=3, logit_scale=beta, noise=0.1,
                               vocabulary_size=12, vocabulary_law="symmetric",
                               random_state=seed)
    with pytest.warns(RankEstimationWarning, match="Kronecker whitening"):
        est = IntrinsicRankEstimator("attention", value="identity").fit(X, Y)
    assert est.rank_ == 3


def test_the_short_sequence_caveat_reads_the_mask():
    # Without the value map a token's own share a_ii of its moment is a full-rank systematic
    # term of energy about 2 E[a_ii^2]: 2 / n^2 unmasked, far more under a causal mask, whose
    # first queries see few keys. At n = 24 the causal reading is warned, the unmasked is not.
    from sklearn_ebound._attention_operators import check_attention_pattern, own_share_energy

    unmasked = own_share_energy(check_attention_pattern(None, 24, "linear"), 24)
    assert unmasked == pytest.approx(2 / 24**2)
    causal = own_share_energy(check_attention_pattern("causal", 24, "linear"), 24)
    # Rows weighted by |K_i| / n: 2 sum_k (k / n) k^-2 / sum_k (k / n).
    k = np.arange(1, 25)
    assert causal == pytest.approx(2 * np.sum(1 / k) / np.sum(k))
    assert own_share_energy(check_attention_pattern("causal", 64, "linear"), 64) < 0.01
    for mask, warned in [(None, False), ("causal", True)]:
        X, Y = make_attention_task("linear", 200, 24, 6, rank=2, noise=0.05, mask=mask,
                                   random_state=0)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            IntrinsicRankEstimator("attention", attention="linear", mask=mask).fit(X, Y)
        said = [str(w.message) for w in caught if "own share" in str(w.message)]
        assert bool(said) == warned, said
