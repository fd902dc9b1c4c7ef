"""Every benchmark of issue 5 runs in its smallest mode and reports sane numbers.

The full runs (minutes) regenerate ``docs/performance.rst``'s tables; these smoke runs (seconds)
only check that the scripts still work against the current API.
"""

import importlib.util
import json
import shutil
import subprocess
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
    pytest.importorskip("screenot")
    pytest.importorskip("matplotlib")
    bench = load("bench_recovery_accuracy")
    monkeypatch.setattr(bench, "DOCS", tmp_path / "docs")
    out = tmp_path / "recovery.json"
    report = bench.main(["--quick", "--n-jobs", "1", "--output", str(out), "--write-docs"])
    saved = json.loads(out.read_text())
    assert saved["overall"] == report["overall"] and saved["complete"]
    assert (tmp_path / "docs" / "recovery_accuracy.csv").is_file()
    assert (tmp_path / "docs" / "recovery_accuracy.png").is_file()
    names = [res["cell"]["name"] for res in report["results"]]
    assert names == ["BSW 2011", "base", "rrpack sim4"]
    for res in report["results"]:
        assert set(res["scores"]) == set(bench.METHODS)
        for score in res["scores"].values():
            assert 0 <= score["exact"] <= 1 and score["mae"] >= 0
        reading = res["scores"]["threshold"]["reading"]
        assert reading["draws"] == 4 and 0 <= reading["warned"] <= 1
    # The default recovered the rank in all 200 draws of the full BSW cell.
    assert report["results"][0]["scores"]["threshold"]["exact"] >= 0.75
    # The mean is over the grid cells only, not the rrpack cell.
    assert report["overall"]["grid_cells"] == 2
    for row in report["comparison"]:
        assert row["target_min"] <= row["target_max"]
        assert row["pass_min"] or not row["pass_max"]  # the min reading is the laxer one

    # Re-reading only the package's criteria keeps the peers' rates of the same draws.
    again = bench.main(["--quick", "--n-jobs", "1", "--output", str(tmp_path / "again.json"),
                        "--cells", "base", "--reuse-peers", str(out)])
    assert again["peers_reused"] == [
        {"cell": "base", "methods": sorted(set(bench.METHODS) - set(bench.PACKAGE))}]
    base = report["results"][1]["scores"]
    for method, score in again["results"][0]["scores"].items():
        assert score["exact"] == base[method]["exact"], method
    # A method left out is absent from the scores, and cells run in the order asked.
    skipped = bench.main(["--quick", "--n-jobs", "1", "--output", str(tmp_path / "skip.json"),
                          "--cells", "rrpack sim4", "base", "--skip", "gridsearch"])
    assert [res["cell"]["name"] for res in skipped["results"]] == ["rrpack sim4", "base"]
    assert all("gridsearch" not in res["scores"] for res in skipped["results"])
    assert skipped["skipped_methods"] == ["gridsearch"]
    # Reusing a run that left a peer out reuses the others and computes that one.
    filled = bench.main(["--quick", "--n-jobs", "1", "--output", str(tmp_path / "filled.json"),
                         "--cells", "base", "--reuse-peers", str(tmp_path / "skip.json")])
    reused = filled["peers_reused"][0]["methods"]
    assert "gridsearch" not in reused and "optht" in reused
    assert filled["results"][0]["scores"]["gridsearch"]["exact"] == base["gridsearch"]["exact"]


