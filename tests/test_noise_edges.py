"""The edge of the noise in the fitted values, for white and correlated noise, the noise
covariance estimate it uses, and the Tracy–Widom laws behind both."""

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from scipy import stats

import sklearn_ebound._null_laws as null_laws
from sklearn_ebound import IntrinsicRankEstimator
from sklearn_ebound._diagnostics import residuals_are_spherical
from sklearn_ebound._null_laws import (
    LargestEigenvalueLaw,
    edge_matched_noise_covariance,
    largest_eigenvalue_law,
    null_edge_correlated,
    null_edge_ratio,
    null_edge_white,
    rotation_null_law,
    tracy_widom_quantile,
    tracy_widom_sf,
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


def test_a_detached_noise_spike_has_a_normal_largest_eigenvalue():
    eigenvalues, n_rows = np.r_[6.0, np.ones(59)], 49
    law = largest_eigenvalue_law(eigenvalues, n_rows)
    assert law.spike_sd > 0
    largest = _largest_squared_singular_values(eigenvalues, n_rows, draws=4000, seed=4)
    # Baik-Ben Arous-Peche: mean n psi(a), variance 2 n a^2 psi'(a); the bulk edge, with its
    # TW1 scale, misses most of the spread.
    assert law.mean == pytest.approx(largest.mean(), rel=0.02)
    assert law.spike_sd == pytest.approx(largest.std(), rel=0.15)
    assert largest.std() > 3 * largest_eigenvalue_law(eigenvalues[1:], n_rows).sigma
    assert np.mean(largest > null_edge_correlated(eigenvalues, n_rows)) < 0.004


def test_edge_without_noise_or_rows_is_zero():
    assert null_edge_correlated(np.zeros(5), 10) == 0.0
    assert null_edge_correlated(np.ones(5), 0) == 0.0


def _residual(covariance, dof, seed=0):
    rng = np.random.default_rng(seed)
    E = rng.standard_normal((dof, len(covariance))) @ np.linalg.cholesky(covariance).T
    return E.T @ E


def test_edge_matched_covariance_flattens_white_noise():
    q, dof = 50, 60
    residual = _residual(np.eye(q), dof)
    before = residual.copy()
    values, vectors = edge_matched_noise_covariance(residual, dof)
    np.testing.assert_array_equal(residual, before)  # the input is not mutated
    sample = np.linalg.eigvalsh(residual / dof)
    # Marchenko-Pastur spreads the sample eigenvalues over about [0.01, 3.7]; white noise
    # of the same trace explains the largest one, so the estimate is back near the true 1.
    assert sample.max() / sample.min() > 20
    assert values.max() / values.min() < 1.5
    assert values.sum() == pytest.approx(sample.sum(), rel=1e-10)
    np.testing.assert_allclose(vectors.T @ vectors, np.eye(q), atol=1e-10)


@pytest.mark.parametrize("covariance, dof", [
    (ar1_covariance(60, 0.7), 50),
    (ar1_covariance(100, 0.3), 300),
    (np.diag(np.r_[20.0, 10.0, 5.0, np.ones(47)]), 49),
], ids=["ar1-0.7", "ar1-0.3", "three-factors"])
def test_edge_matched_covariance_explains_the_largest_residual_eigenvalue(covariance, dof):
    residual = _residual(covariance, dof, seed=1)
    values, _ = edge_matched_noise_covariance(residual, dof)
    law = largest_eigenvalue_law(values, dof)
    # The largest eigenvalue expected under the estimate is the one observed ...
    assert law.mean == pytest.approx(np.linalg.eigvalsh(residual)[-1], rel=1e-4)
    # ... and the spread lies between the sample's (too wide) and none.
    sample = np.linalg.eigvalsh(residual / dof)
    assert values.min() >= sample.min() - 1e-12 and values.max() <= sample.max() + 1e-12
    assert values.max() > values.min()


@pytest.mark.parametrize("quantile, probability", [(0.9793, 0.05), (2.0234, 0.01),
                                                   (3.2724, 0.001)])
def test_tracy_widom_tail_matches_its_tables(quantile, probability):
    # TW1 percentiles tabulated by Bejan (2005).
    assert tracy_widom_sf(quantile) == pytest.approx(probability, rel=0.06)


@pytest.mark.parametrize("level, quantile", [(0.90, 0.4501), (0.95, 0.9793), (0.99, 2.0234),
                                             (0.999, 3.2724)])
def test_tracy_widom_quantile_matches_its_tables(level, quantile):
    # Bejan (2005) tabulates to 4 decimals; the Fredholm determinant is exact.
    assert tracy_widom_quantile(level) == pytest.approx(quantile, abs=5e-4)


def test_tracy_widom_quantile_rejects_levels_outside_its_range():
    for level in (0.4, 1.0, 1.5):
        with pytest.raises(ValueError, match="level"):
            tracy_widom_quantile(level)


@settings(max_examples=30, deadline=None)
@given(level=st.floats(0.5, 1 - 1e-9), n_rows=st.integers(1, 200), n_cols=st.integers(1, 200))
def test_edges_grow_with_the_level(level, n_rows, n_cols):
    stricter = 1 - (1 - level) / 10
    assert tracy_widom_quantile(stricter) > tracy_widom_quantile(level)
    if min(n_rows, n_cols) > 1:
        assert null_edge_white(n_rows, n_cols, stricter) > null_edge_white(n_rows, n_cols, level)


def test_ratio_edge_reduces_to_the_plain_edge_without_a_noisy_denominator():
    law = largest_eigenvalue_law(np.ones(30), 30)
    plain = null_edge_ratio(law, LargestEigenvalueLaw(1.0, 0.0))
    assert tracy_widom_sf((plain - law.mu) / law.sigma) == pytest.approx(0.001, rel=1e-6)
    # A fluctuating denominator needs a larger ratio, and a stricter level too.
    noisy = null_edge_ratio(law, LargestEigenvalueLaw(1.0, 0.05))
    assert noisy > plain
    assert null_edge_ratio(law, LargestEigenvalueLaw(1.0, 0.05), level=0.9999) > noisy
    with pytest.raises(ValueError, match="level"):
        null_edge_ratio(law, LargestEigenvalueLaw(1.0, 0.05), level=1.0)


@pytest.mark.parametrize("eigenvalues, n_rows, dof", [
    (np.ones(20), 20, 20),
    (np.linalg.eigvalsh(ar1_covariance(30, 0.5)), 15, 60),
], ids=["white", "ar1-0.5"])
def test_ratio_edge_is_the_quantile_of_two_largest_eigenvalues(eigenvalues, n_rows, dof):
    # Fitted-value and residual noises with the same covariance, independent: the ratio of
    # their largest eigenvalues exceeds the 99% edge about 1% of the time.
    fitted = _largest_squared_singular_values(eigenvalues, n_rows, draws=4000, seed=2)
    residual = _largest_squared_singular_values(eigenvalues, dof, draws=4000, seed=3)
    edge = null_edge_ratio(largest_eigenvalue_law(eigenvalues, n_rows),
                           largest_eigenvalue_law(eigenvalues, dof), level=0.99)
    assert 0.005 < np.mean(fitted / residual > edge) < 0.02


@pytest.mark.parametrize("n_rows, dof", [(50, 49), (20, 99)])
def test_ratio_edge_holds_its_level_under_a_noise_spike(n_rows, dof):
    # As the estimator uses it: the observed (residual) eigenvalue with the spike's own law,
    # whose low draws a TW1 law would not allow for.
    eigenvalues = np.r_[6.0, np.ones(59)]
    fitted = _largest_squared_singular_values(eigenvalues, n_rows, draws=4000, seed=2)
    residual = _largest_squared_singular_values(eigenvalues, dof, draws=4000, seed=3)
    edge = null_edge_ratio(largest_eigenvalue_law(eigenvalues, n_rows, detach_spike=False),
                           largest_eigenvalue_law(eigenvalues, dof), level=0.99)
    assert np.mean(fitted / residual > edge) < 0.015
    without_spike_law = null_edge_ratio(
        largest_eigenvalue_law(eigenvalues, n_rows, detach_spike=False),
        largest_eigenvalue_law(eigenvalues, dof, detach_spike=False), level=0.99)
    assert without_spike_law < edge


def _noise_only(n, p, q, covariance, seed):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, p))
    return X, rng.standard_normal((n, q)) @ np.linalg.cholesky(covariance).T


