"""``rank_interval_``: the ranks consistent with the data among directions at least
``interval_strength`` times ``detection_limit_`` (:mod:`sklearn_ebound._rules.rank_interval`)."""

import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sklearn_ebound import IntrinsicRankEstimator
from sklearn_ebound._rules.rank_interval import (
    TOP_LEVEL,
    cluster_minimum_quantile,
    spike_location,
    spike_spread,
    strength_top,
)
from sklearn_ebound.datasets import make_static_task
from sklearn_ebound.exceptions import RankEstimationWarning

SETTINGS = settings(max_examples=25, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])


def _fit(X, Y, **params):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RankEstimationWarning)
        return IntrinsicRankEstimator(random_state=0, **params).fit(X, Y)


def test_planted_rank_far_above_the_noise_reads_one_rank():
    # Singular values 4.25, 1.72, 1.33 against a noise edge of 0.16 and a detection limit of
    # 0.078: no fourth direction of twice the limit (0.155) can hide below 1.33, and the
    # fourth sample value (0.124) is too small for one. The top of directions of any strength
    # passes every noise value of this 12 x 12 spectrum.
    X, Y = make_static_task(2000, 12, rank=3, singular_values=(4.39, 1.79, 1.35), noise=1.0,
                            random_state=0)
    estimator = _fit(X, Y)
    assert estimator.rank_ == 3
    assert estimator.rank_interval_ == (3, 3)
    assert estimator.p_values_.size == 4  # the tests stop at the interval's end
    assert _fit(X, Y, interval_strength=0).rank_interval_ == (3, 12)


def test_readme_example_reads_one_rank():
    X, Y = make_static_task(2000, 20, rank=4, noise=0.5, random_state=0)
    assert _fit(X, Y).rank_interval_ == (4, 4)


def test_equal_directions_at_the_stated_strength_are_held():
    # Four equal directions at exactly twice the detection limit (the least favourable case of
    # the default: the rank misses the fourth in about a quarter of the draws, equal
    # directions pushing each other's values apart): the top still holds them.
    n, p, q, rank = 2000, 20, 60, 4
    limit = (p * q) ** 0.25 / np.sqrt(n)  # detection_limit_ at the true (unit) noise
    held = missed = widths = 0
    draws = 40
    for seed in range(draws):
        rng = np.random.default_rng(seed)
        X, E = rng.standard_normal((n, p)), rng.standard_normal((n, q))
        Xc = X - X.mean(axis=0)
        U = np.linalg.svd(Xc @ rng.standard_normal((p, rank)), full_matrices=False)[0]
        V = np.linalg.qr(rng.standard_normal((q, rank)))[0]
        estimator = _fit(X, (U * 2 * limit * np.sqrt(n)) @ V.T + E)
        low, high = estimator.rank_interval_
        assert low == estimator.rank_ <= high
        held += low <= rank <= high
        missed += estimator.rank_ < rank
        widths += high - low
    assert missed >= 4  # the case is a hard one for the rank itself
    assert held >= 0.95 * draws, held
    assert widths / draws < 1  # and the interval is narrow


def test_interval_strength_is_validated():
    X, Y = make_static_task(200, 5, rank=1, random_state=0)
    with pytest.raises(ValueError, match="interval_strength"):
        IntrinsicRankEstimator(interval_strength=-1.0).fit(X, Y)


def test_spike_law_matches_monte_carlo():
    # One direction at twice the detection limit in 9 x 9 unit noise: its sample value's mean
    # and spread are those of spike_location and spike_spread (the mean one dimension
    # deflated, as strength_top reads it).
    rng = np.random.default_rng(0)
    m = r = 9
    t = 2 * (m * r) ** 0.25
    values = []
    for _ in range(3000):
        W = rng.standard_normal((m, r))
        W[0, 0] += t
        values.append(np.linalg.norm(W, 2))
    assert np.mean(values) == pytest.approx(spike_location(t, m - 1, r - 1), abs=0.1)
    assert np.std(values) == pytest.approx(spike_spread(t, m, r), rel=0.06)
    # Its lower TOP_LEVEL quantile is above the law's (the normal law is conservative there).
    law = spike_location(t, m - 1, r - 1) + spike_spread(t, m - 1, r - 1) * \
        cluster_minimum_quantile(1, TOP_LEVEL)
    assert np.quantile(values, TOP_LEVEL) >= law - 0.05