def test_recovery_summary_targets(load):
    bench = load("bench_recovery_accuracy")
    scores = {m: {"exact": 0.5, "mae": 0.5} for m in bench.METHODS}
    scores["aic"] = {"exact": 0.95, "mae": 0.05}
    scores["oracle_999"] = {"exact": 0.89, "mae": 0.11}
    scores["threshold"] = {"exact": 0.76, "mae": 0.3}
    cell = {"name": "n,p,q=120,20,100", "reps": 200}
    rows, overall = bench.summarise([{"cell": cell, "scores": scores}])
    (row,) = rows
    assert row["best_peer"] == "aic"
    assert row["target_max"] == 0.95 and row["target_min"] == 0.89
    # The example: 0.76 against 0.89 over 200 draws misses by more than two SE.
    assert not row["pass_min"] and not row["pass_max"]
    scores["threshold"] = {"exact": 0.86, "mae": 0.2}
    (row,), _ = bench.summarise([{"cell": cell, "scores": scores}])
    assert row["pass_min"] and not row["pass_max"]
    assert overall["mean_target"] == 0.94 and not overall["mean_ok"]


def test_new_peers_on_a_clear_task(load):
    pytest.importorskip("screenot")
    peers = load("_peers")
    bench = load("bench_recovery_accuracy")
    cell = dict(bench.BASE, name="clear", snr=4.0, rho_x=0.0, rho_e=0.0, reps=1)
    X, Y, signal, _ = bench.draw_task(cell, seed=0)
    assert np.linalg.matrix_rank(signal) == 3
    for rule in (peers.strs_rank, peers.screenot_rank, peers.bcv_rank):
        assert rule(X, Y) == 3, rule.__name__
    assert peers.strs_rank(X, Y, update="db") == 3
    # Noise alone: the self-tuning rule starts from a penalty above the noise's edge.
    noise = np.random.default_rng(1).standard_normal(Y.shape)
    assert peers.strs_rank(X, noise) == 0
    with pytest.raises(ValueError, match="update"):
        peers.strs_rank(X, Y, update="nope")
    Z, residual_ss, n_eff, x_rank = peers.fitted_basis(X, Y)
    assert Z.shape == (x_rank, Y.shape[1]) and n_eff == len(X) - 1
    Yc = Y - Y.mean(axis=0)
    assert np.isclose(residual_ss + np.sum(Z**2), np.sum(Yc**2))


def test_rrpack_settings(load):
    bench = load("bench_recovery_accuracy")
    sim1, sim4, sim5, clean = bench.classic(reps=1)
    X, Y, signal, cov = bench.draw_task(sim1, seed=3)
    # C = U D V^T with orthonormal sparse factors: its singular values are 20, 15, 10.
    coef = np.linalg.lstsq(X, signal, rcond=None)[0]
    assert np.allclose(np.linalg.svd(coef, compute_uv=False)[:4], [20, 15, 10, 0], atol=1e-8)
    assert np.count_nonzero(np.abs(coef).sum(axis=1) > 1e-12) == 10  # sparse rows
    assert cov.shape == (25, 25)
    X, Y, signal, _ = bench.draw_task(sim4, seed=3)
    assert X.shape == (100, 12) and Y.shape == (100, 8)
    assert np.all(np.abs(X[:10]) == 10) and np.all(X[:10] == X[0])  # the leverage points
    assert np.linalg.matrix_rank(signal) == 3
    X, Y, signal, _ = bench.draw_task(clean, seed=3)
    assert X.shape == (40, 100) and np.linalg.matrix_rank(X) == 10
    assert np.linalg.matrix_rank(signal) == 5
    X, _, _, _ = bench.draw_task(sim5, seed=3)
    assert np.linalg.matrix_rank(X) == 11  # the constant leverage rows add a direction


def test_identified_rank_counts_what_the_data_determine(load):
    bench = load("bench_recovery_accuracy")
    _, sim4, sim5, clean = bench.classic(reps=1)
    # The outlier shift of sim4 / sim5 leaves one direction of its own in the span of the
    # leverage points' inputs; without outliers the identified rank is the planted one.
    for cell, identified in [(sim4, 4), (sim5, 6), (clean, 5)]:
        X, Y, signal, _, noise_free = bench.draw_task(cell, seed=3, expected=True)
        assert bench.identified_rank(X, noise_free) == identified, cell["name"]
        assert bench.identified_rank(X, signal) == cell["rank"]  # the clean X B alone
        assert np.array_equal(bench.draw_task(cell, seed=3)[1], Y)  # the same draw
    # Only the part in the inputs' span counts: four target columns on three input directions.
    rng = np.random.default_rng(0)
    X = np.c_[rng.standard_normal((50, 3)), np.zeros((50, 2))]
    assert bench.identified_rank(X, rng.standard_normal((50, 4))) == 3
    assert bench.identified_rank(X, np.ones((50, 4))) == 0  # constant targets: the intercept


