"""Experiments: rank sweep, interpolation ladder, recovery and the predictability frontier."""

import json

import numpy as np
import pytest

from sklearn_ebound import ReducedRankRegressor
from sklearn_ebound.datasets import make_attention_task, make_static_task
from sklearn_ebound.experiments import (
    interpolation_ladder,
    predictability_frontier,
    rank_sweep,
    recovery_experiment,
)


def test_static_rank_sweep_finds_the_knee_and_tracks_the_bound(tmp_path):
    X, Y, params = make_static_task(6000, 10, rank=3, singular_values=[2, 1, 0.5], noise=0.5,
                                    random_state=0, return_params=True)
    result = rank_sweep(ReducedRankRegressor(), X, Y, range(0, 11), n_jobs=2,
                        noise_floor=params.noise_floor, singular_values=params.singular_values)
    assert result.knee == 3
    below = result.column("rank") < 3
    ratio = result.column("excess_risk")[below] / result.column("bound")[below]
    assert np.all(np.abs(ratio - 1) < 0.1), ratio
    # Exports carry the same numbers.
    result.to_json(tmp_path / "sweep.json")
    loaded = json.loads((tmp_path / "sweep.json").read_text())
    assert loaded["knee"] == 3 and len(loaded["rows"]) == 11
    csv_lines = result.to_csv().splitlines()
    assert csv_lines[0] == "rank,risk,risk_std,excess_risk,bound" and len(csv_lines) == 12


def test_rank_sweep_of_an_attention_regressor():
    from sklearn_ebound.nn import LowRankAttentionRegressor

    X, Y, params = make_attention_task("linear", 240, 8, 4, rank=2, value="identity",
                                       noise=0.05, random_state=0, return_params=True)
    net = LowRankAttentionRegressor(attention="linear", value="identity", lr=0.05,
                                    max_epochs=80, batch_size=-1, random_state=0)
    result = rank_sweep(net, X, Y, [1, 2, 3, 4], cv=3, noise_floor=params.noise_floor)
    assert result.knee == 2
    excess = result.column("excess_risk")
    assert excess[0] > 10 * params.noise_floor  # rank 1 < r*: clearly above the floor
    assert np.all(np.abs(excess[1:]) < 0.2 * params.noise_floor)  # at the floor from r* on


def test_rank_sweep_needs_ranks():
    X, Y = make_static_task(50, 4, rank=1, random_state=0)
    with pytest.raises(ValueError, match="ranks"):
        rank_sweep(ReducedRankRegressor(), X, Y, [])


def test_interpolation_ladder_localises_the_failure():
    result = interpolation_ladder(n_samples=2000, n_tokens=16, n_features=4, rank=3,
                                  logit_scales=(0.5, 1.0, 4.0), random_state=0)
    rows = {(r["rung"], r["logit_scale"]): r for r in result.rows}
    # Rungs 0-1 and the static softmax at small logit scales: a static reading recovers r*.
    for key in [(0, None), (1, None), (2, 0.5), (2, 1.0)]:
        assert rows[key]["static_estimate"] == 3, key
        assert abs(rows[key]["static_excess_risk"]) < 0.01
    # At logit scale 4 the smallest mixing weights drown in noise: the limit is reported.
    assert rows[(2, 4.0)]["static_estimate"] is None
    assert not rows[(2, 4.0)]["static_recovers"]
    # Input conditioning breaks the static reading; the attention-native rank recovers.
    for key in [(3, None), (4, 0.5), (4, 1.0), (4, 4.0)]:
        assert not rows[key]["static_recovers"], key
        assert rows[key]["static_relative_excess"] > 0.2, key  # no static model solves it
        assert rows[key]["attention_estimate"] == 3, key
    assert sum(rows[key]["static_estimate"] != 3 for key in [(3, None), (4, 1.0), (4, 4.0)]) == 3
    print(result.format())


def test_frontier_linear_is_exact_and_identifiability_limits_the_unknown_value():
    result = predictability_frontier(attention=("linear",), n_tokens=(64,),
                                     vocabulary_sizes=(None,),
                                     value_conditions=(1.0, 10.0, np.inf), n_samples=200,
                                     n_features=6, rank=2, n_repeats=3, random_state=0)
    rows = {(r["value_known"], r["value_condition"]): r["recovery_rate"] for r in result.rows}
    assert rows[(True, 1.0)] == rows[(True, 10.0)] == rows[(True, np.inf)] == 1.0
    assert rows[(False, 1.0)] == rows[(False, 10.0)] == 1.0
    assert rows[(False, np.inf)] < 1.0  # the annihilated direction is invisible without V
    assert json.loads(result.to_json())["rows"][2]["value_condition"] == "inf"


def test_frontier_softmax_holds_for_vocabulary_tokens_at_every_logit_scale():
    # The linearisation around uniform weights degraded with the logit scale for tokens of a
    # vocabulary (0.5 and below at scale 8); the softmax fit with its noise along the
    # directions near the cut reads the rank at every scale.
    result = predictability_frontier(attention=("softmax",), value_known=(True,),
                                     vocabulary_sizes=(None, 24), n_tokens=(32,),
                                     value_conditions=(1.0,), logit_scales=(0.5, 2.0, 8.0),
                                     n_samples=300, n_repeats=4, random_state=0)
    rate = {(r["vocabulary_size"], r["logit_scale"]): r["recovery_rate"] for r in result.rows}
    print(result.format())
    assert min(rate.values()) == 1.0


def test_frontier_and_ladder_take_the_attention_mask():
    frontier = predictability_frontier(attention=("linear", "softmax"), value_known=(True,),
                                       vocabulary_sizes=(None,), n_tokens=(16,),
                                       value_conditions=(1.0,), logit_scales=(1.0,),
                                       n_samples=200, n_repeats=2, mask="causal",
                                       random_state=0)
    assert frontier.meta["mask"] == "causal"
    assert [r["recovery_rate"] for r in frontier.rows] == [1.0, 1.0]
    ladder = interpolation_ladder(n_samples=400, n_tokens=12, n_features=4, rank=2,
                                  logit_scales=(1.0,), mask="causal", random_state=0)
    assert ladder.meta["mask"] == "causal"
    assert [r["attention_estimate"] for r in ladder.rows if r["rung"] >= 3] == [2, 2]


def test_recovery_experiment_energy_rank_holds():
    result = recovery_experiment(attention=("softmax",), logit_scales=(0.5, 8.0), seeds=[0],
                                 n_samples=200, n_tokens=8, n_features=5, rank=2)
    assert all(result.column("recovered"))
    assert np.all(result.column("entropy_rank") > 2)  # entropy rank never reads r* exactly
    assert len(result.rows[0]["singular_values"]) == 5