# With fewer residual degrees of freedom than targets the rotation test reads the rank alone
# (its path is asserted in test_intrinsic_rank.py); this test measures its level.
@pytest.mark.filterwarnings("ignore:The residuals are not white")
@pytest.mark.parametrize("covariance", [
    ar1_covariance(60, 0.9),
    np.eye(60) + 20 * np.full((60, 60), 1 / 60),  # one strong noise direction
], ids=["ar1-0.9", "spike"])
@pytest.mark.parametrize("n, p", [(200, 30), (100, 50)], ids=["dof>q", "dof<q"])
def test_correlated_noise_alone_reads_rank_zero(covariance, n, p):
    # With 49 residual degrees of freedom for 60 targets the noise covariance cannot be
    # estimated well; the edge must still hold its level.
    ranks = [IntrinsicRankEstimator().fit(*_noise_only(n, p, 60, covariance, seed)).rank_
             for seed in range(20)]
    assert ranks.count(0) >= 19, ranks


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
    # costs most of the power; the edge relative to the residuals keeps it.
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


def test_mild_correlation_kept_as_white_widens_the_edge():
    # John's test keeps AR(1) 0.2 noise as white in some draws at 49 residual degrees of
    # freedom; the edge then widens by what the matched shape says, and exactly white noise
    # keeps the white edge whenever white noise explains the largest residual eigenvalue.
    def ratios(covariance):
        out = []
        for seed in range(40):
            X, Y = _noise_only(100, 50, 50, covariance, seed)
            Xc, Yc = X - X.mean(axis=0), Y - Y.mean(axis=0)
            residual = Yc - Xc @ np.linalg.lstsq(Xc, Yc, rcond=None)[0]
            if not residuals_are_spherical(residual.T @ residual, 49):
                continue
            est = IntrinsicRankEstimator().fit(X, Y)
            white = np.sqrt(est.noise_variance_ * null_edge_white(50, 50) / 100)
            out.append(est.threshold_ / white)
        return np.array(out)

    mild, white = ratios(ar1_covariance(50, 0.2)), ratios(np.eye(50))
    assert mild.size >= 5 and white.size >= 20
    assert np.all(mild >= 1 - 1e-9) and np.all(white >= 1 - 1e-9)
    assert np.median(mild) > 1.01
    assert np.mean(np.isclose(white, 1.0)) >= 0.3


