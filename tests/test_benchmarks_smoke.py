"""Every benchmark of issue 5 runs in its smallest mode and reports sane numbers.

The full runs (minutes) regenerate ``docs/performance.rst``'s tables; these smoke runs (seconds)
only check that the scripts still work against the current API.
"""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture
def load(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # the scripts import their sibling _timing

    def load(name):
        spec = importlib.util.spec_from_file_location(f"_bench_{name}", BENCHMARKS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load


def test_recovery_accuracy_quick(load, tmp_path, monkeypatch):
    pytest.importorskip("optht")
    pytest.importorskip("matplotlib")
    bench = load("bench_recovery_accuracy")
    monkeypatch.setattr(bench, "DOCS", tmp_path / "docs")
    out = tmp_path / "recovery.json"
    report = bench.main(["--quick", "--n-jobs", "1", "--output", str(out), "--write-docs"])
    assert json.loads(out.read_text())["overall"] == report["overall"]
    assert (tmp_path / "docs" / "recovery_accuracy.csv").is_file()
    assert (tmp_path / "docs" / "recovery_accuracy.png").is_file()
    names = [res["cell"]["name"] for res in report["results"]]
    assert names == ["BSW 2011", "base"]
    for res in report["results"]:
        assert set(res["scores"]) == {*bench.OURS, *bench.PEERS, *bench.REFERENCE,
                                      *bench.SIGNIFICANCE}
        for score in res["scores"].values():
            assert 0 <= score["exact"] <= 1 and score["mae"] >= 0
    # The default recovered the rank in all 200 draws of the full BSW cell.
    assert report["results"][0]["scores"]["threshold"]["exact"] >= 0.75


def test_null_calibration_quick(load, tmp_path):
    bench = load("bench_null_calibration")
    out = tmp_path / "null.json"
    rows = bench.main(["--quick", "--n-jobs", "1", "--output", str(out),
                       "--significance", "1e-3", "0.4"])
    assert json.loads(out.read_text())["cells"] == rows
    names = [name for name, *_ in bench.cells()[:2]]
    assert [(row["cell"], row["significance"]) for row in rows] == [
        (name, level) for name in names for level in (1e-3, 0.4)]
    # White noise: the test holds its 99.9% level, so 4 draws of noise alone read rank 0.
    assert rows[0]["false_positives"] == 0
    for row in rows:
        assert row["reps"] == 4 and 0 <= row["rate"] <= 1
    # The same draws at a laxer level pass at least as often.
    for strict, lax in zip(rows[::2], rows[1::2], strict=True):
        assert lax["false_positives"] >= strict["false_positives"]
    for _, n, p, q, covariance in bench.cells():
        assert covariance.shape == (q, q) and n > p
        assert np.all(np.linalg.eigvalsh(covariance) > 0)


def test_information_criteria_on_a_clear_task(load):
    bench = load("bench_recovery_accuracy")
    cell = dict(bench.BASE, name="clear", snr=4.0, rho_x=0.0, rho_e=0.0, reps=1)
    X, Y = bench.draw_task(cell, seed=0)
    ranks = bench.information_criterion_ranks(X, Y)
    assert ranks["bic"] == 3 and ranks["aic"] >= 3
    ranks = bench.estimate_ranks(X, Y, np.eye(cell["q"]))
    assert ranks["threshold"] == 3
    # The references test with the true (here white) noise covariance.
    assert ranks["oracle_999"] == ranks["oracle_99"] == 3


def test_scaling_quick(load, tmp_path, monkeypatch):
    bench = load("bench_scaling")
    monkeypatch.setattr(bench, "DOCS", tmp_path / "docs")
    out = tmp_path / "scaling.json"
    report = bench.main(["--quick", "--output", str(out), "--write-docs"])
    assert out.is_file() and (tmp_path / "docs" / "scaling_rows.csv").is_file()
    assert [r["rank"] for r in report["rows"]] == [bench.RANK] * len(report["rows"])
    assert [r["rank"] for r in report["features"]] == [bench.RANK] * len(report["features"])
    assert report["gemm_fraction"] > 0
    # Streaming: ten times the rows does not need ten times the memory.
    small, large = report["rows"][0], report["rows"][-1]
    assert large["rows"] == 10 * small["rows"]
    assert large["peak_mib"] < 3 * small["peak_mib"]


def test_attention_scale_quick(load, tmp_path, monkeypatch):
    bench = load("bench_attention_scale")
    monkeypatch.setattr(bench, "DOCS", tmp_path / "docs")
    out = tmp_path / "attention.json"
    r = bench.main(["--quick", "--output", str(out), "--write-docs"])
    assert r["rank_read"] == r["rank"] == 2
    assert json.loads(out.read_text())["runs"][0]["n_features"] == 8
    assert (tmp_path / "docs" / "attention_scale.csv").is_file()


def test_cli_startup_quick(load):
    bench = load("bench_cli_startup")
    report = bench.main(["--repeats", "1"])
    assert report["baseline_s"] > 0
    assert report["ratios"] and all(np.isfinite(r) and r > 0 for r in report["ratios"].values())
