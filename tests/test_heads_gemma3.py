"""Families by what their attention computes: Gemma 3's and Qwen 3's normalised heads, and refusals.

A tiny random Gemma 3 (sliding and global layers, two rotary bases, a logit scale of its own,
query and key gains far from one) is read as ``gemma3``: the package's head model reproduces
the heads' real outputs, and its ranks and curves are taken on the normalised queries and
keys. A tiny random Qwen 3 (gains that are the norms' weights themselves, query and key
biases, a sliding layer) likewise as ``qwen3``. An attention block with a parameter its
family does not model is refused by name.
"""

import os

import numpy as np
import pytest

from sklearn_ebound.heads import (
    compress_heads,
    docstring_sentences,
    head_deficiency,
    head_ranks,
    plan_ranks,
)
from sklearn_ebound.heads._families import _gemma3, _qwen3
from sklearn_ebound.heads._head_forms import head_model_errors, layers_of

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

TEXTS = docstring_sentences(["json", "textwrap"])[:16]


def _tokenizer(side="right"):
    from conftest import word_level_tokenizer

    tokenizer = word_level_tokenizer(TEXTS)
    tokenizer.padding_side = side
    return tokenizer


def tiny_gemma3(vocab):
    """Three layers (sliding, global, sliding; window 4), 4 query and 2 key heads of 16."""
    torch.manual_seed(0)
    config = transformers.Gemma3TextConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=32, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=24,
        sliding_window=4,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 50.0},
                         "full_attention": {"rope_type": "default", "rope_theta": 5000.0}},
        attn_implementation="eager", tie_word_embeddings=False)
    model = transformers.Gemma3ForCausalLM(config)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(("q_norm.weight", "k_norm.weight")):
                parameter.uniform_(-0.8, 3.0)  # gains 1 + w in (0.2, 4)
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                parameter.mul_(10.0)
    return model.eval()


def tiny_qwen3(vocab):
    """Three layers (full, sliding, sliding; window 4), 4 query and 2 key heads of 16, query
    and key biases."""
    torch.manual_seed(0)
    config = transformers.Qwen3Config(
        vocab_size=vocab, hidden_size=32, intermediate_size=32, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, attention_bias=True,
        use_sliding_window=True, sliding_window=4, max_window_layers=1,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0},
        attn_implementation="eager", tie_word_embeddings=False)
    model = transformers.Qwen3ForCausalLM(config)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(("q_norm.weight", "k_norm.weight")):
                parameter.uniform_(0.2, 4.0)  # the gains themselves
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                parameter.mul_(10.0)
            if name.endswith(("q_proj.bias", "k_proj.bias")):
                parameter.normal_(0.0, 0.5)
    return model.eval()


def tiny_qwen3_moe(vocab):
    """Qwen 3's attention before a mixture of experts: three layers, no window."""
    torch.manual_seed(0)
    config = transformers.Qwen3MoeConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=32, moe_intermediate_size=16,
        num_experts=4, num_experts_per_tok=2, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, attn_implementation="eager",
        tie_word_embeddings=False)
    model = transformers.Qwen3MoeForCausalLM(config)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(("q_norm.weight", "k_norm.weight")):
                parameter.uniform_(0.2, 4.0)
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                parameter.mul_(10.0)
    return model.eval()


TINY = {"gemma3": (tiny_gemma3, _gemma3.Gemma3Family, 1.0),
        "qwen3": (tiny_qwen3, _qwen3.Qwen3Family, 0.0),
        "qwen3_moe": (tiny_qwen3_moe, _qwen3.Qwen3Family, 0.0)}


@pytest.fixture(scope="module")
def gemma():
    tokenizer = _tokenizer()
    return tiny_gemma3(len(tokenizer.get_vocab())), tokenizer


@pytest.fixture(scope="module", params=list(TINY))
def normalised(request):
    """``(name, model, tokenizer)`` of each family with normalised heads."""
    tokenizer = _tokenizer()
    return request.param, TINY[request.param][0](len(tokenizer.get_vocab())), tokenizer


def test_gemma3_is_read_with_its_norms_scale_windows_and_bases(gemma):
    model, _ = gemma
    family, layers, _ = layers_of(model)
    assert family.name == "gemma3" and family.rotary
    assert [layer.window for layer in layers] == [4, None, 4]
    assert [layer.rope_theta for layer in layers] == [50.0, 5000.0, 50.0]
    for layer in layers:
        attention = model.model.layers[layer.index].self_attn
        np.testing.assert_allclose(layer.scale, 24 ** -0.5)
        np.testing.assert_allclose(layer.q_gain[2], 1 + attention.q_norm.weight.detach())
        np.testing.assert_allclose(layer.k_gain[1], 1 + attention.k_norm.weight.detach())
        assert layer.normalised and layer.q_gain.shape == (4, 16)