def test_cluster_minimum_is_lower_for_larger_clusters_and_below_the_drawn_one():
    quantiles = [cluster_minimum_quantile(j, TOP_LEVEL) for j in (1, 2, 4, 8, 24, 40)]
    assert quantiles[0] == pytest.approx(-1.959964, abs=1e-6)
    assert np.all(np.diff(quantiles) < 0)
    # The Tracy-Widom form is conservative: below the drawn quantile, by less than a spread.
    rng = np.random.default_rng(0)
    for j in (2, 4, 8):
        G = rng.standard_normal((4000, j, j))
        drawn = np.quantile(np.linalg.eigvalsh((G + G.transpose(0, 2, 1)) / 2)[:, 0],
                            TOP_LEVEL)
        assert drawn - 0.5 < cluster_minimum_quantile(j, TOP_LEVEL) < drawn


@SETTINGS
@given(seed=st.integers(0, 2**16), n_inputs=st.integers(4, 40), n_targets=st.integers(4, 40),
       strengths=st.tuples(st.floats(0.0, 5.0), st.floats(0.0, 5.0)),
       n_uncertain=st.sampled_from([1, 3]))
def test_strength_top_falls_as_the_stated_strength_rises(seed, n_inputs, n_targets, strengths,
                                                         n_uncertain):
    # Directions that could be at least a larger strength are among those that could be at
    # least a smaller one: the top never rises with the stated strength.
    rng = np.random.default_rng(seed)
    k = min(n_inputs, n_targets)
    spectrum = np.sort(rng.gamma(2.0, 1.0, k) * np.sqrt(n_inputs + n_targets) / 2)[::-1]
    scales = [1.0, 0.8, 1.25][:n_uncertain]
    limit = (n_inputs * n_targets) ** 0.25
    weak, strong = sorted(strengths)
    top_weak = strength_top(spectrum, scales, n_inputs, n_targets, weak * limit)
    top_strong = strength_top(spectrum, scales, n_inputs, n_targets, strong * limit)
    assert 0 <= top_strong <= top_weak <= k


@SETTINGS
@given(seed=st.integers(0, 2**16), rank=st.integers(0, 3), strength=st.floats(1.0, 4.0),
       stated=st.tuples(st.sampled_from([0.0, 1.5, 2.0]), st.sampled_from([2.0, 3.0, 6.0])))
def test_interval_holds_the_rank_and_narrows_as_the_stated_strength_rises(seed, rank, strength,
                                                                          stated):
    rng = np.random.default_rng(seed)
    n, p, q = 400, 6, 10
    X, E = rng.standard_normal((n, p)), rng.standard_normal((n, q))
    limit = (p * q) ** 0.25 / np.sqrt(n)
    U = np.linalg.qr(rng.standard_normal((p, rank)))[0]
    V = np.linalg.qr(rng.standard_normal((q, rank)))[0]
    Y = X @ (U * strength * limit) @ V.T + E
    loose, tight = (_fit(X, Y, interval_strength=s) for s in sorted(stated))
    for estimator in (loose, tight):
        low, high = estimator.rank_interval_
        assert low <= estimator.rank_ <= high <= min(p, q)
        assert estimator.p_values_.size <= high + 1
    assert loose.rank_ == tight.rank_ and loose.rank_interval_[0] == tight.rank_interval_[0]
    assert tight.rank_interval_[1] <= loose.rank_interval_[1]
