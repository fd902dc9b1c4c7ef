"""Model families (sklearn_ebound.heads._families) and causal language models end to end.

Tiny random causal LMs of every family with an untied LM head are compressed, saved and
reloaded with ``AutoModelForCausalLM``: the same class, no missing key, every weight but the
planned query/key entries bit-identical. Qwen2 (query and key biases) shows that a family's
biases are read and written. The next-token KL is zero for a model against itself and grows
with a perturbation.
"""

import os

import numpy as np
import pytest

from sklearn_ebound.heads import (
    NAMINGS,
    compress_heads,
    distill_compressed,
    docstring_sentences,
    head_deficiency,
    head_ranks,
    is_language_model,
    next_token_kl,
    perplexity,
    plan_ranks,
    refine_compressed,
)
from sklearn_ebound.heads._families import FAMILIES, AttentionFamily, family

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

TEXTS = docstring_sentences(["json", "textwrap"])[:16]
HELD_OUT = docstring_sentences(["csv"])[:8]
VOCAB = 60


def causal_lm(kind, tied=False):
    """A tiny random causal LM, attention far from uniform, query/key biases that matter."""
    torch.manual_seed(0)
    common = dict(vocab_size=VOCAB, tie_word_embeddings=tied, attn_implementation="eager")
    if kind == "gpt2":
        config = transformers.GPT2Config(n_embd=16, n_head=2, n_layer=2, **common)
    else:
        config_class = {"llama": transformers.LlamaConfig, "mistral": transformers.MistralConfig,
                        "qwen2": transformers.Qwen2Config}[kind]
        config = config_class(hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                              intermediate_size=32, num_hidden_layers=2, rope_theta=500.0,
                              **common)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(("c_attn.weight", "q_proj.weight", "k_proj.weight")):
                parameter.mul_(15.0)
            if name.endswith(("c_attn.bias", "q_proj.bias", "k_proj.bias")):
                parameter.normal_(0.0, 0.5)
    return model.eval()


def _is_query_or_key(name):
    return name.endswith(("q_proj.weight", "k_proj.weight", "q_proj.bias", "k_proj.bias",
                          "c_attn.weight", "c_attn.bias"))


@pytest.mark.parametrize("kind", ["llama", "gpt2", "qwen2", "mistral"])
def test_causal_lm_is_written_as_its_class_with_its_head(word_tokenizer, kind, tmp_path):
    model = causal_lm(kind)
    result = head_deficiency(model, TEXTS, tokenizer=word_tokenizer(VOCAB), methods=("data",))
    plan = plan_ranks(result, budget=0.5, method="data")
    compressed = compress_heads(model, result, plan, method="data")
    assert type(compressed) is type(model)
    compressed.save_pretrained(tmp_path)
    loaded, info = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, local_files_only=True, output_loading_info=True)
    assert type(loaded) is type(model)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert not info["mismatched_keys"]
    before, after = model.state_dict(), loaded.state_dict()
    assert "lm_head.weight" in after and set(after) == set(before)
    assert not torch.equal(after["lm_head.weight"], after[next(
        k for k in after if k.endswith(("embed_tokens.weight", "wte.weight")))])  # untied
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(_is_query_or_key(k) for k in changed)
    for k in changed:  # what was written is what was saved
        assert torch.equal(compressed.state_dict()[k], after[k])
    if kind == "gpt2":  # the fused Conv1D: only the query and key thirds change
        d = model.config.n_embd
        for k in changed:
            assert torch.equal(before[k][..., 2 * d:], after[k][..., 2 * d:])


def test_tied_head_stays_tied(word_tokenizer, tmp_path):
    model = causal_lm("llama", tied=True)
    result = head_deficiency(model, TEXTS, tokenizer=word_tokenizer(VOCAB), methods=("data",))
    compressed = compress_heads(model, result, plan_ranks(result, budget=0.5, method="data"),
                                method="data")
    compressed.save_pretrained(tmp_path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, local_files_only=True)
    assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()
    assert torch.equal(loaded.lm_head.weight, model.lm_head.weight)