def test_null_calibration_quick(load, tmp_path):
    bench = load("bench_null_calibration")
    out = tmp_path / "null.json"
    report = bench.main(["--quick", "--n-jobs", "1", "--output", str(out),
                         "--significance", "1e-3", "0.4"])
    assert json.loads(out.read_text())["cells"] == report["cells"] and report["complete"]
    rows = report["cells"]
    names = [c["name"] for c in bench.cells()[:2]] + ["sd ~ |x1|", "N = p + 5"]
    assert [(row["cell"], row["significance"]) for row in rows] == [
        (name, level) for name in names for level in (1e-3, 0.4)]
    # White noise: the test holds its 99.9% level, so 4 draws of noise alone read rank 0.
    assert rows[0]["false_positives"] == 0 and rows[0]["passes"]
    for row in rows:
        assert row["reps"] == 4 and 0 <= row["rate"] <= 1 and 0 <= row["warned"] <= 1
        assert row["passes"] == (row["level_kept"] or row["warned"] == 1.0)
    # The same draws at a laxer level pass at least as often.
    for strict, lax in zip(rows[::2], rows[1::2], strict=True):
        assert lax["false_positives"] >= strict["false_positives"]
    for cell in bench.cells():
        X, E = bench.draw_noise(cell, np.random.default_rng(0))
        assert X.shape == (cell["n"], cell["p"]) and E.shape == (cell["n"], cell["q"])
        if cell["kind"] == "gaussian":
            assert np.all(np.linalg.eigvalsh(cell["covariance"]) > 0)


def test_null_noise_kinds(load):
    bench = load("bench_null_calibration")
    kinds = {c["name"]: c for c in bench.assumption_cells()}
    X, E = bench.draw_noise(kinds["sd ~ |x1|"], np.random.default_rng(0))
    # The noise's spread follows |x_1|: large where |x_1| is large.
    big = np.abs(X[:, 0]) > 1.5
    assert E[big].std() > 3 * E[np.abs(X[:, 0]) < 0.3].std()
    X, E = bench.draw_noise(kinds["AR(1) 0.9 rows"], np.random.default_rng(0))
    lag1 = np.mean([np.corrcoef(E[:-1, j], E[1:, j])[0, 1] for j in range(E.shape[1])])
    assert 0.85 < lag1 < 0.95 and 0.8 < E.std() < 1.2
    assert kinds["N = p + 5"]["n"] == kinds["N = p + 5"]["p"] + 5
    # Rates within the sampling error pass; above it only a warning in every draw passes.
    cell = dict(name="c", n=10, p=2, q=3)
    reading = lambda rank, warned: [{"rank": rank, "warned": warned, "messages": [],  # noqa: E731
                                     "noise_model": "m"}]
    rows = bench.null_rows(cell, [reading(1, True)] * 5 + [reading(0, True)] * 395, [1e-3], 400)
    assert not rows[0]["level_kept"] and rows[0]["passes"]
    rows = bench.null_rows(cell, [reading(1, False)] * 2 + [reading(0, True)] * 398, [1e-3], 400)
    assert rows[0]["level_kept"] and rows[0]["passes"]
    rows = bench.null_rows(cell, [reading(1, False)] * 5 + [reading(0, True)] * 395, [1e-3], 400)
    assert not rows[0]["passes"]


