"""Causal LMs loaded as their causal-LM class, and GGUF files read through transformers.

The GGUF file is written here with the ``gguf`` package's writer: a tiny random LLaMA-style
model (grouped-query attention, an untied output head) and a tiny byte-level BPE tokenizer in
its metadata. llama.cpp stores the query and key rows of each head permuted for its rotary
kernel (the pairs ``(k, k + d_h/2)`` interleaved); the file is written that way, and the test
checks that what comes back is the unpermuted model.
"""

import json
import os

import numpy as np
import pytest

from sklearn_ebound.cli import build_parser
from sklearn_ebound.heads import head_deficiency, head_predictors, head_ranks, load_pretrained

os.environ.setdefault("HF_HUB_OFFLINE", "1")

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

D, LAYERS, HEADS, KV_HEADS, HEAD_DIM, FF = 32, 2, 4, 2, 8, 48
MERGES = ["Ġ t", "h e", "Ġt he", "i n", "e r", "Ġ a"]


def _llama_cpp_order(weight, n_heads):
    """The row order llama.cpp's converter writes: each head's two halves interleaved."""
    return (weight.reshape(n_heads, 2, weight.shape[0] // n_heads // 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def _write_tiny_gguf(path, seed=0):
    """Write a tiny LLaMA GGUF; returns its weights under their Hugging Face names."""
    gguf = pytest.importorskip("gguf")
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    rng = np.random.default_rng(seed)
    tokens = list(bytes_to_unicode().values()) + [m.replace(" ", "") for m in MERGES]
    tokens.append("<|endoftext|>")
    vocab = len(tokens)

    def draw(*shape, offset=0.0):
        return (offset + 0.3 * rng.standard_normal(shape)).astype(np.float32)

    hf = {"model.embed_tokens.weight": draw(vocab, D), "lm_head.weight": draw(vocab, D),
          "model.norm.weight": draw(D, offset=1.0)}
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-llama")
    writer.add_context_length(64)
    writer.add_embedding_length(D)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FF)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_rope_freq_base(5000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * (vocab - 1) + [3])  # the last one a control token
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(vocab - 1)
    writer.add_eos_token_id(vocab - 1)
    gguf_names = {"model.embed_tokens.weight": "token_embd.weight",
                  "lm_head.weight": "output.weight", "model.norm.weight": "output_norm.weight"}
    for i in range(LAYERS):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        layer = {
            "self_attn.q_proj.weight": (draw(HEADS * HEAD_DIM, D), "attn_q.weight"),
            "self_attn.k_proj.weight": (draw(KV_HEADS * HEAD_DIM, D), "attn_k.weight"),
            "self_attn.v_proj.weight": (draw(KV_HEADS * HEAD_DIM, D), "attn_v.weight"),
            "self_attn.o_proj.weight": (draw(D, HEADS * HEAD_DIM), "attn_output.weight"),
            "mlp.gate_proj.weight": (draw(FF, D), "ffn_gate.weight"),
            "mlp.up_proj.weight": (draw(FF, D), "ffn_up.weight"),
            "mlp.down_proj.weight": (draw(D, FF), "ffn_down.weight"),
            "input_layernorm.weight": (draw(D, offset=1.0), "attn_norm.weight"),
            "post_attention_layernorm.weight": (draw(D, offset=1.0), "ffn_norm.weight"),
        }
        for name, (value, gguf_name) in layer.items():
            hf[p + name] = value
            gguf_names[p + name] = b + gguf_name
    for name, gguf_name in gguf_names.items():
        value = hf[name]
        if gguf_name.endswith("attn_q.weight"):
            value = _llama_cpp_order(value, HEADS)
        elif gguf_name.endswith("attn_k.weight"):
            value = _llama_cpp_order(value, KV_HEADS)
        writer.add_tensor(gguf_name, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return hf


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    pytest.importorskip("gguf")
    pytest.importorskip("accelerate")
    path = tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf"
    return path, _write_tiny_gguf(path)


def test_gguf_loads_as_the_causal_lm_that_was_written(tiny_gguf):
    path, written = tiny_gguf
    model, tokenizer = load_pretrained(path)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert not model.config.tie_word_embeddings  # the file has its own output head
    state = model.state_dict()
    assert set(state) == set(written)
    for name, value in written.items():  # the q/k rows back in Hugging Face's order
        np.testing.assert_array_equal(state[name].numpy(), value, err_msg=name)
    config = transformers.LlamaConfig(
        vocab_size=len(written["lm_head.weight"]), hidden_size=D, intermediate_size=FF,
        num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
        rope_theta=5000.0, rms_norm_eps=1e-5, tie_word_embeddings=False)
    reference = transformers.LlamaForCausalLM(config).eval()
    reference.load_state_dict({k: torch.as_tensor(v) for k, v in written.items()})
    batch = tokenizer("the tin there", return_tensors="pt")
    # byte-level BPE from the file's merges: "the" is one token, " there" two
    vocab = tokenizer.get_vocab()
    assert batch["input_ids"][0].tolist()[:2] == [vocab["t"], vocab["he"]]
    assert vocab["Ġthe"] in batch["input_ids"][0].tolist()
    with torch.no_grad():
        got = model.eval()(**batch).logits
        want = reference(**batch).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_heads_of_a_gguf_model(tiny_gguf):
    path, written = tiny_gguf
    result = head_ranks(path)
    assert (result.naming, result.n_layers, result.n_heads, result.n_kv_heads,
            result.head_dim) == ("llama", LAYERS, HEADS, KV_HEADS, HEAD_DIM)
    # the kernel rank of head 1 of layer 0 is that of the written (unpermuted) weights
    q = written["model.layers.0.self_attn.q_proj.weight"][HEAD_DIM:2 * HEAD_DIM].T
    k = written["model.layers.0.self_attn.k_proj.weight"][:HEAD_DIM].T
    s = np.linalg.svd(q.astype(float) @ k.T.astype(float), compute_uv=False)
    energy = np.cumsum(s ** 2) / np.sum(s ** 2)
    row = next(r for r in result.rows if (r["layer"], r["head"]) == (0, 1))
    assert row["kernel_energy_rank_90"] == int(np.searchsorted(energy, 0.9 - 1e-12) + 1)


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_causal_lm_directory_loads_as_its_causal_lm_class(kind, tmp_path, word_tokenizer):
    torch.manual_seed(0)
    if kind == "llama":
        config = transformers.LlamaConfig(
            vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
        model = transformers.LlamaForCausalLM(config)
    else:
        config = transformers.GPT2Config(n_embd=16, n_head=4, n_layer=2, vocab_size=40,
                                         tie_word_embeddings=False)
        model = transformers.GPT2LMHeadModel(config)
    model.save_pretrained(tmp_path)
    loaded, tokenizer = load_pretrained(tmp_path)
    assert type(loaded) is type(model) and tokenizer is None
    head = loaded.state_dict()["lm_head.weight"]
    torch.testing.assert_close(head, model.state_dict()["lm_head.weight"], rtol=0, atol=0)
    assert not torch.equal(head, loaded.state_dict()[
        "model.embed_tokens.weight" if kind == "llama" else "transformer.wte.weight"])
    # the heads' readers find the layers under the `model.` / `transformer.` prefix
    result = head_ranks(loaded)
    assert (result.naming, result.n_layers, result.n_heads) == (kind, 2, 4)
    texts = ["one two three four five six seven", "eight nine ten eleven twelve thirteen",
             "a b c d e f g h", "the quick brown fox jumps over it"]
    table = head_predictors(loaded, texts, tokenizer=word_tokenizer(40), window=4,
                            layers=[1])
    assert [(r["layer"], r["head"]) for r in table.rows] == [(1, h) for h in range(4)]
    curves = head_deficiency(loaded, texts, tokenizer=word_tokenizer(40),
                             methods=("data",)).curves("data")
    assert curves.shape == (2, 4, 5) and np.allclose(curves[..., -1], 0, atol=1e-12)


def test_base_model_directory_loads_as_the_base_model(tmp_path):
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=30, hidden_size=16, num_hidden_layers=1,
                                     num_attention_heads=2, intermediate_size=16)
    transformers.BertModel(config).save_pretrained(tmp_path)
    model, _ = load_pretrained(tmp_path)
    assert type(model).__name__ == "BertModel"


def test_gguf_errors(tiny_gguf, tmp_path, monkeypatch):
    import importlib.util

    with pytest.raises(ValueError, match="is not a GGUF file"):
        load_pretrained(tmp_path / "missing.gguf")
    with pytest.raises(ValueError, match="neither a directory with a Hugging Face config.json"):
        load_pretrained(tmp_path)
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "gguf" else find_spec(name, *a))
    with pytest.raises(ImportError, match="needs `gguf`.*pip install gguf"):
        load_pretrained(tiny_gguf[0])
    args = build_parser().parse_args(["heads", str(tiny_gguf[0]), "--out", str(tmp_path)])
    with pytest.raises(ValueError, match="reading a GGUF file needs gguf"):
        args.run(args)


def test_cli_on_a_gguf_file(tiny_gguf, tmp_path, capsys):
    path, written = tiny_gguf
    text = tmp_path / "text.txt"
    words = ["the", "tin", "there", "a", "water", "inner", "tent", "heat", "rate", "art"]
    rng = np.random.default_rng(0)
    text.write_text("\n".join(" ".join(rng.choice(words, 6)) for _ in range(8)) + "\n")
    out, target = tmp_path / "out", tmp_path / "compressed"
    args = build_parser().parse_args(["heads", str(path), "--text", str(text), "--compress",
                                      str(target), "--budget", "0.5", "--out", str(out),
                                      "--json"])
    assert args.run(args) == 0
    captured = capsys.readouterr()
    payload = json.loads(captured.out)
    assert "de-quantizing" not in captured.err  # the GGUF reader's bar is silenced too
    assert payload["result"]["naming"] == "llama"
    assert payload["fidelity"]["measure"] == "perplexity and next-token KL"
    assert payload["fidelity"]["mean_kl"] >= 0
    assert np.isfinite(payload["fidelity"]["compressed"])
    # --form auto on rotary heads: shared latent keys, the stock class with its own attention
    compressed = transformers.AutoModelForCausalLM.from_pretrained(
        target, local_files_only=True, trust_remote_code=True)
    assert type(compressed).__name__ == "KeptLlamaForCausalLM"
    assert payload["form"] == "latent-shared"
    saved = json.loads((target / "config.json").read_text())
    assert saved["architectures"] == ["KeptLlamaForCausalLM"] and saved["qk_latent"]
    assert "quantization_config" not in saved  # a plain dense model
    state = compressed.state_dict()
    for name, value in written.items():  # every weight of the file kept, the maps added
        np.testing.assert_array_equal(state[name].numpy(), value, err_msg=name)
    assert {name.rsplit(".", 1)[-1] for name in set(state) - set(written)} == {
        "query_map", "key_map"}
    assert (target / "tokenizer.json").is_file()
