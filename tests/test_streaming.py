"""partial_fit: accumulated moments give the result of one fit, for any chunk size."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sklearn_ebound import IntrinsicRankEstimator, ReducedRankRegressor
from sklearn_ebound.datasets import make_attention_task, make_static_task

# Early chunks hold too few samples to whiten the noise: the estimator warns, as it should.
pytestmark = pytest.mark.filterwarnings("ignore::sklearn_ebound.exceptions.RankEstimationWarning")


def _chunks(n, sizes):
    start = 0
    for size in sizes:
        if start >= n:
            return
        yield slice(start, min(start + size, n))
        start += size
    if start < n:
        yield slice(start, n)


@settings(max_examples=15, deadline=None)
@given(sizes=st.lists(st.integers(1, 90), min_size=1, max_size=12))
def test_partial_fit_equals_fit_for_any_chunks(sizes):
    X, Y = make_static_task(300, 8, 6, rank=3, noise=0.3, input_correlation=0.4,
                            random_state=0)
    X = X + 50.0  # a large mean stresses the pairwise centring
    full = IntrinsicRankEstimator().fit(X, Y)
    streamed = IntrinsicRankEstimator()
    for part in _chunks(len(X), sizes):
        streamed.partial_fit(X[part], Y[part])
    assert streamed.rank_ == full.rank_
    np.testing.assert_allclose(streamed.singular_values_, full.singular_values_, rtol=1e-10)
    np.testing.assert_allclose(streamed.components_, full.components_, rtol=1e-8, atol=1e-10)
    rrr_full = ReducedRankRegressor(rank=3).fit(X, Y)
    rrr = ReducedRankRegressor(rank=3)
    for part in _chunks(len(X), sizes):
        rrr.partial_fit(X[part], Y[part])
    np.testing.assert_allclose(rrr.coef_, rrr_full.coef_, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(rrr.intercept_, rrr_full.intercept_, rtol=1e-10, atol=1e-10)


def test_single_rows_work():
    X, Y = make_static_task(60, 4, rank=2, noise=0.1, random_state=1)
    est = IntrinsicRankEstimator(criterion="rsc").partial_fit(X[:1], Y[:1])
    assert not hasattr(est, "rank_") and est.n_samples_seen_ == 1  # read once enough arrive
    with pytest.raises(ValueError, match="minimum of 2 is required"):
        IntrinsicRankEstimator().fit(X[:1], Y[:1])
    for i in range(1, 60):
        est.partial_fit(X[i:i + 1], Y[i:i + 1])
    full = IntrinsicRankEstimator(criterion="rsc").fit(X, Y)
    assert est.rank_ == full.rank_ == 2
    np.testing.assert_allclose(est.singular_values_, full.singular_values_, rtol=1e-10)


@pytest.mark.parametrize("kwargs", [
    {"operator": "attention", "attention": "linear", "value": "identity"},
    {"operator": "attention", "attention": "softmax", "value": "identity"},
    {"operator": "attention", "attention": "linear"},
    {"operator": "static"},
])
def test_partial_fit_on_sequences(kwargs):
    X, Y = make_attention_task(kwargs.get("attention", "linear"), 90, 16, 4, rank=2,
                               noise=0.05, random_state=0)
    full = IntrinsicRankEstimator(**kwargs).fit(X, Y)
    streamed = IntrinsicRankEstimator(**kwargs)
    for part in _chunks(len(X), [1, 7, 30, 52]):
        streamed.partial_fit(X[part], Y[part])
    assert streamed.rank_ == full.rank_
    np.testing.assert_allclose(streamed.singular_values_, full.singular_values_, rtol=1e-9)


def test_partial_fit_checks_consistency():
    X, Y = make_static_task(40, 5, 3, rank=1, random_state=0)
    est = IntrinsicRankEstimator().partial_fit(X, Y)
    with pytest.raises(ValueError, match="features"):
        est.partial_fit(X[:, :4], Y)
    with pytest.raises(ValueError, match="targets"):
        est.partial_fit(X, Y[:, :2])
    with pytest.raises(ValueError, match="cannot be accumulated"):
        IntrinsicRankEstimator(criterion="cv").partial_fit(X, Y)
    Xs, Ys = make_attention_task("linear", 10, 8, 4, rank=1, random_state=0)
    seq = IntrinsicRankEstimator("attention", value="identity").partial_fit(Xs, Ys)
    with pytest.raises(ValueError, match="tokens"):
        seq.partial_fit(Xs[:, :4], Ys[:, :4])
    rrr = ReducedRankRegressor(rank=1).partial_fit(X, Y)
    with pytest.raises(ValueError, match="targets"):
        rrr.partial_fit(X, Y[:, :2])


def test_fit_resets_partial_state():
    X, Y = make_static_task(100, 5, rank=2, noise=0.1, random_state=0)
    est = IntrinsicRankEstimator().partial_fit(X[:50], Y[:50])
    est.fit(X[50:], Y[50:])
    np.testing.assert_allclose(est.singular_values_,
                               IntrinsicRankEstimator().fit(X[50:], Y[50:]).singular_values_)


def test_large_kernel_is_solved_without_the_dense_normal_matrix():
    from sklearn_ebound._kernel_moments import KernelMoments

    X, Y, params = make_attention_task("linear", 300, 12, 9, rank=3, value="random",
                                       noise=0.05, random_state=0, return_params=True)
    moments = KernelMoments(params.V, "linear").update(X, Y)
    d = 9
    assert moments.C.shape == (d * (d + 1) // 2,) * 2  # compressed: a quarter of d^4
    dense, iterative = moments.solve(), moments.solve(dense_limit=0)
    np.testing.assert_allclose(iterative.kernel, dense.kernel, rtol=1e-7, atol=1e-9)
    assert iterative.rank == dense.rank == 3


def test_compressed_product_equals_the_dense_normal_matrix():
    # d = 20: 210 rows of the compressed matrix, more than one block of the product.
    from sklearn_ebound._attention_solver import compressed_product, normal_matrix
    from sklearn_ebound._kernel_moments import KernelMoments

    rng = np.random.default_rng(0)
    X, Y = rng.standard_normal((30, 8, 20)), rng.standard_normal((30, 8, 20))
    moments = KernelMoments(rng.standard_normal((20, 20)), "softmax").update(X, Y)
    A = rng.standard_normal((20, 20))
    np.testing.assert_allclose(compressed_product(moments, A).ravel(),
                               normal_matrix(moments) @ A.ravel(), rtol=1e-10, atol=1e-10)


@settings(max_examples=20, deadline=None)
@given(chunk_values=st.integers(1, 600), scale=st.booleans(), float32=st.booleans())
def test_moments_agree_whatever_the_internal_chunk_size(chunk_values, scale, float32):
    # Moments.update reads its rows in chunks of about _CHUNK_VALUES values through one reused
    # buffer; any chunk size gives the moments of one pass (to rounding), large means included.
    from sklearn_ebound import _moments

    X, Y = make_static_task(200, 5, 3, rank=2, noise=0.3, random_state=0)
    X = (X + 50.0).astype(np.float32 if float32 else np.float64)
    whole = _moments.Moments.from_arrays(X, Y, scale=scale)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_moments, "_CHUNK_VALUES", chunk_values)
        chunked = _moments.Moments.from_arrays(X, Y, scale=scale)
    assert chunked.n == whole.n == 200
    for name in ("mean_x", "mean_y", "xx", "xy", "yy"):
        np.testing.assert_allclose(getattr(chunked, name), getattr(whole, name), rtol=1e-9,
                                   atol=1e-9 * np.abs(getattr(whole, name)).max())


@settings(max_examples=40, deadline=None)
@given(exponent=st.integers(-1074, 1023), seed=st.integers(0, 2**16))
def test_scaled_moments_take_the_exact_quotient_by_the_power_of_two(exponent, seed):
    # The moment pass scales a chunk by the product with 1 / 2^e where that inverse is finite
    # (cheaper) and by the quotient where it overflows; both must be the quotient, bit for bit,
    # subnormal results included.
    from sklearn_ebound._moments import Moments

    rng = np.random.default_rng(seed)
    scale = float(np.ldexp(1.0, exponent))
    X = rng.standard_normal((7, 3)) * np.ldexp(1.0, int(rng.integers(-1074, 1000)))
    Y = rng.standard_normal((7, 2)) * scale
    moments = Moments.empty(3, 2, center=False, scale_x=scale, scale_y=scale)
    buffer = np.empty((7, 5))
    with np.errstate(all="ignore"):
        moments._add_chunk(X, Y, buffer)
        expected = np.concatenate([X / scale, Y / scale], axis=1)
    assert np.array_equal(buffer, expected, equal_nan=True)