def test_null_power_section(load, tmp_path, monkeypatch):
    bench = load("bench_null_calibration")
    # The planted signal sits at exactly the asked multiple of the limit, in the estimator's
    # units (singular values of the centred fitted values over sqrt(n)).
    X = np.random.default_rng(0).standard_normal((200, 10))
    U, strength = bench.planted_signal(X, 0.25, np.random.default_rng(1))
    s = np.linalg.svd(strength * U, compute_uv=False) / np.sqrt(200)
    assert np.allclose(s, 0.5) and np.allclose(U.sum(axis=0), 0)

    class WithLimit(bench.IntrinsicRankEstimator):
        """The estimator with a detection limit and an interval, whatever its version."""

        def fit(self, X, y=None):
            super().fit(X, y)
            if not hasattr(self, "detection_limit_"):
                self.detection_limit_ = 0.3
                self.rank_interval_ = (self.rank_, self.rank_)
            return self

    monkeypatch.setattr(bench, "IntrinsicRankEstimator", WithLimit)
    report = bench.main(["--quick", "--n-jobs", "1", "--output", str(tmp_path / "p.json"),
                         "--cells", "white"])
    (row,) = report["power"]
    assert row["available"] and row["reps"] == 4 and row["rank"] == bench.POWER_RANK
    assert 0 <= row["exact"] <= 1 and 0 <= row["coverage"] <= 1 and row["mean_width"] >= 0
    assert row["mean_unit_ratio"] == pytest.approx(1.0)  # the white path reads the fitted values
    report = bench.main(["--quick", "--n-jobs", "1", "--output", str(tmp_path / "p.json"),
                         "--power-only", "--cells", "white", "--power-factors", "2", "3"])
    (row,) = report["power"]
    assert row["rank"] == 2 and row["factors"] == [2.0, 3.0] and not report["cells"]


def test_power_oracle_quick(load, tmp_path):
    bench = load("bench_power_oracle")
    out = tmp_path / "oracle.json"
    report = bench.main(["--reps", "200", "--null-draws", "2000", "--factors", "0.5", "4",
                         "--dof", "5", "--output", str(out)])
    assert json.loads(out.read_text())["rows"] == report["rows"]
    exact = {(r["factor"], r["cut"]): r["exact"] for r in report["rows"]}
    assert len(exact) == 2 * 5
    # Below the phase transition no cut finds the four directions; far above every one does.
    assert all(v == 0 for (f, _), v in exact.items() if f == 0.5)
    assert all(v >= 0.95 for (f, _), v in exact.items() if f == 4)


def test_information_criteria_on_a_clear_task(load):
    bench = load("bench_recovery_accuracy")
    cell = dict(bench.BASE, name="clear", snr=4.0, rho_x=0.0, rho_e=0.0, reps=1)
    X, Y, _, _ = bench.draw_task(cell, seed=0)
    ranks = bench.information_criterion_ranks(X, Y)
    assert ranks["bic"] == 3 and ranks["aic"] >= 3
    ranks = bench.estimate_ranks(X, Y, np.eye(cell["q"]))
    assert ranks["threshold"] == 3 and not ranks["_failed"]
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
    # CPU and wall time, the floor timed during the accumulation and after the solve.
    assert r["cpu_seconds"] > 0 and r["floor_during_cpu_seconds"] > 0
    assert r["floor_after_cpu_seconds"] > 0
    low, high = r["ratio_range"]
    assert low <= r["ratio_to_floor"] <= high
    assert json.loads(out.read_text())["runs"][0]["n_features"] == 8
    assert (tmp_path / "docs" / "attention_scale.csv").is_file()