def test_qwen2_query_and_key_biases_are_read_and_written(word_tokenizer):
    # Adding a family is a module and a test like this one: the curve is the compressed
    # model's own head error, biases and rotations included, run by transformers itself.
    model = causal_lm("qwen2")
    tokenizer = word_tokenizer(VOCAB)
    result = head_deficiency(model, TEXTS, tokenizer=tokenizer, methods=("data",), layers=[0],
                             random_state=1)
    assert result.naming == "llama" and result.rotary and result.causal
    q_bias = model.model.layers[0].self_attn.q_proj.bias
    evaluation = [TEXTS[i] for i in result.evaluation_index]
    kept = []

    def heads_output(m):
        handle = m.get_submodule("model.layers.0.self_attn.o_proj").register_forward_pre_hook(
            lambda module, args: kept.append(args[0].detach().double()))
        try:
            batch = tokenizer(evaluation)
            with torch.no_grad():
                m(**batch)
        finally:
            handle.remove()
        return kept.pop(), batch["attention_mask"].bool()

    reference, mask = heads_output(model)
    d_h, curves = result.head_dim, result.curves("data")
    for head in range(result.n_heads):
        rank = d_h // 2
        compressed = compress_heads(model, result, {(0, head): rank}, method="data")
        new_bias = compressed.model.layers[0].self_attn.q_proj.bias
        cols = slice(head * d_h, (head + 1) * d_h)
        q, _ = result.factors(0, head, rank, "data")
        np.testing.assert_allclose(new_bias[cols].detach().numpy(), q[-1], rtol=1e-6,
                                   atol=1e-7)
        assert not torch.equal(new_bias[cols], q_bias[cols])  # the bias mapped to rank r
        out, _ = heads_output(compressed)
        ref, new = reference[..., cols][mask], out[..., cols][mask]
        err = float(((new - ref) ** 2).sum() / (ref ** 2).sum())
        np.testing.assert_allclose(err, curves[0, head, rank], rtol=2e-3, atol=1e-6)


def test_refine_and_distill_keep_the_causal_lm_class(word_tokenizer):
    model = causal_lm("gpt2")
    tokenizer = word_tokenizer(VOCAB)
    result = head_deficiency(model, TEXTS, tokenizer=tokenizer, methods=("data",))
    plan = plan_ranks(result, budget=0.5, method="data")
    compressed = compress_heads(model, result, plan, method="data")
    refined = refine_compressed(model, compressed, plan, TEXTS, tokenizer=tokenizer,
                                train_steps=2)
    distilled = distill_compressed(model, compressed, plan, TEXTS, tokenizer=tokenizer,
                                   objective="hidden", max_epochs=1, batch_size=8)
    for new in (refined, distilled):
        assert type(new) is type(model)
        before, after = model.state_dict(), new.state_dict()
        assert torch.equal(before["lm_head.weight"], after["lm_head.weight"])
        assert all(_is_query_or_key(k) for k in before if not torch.equal(before[k], after[k]))


def test_frontier_and_predictors_on_a_causal_lm(word_tokenizer):
    from sklearn_ebound.heads import compression_frontier, head_predictors

    model = causal_lm("gpt2")
    tokenizer = word_tokenizer(VOCAB)
    result = head_deficiency(model, TEXTS, tokenizer=tokenizer, methods=("data",))
    frontier = compression_frontier(model, result, HELD_OUT, tokenizer, budgets=(0.25, 1.0),
                                    strategies=("uniform",))
    kl = {row["budget"]: row["kl"] for row in frontier.rows}
    assert kl[1.0] < 1e-9 < kl[0.25]
    predictors = head_predictors(model, TEXTS[:8], tokenizer=tokenizer, layers=[0], window=4)
    assert len(predictors.rows) == model.config.n_head


def test_head_ranks_read_the_causal_lm_as_its_base_model():
    model = causal_lm("llama")
    with_head, bare = head_ranks(model), head_ranks(model.model)
    assert with_head.naming == bare.naming == "llama"
    np.testing.assert_array_equal(with_head.kernel_spectra, bare.kernel_spectra)


# --- the next-token measure ----------------------------------------------------------------


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_next_token_kl_is_zero_to_itself_and_grows_with_a_perturbation(word_tokenizer, kind):
    import copy

    model = causal_lm(kind)
    tokenizer = word_tokenizer(VOCAB)
    same = next_token_kl(model, model, HELD_OUT, tokenizer)
    assert same.mean_kl == 0.0 and same.max_kl == 0.0
    assert same.n_tokens == sum(len(t.split()) - 1 for t in HELD_OUT)
    kls = []
    for scale in (0.05, 0.5):
        other = copy.deepcopy(model)
        with torch.no_grad():
            generator = torch.Generator().manual_seed(1)
            for p in other.parameters():
                p.add_(scale * p.std() * torch.randn(p.shape, generator=generator))
        table = next_token_kl(model, other, HELD_OUT, tokenizer)
        assert table.mean_kl > 0 and np.all(table.column("kl") > 0)
        # the token-weighted mean of the per-text means
        weights = table.column("n_tokens")
        np.testing.assert_allclose(table.mean_kl,
                                   np.sum(table.column("kl") * weights) / weights.sum())
        kls.append(table.mean_kl)
    assert kls[0] < kls[1]


