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
    # The empty bound column is left out of the printed table and said so; excess_risk is
    # explained. The JSON keeps every column.
    header = next(line for line in out.splitlines() if line.lstrip().startswith("rank "))
    assert "excess_risk" in header and "bound" not in header
    assert "excess_risk = held-out risk minus the noise floor" in out
    assert "bound (the tail energy T(r)) is left out" in out
    result = json.loads((tmp_path / "demo.json").read_text())
    assert result["data_only_rank"] == result["knee"] == result["gradient_descent_rank"] == 2
    assert result["naive_static_rank"] != 2
    assert "bound" in result["sweep"]["columns"]
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


def test_estimate_csv_without_n_targets_reads_the_rank_of_x_as_other_formats_do(data_dir,
                                                                               capsys):
    # No target columns named: every column is X, as an .npy without --targets.
    table = np.loadtxt(data_dir / "d.csv", delimiter=",", skiprows=1)
    np.save(data_dir / "all.npy", table)
    assert main(["estimate", str(data_dir / "d.csv"), "--json"]) == 0
    from_csv = json.loads(capsys.readouterr().out)
    assert main(["estimate", str(data_dir / "all.npy"), "--json"]) == 0
    from_npy = json.loads(capsys.readouterr().out)
    assert from_csv["rank"] == from_npy["rank"]
    np.testing.assert_allclose(from_csv["singular_values"], from_npy["singular_values"],
                               rtol=1e-10)
    assert main(["estimate", str(data_dir / "d.csv")]) == 0
    assert "Rank of X alone" in capsys.readouterr().out