def test_qwen3_is_read_with_its_norms_and_windows():
    model = tiny_qwen3(len(_tokenizer().get_vocab()))
    family, layers, _ = layers_of(model)
    assert family.name == "qwen3" and family.rotary
    assert [layer.window for layer in layers] == [None, 4, 4]
    for layer in layers:
        attention = model.model.layers[layer.index].self_attn
        np.testing.assert_allclose(layer.scale, 16 ** -0.5)
        np.testing.assert_allclose(layer.q_gain[2], attention.q_norm.weight.detach())
        np.testing.assert_allclose(layer.k_gain[1], attention.k_norm.weight.detach())
        assert layer.normalised and layer.b_q is not None


@pytest.mark.parametrize("side", ["right", "left"])
def test_the_head_model_matches_the_real_head_outputs(normalised, side):
    name, model, _ = normalised
    errors, family = head_model_errors(model, TEXTS, _tokenizer(side))
    assert family.name == name.removesuffix("_moe") and errors.shape == (3, 4)
    assert errors.max() < 2e-6  # a float32 model against the head model in float64


@pytest.mark.parametrize(("name", "setting"), [
    ("gemma3", "window"), ("gemma3", "logit_scale"), ("gemma3", "gains"),
    ("gemma3", "gain_offset"), ("qwen3", "window"), ("qwen3", "gains"),
    ("qwen3", "gain_offset")])  # (Qwen 3's logit scale is LLaMA's 1 / sqrt(d_h))
def test_each_part_of_what_the_normalised_heads_compute_matters(name, setting, monkeypatch):
    # Leaving out the windows, the scale or the gains (the query read as LLaMA reads it), or
    # reading the gains as the other family's, misses the heads' outputs: the test above
    # could fail.
    tokenizer = _tokenizer()
    make, adapter, offset = TINY[name]
    model = make(len(tokenizer.get_vocab()))
    if setting == "gains":
        read = adapter.read

        def ungained(self, *args, **kwargs):
            layer = read(self, *args, **kwargs)
            layer.q_gain = layer.k_gain = None
            return layer

        monkeypatch.setattr(adapter, "read", ungained)
    elif setting == "gain_offset":
        monkeypatch.setattr(adapter, "gain_offset", 1.0 - offset)
    else:
        settings = adapter.layer_settings

        def without(self, config, i):
            return {**settings(self, config, i), setting: None}

        monkeypatch.setattr(adapter, "layer_settings", without)
    errors, _ = head_model_errors(model, TEXTS, tokenizer)
    assert errors.max() > 1e-2


def test_ranks_and_curves_are_taken_on_the_normalised_heads(gemma):
    model, tokenizer = gemma
    ranks = head_ranks(model, inputs=TEXTS, tokenizer=tokenizer, taus=(0.9,))
    assert ranks.naming == "gemma3" and ranks.rotary
    layer = layers_of(model)[1][0]
    attention = model.model.layers[0].self_attn
    w_q = attention.q_proj.weight.detach().double().reshape(4, 16, 32)
    w_k = attention.k_proj.weight.detach().double().reshape(2, 16, 32)
    g_q, g_k = 1 + attention.q_norm.weight.double(), 1 + attention.k_norm.weight.double()
    kernel = (w_q[1].T * g_q) @ (w_k[layer.kv_index[1]].T * g_k).T  # the kernel with its gains
    expected = torch.linalg.svdvals(kernel)[:16].detach().numpy()
    np.testing.assert_allclose(ranks.kernel_spectra[0, 1], expected, rtol=1e-8)
    assert np.all(np.isfinite(ranks.field_spectra))

    result = head_deficiency(model, TEXTS, tokenizer=tokenizer, methods=("weight", "data"))
    for method in ("weight", "data"):
        curves = result.curves(method)
        assert curves.shape == (3, 4, 17)
        assert curves[..., -1].max() < 1e-10  # the full form is the head itself
        assert curves[..., 0].min() > 1e-3 and np.all(np.isfinite(curves))


@pytest.mark.parametrize("name", ["gemma3", "qwen3"])  # (the experts take no float64)
def test_the_taylor_terms_are_taken_on_the_normalised_queries(name):
    # The query gradients are read at q_norm's output: summed over the tokens, the trace of
    # ``q^T dL/dq`` of the normalised queries is the derivative of the summed loss along a
    # common scaling of the layer's query gains, ``d/dt L(gains (1 + t))`` at 0.
    import copy

    from sklearn_ebound.heads import head_sensitivity

    tokenizer = _tokenizer()
    make, _, offset = TINY[name]  # gain = offset + weight
    model = make(len(tokenizer.get_vocab()))
    model = copy.deepcopy(model).double()  # one text per batch: no padding in float64

    def sensitivity():
        return head_sensitivity(model, TEXTS, tokenizer=tokenizer, labels="data",
                                batch_size=1)

    sens = sensitivity()
    M = (sens.query_gradient * sens.half_tokens[:, None, None, None, None]).sum(0)
    trace = np.trace(M, axis1=-2, axis2=-1).sum(-1)  # per layer, summed over tokens
    norm = model.model.layers[1].self_attn.q_norm
    saved = norm.weight.detach().clone()
    losses = []
    for t in (-1e-3, 1e-3):
        with torch.no_grad():
            norm.weight.copy_((offset + saved) * (1 + t) - offset)
        losses.append(sensitivity().loss)  # mean over the predicted tokens
    n_predicted = sens.n_tokens - len(TEXTS)
    slope = (losses[1] - losses[0]) / 2e-3 * n_predicted
    assert abs(trace[1]) > 1e-2
    np.testing.assert_allclose(slope, trace[1], rtol=1e-3)


