"""Long deficiency analyses: per-layer reports, finished layers kept, and a rerun resumes."""

import json

import numpy as np
import pytest

from sklearn_ebound.heads import _deficiency, docstring_sentences, head_deficiency

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

TEXTS = [s for s in docstring_sentences(["json", "textwrap"]) if len(s.split()) >= 5][:14]


def _model(kind):
    torch.manual_seed(0)
    if kind == "bert":
        config = transformers.BertConfig(vocab_size=60, hidden_size=16, num_attention_heads=2,
                                         intermediate_size=32, num_hidden_layers=3)
        model = transformers.BertModel(config)
    else:
        config = transformers.LlamaConfig(vocab_size=60, hidden_size=32, num_attention_heads=4,
                                          num_key_value_heads=2, intermediate_size=32,
                                          num_hidden_layers=3, rope_theta=500.0)
        model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():  # attention far from uniform
        for name, parameter in model.named_parameters():
            if name.endswith(("query.weight", "key.weight", "q_proj.weight", "k_proj.weight")):
                parameter.mul_(15.0)
    return model


class _Stop(Exception):
    pass


def _options(kind, word_tokenizer):
    options = dict(tokenizer=word_tokenizer(60), methods=("weight", "data"))
    if kind == "bert":  # trained pairs too: they must survive the round trip
        options.update(methods=("weight", "data", "trained"), train_steps=3,
                       train_at={(0, 0): 2, (1, 1): [1, 3], (2, 0): 5})
    return options


@pytest.fixture
def count_layers(monkeypatch):
    """Record the layers the analysis computes (rather than reads back)."""
    computed = []
    analyse = _deficiency._analyse_layer

    def spy(model, tokenizer, layer, *args, **kwargs):
        computed.append(layer.index)
        return analyse(model, tokenizer, layer, *args, **kwargs)

    monkeypatch.setattr(_deficiency, "_analyse_layer", spy)
    return computed


def _assert_same(a, b):
    for m in ("weight", "data", "trained"):
        np.testing.assert_allclose(a.curves(m), b.curves(m), rtol=1e-12, atol=0)
        np.testing.assert_allclose(a.residual_curves(m, per_text=True),
                                   b.residual_curves(m, per_text=True), rtol=1e-6, atol=0)
    np.testing.assert_allclose(a.output_share, b.output_share, rtol=1e-12)
    assert a.eps_ranks().rows == b.eps_ranks().rows
    assert a.n_trained == b.n_trained and sorted(a._trained) == sorted(b._trained)
    for li in range(a.n_layers):
        for h in a.heads:
            for r in (0, 1, 3, a.head_dim - 2):
                for m in ("weight", "data", "trained"):
                    for x, y in zip(a.factors(li, h, r, m), b.factors(li, h, r, m),
                                    strict=True):
                        np.testing.assert_allclose(x, y, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("kind", ["bert", "llama"])
def test_an_interrupted_analysis_resumes_to_the_same_result(kind, word_tokenizer, tmp_path,
                                                            count_layers):
    model = _model(kind)
    options = _options(kind, word_tokenizer)
    reports = []
    whole = head_deficiency(model, TEXTS, on_layer=reports.append, **options)
    assert [r["layer"] for r in reports] == [0, 1, 2]
    assert [(r["done"], r["total"], r["resumed"]) for r in reports] == [
        (1, 3, False), (2, 3, False), (3, 3, False)]
    assert whole.resumed_layers == [] and count_layers == [0, 1, 2]

    def stop_after_the_first(info):
        if info["done"] == 1:
            raise KeyboardInterrupt

    count_layers.clear()
    with pytest.raises(KeyboardInterrupt):
        head_deficiency(model, TEXTS, checkpoint=tmp_path, on_layer=stop_after_the_first,
                        **options)
    assert count_layers == [0]
    assert sorted(p.name for p in tmp_path.glob("layer_*.npz")) == ["layer_0000.npz"]
    assert not list(tmp_path.glob(".*tmp"))  # written atomically: no partial file left

    count_layers.clear()
    reports.clear()
    resumed = head_deficiency(model, TEXTS, checkpoint=tmp_path, on_layer=reports.append,
                              **options)
    assert count_layers == [1, 2]  # the finished layer is not computed again
    assert resumed.resumed_layers == [0]
    assert [r["resumed"] for r in reports] == [True, False, False]
    _assert_same(resumed, whole)

    count_layers.clear()
    again = head_deficiency(model, TEXTS, checkpoint=tmp_path, **options)
    assert count_layers == [] and again.resumed_layers == [0, 1, 2]
    _assert_same(again, whole)


def test_progress_counts_the_heads_of_kept_layers(word_tokenizer, tmp_path):
    model = _model("bert")
    options = dict(tokenizer=word_tokenizer(60), methods=("data",), checkpoint=tmp_path)
    head_deficiency(model, TEXTS, layers=[1], **options)
    calls = []
    result = head_deficiency(model, TEXTS, progress=lambda d, t: calls.append((d, t)),
                             **options)
    # a subset's layers are reused by the analysis of every layer
    assert result.resumed_layers == [1]
    assert calls == [(1, 6), (2, 6), (4, 6), (5, 6), (6, 6)]


def test_other_arguments_start_over(word_tokenizer, tmp_path, count_layers):
    model = _model("bert")
    options = dict(tokenizer=word_tokenizer(60), methods=("weight", "data"),
                   checkpoint=tmp_path, layers=[0, 1])
    head_deficiency(model, TEXTS, **options)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    count_layers.clear()
    with pytest.warns(UserWarning, match="2 layers of another analysis"):
        other = head_deficiency(model, TEXTS, epsilons=(0.2,), **options)
    assert count_layers == [0, 1] and other.resumed_layers == []
    assert json.loads((tmp_path / "manifest.json").read_text()) != manifest
    count_layers.clear()
    with pytest.warns(UserWarning, match="another analysis"):  # other texts
        head_deficiency(model, TEXTS[1:], epsilons=(0.2,), **options)
    assert count_layers == [0, 1]
    with torch.no_grad():  # another model: one weight changed
        model.encoder.layer[1].output.dense.bias[0] += 1.0
    count_layers.clear()
    with pytest.warns(UserWarning, match="another analysis"):
        head_deficiency(model, TEXTS[1:], epsilons=(0.2,), **options)
    assert count_layers == [0, 1]


def test_checkpoint_errors(word_tokenizer, tmp_path):
    model = _model("bert")
    with pytest.raises(ValueError, match="`checkpoint` needs an integer `random_state`"):
        head_deficiency(model, TEXTS, tokenizer=word_tokenizer(60), methods=("data",),
                        checkpoint=tmp_path, random_state=np.random.default_rng(0))
    with pytest.raises(TypeError, match="`on_layer` must be callable"):
        head_deficiency(model, TEXTS, tokenizer=word_tokenizer(60), on_layer=3)
    # an unreadable layer file is computed again, not trusted
    options = dict(tokenizer=word_tokenizer(60), methods=("data",), checkpoint=tmp_path,
                   layers=[0])
    head_deficiency(model, TEXTS, **options)
    (tmp_path / "layer_0000.npz").write_bytes(b"not a zip file")
    assert head_deficiency(model, TEXTS, **options).resumed_layers == []
