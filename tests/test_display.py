"""Display objects: what they draw, the handles they keep, and their errors."""

import doctest
import importlib
import sys

import numpy as np
import pytest
from sklearn.exceptions import NotFittedError

from sklearn_ebound import IntrinsicRankEstimator, ReducedRankRegressor, energy_rank, entropy_rank
from sklearn_ebound.datasets import make_static_task
from sklearn_ebound.display import (
    FrontierDisplay,
    HeadRankDisplay,
    HeadSpectrumDisplay,
    RankSweepDisplay,
    SpectrumDisplay,
)
from sklearn_ebound.experiments import FrontierResult, RankSweepResult
from sklearn_ebound.heads import head_ranks

matplotlib = pytest.importorskip("matplotlib")


@pytest.fixture(autouse=True)
def _agg_backend():
    import matplotlib.pyplot as plt

    backend = matplotlib.get_backend()
    plt.switch_backend("Agg")
    yield
    plt.close("all")
    plt.switch_backend(backend)


@pytest.fixture(scope="module")
def static_task():
    return make_static_task(600, 8, rank=3, noise=0.3, decay=0.8, random_state=0,
                            return_params=True)


def _sweep_result(knee=2):
    rows = [{"rank": r, "risk": 1.0 + max(2 - r, 0), "risk_std": 0.1, "excess_risk": max(2 - r, 0),
             "bound": float(max(2 - r, 0))} for r in range(5)]
    return RankSweepResult(rows, knee=knee, noise_floor=1.0, n_splits=5)


def _frontier_result():
    rows = []
    for kind in ["linear", "softmax"]:
        for n in [16, 64]:
            for beta in ([None] if kind == "linear" else [0.5, 2.0, 8.0]):
                rate = 1.0 if kind == "linear" else 1.0 / beta
                rows.append({"attention": kind, "value_known": True, "logit_scale": beta,
                             "n_tokens": n, "value_condition": 1.0, "noise": 0.1,
                             "recovery_rate": rate, "mean_abs_error": 1 - rate})
    return FrontierResult(rows, rank=2)


# RankSweepDisplay -------------------------------------------------------------------------


def test_sweep_from_estimator_marks_the_knee_at_the_planted_rank(static_task):
    X, Y, params = static_task
    display = RankSweepDisplay.from_estimator(
        ReducedRankRegressor(), X, Y, ranks=range(9), cv=3, noise_floor=params.noise_floor,
        singular_values=params.singular_values)
    assert display.knee == display.result_.knee == 3
    np.testing.assert_array_equal(display.knee_line_.get_xdata(), [3, 3])
    np.testing.assert_allclose(display.line_.get_ydata(), display.result_.column("risk"))
    np.testing.assert_array_equal(display.line_.get_xdata(), np.arange(9))
    # The bound is drawn as noise floor + T(r).
    np.testing.assert_allclose(display.bound_line_.get_ydata(),
                               params.noise_floor + display.result_.column("bound"))
    np.testing.assert_array_equal(display.noise_floor_line_.get_ydata(), [params.noise_floor] * 2)
    assert display.ax_.get_xlabel() == "rank r of the model"
    assert display.ax_.get_ylabel() == "held-out risk"
    assert display.figure_ is display.ax_.figure
    assert "ReducedRankRegressor" in display.line_.get_label()


def test_sweep_from_result_on_given_axes():
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    display = RankSweepDisplay.from_result(_sweep_result(knee=2), ax=ax, name="mine")
    assert display.ax_ is ax and display.figure_ is fig
    assert display.fill_between_ is not None
    assert display.line_.get_label() == "held-out risk (mine)"
    np.testing.assert_array_equal(display.knee_line_.get_xdata(), [2, 2])
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "noise floor" in labels and "knee r* = 2" in labels


def test_sweep_without_floor_bound_or_std():
    rows = [{"rank": r, "risk": 3.0 - r, "risk_std": 0.1, "excess_risk": np.nan,
             "bound": np.nan} for r in range(3)]
    display = RankSweepDisplay.from_result(RankSweepResult(rows, knee=2, noise_floor=None),
                                           show_std=False)
    assert display.noise_floor_line_ is None and display.bound_line_ is None
    assert display.fill_between_ is None


