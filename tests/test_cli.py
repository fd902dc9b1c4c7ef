"""The ``ebound`` command line."""

import json

from sklearn_ebound.cli import main


def test_demo_recovers_the_planted_rank(tmp_path, capsys):
    code = main(["demo", "--n-samples", "4000", "--n-features", "10", "--rank", "3",
                 "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0
    assert "Verdict: r* = 3" in out and "agree" in out
    result = json.loads((tmp_path / "demo.json").read_text())
    assert result["data_only_rank"] == result["planted_rank"] == result["knee"] == 3


def test_bad_option_is_a_one_line_error(tmp_path, capsys):
    code = main(["demo", "--n-samples", "10", "--n-features", "4", "--rank", "9",
                 "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("ebound: error:") and "rank" in err
