"""Fisher weights of the heads' outputs and the plan that spends rank by them.

Tiny random LLaMA- and GPT-2-style causal language models: a head the output projection does
not read costs nothing, a head read louder costs more, padding changes nothing, the model is
left as it was; the "fisher" plan gives the rank to the head the model reads, and the
next-token distillation trains rotary and GPT-2 heads within their forms.
"""

import os

import numpy as np
import pytest

from sklearn_ebound.heads import (
    HeadDeficiencyResult,
    HeadSensitivityResult,
    compress_heads,
    distill_compressed,
    docstring_sentences,
    head_deficiency,
    head_sensitivity,
    next_token_kl,
    plan_ranks,
)

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

TEXTS = docstring_sentences(["json", "textwrap"])[:12]


def tiny_lm(kind):
    torch.manual_seed(0)
    if kind == "gpt2":
        config = transformers.GPT2Config(n_embd=16, n_head=2, n_layer=2, vocab_size=60,
                                         attn_implementation="eager")
        return transformers.GPT2LMHeadModel(config).eval()
    config = transformers.LlamaConfig(hidden_size=32, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=32,
                                      vocab_size=60, num_hidden_layers=2, rope_theta=500.0,
                                      attn_implementation="eager")
    return transformers.LlamaForCausalLM(config).eval()


def _head_columns(model, kind, layer, head):
    """The output projection's weight and the index of head ``head``'s input block."""
    if kind == "gpt2":  # Conv1D: (n_heads d_h, d), y = x W
        weight = model.transformer.h[layer].attn.c_proj.weight
        d_h = weight.shape[0] // model.config.n_head
        return weight, (slice(head * d_h, (head + 1) * d_h), slice(None))
    weight = model.model.layers[layer].self_attn.o_proj.weight  # (d, n_heads d_h)
    d_h = weight.shape[1] // model.config.num_attention_heads
    return weight, (slice(None), slice(head * d_h, (head + 1) * d_h))


def _weight(sens, layer, head, column="weight"):
    return next(r[column] for r in sens.rows if (r["layer"], r["head"]) == (layer, head))


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_a_head_the_model_does_not_read_costs_nothing(word_tokenizer, kind):
    model = tiny_lm(kind)
    tok = word_tokenizer(60)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    sens = head_sensitivity(model, TEXTS, tokenizer=tok)
    assert {k: bool(torch.equal(v, before[k])) for k, v in model.state_dict().items()} == {
        k: True for k in before}
    assert all(p.grad is None and p.requires_grad for p in model.parameters())
    assert len(sens.rows) == 2 * model.config.num_attention_heads
    assert np.all(sens.column("weight") > 0) and sens.loss > 0
    weight, index = _head_columns(model, kind, 0, 1)
    with torch.no_grad():
        weight[index] = 0.0
    silent = head_sensitivity(model, TEXTS, tokenizer=tok)
    assert _weight(silent, 0, 1) == 0.0 and _weight(silent, 0, 1, "energy") > 0
    assert _weight(silent, 0, 0) > 0 and _weight(silent, 1, 1) > 0


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_a_head_read_louder_costs_more(word_tokenizer, kind):
    tok = word_tokenizer(60)
    values = []
    for scale in (0.5, 1.0, 2.0):
        model = tiny_lm(kind)
        weight, index = _head_columns(model, kind, 1, 0)  # the last layer: little feedback
        with torch.no_grad():
            weight[index] *= scale
        sens = head_sensitivity(model, TEXTS, tokenizer=tok)
        values.append(_weight(sens, 1, 0, "fisher"))
    assert values[0] < values[1] < values[2]
    # the gradient in the head's output is the stream's gradient through its block
    assert 2.0 < values[2] / values[1] < 8.0


def test_padding_and_labels(word_tokenizer):
    model = tiny_lm("llama")
    tok = word_tokenizer(60)
    one = head_sensitivity(model, TEXTS, tokenizer=tok, batch_size=1)
    padded = head_sensitivity(model, TEXTS, tokenizer=tok, batch_size=5)
    np.testing.assert_allclose(padded.column("weight"), one.column("weight"), rtol=1e-4)
    assert padded.n_tokens == one.n_tokens == sum(min(len(t.split()), 64) for t in TEXTS)
    drawn = head_sensitivity(model, TEXTS, tokenizer=tok, labels="model", random_state=1)
    assert drawn.labels == "model" and np.all(drawn.column("fisher") > 0)
    assert not np.allclose(drawn.column("fisher"), one.column("fisher"))