def test_sweep_from_result_rejects_other_tables():
    with pytest.raises(ValueError, match="columns of a RankSweepResult"):
        RankSweepDisplay.from_result(_frontier_result())


# SpectrumDisplay --------------------------------------------------------------------------


def test_spectrum_from_estimator(static_task):
    X, Y, _ = static_task
    estimator = IntrinsicRankEstimator().fit(X, Y)
    display = SpectrumDisplay.from_estimator(estimator)
    s = estimator.singular_values_
    assert display.threshold_rank == estimator.rank_ == 3
    assert display.energy_rank == energy_rank(s, estimator.tau)
    assert display.entropy_rank == pytest.approx(entropy_rank(s))
    np.testing.assert_array_equal(display.threshold_line_.get_ydata(), [estimator.threshold_] * 2)
    np.testing.assert_array_equal(display.threshold_rank_line_.get_xdata(), [3, 3])
    np.testing.assert_allclose(display.line_.get_ydata(), np.sort(s)[::-1])
    assert display.ax_.get_xlabel() == "index k"
    assert display.ax_.get_ylabel() == "singular value s_k"
    assert "threshold" in display.line_.get_label()


def test_spectrum_from_estimator_is_readable_at_a_glance(static_task):
    # A log axis, so that the threshold and the detection limit stand apart from zero, and
    # only the lines that matter: the values, the threshold, the rank read, the limit.
    X, Y, _ = static_task
    estimator = IntrinsicRankEstimator().fit(X, Y)
    display = SpectrumDisplay.from_estimator(estimator, name="values")
    assert display.ax_.get_yscale() == "log"
    labels = [t.get_text() for t in display.ax_.get_legend().get_texts()]
    expected = ["values", f"threshold = {estimator.threshold_:.3g}",
                f"r* = {estimator.rank_}",
                f"detection limit = {estimator.detection_limit_:.3g}"]
    low, high = estimator.rank_interval_
    if high > low:
        expected.insert(3, f"ranks not told apart = {low}..{high}")
    assert labels == expected
    assert display.energy_rank_line_ is None and display.entropy_rank_line_ is None
    # All rank lines on request; a linear axis on request.
    every = SpectrumDisplay.from_estimator(estimator, rank_lines="all", log_scale=False)
    assert every.ax_.get_yscale() == "linear"
    assert every.energy_rank_line_ is not None and every.entropy_rank_line_ is not None
    with pytest.raises(ValueError, match="`rank_lines` must be"):
        SpectrumDisplay.from_estimator(estimator, rank_lines="some")


def _span(patch):
    """x extent of an ``axvspan`` (a Rectangle in recent matplotlib, a Polygon before)."""
    if hasattr(patch, "get_width"):
        return patch.get_x(), patch.get_x() + patch.get_width()
    x = np.asarray(patch.get_xy())[:, 0]
    return x.min(), x.max()


def test_spectrum_from_estimator_shows_how_sure_the_rank_is():
    X, Y = make_static_task(300, 8, 6, rank=2, noise=1.0, decay=0.3, random_state=4)
    estimator = IntrinsicRankEstimator().fit(X, Y)
    display = SpectrumDisplay.from_estimator(estimator)
    assert display.rank_interval == estimator.rank_interval_
    assert display.detection_limit == estimator.detection_limit_
    np.testing.assert_allclose(display.detection_limit_line_.get_ydata(),
                               [estimator.detection_limit_] * 2)
    low, high = estimator.rank_interval_
    if high > low:
        assert _span(display.rank_interval_span_) == (low, high)
    else:
        assert display.rank_interval_span_ is None
    # A wider interval is shaded between its ends.
    shaded = SpectrumDisplay(singular_values=estimator.singular_values_,
                             rank_interval=(1, 3)).plot()
    assert _span(shaded.rank_interval_span_) == (1, 3)
    assert "1..3" in shaded.rank_interval_span_.get_label()
    assert shaded.detection_limit_line_ is None


def test_spectrum_from_estimator_needs_a_fitted_estimator():
    with pytest.raises(NotFittedError):
        SpectrumDisplay.from_estimator(IntrinsicRankEstimator())