def _skip_without_commit(commit):
    """Skip where this is no git checkout holding ``commit`` (a benchmark's baseline)."""
    known = shutil.which("git") and subprocess.run(
        ["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=BENCHMARKS.parent,
        capture_output=True).returncode == 0
    if not known:
        pytest.skip(f"not a git checkout holding the baseline commit {commit}")


def test_rotation_speed_quick(load):
    bench = load("bench_rotation_speed")
    _skip_without_commit(bench.BASELINE)
    report = bench.main(["--quick"])
    (row,) = report["rows"]
    # Both versions took the rotation path, as many steps each, and read the same ranks.
    assert row["fits"] == 2 and row["laws"][0] == row["laws"][1] > 0
    assert row["same_rank"] == row["same_interval"] == 2
    assert report["ratio"] > 0


def test_influence_speed_quick(load):
    bench = load("bench_influence_speed")
    _skip_without_commit(bench.BASELINE)
    report = bench.main(["--quick"])
    (row,) = report["rows"]
    # The noise that follows an input sent the fit to the influence check; both versions
    # read the same rank.
    assert row["fits"] == row["checked"] == 1 and row["same_rank"] == 1
    assert report["ratio"] > 0


def test_cli_startup_quick(load):
    bench = load("bench_cli_startup")
    report = bench.main(["--repeats", "1"])
    assert report["baseline_s"] > 0
    assert report["ratios"] and all(np.isfinite(r) and r > 0 for r in report["ratios"].values())


def test_attention_patterns_quick(load):
    bench = load("bench_attention_patterns")
    rows = bench.table_row(1)
    by_reading = {(row["value"], row["reading"].split()[0]): row["ranks"] for row in rows}
    assert by_reading[("identity", "weights")] == [3] and by_reading[(None, "weights")] == [3]
    assert by_reading[("identity", "mask='causal'")][0] > 3  # the average is another model
    summary = bench.grid(1, quick=True)
    assert summary["tasks"] == 12 and summary["exact"] == 1.0
    assert summary["solver_difference"] < 1e-8


def test_lack_of_fit_quick(load):
    bench = load("bench_lack_of_fit")
    report = bench.main(["--quick", "--draws", "2", "--repeats", "1"])
    assert len(report["table"]) == 14 and all(row["ok"] for row in report["table"])
    for value in ("identity", None):  # the kernel's reading and the per-token one
        rows = [row for row in report["table"] if row["value"] == value]
        misfits = [row for row in rows if row["kind"] == "misfit"]
        assert [row["better"] for row in misfits[1:]] == [{"linear-1/n": 2}] * 2
        assert all(row["warned"] == 0 for row in rows if row["kind"] == "planted")
    # Linear data read as softmax: the kernel's reading warns; the per-token one is right.
    known, per_token = (next(row for row in report["table"] if row["value"] == value)
                        for value in ("identity", None))
    assert known["better"] == {"linear": 2} and per_token["ranks"] == [2, 2]
    assert len(report["overhead"]) == 8
    assert all(np.isfinite(row["ratio"]) and row["on_s"] > 0 for row in report["overhead"])
    assert all(0 <= row["check_share"] < np.inf for row in report["overhead"])


def _tiny_llama_with_tokenizer(path=None):
    """A tiny random LLaMA-style causal LM (2 key heads for 4 query heads, rotary, untied
    head) and a word-level tokenizer, saved under ``path`` when given."""
    import torch
    import transformers
    from conftest import word_level_tokenizer

    from sklearn_ebound.heads import HELD_OUT_MODULES, docstring_sentences

    texts = docstring_sentences(["json", "textwrap"])[:12] + docstring_sentences(
        HELD_OUT_MODULES)[:6]
    tokenizer = word_level_tokenizer(texts)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)).eval()
    if path is not None:
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
    return model, tokenizer, texts