def _result(curves, d_h):
    """A deficiency result of one layer holding ``curves`` (heads x (d_h + 1)) as data curves."""
    n_heads = len(curves)
    rows = [{"layer": 0, "head": h, "rank": r, "err_weight": np.nan,
             "err_data": float(curves[h][r]), "err_trained": np.nan}
            for h in range(n_heads) for r in range(d_h + 1)]
    result = HeadDeficiencyResult(rows, naming="llama", n_layers=1, n_heads=n_heads,
                                  heads=list(range(n_heads)), layer_indices=[0], head_dim=d_h,
                                  output_share=np.full((1, n_heads), np.nan))
    result._stream_err = {m: np.full((1, n_heads, d_h + 1, 1), np.nan, np.float32)
                          for m in ("weight", "data", "trained")}
    result._text_energy = np.ones((1, 1))
    return result


def _sensitivity(weights):
    rows = [{"layer": 0, "head": h, "fisher": w, "energy": 1.0, "weight": w}
            for h, w in enumerate(weights)]
    return HeadSensitivityResult(rows, naming="llama", head_dim=8, labels="data", n_texts=2,
                                 n_tokens=10, loss=1.0)


def test_the_plan_gives_rank_to_the_head_the_model_reads():
    d_h = 8
    curve = np.exp(-0.4 * np.arange(d_h + 1))
    curve[-1] = 0.0
    result = _result([curve, curve, curve], d_h)
    sens = _sensitivity([1.0, 10.0, 0.0])
    plan = plan_ranks(result, budget=0.5, method="data", allocation="fisher",
                      sensitivity=sens)
    ranks = plan.column("rank")
    assert ranks.sum() == 12 and ranks[1] > ranks[0] > ranks[2] == 0
    assert plan.predicted_loss == pytest.approx(sum(
        w * curve[r] for w, r in zip([1.0, 10.0, 0.0], ranks, strict=True)))
    assert plan.predicted_loss == pytest.approx(sens.predicted_loss(result, plan))
    # equal weights: equal curves share the budget evenly
    even = plan_ranks(result, budget=0.5, method="data", allocation="fisher",
                      sensitivity=_sensitivity([2.0, 2.0, 2.0])).column("rank")
    assert even.max() - even.min() <= 1


def test_the_fisher_plan_on_a_measured_model(word_tokenizer):
    model = tiny_lm("llama")
    tok = word_tokenizer(60)
    result = head_deficiency(model, TEXTS, tokenizer=tok, methods=("data",))
    sens = head_sensitivity(model, TEXTS, tokenizer=tok)
    plan = plan_ranks(result, budget=0.5, method="data", allocation="fisher",
                      sensitivity=sens)
    assert plan.budget_used <= 0.5 and plan.allocation == "fisher"
    greedy = plan_ranks(result, budget=0.5, method="data")
    # the Fisher plan predicts no more loss than any other plan of the same budget
    assert plan.predicted_loss <= sens.predicted_loss(result, greedy) + 1e-12
    uniform = plan_ranks(result, budget=0.5, method="data", allocation="uniform")
    assert plan.predicted_loss <= sens.predicted_loss(result, uniform) + 1e-12