def test_next_token_kl_by_hand_on_one_text(word_tokenizer):
    model, other = causal_lm("gpt2"), causal_lm("llama")
    assert model.config.vocab_size == other.config.vocab_size
    tokenizer = word_tokenizer(VOCAB)
    texts = HELD_OUT[:2]
    table = next_token_kl(model, other, texts, tokenizer)
    for i, text in enumerate(texts):
        batch = tokenizer([text])
        with torch.no_grad():
            p = torch.log_softmax(model(**batch).logits[0, :-1].double(), -1)
            q = torch.log_softmax(other(**batch).logits[0, :-1].double(), -1)
        expected = float((p.exp() * (p - q)).sum(-1).mean())
        np.testing.assert_allclose(table.rows[i]["kl"], expected, rtol=1e-5)  # batched: padding


def _padded_tokenizer(side):
    from conftest import word_level_tokenizer

    tokenizer = word_level_tokenizer(TEXTS + HELD_OUT)
    tokenizer.padding_side = side
    return tokenizer


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_perplexity_and_kl_do_not_depend_on_the_padding_side(kind):
    # A left-padded row's last pad position precedes its first real token: it predicts
    # nothing. Left, right and no padding (one text per batch) score every text alike, for
    # rotary (LLaMA) and absolute (GPT-2) positions.
    torch.manual_seed(1)
    model, other = causal_lm(kind), causal_lm(kind)
    with torch.no_grad():
        for parameter in other.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    left, right = _padded_tokenizer("left"), _padded_tokenizer("right")
    vocab = len(left.get_vocab())
    model.resize_token_embeddings(vocab)
    other.resize_token_embeddings(vocab)
    texts = HELD_OUT[:6]
    assert len({len(t.split()) for t in texts}) > 1  # rows of different lengths: padding
    alone = perplexity(model, texts, right, batch_size=1)
    assert alone > 1
    for tokenizer in (left, right):
        np.testing.assert_allclose(perplexity(model, texts, tokenizer), alone, rtol=1e-6)
    kl_alone = next_token_kl(model, other, texts, right, batch_size=1)
    assert kl_alone.mean_kl > 0
    for tokenizer in (left, right):
        kl = next_token_kl(model, other, texts, tokenizer)
        np.testing.assert_allclose(kl.mean_kl, kl_alone.mean_kl, rtol=1e-5)
        np.testing.assert_allclose(kl.column("kl"), kl_alone.column("kl"), rtol=1e-5)
        assert kl.n_tokens == kl_alone.n_tokens


def test_next_token_kl_checks_its_input(word_tokenizer):
    model = causal_lm("gpt2")
    tokenizer = word_tokenizer(VOCAB)
    with pytest.raises(TypeError, match="`compressed` must be a causal language model"):
        next_token_kl(model, model.transformer, HELD_OUT, tokenizer)
    with pytest.raises(ValueError, match="`batch_size` must be a positive integer"):
        next_token_kl(model, model, HELD_OUT, tokenizer, batch_size=0)
    with pytest.raises(TypeError, match="`texts` must be a list of strings"):
        next_token_kl(model, model, "one text", tokenizer)


def test_which_models_are_language_models():
    bert = transformers.BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1,
                                   num_attention_heads=2, intermediate_size=16)
    assert is_language_model(causal_lm("gpt2")) and is_language_model(causal_lm("qwen2"))
    assert not is_language_model(causal_lm("gpt2").transformer)  # the bare decoder
    assert not is_language_model(transformers.BertModel(bert))
    assert not is_language_model(transformers.BertForMaskedLM(bert))  # not causal
    assert not is_language_model(object())


# --- the CLI's report of the measure --------------------------------------------------------