@pytest.mark.parametrize("significance", [0.05, 0.2])
def test_significance_is_the_false_positive_rate_on_white_noise(significance):
    # Noise alone: the first test of the sequence passes with probability `significance`
    # (Tracy–Widom approximations at 10 x 20). 300 draws: a Binomial(300, significance) count.
    rng = np.random.default_rng(0)
    false_positives = sum(
        IntrinsicRankEstimator(significance=significance).fit(
            rng.standard_normal((100, 10)), rng.standard_normal((100, 20))).rank_ > 0
        for _ in range(300))
    expected = 300 * significance
    sd = np.sqrt(expected * (1 - significance))
    assert abs(false_positives - expected) < 3 * sd, false_positives


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), correlation=st.sampled_from([0.0, 0.6]),
       n=st.sampled_from([60, 300]))
def test_a_larger_significance_never_reads_a_smaller_rank(seed, correlation, n):
    X, Y = make_static_task(n, 12, 16, rank=3, noise=2.0, noise_correlation=correlation,
                            random_state=seed)
    ranks = [IntrinsicRankEstimator(significance=level).fit(X, Y).rank_
             for level in (1e-5, 1e-3, 0.05, 0.3)]
    assert ranks == sorted(ranks), ranks


def test_sphericity_keeps_white_noise_and_rejects_a_noise_spike():
    # Two tests: John's (spread correlation) and the largest root's (one strong direction).
    # White noise leaves the white path at about their union's nominal 7.5% at most; a single
    # noise spike that John's test keeps as white in a fifth of the draws is caught by the
    # largest root in nearly all of them.
    rng = np.random.default_rng(0)
    draws = 300

    def john_keeps(residual, dof):
        q = residual.shape[0]
        unit = residual / np.trace(residual)
        return (dof * (q * np.sum(unit * unit) - 1) - q - 1) / 2 <= 1.6449

    for dof, q in [(49, 60), (100, 60), (300, 20)]:
        kept = 0
        for _ in range(draws):
            Z = rng.standard_normal((dof, q))
            kept += residuals_are_spherical(Z.T @ Z, dof)
        rate = 1 - kept / draws
        assert rate <= 0.075 + 2 * np.sqrt(0.075 * 0.925 / draws), (dof, q, rate)
    scale = np.ones(60)
    scale[0] = np.sqrt(3.0)  # a noise variance of 3 along one target, 1 elsewhere
    john = both = 0
    for _ in range(draws):
        Z = rng.standard_normal((100, 60)) * scale
        residual = Z.T @ Z
        eigenvalues = np.linalg.eigvalsh(residual / 100)
        john += john_keeps(residual, 100)
        white = residuals_are_spherical(residual, 100, eigenvalues)
        assert white == residuals_are_spherical(residual, 100)  # the eigenvalues only save work
        both += white
    assert john >= 0.12 * draws and both <= john / 2, (john, both)