def test_estimate_help_says_what_a_file_without_targets_reads(capsys):
    with pytest.raises(SystemExit):
        main(["estimate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "Without targets it reads the rank of X alone" in text
    assert "the last K columns are targets (default: none: the rank of X)" in text


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


def test_estimate_says_how_sure_the_rank_is(data_dir, capsys):
    assert main(["estimate", str(data_dir / "d.npz"), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    low, high = payload["rank_interval"]
    assert low == payload["rank"] == 2 <= high
    assert all(p <= 1e-3 for p in payload["p_values"][:2]) and payload["p_values"][2] > 1e-3
    assert payload["detection_limit"] > 0
    assert payload["noise_model"] == "gaussian" and payload["failed_assumptions"] == []
    assert main(["estimate", str(data_dir / "d.npz")]) == 0
    out = capsys.readouterr().out
    assert ("Ranks consistent with the data among directions at least 2 times the detection "
            f"limit (significance 0.001): {low if low == high else f'{low}..{high}'}\n") in out
    assert "Detection limit: " in out and "Noise model: gaussian" in out


def test_estimate_sequences(data_dir, capsys):
    code = main(["estimate", str(data_dir / "seq.npz"), "--operator", "attention",
                 "--attention", "linear"])
    assert code == 0
    assert "Intrinsic rank r* = 1" in capsys.readouterr().out


@pytest.fixture(scope="module")
def planted_attention(tmp_path_factory):
    """The README's planted softmax-attention task of rank 2, as .npz and as two .npy."""
    X, Y = make_attention_task("softmax", 512, 32, 6, rank=2, value="random", random_state=0)
    path = tmp_path_factory.mktemp("attention")
    np.savez(path / "task.npz", X=X, Y=Y)
    np.save(path / "x.npy", X)
    np.save(path / "y.npy", Y)
    return path


def test_estimate_reads_sequences_attention_natively_by_default(planted_attention, capsys):
    # Without options: the attention-native rank, the naive static reading beside it.
    assert main(["estimate", str(planted_attention / "task.npz")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Intrinsic rank r* = 2  (attention-native")
    assert "Naive static token-mixing rank: 1 of 32 (the naive static transfer" in out
    assert main(["estimate", str(planted_attention / "task.npz"), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["rank"] == 2 and payload["operator"] == "attention"
    assert payload["naive_static_rank"] == 1


def test_estimate_streams_sequences_with_the_naive_reading(planted_attention, capsys):
    # Memory-mapped sequences in chunks: both readings from the one pass, as in memory.
    assert main(["estimate", str(planted_attention / "x.npy"), "--targets",
                 str(planted_attention / "y.npy"), "--chunk-rows", "100", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert (payload["rank"], payload["naive_static_rank"]) == (2, 1)


@pytest.mark.parametrize("operator, rank, label", [
    ("auto", 2, "attention-native"),
    ("attention", 2, "attention-native"),
    ("static", 1, "naive static transfer"),
])
def test_estimate_operator_is_passed_through(planted_attention, capsys, operator, rank, label):
    assert build_parser().parse_args(["estimate", "d.npz"]).operator == "auto"
    assert main(["estimate", str(planted_attention / "task.npz"), "--operator", operator]) == 0
    out = capsys.readouterr().out
    assert f"= {rank}  (" in out.splitlines()[0] and label in out


def test_estimate_without_targets_says_it_reads_x_alone(data_dir, capsys):
    assert main(["estimate", str(data_dir / "x.npy")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Rank of X alone r* = ")
    assert "No targets given: this is the rank of X alone" in out
    assert main(["estimate", str(data_dir / "x.npy"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["targets"] is False


def test_estimate_out_writes_json_and_spectrum(data_dir, tmp_path, capsys):
    out = tmp_path / "est"
    assert main(["estimate", str(data_dir / "d.npz"), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    result = json.loads((out / "estimate.json").read_text())
    assert result["rank"] == 2 and result["files"][0] == str(out / "estimate.json")
    assert f"Wrote {out / 'estimate.json'}" in text
    if pytest.importorskip("matplotlib"):
        assert (out / "spectrum.png").stat().st_size > 1000
        assert str(out / "spectrum.png") in text


def test_estimate_without_out_writes_nothing(data_dir, monkeypatch, capsys):
    monkeypatch.chdir(data_dir)
    before = sorted(data_dir.rglob("*"))
    assert main(["estimate", str(data_dir / "d.npz")]) == 0
    assert "Wrote" not in capsys.readouterr().out
    assert sorted(data_dir.rglob("*")) == before


@pytest.mark.parametrize("args, message", [
    (["obj.npy"], "without unpickling"),
    (["missing.npz"], "no such file"),
    (["junk.npz"], "not a readable .npz"),
    (["d.txt"], "unsupported file type"),
    (["d.csv", "--n-targets", "12"], "less than the 12 columns"),
    (["d.csv", "--n-targets", "12"], "Got 12"),
    (["d.csv", "--n-targets", "-1"], "Got -1"),
    (["x.npy", "--targets", "seq.npz"], "not a readable .npy"),
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


def test_help_fits_one_screen(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    for command in ["demo", "estimate", "sweep", "ladder", "frontier", "heads"]:
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = capsys.readouterr().out
        assert len(text.splitlines()) < 45
        assert "%%" not in text  # help text escaped once, not twice


def _command_parsers():
    """``{command: parser}`` of every ``ebound`` command (argparse lists them nowhere public)."""
    subparsers = next(a for a in build_parser()._actions if a.choices)
    return subparsers.choices


@pytest.mark.parametrize("command", ["demo", "estimate", "sweep", "ladder", "frontier", "heads"])
def test_every_option_has_help_that_says_its_default(command):
    for action in _command_parsers()[command]._actions:
        if not action.option_strings or action.dest == "help" or action.help == "==SUPPRESS==":
            continue  # the positional arguments, -h and the hidden alias --kind
        assert action.help, action.option_strings
        if action.nargs != 0:  # options with a value; flags are off unless given
            text = action.help % {"default": action.default}
            assert "(default: " in text or "(no default)" in text, (action.option_strings, text)


def test_heads_help_quotes_percents_once(capsys):
    with pytest.raises(SystemExit):
        main(["heads", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "90% and 99%" in text


def test_ladder_table_fits_100_columns(tmp_path, capsys):
    assert main(["ladder", "--n-samples", "400", "--logit-scales", "0.5", "4",
                 "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    report = [line for line in out.splitlines() if not line.startswith("Wrote ")]
    assert max(len(line) for line in report) <= 100
    assert "r_static" in out and "r_attn" in out and "beta: logit scale" in out
    # The JSON and CSV keep every column under its full name, with every digit.
    table = json.loads((tmp_path / "ladder.json").read_text())
    assert {"static_estimate", "attention_estimate", "static_excess_risk",
            "static_relative_excess", "static_recovers", "mixing"} <= set(table["columns"])
    assert (tmp_path / "ladder.csv").read_text().splitlines()[0].split(",") == table["columns"]


def test_sweep_explains_its_columns(tmp_path, capsys):
    assert main(["sweep", "--n-samples", "300", "--n-features", "4",
                 "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "bound = T(r), the true spectrum's tail energy" in out and "make it < 0" in out


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


@pytest.mark.parametrize("module", ["sklearn_ebound", "sklearn_ebound.cli"])
def test_python_dash_m_runs_the_cli(module):
    completed = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True,
                               text=True)
    assert completed.returncode == 0 and "usage: ebound" in completed.stdout


@pytest.fixture(scope="module")
def grouped_dir(tmp_path_factory):
    """A planted rank-2 task whose noise is shared within 40 interleaved groups of 10 rows
    (subjects measured ten times, in no particular order), in every format ``--groups`` reads."""
    path = tmp_path_factory.mktemp("grouped")
    rng = np.random.default_rng(0)
    X, Y = make_static_task(400, 6, 8, rank=2, noise=0.3, random_state=0)
    groups = rng.permutation(np.repeat(np.arange(40), 10))
    Y = Y + 1.5 * rng.standard_normal((40, 8))[groups]
    np.savez(path / "d.npz", X=X, Y=Y, subject=groups)
    np.save(path / "x.npy", X)
    np.save(path / "y.npy", Y)
    np.save(path / "g.npy", groups)
    np.save(path / "g2d.npy", np.stack([groups, groups], axis=1))
    np.save(path / "short.npy", groups[:10])
    names = [f"x{i}" for i in range(6)] + ["subject"] + [f"y{i}" for i in range(8)]
    np.savetxt(path / "d.csv", np.column_stack([X, groups, Y]), delimiter=",",
               header=",".join(names), comments="")
    (path / "g.csv").write_text("subject\n" + "\n".join(f"s{g}" for g in groups) + "\n")
    return path


@pytest.mark.parametrize("args", [
    ["d.npz", "--groups", "subject"],
    ["d.npz", "--groups", "g.npy"],
    ["d.npz", "--groups", "g.csv"],
    ["d.csv", "--n-targets", "8", "--groups", "subject"],
    ["x.npy", "--targets", "y.npy", "--groups", "g.npy", "--chunk-rows", "64"],
])
def test_estimate_groups_from_every_source(grouped_dir, capsys, args):
    # The dependence within the groups is tested and the rank read by resampling whole
    # groups, from a file, an .npz array or a CSV column (left out of the inputs), in memory
    # or streamed in chunks.
    args = [str(grouped_dir / args[0])] + [str(grouped_dir / a) if a.endswith((".npy", ".csv"))
                                           else a for a in args[1:]]
    assert main(["estimate", *args, "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["shape_X"] == [400, 6] and payload["n_groups"] == 40
    assert "group_dependence" in payload["failed_assumptions"]
    assert payload["noise_model"] == "group-bootstrap"
    assert payload["rank"] == 2
    assert main(["estimate", *args]) == 0
    assert "Groups: 40 (--groups " in capsys.readouterr().out


def test_estimate_without_groups_reads_no_group_test(grouped_dir, capsys):
    assert main(["estimate", str(grouped_dir / "d.npz"), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["n_groups"] is None
    assert "group_dependence" not in payload["failed_assumptions"]


@pytest.mark.parametrize("args, message", [
    (["d.npz", "--groups", "short.npy"], "--groups has 10 labels but X has 400 samples"),
    (["d.npz", "--groups", "g2d.npy"], "one number or string per sample"),
    (["d.npz", "--groups", "missing.npy"], "no such file (--groups)"),
    (["d.npz", "--groups", "visit"], "no array named 'visit' for --groups"),
    (["d.csv", "--n-targets", "8", "--groups", "visit"], "no column named 'visit'"),
    (["x.npy", "--targets", "y.npy", "--groups", "subject"], "give a .npy or .csv file"),
])
def test_estimate_groups_errors_are_one_line(grouped_dir, capsys, args, message):
    args = [str(grouped_dir / args[0])] + [str(grouped_dir / a) if a.endswith((".npy", ".csv"))
                                           else a for a in args[1:]]
    code = main(["estimate", *args])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("ebound: error:") and message in err, err
    assert len(err.strip().splitlines()) == 1
