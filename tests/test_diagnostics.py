"""Residual diagnostics, the calibration they choose, and the attributes that say how sure a
rank is: ``noise_model_``, ``diagnostics_``, ``p_values_``, ``rank_interval_``,
``detection_limit_``, and ``groups=``."""

import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import special
from scipy.optimize import brentq
from sklearn.model_selection import GroupKFold

from sklearn_ebound import IntrinsicRankEstimator, rank_path_scores
from sklearn_ebound._diagnostics import (
    DIAGNOSTIC_LEVEL,
    DIAGNOSTIC_ROWS,
    RowSample,
    _chi2_upper,
    absorbed_group_contrasts,
    diagnose_residuals,
    failed_assumptions,
    residual_rows,
)
from sklearn_ebound._least_squares import solve_static
from sklearn_ebound._moments import Moments
from sklearn_ebound._null_laws import _tracy_widom_cdf, tracy_widom_p_value
from sklearn_ebound._resampled_null import fitted_noise_autocovariance, long_run_factor
from sklearn_ebound.datasets import make_attention_task, make_static_task
from sklearn_ebound.exceptions import RankEstimationWarning

SETTINGS = settings(max_examples=25, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])


def _fit(X, Y, **kwargs):
    """Fit, returning the estimator and the RankEstimationWarnings it raised."""
    groups = kwargs.pop("groups", None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        estimator = IntrinsicRankEstimator(random_state=0, **kwargs).fit(X, Y, groups=groups)
    return estimator, [w for w in caught if issubclass(w.category, RankEstimationWarning)]


@st.composite
def clean_tasks(draw):
    """Gaussian, independent, homoscedastic data (correlated inputs and noise allowed)."""
    p = draw(st.integers(1, 8))
    q = draw(st.integers(1, 12))
    n = draw(st.integers(p + 25, 600))
    X, Y = make_static_task(
        n, p, q, rank=draw(st.integers(0, min(p, q))), noise=draw(st.sampled_from([0.1, 1.0])),
        input_correlation=draw(st.sampled_from([0.0, 0.6])),
        noise_correlation=draw(st.sampled_from([0.0, 0.4])),
        random_state=draw(st.integers(0, 2**16)))
    groups = draw(st.sampled_from([None, "blocks", "random"]))
    if groups == "blocks":
        groups = np.arange(n) // draw(st.integers(2, 10))
    elif groups == "random":
        groups = np.random.default_rng(n).integers(0, max(2, n // 5), n)
    return X, Y, groups


@SETTINGS
@given(clean_tasks())
def test_clean_gaussian_data_keep_the_tracy_widom_calibration(task):
    X, Y, groups = task
    copies = [X.copy(), Y.copy(), None if groups is None else groups.copy()]
    estimator, caught = _fit(X, Y, groups=groups)
    assert estimator.noise_model_ == "gaussian"
    assert estimator.diagnostics_["failed"] == ()
    assert not any("Tracy–Widom edges assume" in str(w.message) for w in caught)
    # Inputs are never mutated.
    np.testing.assert_array_equal(X, copies[0])
    np.testing.assert_array_equal(Y, copies[1])
    if groups is not None:
        np.testing.assert_array_equal(groups, copies[2])


@SETTINGS
@given(clean_tasks())
def test_diagnostic_p_values_are_probabilities_and_the_rule_is_their_level(task):
    X, Y, groups = task
    moments = Moments.from_arrays(X, Y, scale=True)
    operator = solve_static(moments)
    sample = RowSample(X, Y, groups)
    diagnostics = diagnose_residuals(residual_rows(X, Y, moments, operator,
                                                   sample.group_codes()))
    tested = [name for name in ("heteroscedasticity", "serial_dependence",
                                "group_dependence", "heavy_tails") if name in diagnostics]
    assert tested  # at least the families that need neither groups nor order
    for name in tested:
        assert 0 <= diagnostics[name]["p_value"] <= 1
    # A family fails exactly where its p-value is at most the level over four.
    failed = failed_assumptions(diagnostics)
    assert failed == tuple(name for name in tested
                           if diagnostics[name]["p_value"] <= DIAGNOSTIC_LEVEL / 4)


@pytest.mark.parametrize("df", [1, 2, 5, 10, 19, 20, 59, 60, 61, 100])
def test_chi_square_tail_in_closed_form_is_scipys(df):
    # Where the closed form is taken (and where it hands over to scipy), from p near one to
    # p far below any level.
    for x in np.r_[0.0, np.logspace(-4, 3.3, 120)]:
        np.testing.assert_allclose(_chi2_upper(df, float(x)), special.chdtrc(df, x),
                                   rtol=1e-12, atol=0)


@pytest.mark.parametrize("constant_input", [False, True])
def test_variance_test_is_koenkers_n_r_squared(constant_input):
    # The test's statistic, read from Grams and one Cholesky factor, is n R^2 of the squared
    # norms of the residuals' leading projections on the standardised inputs, and apart on
    # their squares, each with an intercept (least squares on the rows, in the data's units,
    # away from zero mean; a constant input drops out).
    rng = np.random.default_rng(3)
    n, p, q = 600, 5, 8
    X = rng.standard_normal((n, p)) + 40.0
    if constant_input:
        X[:, 1] = 3.0
    noise = rng.standard_normal((n, q)) * (1 + 0.5 * np.abs(X[:, [0]] - 40.0))
    Y = X @ rng.standard_normal((p, q)) + noise + 7.0
    moments = Moments.from_arrays(X, Y, scale=True)
    diagnostics = diagnose_residuals(residual_rows(X, Y, moments, solve_static(moments)))
    Xc, Yc = X - X.mean(axis=0), Y - Y.mean(axis=0)
    E = Yc - Xc @ np.linalg.lstsq(Xc, Yc, rcond=None)[0]
    leading = np.linalg.eigh(E.T @ E)[1][:, -3:]
    target = np.sum((E @ leading) ** 2, axis=1)
    target -= target.mean()
    Z = Xc[:, Xc.std(axis=0) > 1e-9]
    statistics = []
    for design in (Z, Z**2):
        design = np.column_stack([np.ones(n), design])
        fitted = design @ np.linalg.lstsq(design, target, rcond=None)[0]
        statistics.append(n * (fitted @ fitted) / (target @ target))
    test = diagnostics["heteroscedasticity"]
    assert test["df"] == 2 * Z.shape[1]
    np.testing.assert_allclose(test["statistic"], max(statistics), rtol=1e-8)
    assert test["p_value"] < 1e-6  # the noise grows with the first input


def _null_rows(kind, seed, n=1500, p=10, q=30):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, p))
    E = rng.standard_normal((n, q))
    groups = None
    if kind == "heteroscedastic":
        E *= np.abs(X[:, [0]])
    elif kind == "serial":
        for A in (X, E):
            for t in range(1, n):
                A[t] = 0.7 * A[t - 1] + np.sqrt(1 - 0.7**2) * A[t]
    elif kind == "groups":
        groups = np.repeat(np.arange(n // 15), 15)
        E += 1.5 * rng.standard_normal((n // 15, q))[groups]
        X += rng.standard_normal((n // 15, p))[groups]
    elif kind == "heavy":
        E = rng.standard_t(2.5, (n, q))
    return X, E, groups


@pytest.mark.parametrize("kind, assumption, model", [
    ("heteroscedastic", "heteroscedasticity", "wild-bootstrap"),
    ("serial", "serial_dependence", "block-bootstrap"),
    ("groups", "group_dependence", "group-bootstrap"),
    ("heavy", "heavy_tails", "wild-bootstrap"),
])
def test_a_failed_assumption_switches_the_calibration_and_warns_once(kind, assumption, model):
    X, Y, groups = _null_rows(kind, 0)
    estimator, caught = _fit(X, Y, groups=groups)
    assert assumption in estimator.diagnostics_["failed"]
    assert estimator.noise_model_ == model
    switch = [w for w in caught if "Tracy–Widom edges assume" in str(w.message)]
    assert len(switch) == 1
    assert model in str(switch[0].message)
    # The resampled test reads no rank in pure noise (it may, once in a thousand).
    assert estimator.rank_ == 0
    assert estimator.rank_interval_[0] == 0


def test_resampled_test_finds_a_planted_rank_above_the_detection_limit():
    X, E, _ = _null_rows("heteroscedastic", 1)
    null, _ = _fit(X, E)
    rng = np.random.default_rng(1)
    U = np.linalg.qr(rng.standard_normal((X.shape[1], 3)))[0]
    V = np.linalg.qr(rng.standard_normal((E.shape[1], 3)))[0]
    B = (U * null.detection_limit_ * np.array([6.0, 5.0, 4.0])) @ V.T
    estimator, _ = _fit(X, X @ B + E)
    assert estimator.noise_model_ == "wild-bootstrap"
    assert estimator.rank_ == 3
    low, high = estimator.rank_interval_
    assert low == 3 <= high


def test_p_values_rank_interval_and_detection_limit_on_the_gaussian_path():
    X, Y = make_static_task(2000, 20, 30, rank=4, noise=0.5, random_state=0)
    estimator, _ = _fit(X, Y, significance=1e-3)
    assert estimator.rank_ == 4
    p = estimator.p_values_
    assert np.all(p[:4] <= 1e-3) and p.size > 4 and p[4] > 1e-3
    low, high = estimator.rank_interval_
    assert isinstance(low, int) and isinstance(high, int)
    assert low == estimator.rank_ <= high <= min(20, 30)
    # The tests ran up to the first p-value at the interval's stop (or the end).
    assert p.size == min(high + 1, 20)
    # The detection limit: below the weakest planted value, positive, in the spectrum's units.
    assert 0 < estimator.detection_limit_ < estimator.singular_values_[3]
    # In the units of the targets, and proportional to the noise level.
    scaled, _ = _fit(X, 0.1 * Y)
    assert scaled.detection_limit_ == pytest.approx(0.1 * estimator.detection_limit_, rel=1e-9)
    X, Y = make_static_task(2000, 20, 30, rank=4, noise=0.05, random_state=0)
    quiet, _ = _fit(X, Y)
    assert quiet.detection_limit_ == pytest.approx(0.1 * estimator.detection_limit_, rel=0.1)


def test_detection_limit_is_the_phase_transition():
    # Rank-one signals either side of the limit: far below it no test sees them, far above
    # every one does.
    rng = np.random.default_rng(3)
    X = rng.standard_normal((3000, 10))
    E = rng.standard_normal((3000, 40))
    null, _ = _fit(X, E)
    u, v = np.eye(10)[:, :1], np.eye(40)[:1]
    weak, _ = _fit(X, X @ (u * 0.5 * null.detection_limit_) @ v + E)
    strong, _ = _fit(X, X @ (u * 3 * null.detection_limit_) @ v + E)
    assert weak.rank_ == 0 and strong.rank_ == 1


def test_lower_tail_p_values_are_exact_where_the_interval_ends():
    # The interval's top ends at a p-value of 1 - significance: there the gamma form's lower
    # tail is a fifth too thin, and the exact p-value is TW1's own distribution function.
    low = brentq(lambda x: _tracy_widom_cdf(x) - 1e-3, -8.0, -2.0, xtol=1e-12)
    assert tracy_widom_p_value(low, exact=True) == pytest.approx(1 - 1e-3, abs=1e-9)
    assert abs(tracy_widom_p_value(low) - (1 - 1e-3)) > 1e-4  # the fast form differs


def _planted(seed, n=2000, p=20, q=30, rank=3, strength=1.0, limit=None):
    """White Gaussian data with ``rank`` equal directions at ``strength`` times ``limit``."""
    rng = np.random.default_rng(seed)
    X, E = rng.standard_normal((n, p)), rng.standard_normal((n, q))
    if limit is None or rank == 0:
        return X, E
    U = np.linalg.qr(rng.standard_normal((p, rank)))[0]
    V = np.linalg.qr(rng.standard_normal((q, rank)))[0]
    return X, X @ (U * strength * limit) @ V.T + E


def test_rank_interval_holds_equal_directions_just_above_the_detection_limit():
    # Three equal directions at 1.5 times the limit, the interval's stated strength: their
    # weakest sample value falls below the centre of the noise's edge in about half the draws
    # (what the interval's top used to count up to), and the rank misses them often, but the
    # top holds them (equal directions repel: the top allows for it).
    limit = _fit(*_planted(100, rank=0))[0].detection_limit_
    held = 0
    for seed in range(30):
        estimator, _ = _fit(*_planted(seed, strength=1.5, limit=limit), interval_strength=1.5)
        low, high = estimator.rank_interval_
        held += low <= 3 <= high
        # The tests' p-values run up to the first direction outside the interval.
        p = estimator.p_values_
        assert p.size == min(high + 1, 20)
    assert held >= 29


def test_rank_interval_of_white_noise_stops_a_few_values_into_the_bulk():
    # Directions of any strength (interval_strength=0, the sequential test's own top): each
    # further noise value is compared with the largest of a smaller noise matrix, which the
    # m-th largest undershoots by a growing margin: the top passes a few noise values, not the
    # bulk (20 of them here). Directions of twice the detection limit (the default) would
    # stand clear of the noise's edge: no noise value passes for one.
    widths, default_widths = [], []
    for seed in range(20):
        X, Y = _planted(seed, rank=0)
        estimator, _ = _fit(X, Y, interval_strength=0)
        low, high = estimator.rank_interval_
        assert low == estimator.rank_ == 0
        widths.append(high - low)
        default, _ = _fit(X, Y)
        assert default.rank_interval_[0] == 0
        default_widths.append(default.rank_interval_[1])
    assert max(widths) <= 8 and 1 <= np.mean(widths) <= 6
    assert max(default_widths) == 0


@SETTINGS
@given(seed=st.integers(0, 2**16), rank=st.integers(0, 3),
       levels=st.tuples(st.sampled_from([1e-4, 1e-3, 1e-2]), st.sampled_from([1e-3, 1e-2, 0.05])))
def test_rank_interval_top_grows_as_the_significance_falls(seed, rank, levels):
    # Both ends are level-`significance` tests: a smaller level reads a smaller rank, and an
    # interval whose top is no lower (a direction too weak for noise at one level is too
    # weak at a larger one).
    small, large = sorted(levels)
    X, Y = _planted(seed, n=400, p=6, q=10, rank=rank, strength=1.5, limit=0.25)
    tight, _ = _fit(X, Y, significance=small)
    loose, _ = _fit(X, Y, significance=large)
    assert tight.rank_interval_[0] <= loose.rank_interval_[0]
    assert tight.rank_interval_[1] >= loose.rank_interval_[1]


def test_sequences_are_grouped_by_sequence():
    X, Y = make_attention_task("linear", 150, 8, 4, rank=2, noise=0.05, random_state=0)
    estimator, _ = _fit(X, Y, operator="attention")
    assert estimator.diagnostics_["group_dependence"]["n_groups"] == DIAGNOSTIC_ROWS // 8
    # Groups of sequences: labels per sequence group their tokens together.
    grouped, _ = _fit(X, Y, operator="attention", groups=np.arange(150) // 3)
    assert grouped.diagnostics_["group_dependence"]["n_groups"] == DIAGNOSTIC_ROWS // 24 + 1
    assert grouped.rank_ == estimator.rank_ == 2


def test_groups_with_partial_fit():
    X, Y, groups = _null_rows("groups", 2)
    full, _ = _fit(X, Y, groups=groups)
    streamed = IntrinsicRankEstimator(random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RankEstimationWarning)
        for start in range(0, X.shape[0], 400):
            chunk = slice(start, start + 400)
            streamed.partial_fit(X[chunk], Y[chunk], groups=groups[chunk])
        assert streamed.rank_ == 0  # the lazy solve, and its warning, at the first read
    assert streamed.noise_model_ == full.noise_model_ == "group-bootstrap"
    # The same rows tested, with the operator of the same moments (to rounding).
    streamed_test, full_test = (e.diagnostics_["group_dependence"] for e in (streamed, full))
    assert streamed_test["n_groups"] == full_test["n_groups"]
    assert streamed_test["statistic"] == pytest.approx(full_test["statistic"], rel=1e-8)
    assert streamed.rank_ == full.rank_ == 0
    np.testing.assert_allclose(streamed.singular_values_, full.singular_values_, rtol=1e-10)


def test_partial_fit_keeps_a_bounded_number_of_rows():
    from sklearn_ebound._diagnostics import MAX_KEPT_ROWS

    rng = np.random.default_rng(0)
    estimator = IntrinsicRankEstimator()
    for _ in range(3):
        estimator.partial_fit(rng.standard_normal((MAX_KEPT_ROWS // 2, 3)),
                              rng.standard_normal((MAX_KEPT_ROWS // 2, 2)))
    assert estimator._rows.n_kept == MAX_KEPT_ROWS
    # The diagnostics read the first of them; a resampled null would read all.
    assert estimator.diagnostics_["n_rows"] == DIAGNOSTIC_ROWS
    assert estimator.n_samples_seen_ == 3 * (MAX_KEPT_ROWS // 2)


def test_cv_splits_by_groups():
    X, Y = make_static_task(300, 6, 5, rank=2, noise=0.5, random_state=0)
    groups = np.arange(300) // 10
    estimator, _ = _fit(X, Y, criterion="cv", cv=4, groups=groups)
    ranks = estimator.cv_results_["rank"]
    scores = rank_path_scores(X, Y, ranks, cv=GroupKFold(n_splits=4), groups=groups,
                              scoring="neg_mean_squared_error")
    np.testing.assert_allclose(estimator.cv_results_["mean_test_score"], scores.mean(axis=0))


@pytest.mark.parametrize("groups, match", [
    (np.arange(99), "one label per sample: got 99 labels for 100 samples"),
    (np.zeros((100, 2)), "1-D array-like of one group label per sample"),
    (np.r_[np.zeros(99), np.nan], "NaN or infinite"),
    (np.array([None] * 100, dtype=object), "None labels"),
    (np.array([1, "a"] * 50, dtype=object), "labels that can be sorted"),
])
def test_bad_groups_are_rejected(groups, match):
    X, Y = make_static_task(100, 3, 2, rank=1, random_state=0)
    with pytest.raises(ValueError, match=match):
        IntrinsicRankEstimator().fit(X, Y, groups=groups)
    with pytest.raises(ValueError, match=match):
        IntrinsicRankEstimator().partial_fit(X, Y, groups=groups)


def test_three_d_groups_are_per_sequence():
    X, Y = make_attention_task("linear", 20, 8, 4, rank=2, noise=0.05, random_state=0)
    with pytest.raises(ValueError, match="got 160 labels for 20 samples"):
        IntrinsicRankEstimator().fit(X, Y, groups=np.arange(160))


def test_rank_interval_follows_the_energy_cap_of_approximate_attention():
    X, Y = make_attention_task("softmax", 200, 16, 6, rank=2, value="random", random_state=0)
    estimator, _ = _fit(X, Y, operator="attention")
    low, high = estimator.rank_interval_
    assert low == estimator.rank_ <= high
    assert estimator.p_values_.size >= 1


def test_the_resampled_null_repeats_with_its_random_state():
    X, Y, _ = _null_rows("heteroscedastic", 5)
    first, _ = _fit(X, Y)
    again, _ = _fit(X, Y)
    assert first.noise_model_ == "wild-bootstrap"
    np.testing.assert_array_equal(first.p_values_, again.p_values_)
    assert first.detection_limit_ == again.detection_limit_


def test_noise_free_fit_keeps_the_gaussian_rule():
    # Rounding error grows with the inputs (it is "heteroscedastic"), but it is not noise: a
    # resampled null of it would read a direction at 1e-16 as signal.
    X, Y, params = make_static_task(50, 2, 3, rank=1, noise=0.0, input_correlation=0.5,
                                    random_state=69, return_params=True)
    est = IntrinsicRankEstimator().fit(X, Y)
    assert est.rank_ == params.rank == 1
    assert est.noise_model_ == "gaussian"


def _sequence_rows(seed, n=1200, p=10, q=30, length=20):
    """Rows in consecutive sequences of ``length`` sharing an effect in inputs and noise."""
    rng = np.random.default_rng(seed)
    codes = np.arange(n) // length
    X = rng.standard_normal((n, p)) + 0.7 * rng.standard_normal((codes[-1] + 1, p))[codes]
    E = rng.standard_normal((n, q)) + 0.7 * rng.standard_normal((codes[-1] + 1, q))[codes]
    return X, E


def test_fitted_noise_autocovariance_is_the_sum_of_lagged_products():
    rng = np.random.default_rng(0)
    basis, residual = rng.standard_normal((200, 3)), rng.standard_normal((200, 4))
    c, reach = fitted_noise_autocovariance(basis, residual, max_lag=6)
    u = np.einsum("ti,tj->tij", basis, residual)
    for h, value in enumerate(c):
        expected = np.einsum("tij,tij->", u[h:], u[:len(u) - h])
        assert value == pytest.approx(expected, rel=1e-12)
    assert c.size == reach + 1


def test_dependence_range_sees_rows_sharing_effects_and_not_independent_rows():
    X, E = _sequence_rows(0, length=12)
    Xc = X - X.mean(0)
    basis = np.linalg.qr(Xc)[0]
    residual = E - E.mean(0) - basis @ (basis.T @ E)
    _, reach = fitted_noise_autocovariance(basis, residual)
    assert 8 <= reach <= 14
    rng = np.random.default_rng(1)
    basis = np.linalg.qr(rng.standard_normal((1200, 10)))[0]
    _, reach = fitted_noise_autocovariance(basis, rng.standard_normal((1200, 30)))
    assert reach <= 2


def test_long_run_factor_restores_what_blocks_cut():
    assert long_run_factor([5.0], 10) == 1.0
    c = np.array([4.0, 2.0, 1.0])
    kept = 4 + 2 * (2 * (1 - 1 / 4) + 1 * (1 - 2 / 4))
    assert long_run_factor(c, 4) == pytest.approx(np.sqrt((4 + 2 * 3) / kept))
    assert long_run_factor([4.0, -1.0], 4) == 1.0  # never narrower than the blocks


def test_rows_sharing_effects_without_groups_keep_the_level():
    # Sequences of 20 rows sharing effects, the groups not given: the serial test sends them
    # to the block bootstrap, whose blocks must span the sequences (an AR(1) filter does not
    # remove this dependence). Blocks from the lag-one autocorrelation alone read a rank in
    # four of these six draws at 1e-3.
    ranks, models = [], set()
    for seed in range(6):
        X, E = _sequence_rows(seed, n=2000, p=20, q=60)
        estimator, _ = _fit(X, E, significance=1e-3)
        ranks.append(estimator.rank_)
        models.add(estimator.noise_model_)
        assert estimator.diagnostics_["dependence_range"] >= 10
    assert models == {"block-bootstrap"}
    assert sum(ranks) <= 1


def test_absorbed_group_contrasts_count_the_group_directions_the_inputs_span():
    rng = np.random.default_rng(0)
    codes = np.repeat(np.arange(10), 30)
    # each direction of inputs constant within groups is a contrast; of independent inputs,
    # about k 9 / n of them
    X = rng.standard_normal((10, 8))[codes]
    basis = np.linalg.qr(X - X.mean(0))[0]
    absorbed, contrasts = absorbed_group_contrasts(basis, codes)
    assert contrasts == 9 and absorbed == pytest.approx(8.0)
    X = rng.standard_normal((300, 12))
    basis = np.linalg.qr(X - X.mean(0))[0]
    absorbed, _ = absorbed_group_contrasts(basis, codes)
    assert absorbed < 2.0


def test_groups_the_inputs_span_are_warned():
    # 16 groups of 20 rows sharing effects in inputs and noise, 60 inputs: the fit takes the
    # groups' shared noise into the fitted values, the residuals pass every test, and a rank
    # is read in pure noise. That must not come without a warning.
    rng = np.random.default_rng(0)
    codes = np.repeat(np.arange(16), 20)
    X = rng.standard_normal((320, 60)) + 0.7 * rng.standard_normal((16, 60))[codes]
    E = rng.standard_normal((320, 3)) + 0.7 * rng.standard_normal((16, 3))[codes]
    estimator, caught = _fit(X, E, groups=codes)
    assert any("directions that separate the 16 groups" in str(w.message) for w in caught)
    assert estimator.diagnostics_["absorbed_group_contrasts"]["absorbed"] > 7.5
    # independent inputs with the same groups: no such warning
    estimator, caught = _fit(rng.standard_normal((320, 60)), E, groups=codes)
    assert not any("separate the" in str(w.message) for w in caught)


def test_normal_multipliers_keep_the_clusters_energy_in_every_resample():
    # Both ways of forming the resampled noise (all per-row products at once, or one resample
    # at a time) rescale each resample's multipliers so that sum_g w_g^2 ||S_g||^2 is the
    # clusters' total energy: the noise keeps its scale, only the clusters' shares vary.
    from sklearn_ebound import _resampled_null as resampled
    from sklearn_ebound._diagnostics import ResidualRows

    rng = np.random.default_rng(0)
    basis = np.linalg.qr(rng.standard_normal((300, 4)))[0]
    residual = rng.standard_normal((300, 5))
    clusters = np.repeat(np.arange(30), 10)
    rows = ResidualRows(np.zeros((300, 1)), np.zeros((300, 1)), None, basis,
                        np.einsum("ij,ij->i", basis, basis), residual)
    energies = resampled._cluster_energies(
        basis, resampled._cluster_corrected(residual, basis, clusters), clusters, 30)
    norms = []
    for limit in (resampled._MAX_VALUES, 0):  # the batched and the resample-at-a-time paths
        old = resampled._MAX_VALUES
        resampled._MAX_VALUES = limit
        try:
            null = resampled.ResampledNull(rows, clusters, np.random.default_rng(1),
                                           n_resamples=50, gaussian=True)
        finally:
            resampled._MAX_VALUES = old
        norms.append(np.linalg.norm(null.noise.reshape(50, -1), axis=1))
    np.testing.assert_allclose(norms[0], norms[1], rtol=1e-10)
    # with signs the energy is fixed up to the cross terms; the rescaled normal multipliers
    # have that property too (w^2 averages to one over the clusters' energies)
    w = rng.standard_normal((50, 30))
    scaled = resampled._normalised(w, energies)
    np.testing.assert_allclose(scaled**2 @ energies, energies.sum(), rtol=1e-12)