@settings(max_examples=20, deadline=None)
@given(eigenvalues=st.lists(st.floats(0.01, 100.0), min_size=1, max_size=30),
       n_rows=st.integers(1, 12), extra=st.integers(0, 20), scale=st.floats(1e-3, 1e3))
@example(eigenvalues=[1.0, 1.0], n_rows=1, extra=1, scale=1.0)  # a Gram proportional to I
def test_rotation_law_is_scale_equivariant_and_bounded_by_the_gram(eigenvalues, n_rows,
                                                                   extra, scale):
    # The part of a Gram that n_rows rows carry lies between 0 and the whole Gram's top.
    d = np.array(eigenvalues)
    law = rotation_null_law(d, n_rows, n_rows + extra, n_draws=200)
    scaled = rotation_null_law(scale * d, n_rows, n_rows + extra, n_draws=200)
    assert scaled.mean == pytest.approx(scale * law.mean, rel=1e-9)
    assert scaled.sd == pytest.approx(scale * law.sd, rel=1e-9, abs=1e-12 * scale * d.max())
    assert 0 < law.mean <= d.max() * (1 + 1e-12)
    if extra == 0:  # all the rows: the Gram's own largest eigenvalue, with no spread
        assert law.sd == 0 and law.mean == pytest.approx(d.max())
        assert law.sf(d.max() * 0.999) == 1.0 and law.sf(d.max() * 1.001) == 0.0
    assert rotation_null_law(0 * d, n_rows, n_rows + extra).sf(0.0) == 1.0  # nothing to test


@pytest.mark.parametrize("covariance", [
    np.diag(np.r_[30.0, np.ones(39)]),  # one strong noise direction
    ar1_covariance(40, 0.7),
], ids=["spike", "ar1-0.7"])
@pytest.mark.parametrize("decide", [False, True], ids=["all-draws", "drawn-for-the-value"])
def test_rotation_law_gives_uniform_p_values_for_any_covariance(covariance, decide,
                                                                monkeypatch):
    # 6 of 30 Gaussian rows with a non-white covariance, q = 40 > 30: given the Gram of all
    # the rows, the p-value of the 6 rows' largest eigenvalue is uniform whatever the
    # covariance, also from a law whose draws stop once the value is clear (staged here
    # though the law is cheap).
    monkeypatch.setattr(null_laws, "_ROTATION_STAGED_COST", 0)
    rng = np.random.default_rng(0)
    root = np.linalg.cholesky(covariance).T
    p_values = []
    for seed in range(300):
        W = rng.standard_normal((30, 40)) @ root
        value = np.linalg.norm(W[:6], 2) ** 2
        law = rotation_null_law(np.linalg.eigvalsh(W.T @ W), 6, 30, n_draws=400, seed=seed,
                                **({"value": value, "significance": 1e-3} if decide else {}))
        p_values.append(law.sf(value))
    p_values = np.array(p_values)
    for level in (0.1, 0.5):
        assert abs(np.mean(p_values <= level) - level) < 3.5 * np.sqrt(level * (1 - level) / 300)


def test_rotation_law_drawn_for_a_value_stops_only_where_its_side_is_clear(monkeypatch):
    # Drawn to decide one value, the law stops early where the value is far from both
    # quantiles of the test, and gives the decisions all the draws give; near a quantile it
    # is the law of all the draws, exactly (staged here though the law is cheap).
    monkeypatch.setattr(null_laws, "_ROTATION_STAGED_COST", 0)
    rng = np.random.default_rng(3)
    W = rng.standard_normal((60, 40)) @ np.linalg.cholesky(ar1_covariance(40, 0.7)).T
    d = np.linalg.eigvalsh(W.T @ W)
    full = rotation_null_law(d, 10, 60)
    for p_value, clear in [(1e-7, True), (4e-4, False), (2.5e-3, False), (0.3, True),
                           (0.997, False), (0.9995, False), (1 - 1e-7, True)]:
        value = full.quantile(1 - p_value)
        law = rotation_null_law(d, 10, 60, value=value, significance=1e-3)
        assert (law != full) == clear, p_value
        for level in (1e-3, 1 - 1e-3):
            assert (law.sf(value) <= level) == (full.sf(value) <= level), p_value