def test_spectrum_from_spectrum_marks_every_rank():
    s = np.array([0.5, 3.0, 2.0, 0.01, 0.02, 0.015])
    display = SpectrumDisplay.from_spectrum(s, tau=0.9, log_scale=True)
    assert display.energy_rank == energy_rank(s, 0.9)
    np.testing.assert_allclose(display.entropy_rank_line_.get_xdata(), [entropy_rank(s)] * 2)
    np.testing.assert_array_equal(display.energy_rank_line_.get_xdata(),
                                  [display.energy_rank] * 2)
    assert display.threshold_rank == int(np.sum(s > display.threshold))
    assert display.ax_.get_yscale() == "log"
    np.testing.assert_allclose(display.line_.get_ydata(), np.sort(s)[::-1])

    no_cut = SpectrumDisplay.from_spectrum(s, threshold=None)
    assert no_cut.threshold_line_ is None and no_cut.threshold_rank_line_ is None
    fixed = SpectrumDisplay.from_spectrum(s, threshold=1.0)
    assert fixed.threshold_rank == 2


@pytest.mark.parametrize("kwargs, match", [
    ({"singular_values": np.ones((2, 2))}, "must be 1-D"),
    ({"singular_values": np.ones(3), "threshold": "best"}, "`threshold` must be"),
])
def test_spectrum_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SpectrumDisplay.from_spectrum(**kwargs)


# FrontierDisplay --------------------------------------------------------------------------


def test_frontier_heat_map_of_one_slice():
    display = FrontierDisplay.from_result(_frontier_result(), x="logit_scale", y="n_tokens",
                                          where={"attention": "softmax"})
    assert display.x_values == [0.5, 2.0, 8.0] and display.y_values == [16, 64]
    np.testing.assert_allclose(display.values, [[2.0, 0.5, 0.125]] * 2)
    np.testing.assert_allclose(display.im_.get_array(), display.values)
    assert display.text_.shape == (2, 3) and display.text_[0, 1].get_text() == "0.50"
    assert display.ax_.get_xlabel() == "logit_scale" and display.ax_.get_ylabel() == "n_tokens"
    assert display.im_.get_clim() == (0.0, 1.0)
    assert display.colorbar_ is not None
    assert [t.get_text() for t in display.ax_.get_xticklabels()] == ["0.5", "2", "8"]
    assert display.slice["attention"] == "softmax" and display.slice["noise"] == 0.1
    assert "attention=softmax" in display.ax_.get_title()


def test_frontier_other_value_and_no_annotations():
    display = FrontierDisplay.from_result(
        _frontier_result(), x="n_tokens", y="attention", value="mean_abs_error",
        where={"logit_scale": None}, include_values=False, colorbar=False)
    assert display.text_ is None and display.colorbar_ is None
    assert display.y_values == ["linear"] and display.x_values == [16, 64]


def test_frontier_asks_for_a_slice():
    with pytest.raises(ValueError, match="Choose one slice.*attention"):
        FrontierDisplay.from_result(_frontier_result(), x="logit_scale", y="n_tokens")
    with pytest.raises(ValueError, match="not a column"):
        FrontierDisplay.from_result(_frontier_result(), x="beta", y="n_tokens")
    with pytest.raises(ValueError, match="No row"):
        FrontierDisplay.from_result(_frontier_result(), where={"attention": "none"})
    with pytest.raises(ValueError, match="different columns"):
        FrontierDisplay.from_result(_frontier_result(), x="n_tokens", y="n_tokens")


# HeadRankDisplay and HeadSpectrumDisplay ------------------------------------------------


def _head_result(inputs=True):
    # 3 layers x 2 heads of d_h = 4 in the BERT naming; with hidden states, a logit field.
    rng = np.random.default_rng(0)
    state = {f"encoder.layer.{i}.attention.self.{m}.weight": rng.normal(size=(8, 8))
             for i in range(3) for m in ("query", "key")}
    X = rng.normal(size=(10, 5, 8))
    return head_ranks(state, n_heads=2, inputs=[X] * 3 if inputs else None)