def test_decoder_peers_cut_what_they_say(load):
    # Palu cuts each key head to rank r and leaves the queries; the kernel truncations map
    # each query head to rank r and leave the keys; at the full rank all three are the model.
    pytest.importorskip("transformers")
    import torch

    from sklearn_ebound.heads._head_forms import augmented_weights, layers_of

    peers = load("_decoder_peers")
    model, tokenizer, texts = _tiny_llama_with_tokenizer()
    stats = peers.activation_statistics(model, texts[:8], tokenizer)
    for s in stats.values():
        assert np.all(s["mean_abs"] >= 0) and np.isclose(s["moment"][-1, -1], 1.0)
        assert np.linalg.eigvalsh(s["moment"]).min() > -1e-8
    ids = tokenizer(texts[8], return_tensors="pt")
    with torch.no_grad():
        reference = model(**ids).logits
    before = model.state_dict()
    for name, peer in peers.PEERS.items():
        cut = peer(model, 3, stats)
        changed = {k for k, v in cut.state_dict().items() if not torch.equal(v, before[k])}
        side = "k_proj.weight" if name.startswith("Palu") else "q_proj.weight"
        assert changed and all(k.endswith(side) for k in changed), (name, changed)
        layers = layers_of(cut)[1]
        for layer in layers:
            wq, wk, _ = augmented_weights(layer)
            for block in (wk if name.startswith("Palu") else wq):
                assert np.linalg.matrix_rank(block, tol=1e-6 * np.abs(block).max()) <= 3
        with torch.no_grad():
            full = peer(model, layers[0].head_dim, stats)(**ids).logits
        np.testing.assert_allclose(full.numpy(), reference.numpy(), atol=2e-4, rtol=1e-4)