@pytest.mark.filterwarnings("ignore:The residuals are not white")
def test_rotation_laws_drawn_for_their_values_read_the_rank_and_interval_of_all_draws(
        monkeypatch):
    # The sequential test and its interval's top on the rotation path (dof 39 < q 50), each
    # step's law stopped early where its value is clear, and with all the draws at every step.
    data = [make_static_task(60, 20, 50, rank=rank, singular_values=[3.0, 2.0][:rank],
                             noise=1.0, noise_correlation=0.6, random_state=seed)
            for rank in (0, 2) for seed in range(3)]
    readings, p_values = [], []
    for stages in (null_laws._ROTATION_STAGES, ()):
        monkeypatch.setattr(null_laws, "_ROTATION_STAGES", stages)
        fits = [IntrinsicRankEstimator().fit(X, Y) for X, Y in data]
        readings.append([(est.rank_, est.rank_interval_) for est in fits])
        p_values.append(np.concatenate([est.p_values_ for est in fits]))
    assert readings[0] == readings[1]
    ranks = [rank for rank, _ in readings[0]]
    assert min(ranks) == 0 and max(ranks) >= 2
    assert any(high > rank for rank, (_, high) in readings[0])  # the top ran past the rank
    assert not np.array_equal(*p_values)  # some steps stopped early


def test_rotation_law_keeps_the_skewness_of_the_draws():
    # A spike's eigenvalue is nearly normal, an AR(1) bulk's skewed like TW1 or more: the
    # Pearson law follows the drawn skewness, so its quantile is that of the draws.
    rng = np.random.default_rng(1)
    for covariance in (np.diag(np.r_[30.0, np.ones(39)]), ar1_covariance(40, 0.7)):
        W = rng.standard_normal((80, 40)) @ np.linalg.cholesky(covariance).T
        d = np.linalg.eigvalsh(W.T @ W)
        law = rotation_null_law(d, 10, 80, n_draws=4000)
        fresh = rotation_null_law(d, 10, 80, n_draws=4000, seed=1)
        assert fresh.quantile(0.99) == pytest.approx(law.quantile(0.99), abs=0.2 * law.sd)
        assert law.quantile(0.99) != pytest.approx(
            law.mean + law.sd * stats.norm.ppf(0.99), abs=0.01 * law.sd)


def test_every_null_law_inverts_its_own_survival_function():
    # Each null law is one object with sf (a p-value) and isf (an edge), as scipy.stats
    # distributions are: the edge at q has p-value q.
    from sklearn_ebound._null_laws import (
        CanonicalEdgeLaw,
        PointMass,
        RatioLaw,
        RotationLaw,
        ShiftedGammaLaw,
        WhiteEdgeLaw,
        WhiteFloorLaw,
    )

    spiked = largest_eigenvalue_law(np.r_[np.ones(20), 4.0], 40)
    laws = [WhiteEdgeLaw(30, 40, unit=2.5), CanonicalEdgeLaw(5, 8, 200),
            RatioLaw(largest_eigenvalue_law(np.ones(10), 20, detach_spike=False),
                     largest_eigenvalue_law(np.ones(10), 60), unit=3.0),
            spiked, RotationLaw(10.0, 2.0, 0.4), ShiftedGammaLaw(40.0, 0.2, -3.0),
            WhiteFloorLaw(3, 30, unit=0.5)]
    for law in laws:
        for q in (1e-3, 0.05, 0.5):
            edge = law.isf(q)
            assert law.sf(edge, exact=True) == pytest.approx(q, rel=1e-3), (law, q)
            assert law.sf(1.01 * edge) < q < law.sf(0.99 * edge)
    assert PointMass(2.0).isf(0.01) == 2.0 and PointMass(2.0).sf(2.0) == 1.0
    assert CanonicalEdgeLaw(5, 8, 12).isf(0.01) is None  # too few degrees of freedom: no test