def test_bad_input(word_tokenizer):
    tok = word_tokenizer(60)
    model = tiny_lm("llama")
    with pytest.raises(ValueError, match="labels"):
        head_sensitivity(model, TEXTS, tokenizer=tok, labels="teacher")
    with pytest.raises(ValueError, match="batch_size"):
        head_sensitivity(model, TEXTS, tokenizer=tok, batch_size=0)
    with pytest.raises(TypeError, match="texts"):
        head_sensitivity(model, "one text", tokenizer=tok)
    torch.manual_seed(0)
    encoder = transformers.BertModel(transformers.BertConfig(
        vocab_size=60, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=16))
    with pytest.raises(ValueError, match="causal language model"):
        head_sensitivity(encoder, TEXTS, tokenizer=tok)
    bare = transformers.LlamaModel(model.config)
    with pytest.raises(ValueError, match="causal language model"):
        head_sensitivity(bare, TEXTS, tokenizer=tok)
    curve = np.linspace(1.0, 0.0, 9)
    result = _result([curve, curve], 8)
    with pytest.raises(ValueError, match="needs `sensitivity`"):
        plan_ranks(result, budget=0.5, method="data", allocation="fisher")
    with pytest.raises(ValueError, match="only read by"):
        plan_ranks(result, budget=0.5, method="data", sensitivity=_sensitivity([1.0, 1.0]))
    with pytest.raises(TypeError, match="head_sensitivity result"):
        plan_ranks(result, budget=0.5, method="data", allocation="fisher",
                   sensitivity={(0, 0): 1.0})
    with pytest.raises(ValueError, match="no weight for head 0.1"):
        plan_ranks(result, budget=0.5, method="data", allocation="fisher",
                   sensitivity=_sensitivity([1.0]))
    other = HeadSensitivityResult(_sensitivity([1.0, 1.0]).rows, naming="gpt2", head_dim=8)
    with pytest.raises(ValueError, match="gpt2-style"):
        plan_ranks(result, budget=0.5, method="data", allocation="fisher", sensitivity=other)


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_next_token_distillation_of_the_fisher_plan(word_tokenizer, kind):
    # Adam on the KL of the next-token distributions brings the compressed model closer to
    # the original on the texts it is trained on (measured here, not read from the history);
    # in a rotary head only its query map moves, kept at rank r on the span its form chose,
    # its shared keys stay, and every other weight stays.
    model = tiny_lm(kind)
    with torch.no_grad():  # attention far from uniform and peaked next-token distributions
        for name, parameter in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight", "c_attn.weight")):
                parameter.mul_(15.0)
        model.get_output_embeddings().weight.mul_(10.0)
    tok = word_tokenizer(60)
    texts = docstring_sentences(["json", "textwrap", "argparse"])[:40]
    result = head_deficiency(model, texts, tokenizer=tok, methods=("data",))
    sens = head_sensitivity(model, texts, tokenizer=tok)
    plan = plan_ranks(result, budget=0.4, method="data", allocation="fisher",
                      sensitivity=sens)
    compressed = compress_heads(model, result, plan, method="data")
    before = {k: v.clone() for k, v in compressed.state_dict().items()}
    distilled = distill_compressed(model, compressed, plan, texts, tokenizer=tok,
                                   objective="next_token", max_epochs=4,
                                   # a rotary head's whole query map moves (on its span)
                                   learning_rate=1e-2 if kind == "gpt2" else 3e-3,
                                   batch_size=8)
    history = distilled.distillation_
    assert history["objective"] == "next_token" and history["best_epoch"] >= 1
    assert min(history["validation_loss"]) < history["validation_loss"][0]
    assert (next_token_kl(model, distilled, texts, tok).mean_kl
            < next_token_kl(model, compressed, texts, tok).mean_kl)
    new = distilled.state_dict()
    moved = {k for k in before if not torch.equal(before[k], new[k])}
    assert moved and all(k.endswith(("q_proj.weight", "c_attn.weight", "c_attn.bias"))
                         for k in moved)
    from sklearn_ebound.heads._head_forms import augmented_weights, layers_of

    _, layers, _ = layers_of(distilled)
    _, c_layers, _ = layers_of(compressed)
    for row in plan.rows:
        (wq, wk, _), (cq, ck, _) = (augmented_weights(x[row["layer"]])
                                    for x in (layers, c_layers))
        h = row["head"]
        if kind == "llama":  # the query map stays on the span of the compressed one
            assert np.array_equal(wk, ck)
            span = np.linalg.svd(cq[h], full_matrices=False)[2][:row["rank"]]
            off_span = wq[h] - (wq[h] @ span.T) @ span
            assert np.abs(off_span).max() <= 1e-5 * max(np.abs(wq[h]).max(), 1e-30)
        else:
            assert not np.any(wq[h][:, np.all(cq[h] == 0, axis=0)])  # dropped columns stay 0
        if row["rank"] in (0, result.head_dim):
            assert np.array_equal(wq[h], cq[h])


def test_learning_rate_backoff(word_tokenizer):
    # a rate far too large: every epoch overshoots; with the back-off each failed epoch
    # returns to the best state and halves the rate, until an epoch improves on the start
    model = tiny_lm("llama")
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(10.0)
    tok = word_tokenizer(60)
    texts = docstring_sentences(["json", "textwrap", "argparse"])[:24]
    result = head_deficiency(model, texts, tokenizer=tok, methods=("data",))
    plan = plan_ranks(result, budget=0.4, method="data")
    compressed = compress_heads(model, result, plan, method="data")
    common = dict(tokenizer=tok, objective="next_token", max_epochs=5, learning_rate=3.0,
                  batch_size=8, patience=5)
    plain = distill_compressed(model, compressed, plan, texts, **common).distillation_
    backed = distill_compressed(model, compressed, plan, texts, lr_backoff=0.1,
                                **common).distillation_
    assert plain["learning_rate"] == [3.0] * 5 and plain["best_epoch"] == 0
    rates = backed["learning_rate"]
    assert rates[0] == 3.0 and rates[1] == pytest.approx(0.3) and rates[-1] < 1e-2
    assert backed["best_epoch"] >= 1
    assert min(backed["validation_loss"]) < backed["validation_loss"][0]
    with pytest.raises(ValueError, match="lr_backoff"):
        distill_compressed(model, compressed, plan, texts, lr_backoff=1.0, **common)