def test_cli_reports_the_measure_it_used(word_tokenizer):
    from sklearn_ebound.cli._heads import _fidelity_words
    from sklearn_ebound.heads._workflow import _fidelity

    tokenizer = word_tokenizer(VOCAB)
    model = causal_lm("llama")
    result = head_deficiency(model, TEXTS, tokenizer=tokenizer, methods=("data",))
    compressed = compress_heads(model, result, plan_ranks(result, budget=0.5, method="data"),
                                method="data")
    fidelity = _fidelity(model, compressed, HELD_OUT, tokenizer, 64, True)
    phrase = _fidelity_words(fidelity)
    assert fidelity["measure"] == "perplexity and next-token KL"
    assert fidelity["mean_kl"] > 0 and fidelity["ratio"] > 0
    np.testing.assert_allclose(fidelity["original"], perplexity(model, HELD_OUT, tokenizer))
    assert phrase.startswith("measure: next-token prediction") and "KL" in phrase
    encoder = transformers.BertModel(transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=16))
    fidelity = _fidelity(encoder, encoder, HELD_OUT, tokenizer, 64, False)
    phrase = _fidelity_words(fidelity)
    assert fidelity["measure"] == "cosine" and phrase.startswith(
        "measure: sentence-embedding cosine")
    np.testing.assert_allclose(fidelity["mean"], 1.0)


# --- the registry ---------------------------------------------------------------------------


def test_the_namings_are_the_adapters_names():
    assert NAMINGS == tuple(FAMILIES) == ("bert", "gpt2", "llama", "gemma3", "qwen3")
    for name, adapter in FAMILIES.items():
        assert isinstance(adapter, AttentionFamily) and adapter.name == name
        assert family(name) is adapter
    assert family("llama").rotary and family("llama").grouped_query
    assert not family("gpt2").rotary and not family("bert").grouped_query
    assert family("gpt2").is_causal(None) and not family("bert").is_causal(None)
    with pytest.raises(ValueError, match="`naming` must be one of"):
        family("t5")


def test_cli_writes_the_causal_lm_it_loaded(tmp_path, capsys, monkeypatch):
    # `ebound heads --compress` on a saved GPT-2 LM with its own tokenizer. The loader is the
    # causal-LM one (what `load_pretrained` returns for a config whose architectures name a
    # causal LM): the CLI writes the class it was given and measures it by next tokens.
    import json

    from conftest import word_level_tokenizer

    import sklearn_ebound.heads as heads
    from sklearn_ebound.cli import build_parser

    texts = TEXTS + HELD_OUT
    tokenizer = word_level_tokenizer(texts)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_embd=16, n_head=2, n_layer=2, vocab_size=len(tokenizer), tie_word_embeddings=False))
    source, target = tmp_path / "lm", tmp_path / "small"
    model.save_pretrained(source)
    tokenizer.save_pretrained(source)
    (tmp_path / "text.txt").write_text("\n".join(texts))

    def load_causal_lm(path):
        return (transformers.AutoModelForCausalLM.from_pretrained(path, local_files_only=True),
                transformers.AutoTokenizer.from_pretrained(path, local_files_only=True))

    monkeypatch.setattr(heads, "load_pretrained", load_causal_lm)
    args = build_parser().parse_args([
        "heads", str(source), "--text", str(tmp_path / "text.txt"), "--compress", str(target),
        "--budget", "0.5", "--json", "--out", str(tmp_path / "out")])
    assert args.run(args) == 0
    payload = json.loads(capsys.readouterr().out)
    fidelity = payload["fidelity"]
    assert fidelity["measure"] == "perplexity and next-token KL" and fidelity["mean_kl"] > 0
    # A causal LM's rank goes where the next-token loss is predicted to fall fastest.
    plan = payload["plan"]
    assert plan["allocation"] == "fisher" and plan["predicted_loss"] > 0, plan.keys()
    # --train-steps auto and --refine auto: for a causal LM, no trained step, no refinement.
    assert (payload["train_steps"], payload["refine"]) == (0, "none")
    # Only the data-aware curves are measured for a causal LM (the plan's form).
    columns = set(payload["eps_ranks"]["rows"][0])
    assert any(c.startswith("data_rank_") for c in columns)
    assert not any(c.startswith("weight_rank_") for c in columns)
    # GPT-2 has no rotary embeddings: --form auto writes the shrunk form, the causal-LM
    # class it was given with query and key maps of the kept widths.
    assert payload["form"] == "shrunk"
    loaded, info = transformers.AutoModelForCausalLM.from_pretrained(
        target, local_files_only=True, output_loading_info=True, trust_remote_code=True)
    assert isinstance(loaded, transformers.GPT2LMHeadModel) and not info["missing_keys"]
    assert type(loaded).__name__ == "KeptGPT2LMHeadModel"
    assert torch.equal(loaded.lm_head.weight, model.lm_head.weight)