def test_decoder_plan_quick(load, tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("matplotlib")
    _tiny_llama_with_tokenizer(tmp_path / "lm")
    bench = load("bench_decoder_plan")
    out = bench.main(["--model-dir", str(tmp_path / "lm"), "--n-texts", "8",
                      "--n-held-out", "4", "--budgets", "0.5", "--peers",
                      "--plot", str(tmp_path / "frontier.png")])
    plans = {row["plan"] for row in out["rows"]}
    assert plans == {"weight SVD", "ASVD", "Palu (key groups)", "uniform", "greedy", "fisher",
                     "taylor"}
    for row in out["rows"]:
        assert row["perplexity_ratio"] > 0 and row["kl"] >= 0 and len(row["sentence_nll"]) == 4
        assert 0.25 <= row["temperature"] <= 4 and row["perplexity_ratio_matched"] > 0
        if row["plan"] != "uniform":
            for key in ("minus_uniform_90", "minus_uniform_90_matched"):
                lo, hi = row[key]
                assert lo <= hi
    assert (tmp_path / "frontier.png").stat().st_size > 0


def test_fitted_temperature_minimises_the_calibration_loss(load):
    # The fitted temperature is the loss's minimum: no nearby temperature does better, and a
    # model whose logits are scaled by 2 is fitted a temperature twice as large.
    pytest.importorskip("transformers")
    import torch

    model, tokenizer, texts = _tiny_llama_with_tokenizer()
    bench = load("bench_decoder_plan")
    texts = texts[:4]
    t = bench._fitted_temperature(model, texts, tokenizer)
    loss = [sum(bench._sentence_nll(model, texts, tokenizer, t * f)) for f in (0.97, 1, 1.03)]
    assert loss[1] < min(loss[0], loss[2])

    class Scaled(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, **kw):
            out = self.inner(**kw)
            out.logits = 2 * out.logits
            return out

    np.testing.assert_allclose(bench._fitted_temperature(Scaled(model), texts, tokenizer),
                               2 * t, rtol=2e-3)


def test_decoder_plan_held_out_kinds(load):
    # Three kinds of held-out text, none the calibration's, spread over their topics.
    from sklearn_ebound.heads import HELD_OUT_MODULES, docstring_sentences, manual_sentences

    held_out = load("_held_out")
    calibration = docstring_sentences()
    kinds = {kind: held_out.held_out_sentences(kind, calibration) for kind in held_out.KINDS}
    assert all(not set(calibration) & set(held) for held in kinds.values())
    # the held-out modules inherit a docstring or two from the calibration's classes: dropped
    modules = docstring_sentences(HELD_OUT_MODULES)
    assert kinds["modules"] == [s for s in modules if s not in calibration]
    assert len(kinds["modules"]) > 0.99 * len(modules)
    assert kinds["manual"] == manual_sentences()[::4]
    assert kinds["readmes"] and not any(":" in s or "http" in s for s in kinds["readmes"])


def test_encoder_cli_quick(load, tmp_path):
    # The encoder's default command on a random split and with --refit none: a row each, the
    # written models measured on held-out lines of both kinds, the summary per setting.
    transformers = pytest.importorskip("transformers")
    import torch
    from conftest import word_level_tokenizer

    from sklearn_ebound.heads import docstring_sentences

    tokenizer = word_level_tokenizer(docstring_sentences()[:200])
    torch.manual_seed(0)
    model = transformers.BertModel(transformers.BertConfig(
        vocab_size=len(tokenizer), hidden_size=16, num_attention_heads=2, num_hidden_layers=1,
        intermediate_size=16))
    model.save_pretrained(tmp_path / "bert")
    tokenizer.save_pretrained(tmp_path / "bert")
    bench = load("bench_encoder_cli")
    out = bench.main(["--model-dir", str(tmp_path / "bert"), "--splits", "r3", "--n-texts",
                      "8", "--baseline", "none", "--out", str(tmp_path / "enc.json")])
    assert [(r["split"], r["setting"]) for r in out["rows"]] == [("r3", "defaults"),
                                                                 ("r3", "--refit none")]
    for row in out["rows"]:
        assert -1 <= row["held_out_min"] <= row["held_out_mean"] <= 1
        assert -1 <= row["other_min"] <= row["other_mean"] <= 1
        assert row["plan"].startswith("Plan (") and len(row["worst_held_out"]) == 2
    assert out["summary defaults"]["random_splits"] == 1
    assert json.loads((tmp_path / "enc.json").read_text())["n_texts"] == 8


def test_shrinking_peers_keep_what_they_say(load):
    # Palu's latent keys: at the full share the model itself; at a share, Palu's low-rank keys
    # exactly, with the latent (not the keys) in the cache, and one token at a time on the cache
    # what the whole sequence gives. ThinK: whole planes, as many as the share says.
    pytest.importorskip("transformers")
    import torch

    peers = load("_decoder_peers")
    model, tokenizer, texts = _tiny_llama_with_tokenizer()
    stats = peers.activation_statistics(model, texts[:8], tokenizer)
    ids = tokenizer(" ".join(texts[8:]), return_tensors="pt")["input_ids"][:, :24]
    with torch.no_grad():
        reference = model(ids).logits
        full = peers.palu_latent(model, 1.0, stats)(ids).logits
        np.testing.assert_allclose(full.numpy(), reference.numpy(), atol=2e-6)
        half = peers.palu_latent(model, 0.5, stats)
        assert half.latent_key_widths == [8, 8]  # 2 key heads x 4 of d_h = 8 channels
        whole = half(ids).logits
        np.testing.assert_allclose(whole.numpy(), peers.palu(model, 4, stats)(ids).logits.numpy(),
                                   atol=2e-6)
        out = half(ids[:, :16], use_cache=True)
        cache, steps = out.past_key_values, [out.logits]
        for t in range(16, 24):
            steps.append(half(ids[:, t:t + 1], cache=cache, use_cache=True).logits)
        assert cache.layers[0].keys.shape == (1, 1, 24, 8)
        np.testing.assert_allclose(torch.cat(steps, 1).numpy(), whole.numpy(), atol=2e-6)
    for share, n_planes in ((0.5, 8), (0.25, 4)):  # of 2 layers x 2 key heads x 4 planes
        planes = peers.think_planes(model, share, texts[:8], tokenizer)
        kept = [p for heads in planes.values() for p in heads]
        assert sum(map(len, kept)) == n_planes and all(len(p) in (1, 2) for p in kept)
        assert all(0 <= f < 4 for p in kept for f in p)
    with pytest.raises(ValueError, match="LLaMA-style"):
        peers.palu_latent(_tiny_gpt2(), 0.5, stats)


def _tiny_gpt2():
    import transformers

    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=30, n_embd=16, n_layer=1, n_head=2))


