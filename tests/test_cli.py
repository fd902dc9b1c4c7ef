"""The ``ebound`` command line: every command, and every error path with its message."""

import json
import subprocess
import sys

import numpy as np
import pytest

from sklearn_ebound.cli import CLIError, build_parser, main
from sklearn_ebound.datasets import make_attention_task, make_static_task


def test_demo_reaches_the_planted_rank(tmp_path, capsys):
    code = main(["demo", "--n-samples", "256", "--n-tokens", "16", "--n-features", "4",
                 "--max-epochs", "100", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "Verdict: r* = 2" in out and "agree with the planted rank 2" in out
    result = json.loads((tmp_path / "demo.json").read_text())
    assert result["data_only_rank"] == result["knee"] == result["gradient_descent_rank"] == 2
    assert result["naive_static_rank"] != 2
    assert (tmp_path / "deficiency_curve.png").stat().st_size > 1000


@pytest.fixture
def data_dir(tmp_path):
    X, Y = make_static_task(400, 6, rank=2, noise=0.1, random_state=0)
    np.savez(tmp_path / "d.npz", X=X, Y=Y)
    np.savez(tmp_path / "named.npz", inputs=X, outputs=Y)
    np.save(tmp_path / "x.npy", X)
    np.save(tmp_path / "y.npy", Y)
    header = ",".join(f"c{i}" for i in range(12))
    np.savetxt(tmp_path / "d.csv", np.hstack([X, Y]), delimiter=",", header=header, comments="")
    Xs, Ys = make_attention_task("linear", 200, 16, 4, rank=1, noise=0.05, random_state=0)
    np.savez(tmp_path / "seq.npz", X=Xs, Y=Ys)
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    np.savez(tmp_path / "nan.npz", X=np.full((10, 3), np.nan), Y=np.ones((10, 2)))
    np.savez(tmp_path / "strings.npz", X=np.array([["a", "b"]] * 5), Y=np.ones((5, 1)))
    (tmp_path / "junk.npz").write_text("not an archive")
    (tmp_path / "d.txt").write_text("1,2")
    return tmp_path


@pytest.mark.parametrize("args", [
    ["d.npz"],
    ["x.npy", "--targets", "y.npy"],
    ["d.csv", "--n-targets", "6"],
    ["named.npz", "--x-name", "inputs", "--y-name", "outputs"],
])
def test_estimate_reads_every_format(data_dir, capsys, args):
    args = [str(data_dir / args[0])] + [str(data_dir / a) if a.endswith(".npy") else a
                                        for a in args[1:]]
    assert main(["estimate", *args, "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["rank"] == 2


def test_estimate_streams_npy_in_chunks(data_dir, capsys):
    # 7-row chunks of the memory-mapped files give the in-memory answer.
    args = [str(data_dir / "x.npy"), "--targets", str(data_dir / "y.npy"), "--json"]
    assert main(["estimate", *args, "--chunk-rows", "7"]) == 0
    streamed = json.loads(capsys.readouterr().out)
    assert main(["estimate", str(data_dir / "d.npz"), "--json"]) == 0
    whole = json.loads(capsys.readouterr().out)
    assert streamed["rank"] == whole["rank"] == 2
    np.testing.assert_allclose(streamed["singular_values"], whole["singular_values"], rtol=1e-10)


def test_estimate_passes_the_significance_level(tmp_path, capsys):
    # A direction too weak for the default 0.1% test (0.9 of its edge), above a 30% one's.
    rng = np.random.default_rng(0)
    X, Y = rng.standard_normal((300, 8)), rng.standard_normal((300, 6))
    Y[:, 0] += 0.4 * X[:, 0]
    np.savez(tmp_path / "weak.npz", X=X, Y=Y)
    ranks = []
    for level in ("1e-3", "0.3"):
        assert main(["estimate", str(tmp_path / "weak.npz"), "--significance", level,
                     "--json"]) == 0
        ranks.append(json.loads(capsys.readouterr().out)["rank"])
    assert ranks == [0, 1]


def test_estimate_sequences(data_dir, capsys):
    code = main(["estimate", str(data_dir / "seq.npz"), "--operator", "attention",
                 "--attention", "linear"])
    assert code == 0
    assert "Intrinsic rank r* = 1" in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [
    (["obj.npy"], "without unpickling"),
    (["missing.npz"], "no such file"),
    (["junk.npz"], "not a readable .npz"),
    (["d.txt"], "unsupported file type"),
    (["d.csv"], "--n-targets"),
    (["d.npz", "--x-name", "Z"], "no array named 'Z'"),
    (["nan.npz"], "NaN"),
    (["strings.npz"], "real numeric array"),
    (["seq.npz", "--operator", "attention", "--criterion", "rsc", "--value-identity"],
     "not available with a known value"),
    (["d.npz", "--operator", "attention"], "3-D array"),
    (["d.npz", "--significance", "0.7"], "'significance' parameter"),
])
def test_estimate_errors_are_one_line(data_dir, capsys, args, message):
    code = main(["estimate", str(data_dir / args[0]), *args[1:]])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("ebound: error:") and message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize("argv, message", [
    (["demo", "--rank", "x"], "invalid int value"),
    (["demo", "--n-samples", "0"], "positive integer"),
    (["demo", "--noise", "-1"], "finite number >= 0"),
    (["sweep", "--kind", "quadratic"], "invalid choice"),
    (["frontier", "--logit-scales", "nan"], "finite number"),
    (["unknown"], "invalid choice"),
])
def test_bad_options_exit_2_with_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert message in err and len(err.strip().splitlines()) == 1


def test_bad_planted_rank_is_one_line(tmp_path, capsys):
    code = main(["sweep", "--rank", "20", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("ebound: error:") and "rank" in err


@pytest.mark.parametrize("command", [
    ["sweep", "--n-samples", "600", "--n-features", "6"],
    ["ladder", "--n-samples", "400", "--logit-scales", "0.5", "4"],
    ["frontier", "--n-samples", "100", "--n-tokens", "16", "--repeats", "1",
     "--logit-scales", "0.5"],
])
def test_experiment_commands_write_only_to_out(tmp_path, monkeypatch, capsys, command):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "results"
    assert main([*command, "--out", str(out), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["rows"]
    written = {p.relative_to(tmp_path).parts[0] for p in tmp_path.rglob("*") if p.is_file()}
    assert written == {"results"}


def test_help_fits_one_screen(capsys):
    for command in ["demo", "estimate", "sweep", "ladder", "frontier"]:
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = capsys.readouterr().out
        assert len(text.splitlines()) < 45


def test_sweep_attention_option_and_its_kind_alias(tmp_path, capsys):
    parse = build_parser().parse_args
    assert parse(["sweep"]).attention == "static"
    assert parse(["sweep", "--attention", "softmax"]).attention == "softmax"
    assert parse(["sweep", "--kind", "linear"]).attention == "linear"
    with pytest.raises(SystemExit):
        main(["sweep", "--help"])
    assert "--attention" in capsys.readouterr().out
    assert main(["sweep", "--kind", "static", "--n-samples", "300", "--n-features", "4",
                 "--out", str(tmp_path)]) == 0
    assert "Rank sweep on a planted static task of rank 3" in capsys.readouterr().out


def test_cli_error_is_a_value_error():
    # Code calling a command function directly catches user errors as ValueError.
    assert issubclass(CLIError, ValueError)


def test_help_imports_no_heavy_dependency():
    # Every command module is imported to build the parser; torch, matplotlib and
    # transformers wait until a command runs.
    code = ("import sys; from sklearn_ebound.cli import build_parser; "
            "build_parser().format_help(); "
            "print(sorted({'torch', 'matplotlib', 'transformers'} & set(sys.modules)))")
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                               check=True)
    assert completed.stdout.strip() == "[]"


@pytest.mark.parametrize("module", ["sklearn_ebound", "sklearn_ebound.cli"])
def test_python_dash_m_runs_the_cli(module):
    completed = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True,
                               text=True)
    assert completed.returncode == 0 and "usage: ebound" in completed.stdout
