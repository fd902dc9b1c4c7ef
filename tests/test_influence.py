"""The influential-direction check: an accepted direction carried by a handful of rows that the
other rows contradict (outliers that are leverage points) is named, and ``rank_interval_``
starts below it, on the Gaussian path too; a cluster of such rows mixed into every accepted
direction is found in a combination of them; clean data are never flagged, and real directions
of heavy-tailed inputs are not flagged."""

import warnings

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sklearn_ebound import IntrinsicRankEstimator
from sklearn_ebound._influence import (
    _anisotropy,
    _deleted_rows,
    _most_concentrated,
    influential_directions,
    participation_ratio,
)
from sklearn_ebound.datasets import make_static_task
from sklearn_ebound.exceptions import RankEstimationWarning

SETTINGS = settings(max_examples=10, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])
CARRIED = "carried by about"


def _fit(X, Y):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        estimator = IntrinsicRankEstimator(random_state=0).fit(X, Y)
    messages = [str(w.message) for w in caught if issubclass(w.category, RankEstimationWarning)]
    return estimator, messages


def _outliers_and_leverage(seed, n=100, p=12, q=8, rank=3, n_bad=10):
    """Gaussian rank-``rank`` data whose first ``n_bad`` rows get one common shift in ``Y``
    and one common input row of +-10, drawn after ``Y`` (the reduced-rank-regression
    simulation with outliers and leverage points)."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, p))
    mean = X @ rng.standard_normal((p, rank)) @ rng.standard_normal((rank, q))
    E = rng.standard_normal((n, q))
    sigma = np.linalg.svd(mean, compute_uv=False)[rank - 1] / np.linalg.norm(E)
    Y = mean + sigma * E
    Y[:n_bad] += 2.0 * mean.std(axis=0, ddof=1) * rng.choice([-1.0, 1.0], q)
    X[:n_bad] = 10.0 * rng.choice([-1.0, 1.0], p)
    return X, Y


def test_participation_ratio_counts_the_rows_a_direction_spreads_over():
    values = np.zeros((50, 2))
    values[:7, 0] = 3.0
    values[:, 1] = np.random.default_rng(0).standard_normal(50)
    ratio = participation_ratio(values)
    assert ratio[0] == 7
    assert 5 < ratio[1] < 35  # about n / 3 for Gaussian rows


@SETTINGS
@given(st.integers(0, 2**16), st.integers(2, 6), st.integers(4, 15))
def test_the_pursuit_finds_a_cluster_mixed_into_every_axis(seed, r, cluster):
    # r orthonormal columns: a cluster's indicator and r - 1 spread Gaussian columns, rotated
    # at random so that every axis mixes them; the most concentrated combination is the
    # cluster's (about ``cluster`` rows), far below what any axis shows.
    rng = np.random.default_rng(seed)
    n = 300
    columns = rng.standard_normal((n, r))
    columns[:, 0] = 0.0
    columns[:cluster, 0] = 1.0 + 0.1 * rng.standard_normal(cluster)
    basis = np.linalg.qr(columns)[0]
    rotation = np.linalg.qr(rng.standard_normal((r, r)))[0]
    U = basis @ rotation
    found = participation_ratio(_most_concentrated(U))
    assert found <= 1.5 * cluster
    assert found < participation_ratio(U).min()


def test_a_direction_of_contradicting_leverage_rows_is_flagged_not_one_of_consistent_rows():
    rng = np.random.default_rng(1)
    n, p, q = 300, 6, 5
    X = rng.standard_normal((n, p))
    X[:8] = 12.0 * rng.choice([-1.0, 1.0], p)  # eight leverage rows sharing one input
    coef = rng.standard_normal((p, q))
    for shift, expect in ((0.0, ()), (8.0, (0,))):
        Y = X @ coef + rng.standard_normal((n, q))
        Y[:8] += shift * rng.choice([-1.0, 1.0], q)
        Xc, Yc = X - X.mean(axis=0), Y - Y.mean(axis=0)
        basis = np.linalg.svd(Xc, full_matrices=False)[0]
        fitted = basis @ (basis.T @ Yc)
        # The direction the leverage rows' fitted values take, and one spread over the rows.
        direction = np.linalg.svd(fitted[:8], full_matrices=False)[2][0]
        result = influential_directions(basis, fitted, Yc - fitted, direction[:, None], 1e-3,
                                        np.random.default_rng(0))
        assert result["participation"][0] < result["null_median"] / 2  # concentrated both times
        assert result["flagged"] == expect


def test_outliers_that_are_leverage_points_are_named_and_the_interval_holds_the_rank():
    flagged = 0
    for seed in range(6):
        X, Y = _outliers_and_leverage(seed)
        estimator, messages = _fit(X, Y)
        check = estimator.diagnostics_.get("influential_directions")
        if check is None:  # the diagnostics did not flag these residuals: no check run
            assert estimator.noise_model_ == "gaussian"
            continue
        named = [m for m in messages if CARRIED in m]
        assert len(named) <= 1  # warned once
        if check["flagged"]:
            flagged += 1
            assert named and "outliers or leverage points" in named[0]
            low, high = estimator.rank_interval_
            assert low <= estimator.rank_ - len(check["flagged"])
            assert low <= 3 <= high
    assert flagged >= 3


@st.composite
def clean_tasks(draw):
    p = draw(st.integers(1, 8))
    q = draw(st.integers(1, 12))
    n = draw(st.integers(p + 25, 600))
    return make_static_task(n, p, q, rank=draw(st.integers(0, min(p, q))), noise=1.0,
                            input_correlation=draw(st.sampled_from([0.0, 0.6])),
                            random_state=draw(st.integers(0, 2**16)))


@SETTINGS
@given(clean_tasks())
def test_clean_data_are_never_flagged(task):
    X, Y = task
    estimator, messages = _fit(X, Y)
    check = estimator.diagnostics_.get("influential_directions")
    assert check is None or (check["flagged"] == ()
                             and not (check.get("combination") or {}).get("flagged"))
    assert not any(CARRIED in m for m in messages)


def test_leverage_outliers_whose_residuals_pass_the_diagnostics_are_still_named():
    # Draws of the reduced-rank-regression simulation with outliers and leverage points whose
    # residuals pass the diagnostics at their strict level (the rows' own fit absorbs their
    # shift): the Gaussian path reads them, and its check must name the direction they carry.
    named = 0
    for seed in range(30):
        X, Y = _outliers_and_leverage(seed, n_bad=6)
        estimator, messages = _fit(X, Y)
        if estimator.noise_model_ != "gaussian":
            continue
        check = estimator.diagnostics_["influential_directions"]
        if check["flagged"]:
            named += 1
            assert any(CARRIED in m for m in messages)
            assert estimator.rank_interval_[0] <= 3
    assert named >= 1


@SETTINGS
@given(st.integers(0, 2**16), st.integers(1, 3))
def test_real_directions_of_heavy_tailed_inputs_are_not_flagged(seed, rank):
    # Student t (2.5 dof) inputs and noise, a planted rank well above the noise.
    rng = np.random.default_rng(seed)
    n, p, q = 1500, 8, 12
    X = rng.standard_t(2.5, (n, p))
    signal = X @ rng.standard_normal((p, rank)) @ rng.standard_normal((rank, q))
    Y = signal + rng.standard_t(2.5, (n, q))
    estimator, messages = _fit(X, Y)
    check = estimator.diagnostics_.get("influential_directions")
    assert check is not None  # heavy tails flagged, so the check ran
    assert check["flagged"] == ()
    assert not any(CARRIED in m for m in messages)


def test_the_interval_holds_the_rank_where_the_outliers_mix_into_every_direction():
    # Draws of the simulation with outliers and leverage points in which the outliers' direction
    # mixes into every accepted one, and their most concentrated combination is no more
    # concentrated than the inputs' own leverage rows make a random subspace's (two of these
    # thirty): its rows' residual directions still name it, and the interval holds the rank.
    for seed in range(30):
        X, Y = _outliers_and_leverage(seed)
        estimator, messages = _fit(X, Y)
        if estimator.diagnostics_.get("influential_directions") is None:
            continue
        low, high = estimator.rank_interval_
        assert low <= 3 <= high, seed
        if low < estimator.rank_:
            assert any(CARRIED in m for m in messages)


def _anisotropy_of_rows(X, Y, rows):
    """The anisotropy test of ``rows`` (the top ``len(rows)`` of an indicator) in the fit of
    ``Y`` on ``X``."""
    Xc, Yc = X - X.mean(axis=0), Y - Y.mean(axis=0)
    basis = np.linalg.svd(Xc, full_matrices=False)[0]
    residual = Yc - basis @ (basis.T @ Yc)
    values = np.zeros(len(X))
    values[rows] = 1.0
    return _anisotropy(basis, np.eye(basis.shape[1]), residual, values, len(rows),
                       np.random.default_rng(0), 200)


@SETTINGS
@given(st.integers(0, 2**16), st.sampled_from(["abs", "exp"]), st.sampled_from([20, 300]))
def test_the_anisotropy_test_keeps_its_level_under_input_dependent_noise(seed, scale, m):
    # Noise alone whose scale depends on x_1 (the rows' scales differ, the direction of their
    # noise does not): rows chosen by the inputs, the ones of largest |x_1| (the noisiest) or
    # at random, never point along fewer directions than noise.
    rng = np.random.default_rng(seed)
    n, p, q = 1000, 5, 30
    X = rng.standard_normal((n, p))
    sd = np.abs(X[:, :1]) if scale == "abs" else np.exp(X[:, :1])
    Y = sd * rng.standard_normal((n, q))
    for rows in (np.argsort(-np.abs(X[:, 0]))[:m], rng.permutation(n)[:m]):
        p_value, _ = _anisotropy_of_rows(X, Y, rows)
        assert p_value > 1e-3


def test_the_anisotropy_test_finds_rows_shifted_along_a_few_directions():
    rng = np.random.default_rng(3)
    n, p, q, m = 300, 5, 12, 15
    X = rng.standard_normal((n, p))
    Y = rng.standard_normal((n, q)) * np.exp(X[:, :1])  # input-dependent noise as well
    # The first m rows shifted along two target directions, by varying amounts.
    Y[:m] += 6.0 * rng.standard_normal((m, 2)) @ rng.standard_normal((2, q))
    p_value, excess = _anisotropy_of_rows(X, Y, np.arange(m))
    assert p_value < 1e-6
    assert excess > 0.3


@SETTINGS
@given(st.integers(0, 2**16), st.integers(30, 300), st.integers(1, 12), st.integers(1, 8),
       st.booleans())
def test_deleted_residuals_are_those_of_the_fit_without_the_rows(seed, n, k, q, orthonormal):
    # Woodbury's identity in O(m k^2) against (I - H_SS)^-1 r_S solved directly, for any
    # basis (orthonormal or not) and any rows S.
    rng = np.random.default_rng(seed)
    basis = rng.standard_normal((n, k))
    basis -= basis.mean(axis=0)
    if orthonormal:
        basis = np.linalg.qr(basis)[0]
    residual, values = rng.standard_normal((n, q)), rng.standard_normal(n)
    gram_inverse = np.linalg.inv(basis.T @ basis)
    m = int(rng.integers(1, n // 2))
    rows = _deleted_rows(basis, gram_inverse, residual, values, m)
    S = np.argsort(-np.abs(values), kind="stable")[:min(m, n - k - 2)]
    hat = basis[S] @ gram_inverse @ basis[S].T + 1 / n
    expected = np.linalg.solve(np.eye(len(S)) - hat, residual[S])
    np.testing.assert_array_equal(rows["rows"], S)
    np.testing.assert_allclose(rows["deleted"], expected, rtol=1e-8,
                               atol=1e-8 * np.abs(expected).max())


def test_rows_that_alone_span_an_input_direction_cannot_be_deleted():
    # Five rows share an input value that no other row has: without them the fit has no
    # data along it (I - H_SS is singular), and the deletion test cannot run.
    rng = np.random.default_rng(0)
    X = rng.standard_normal((60, 4))
    X[:, 3] = 0.0
    X[:5, 3] = 10.0
    X -= X.mean(axis=0)
    values = np.linspace(2.0, 1.0, 60)  # the rows S are the first ones
    args = (X, np.linalg.inv(X.T @ X), rng.standard_normal((60, 3)), values)
    assert _deleted_rows(*args, 5) is None
    assert _deleted_rows(*args, 9) is None
    assert _deleted_rows(*args, 4) is not None  # the fifth row is left: it can