def test_savings_scores_are_the_packages(load):
    # The benchmark scores one sentence at a time as the package's perplexity and KL do with
    # batch_size=1 (it needs its own: theirs do not take Palu's latent attention).
    pytest.importorskip("transformers")
    from sklearn_ebound.heads import next_token_kl, perplexity
    from sklearn_ebound.heads._shrink import kept_channels, zero_dropped

    bench = load("bench_savings")
    model, tokenizer, texts = _tiny_llama_with_tokenizer()
    cut = zero_dropped(model, kept_channels(model, planes={0: [[0], [1, 2]], 1: [[3], [0]]}))
    ours = bench.held_out_scores(model, cut, texts[12:], tokenizer)
    assert bench.held_out_scores(model, model, texts[12:], tokenizer) == {
        "perplexity": pytest.approx(perplexity(model, texts[12:], tokenizer, batch_size=1))}
    assert ours["perplexity"] == pytest.approx(perplexity(cut, texts[12:], tokenizer,
                                                          batch_size=1))
    theirs = next_token_kl(model, cut, texts[12:], tokenizer, batch_size=1)
    assert ours["mean_kl"] == pytest.approx(theirs.mean_kl) and ours["mean_kl"] > 0
    assert ours["max_kl"] == pytest.approx(theirs.max_kl)


def test_savings_quick(load, tmp_path):
    # One run measures the original, the shrunk form and both peers at each budget: every
    # ratio positive, the key cache and the query-key parameters smaller (but for the latent
    # keys, per key head or shared, which keep the projections whole and add their maps), the
    # values kept, the peers at the package's key cache.
    pytest.importorskip("transformers")
    pytest.importorskip("matplotlib")
    bench = load("bench_savings")
    report = bench.main(["--quick", "--out", str(tmp_path / "savings.json"),
                         "--plot", str(tmp_path / "savings.png")])
    saved = json.loads((tmp_path / "savings.json").read_text())
    assert saved["threads"] == 1 and saved["context"] == 64 and saved["new_tokens"] == 4
    assert (tmp_path / "savings.png").read_bytes().startswith(b"\x89PNG")
    base = report["original"]
    for key in ("qk_parameters", "key_cache_bytes", "value_cache_bytes", "perplexity",
                "prefill_tokens_per_s", "decode_tokens_per_s"):
        assert np.isfinite(base[key]) and base[key] > 0, key
    assert {(r["budget"], r["method"]) for r in report["rows"]} == {
        (b, m) for b in (0.5, 0.3) for m in bench.METHODS}
    for row in report["rows"]:
        for key in ("qk_parameter_ratio", "key_cache_ratio", "prefill_ratio", "decode_ratio",
                    "perplexity_ratio"):
            assert np.isfinite(row[key]) and row[key] > 0, (row["method"], key)
        assert row["key_cache_bytes"] < base["key_cache_bytes"]
        if row["method"] in (bench.LATENT, bench.SHARED):
            assert row["qk_parameters"] > base["qk_parameters"]
        else:
            assert row["qk_parameters"] < base["qk_parameters"]
        assert row["value_cache_ratio"] == 1.0 and row["mean_kl"] >= 0
        assert len(row["decode_seconds"]) == 2
    for budget in (0.5, 0.3):
        caches = {r["key_cache_bytes"] for r in report["rows"] if r["budget"] == budget}
        assert len(caches) == 1 and caches.pop() <= budget * base["key_cache_bytes"]
    assert saved["rows"][0]["method"] == bench.PACKAGE and "targets" not in saved