def test_head_rank_heat_map_of_one_column():
    result = _head_result()
    display = HeadRankDisplay.from_result(result, "field_energy_rank_90")
    np.testing.assert_array_equal(display.im_.get_array(), result.grid("field_energy_rank_90"))
    assert display.ranks.shape == (3, 2) and display.head_dim == 4
    assert display.ax_.get_xlabel() == "head" and display.ax_.get_ylabel() == "layer"
    assert display.ax_.get_title() == "field_energy_rank_90 (d_h = 4)"
    assert display.colorbar_.ax.get_ylabel() == "field_energy_rank_90"
    assert display.figure_ is display.ax_.figure


def test_head_rank_default_column_and_given_axes():
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    display = HeadRankDisplay.from_result(_head_result(inputs=False), ax=ax, colorbar=False)
    assert display.ax_ is ax and display.figure_ is fig
    assert display.column == "kernel_energy_rank_90" and display.colorbar_ is None
    with pytest.raises(ValueError, match="`column` must be one of"):
        HeadRankDisplay.from_result(_head_result(), "nope")


def test_head_spectrum_of_kernel_and_field():
    result = _head_result()
    display = HeadSpectrumDisplay.from_result(result, 2, 1)
    s = result.kernel_spectra[2, 1]
    np.testing.assert_allclose(display.kernel_line_.get_ydata(), s / s[0])
    f = result.field_spectra[2, 1]
    np.testing.assert_allclose(display.field_line_.get_ydata(), f / f[0])
    # One dotted line per spectrum and energy level, at that energy rank.
    assert [line.get_xdata()[0] for line in display.energy_rank_lines_] == [
        energy_rank(s, 0.9), energy_rank(s, 0.99), energy_rank(f, 0.9), energy_rank(f, 0.99)]
    assert len(display.ax_.get_legend().get_texts()) == 2
    assert display.ax_.get_yscale() == "log"
    assert display.ax_.get_title().startswith("layer 2, head 1 (dotted: energy ranks at 90%")


def test_head_spectrum_without_inputs():
    display = HeadSpectrumDisplay.from_result(_head_result(inputs=False), 0, 0)
    assert display.field_line_ is None and len(display.energy_rank_lines_) == 2
    assert len(display.ax_.get_legend().get_texts()) == 1


# Without matplotlib -----------------------------------------------------------------------


@pytest.fixture
def no_matplotlib(monkeypatch):
    # A None entry in sys.modules makes `import matplotlib.pyplot` raise ImportError.
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "matplotlib", None)


@pytest.mark.parametrize("call", [
    lambda: RankSweepDisplay.from_result(_sweep_result()),
    lambda: RankSweepDisplay.from_estimator(ReducedRankRegressor(), np.ones((4, 2)),
                                            np.ones((4, 2)), ranks=[1]),
    lambda: SpectrumDisplay.from_spectrum(np.ones(3)),
    lambda: SpectrumDisplay.from_estimator(IntrinsicRankEstimator()),
    lambda: FrontierDisplay.from_result(_frontier_result()),
    lambda: SpectrumDisplay(singular_values=np.ones(3)).plot(),
])
def test_clear_error_without_matplotlib(no_matplotlib, call):
    with pytest.raises(ImportError, match=r'requires matplotlib.*sklearn-ebound\[plot\]'):
        call()


@pytest.mark.parametrize("call", [
    lambda: HeadRankDisplay.from_result(_head_result()),
    lambda: HeadSpectrumDisplay.from_result(_head_result(), 0, 0),
    lambda: HeadSpectrumDisplay(kernel_spectrum=np.ones(3)).plot(),
])
def test_clear_error_without_matplotlib_for_head_displays(no_matplotlib, call):
    with pytest.raises(ImportError, match=r'requires matplotlib.*sklearn-ebound\[plot\]'):
        call()


# Docstring examples ----------------------------------------------------------------------


@pytest.mark.parametrize("module", ["_sweep", "_spectrum", "_frontier"])
def test_docstring_examples_run(module):
    module = importlib.import_module(f"sklearn_ebound.display.{module}")
    failures, attempted = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert attempted and not failures


def test_head_display_docstring_examples_run():
    module = importlib.import_module("sklearn_ebound.display._heads")
    failures, attempted = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert attempted and not failures