def test_writing_a_normalised_head_into_its_query_projection_is_refused(gemma):
    model, tokenizer = gemma
    result = head_deficiency(model, TEXTS, tokenizer=tokenizer, methods=("data",), layers=[0])
    plan = plan_ranks(result, budget=0.5, method="data")
    with pytest.raises(ValueError, match="before that normalisation"):
        compress_heads(model, result, plan, method="data")


# --- refusals ---------------------------------------------------------------------------


def tiny_llama():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=40, hidden_size=32, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=32,
                                      num_hidden_layers=2)
    return transformers.LlamaForCausalLM(config).eval()


def test_a_gemma3_state_dict_without_its_config_is_not_read_as_llama(gemma):
    model, _ = gemma
    with pytest.raises(ValueError, match=r"not as 'llama'.*q_norm\.weight") as info:
        head_ranks(model.state_dict(), n_heads=4, n_kv_heads=2)
    assert "k_norm.weight" in str(info.value) and "not as 'gemma3'" in str(info.value)
    with pytest.raises(ValueError, match=r"k_norm\.weight, q_norm\.weight"):
        head_ranks(model, naming="llama")


def test_unknown_attention_parameters_are_refused_by_name():
    state = dict(tiny_llama().state_dict())
    state["model.layers.1.self_attn.q_norm.weight"] = torch.ones(8)
    state["model.layers.0.self_attn.gate.weight"] = torch.ones(8)
    with pytest.raises(ValueError, match=r"parameters it does not model: gate\.weight, "
                                         r"q_norm\.weight \(in `model\.layers\.0\.self_attn\.` "
                                         r"and 1 more blocks\)"):
        head_ranks(state, n_heads=4, n_kv_heads=2)
    model = tiny_llama()
    model.model.layers[0].self_attn.register_parameter(
        "temperature", torch.nn.Parameter(torch.ones(1)))
    with pytest.raises(ValueError, match=r"not as 'llama'.*temperature"):
        layers_of(model)
    assert head_ranks(tiny_llama()).naming == "llama"  # the plain model is still read


def test_a_config_that_changes_the_logits_is_refused():
    # Gemma 2: LLaMA's parameter names, its logits scaled by query_pre_attn_scalar and capped.
    config = transformers.Gemma2Config(vocab_size=40, hidden_size=32, num_attention_heads=4,
                                       num_key_value_heads=2, intermediate_size=32,
                                       num_hidden_layers=2, head_dim=8)
    model = transformers.Gemma2ForCausalLM(config)
    with pytest.raises(ValueError, match=r"not as 'llama'.*query_pre_attn_scalar"):
        layers_of(model)


@pytest.mark.parametrize(("name", "setting"), [
    ("StableLm", r"partial_rotary_factor=0\.25"), ("Granite", "attention_multiplier"),
    ("Cohere", "model_type 'cohere' rotates adjacent channel pairs")])
def test_llama_named_blocks_that_compute_other_logits_are_refused(name, setting):
    # LLaMA's parameter names on attention that rotates a quarter of each head (StableLM),
    # scales the logits by a multiplier of its own (Granite) or rotates adjacent channels
    # (Cohere): never read as LLaMA's
    config = getattr(transformers, f"{name}Config")(
        vocab_size=40, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=32, num_hidden_layers=2)
    model = getattr(transformers, f"{name}ForCausalLM")(config)
    with pytest.raises(ValueError, match=rf"not as 'llama'.*{setting}"):
        layers_of(model)


def test_the_head_model_benchmark_runs_on_a_saved_model(gemma, tmp_path, monkeypatch):
    from pathlib import Path

    benchmarks = Path(__file__).resolve().parent.parent / "benchmarks"
    monkeypatch.syspath_prepend(str(benchmarks))  # the script imports its sibling _held_out
    import importlib.util

    spec = importlib.util.spec_from_file_location("_bench_gemma_head_model",
                                                  benchmarks / "bench_gemma_head_model.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    model, tokenizer = gemma
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    for dtype in ("float64", "float32"):
        out = bench.main([str(tmp_path), "--n-lines", "4", "--dtype", dtype])
        assert out["family"] == "gemma3" and out["n_lines"] == 4
        assert out["max"] < 2e-6 and np.array(out["errors"]).shape == (3, 4)
