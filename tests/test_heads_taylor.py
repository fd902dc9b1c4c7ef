"""The first-order term of the loss along each head's truncation, and the plan that spends by it.

On tiny random LLaMA- and GPT-2-style causal language models (float64, so that a finite
difference is exact enough): the measured term equals the derivative of the next-token loss
along the head's rank-``r`` map of its query, computed by autograd in the query projection's
weight and by a finite difference; it is zero at full rank; its split-half reliability is 1
when both halves hold the same texts. The "taylor" plan spends exactly the budget, and on
convex prices its greedy finds the best allocation.
"""

import itertools
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sklearn_ebound.heads import (
    docstring_sentences,
    head_deficiency,
    head_sensitivity,
    plan_ranks,
)
from sklearn_ebound.heads._planning import _greedy

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

TEXTS = docstring_sentences(["json", "textwrap"])[:12]


def tiny_lm(kind):
    torch.manual_seed(0)
    if kind == "gpt2":
        config = transformers.GPT2Config(n_embd=16, n_head=2, n_layer=2, vocab_size=60,
                                         attn_implementation="eager")
        return transformers.GPT2LMHeadModel(config).eval().double()
    config = transformers.LlamaConfig(hidden_size=32, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=32,
                                      vocab_size=60, num_hidden_layers=2, rope_theta=500.0,
                                      attn_implementation="eager")
    return transformers.LlamaForCausalLM(config).eval().double()


def _query_block(model, kind, layer, head, d_h):
    """``(weight, bias, index)`` of one head's query map in the model, in ``y = x W`` form."""
    if kind == "gpt2":  # Conv1D (d, 3d): the query third's columns
        attn = model.transformer.h[layer].attn.c_attn
        return attn.weight, attn.bias, (slice(None), slice(head * d_h, (head + 1) * d_h))
    proj = model.model.layers[layer].self_attn.q_proj  # Linear: rows are the outputs
    return proj.weight, None, (slice(head * d_h, (head + 1) * d_h), slice(None))


def _summed_loss(model, tok):
    total = 0.0
    for text in TEXTS:
        batch = tok([text], return_tensors="pt")
        logits = model(**batch).logits[0, :-1]
        total = total + torch.nn.functional.cross_entropy(
            logits, batch["input_ids"][0, 1:], reduction="sum")
    return total


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def measured(request):
    from conftest import WordTokenizer

    kind, tok = request.param, WordTokenizer(60)
    model = tiny_lm(kind)
    result = head_deficiency(model, TEXTS, tokenizer=tok, methods=("data",))
    return kind, model, tok, result, head_sensitivity(model, TEXTS, tokenizer=tok)


def test_the_first_order_term_is_the_loss_derivative(measured):
    kind, model, tok, result, sens = measured
    first = sens.first_order(result, shrink=False)
    d_h = result.head_dim
    assert first.shape == (2, len(result.heads), d_h + 1)
    np.testing.assert_allclose(first[..., -1], 0.0, atol=1e-12)  # full rank: the query kept
    assert np.abs(first[..., :-1]).max() > 1e-8
    layer, head, rank = 1, 1, 2
    A_Q, A_K = result.bases(layer, head)
    change = A_Q[:, :rank] @ A_K[:, :rank].T - np.eye(d_h)  # q -> q (G_r - I)
    weight, bias, index = _query_block(model, kind, layer, head, d_h)
    # autograd in the query projection's weight: dL/dW . (W G_r - W)
    weight.grad = None
    _summed_loss(model, tok).backward()
    block = weight.detach()[index].numpy()
    step = block @ change if kind == "gpt2" else change.T @ block
    if bias is not None:
        b = bias.detach()[index[1]].numpy()
        derivative = ((weight.grad[index].numpy() * step).sum()
                      + (bias.grad[index[1]].numpy() * (b @ change)).sum())
    else:
        derivative = (weight.grad[index].numpy() * step).sum()
    weight.grad = None
    if bias is not None:
        bias.grad = None
    assert first[layer, head, rank] == pytest.approx(derivative / sens.n_tokens, rel=1e-6)
    # and a finite difference of the loss along the same step
    original = weight.detach().clone(), None if bias is None else bias.detach().clone()
    losses = []
    with torch.no_grad():
        for eps in (3e-3, -3e-3):
            weight[index] = original[0][index] + eps * torch.as_tensor(step)
            if bias is not None:
                bias[index[1]] = original[1][index[1]] + eps * torch.as_tensor(b @ change)
            losses.append(float(_summed_loss(model, tok)))
        weight.copy_(original[0])
        if bias is not None:
            bias.copy_(original[1])
    difference = (losses[0] - losses[1]) / (2 * 3e-3 * sens.n_tokens)
    assert difference == pytest.approx(first[layer, head, rank], rel=0.1)


def test_reliability_of_the_halves(measured, word_tokenizer):
    kind, model, tok, result, sens = measured
    rho = sens.first_order_reliability(result)
    assert 0.0 <= rho <= 1.0
    np.testing.assert_allclose(sens.first_order(result),
                               rho * sens.first_order(result, shrink=False))
    twice = [t for text in TEXTS for t in (text, text)]  # even and odd halves the same
    same = head_sensitivity(model, twice, tokenizer=tok)
    assert same.first_order_reliability(result) == pytest.approx(1.0)
    np.testing.assert_allclose(same.query_gradient[0], same.query_gradient[1], atol=1e-12)
    whole = sens.first_order(result, shrink=False)
    np.testing.assert_allclose(same.first_order(result), whole, rtol=1e-4,
                               atol=1e-6 * np.abs(whole).max())


def test_the_taylor_plan_spends_the_budget(measured):
    kind, model, tok, result, sens = measured
    n_units = len(result.layer_indices) * len(result.heads) * result.head_dim
    for budget in (0.3, 0.5, 0.8):
        plan = plan_ranks(result, budget=budget, method="data", allocation="taylor",
                          sensitivity=sens)
        assert plan.column("rank").sum() == int(np.floor(budget * n_units + 1e-9))
        assert plan.allocation == "taylor"
        assert plan.first_order_reliability == sens.first_order_reliability(result)
        assert plan.predicted_loss == pytest.approx(
            sens.predicted_loss(result, plan, first_order=True))
        uniform = plan_ranks(result, budget=budget, method="data", allocation="uniform")
        if uniform.column("rank").sum() == plan.column("rank").sum():
            assert plan.predicted_loss <= sens.predicted_loss(
                result, uniform, first_order=True) + 1e-12


def test_the_first_order_term_moves_the_plan(measured):
    """A head whose truncation the text rewards loses rank to the others."""
    kind, model, tok, result, sens = measured
    fisher = plan_ranks(result, budget=0.5, method="data", allocation="fisher",
                        sensitivity=sens).column("rank")
    tilted = head_sensitivity(model, TEXTS, tokenizer=tok)
    # a first-order term strongly negative for head (0, 0) at every rank below full
    A_Q, A_K = result.bases(0, 0)
    scale = 1e3 * float(np.abs(tilted.query_gradient).max()) + 1.0
    tilted.query_gradient[:, 0, 0] += scale * np.linalg.inv(A_Q).T @ np.linalg.inv(A_K)
    taylor = plan_ranks(result, budget=0.5, method="data", allocation="taylor",
                        sensitivity=tilted).column("rank")
    assert taylor[0] == 0 < fisher[0]
    assert tilted.first_order_reliability(result) > 0.99


def test_taylor_bad_input(measured):
    kind, model, tok, result, sens = measured
    with pytest.raises(ValueError, match="needs `sensitivity`"):
        plan_ranks(result, budget=0.5, method="data", allocation="taylor")
    with pytest.raises(ValueError, match="'data' or 'weight'"):
        plan_ranks(result, budget=0.5, method="trained", allocation="taylor",
                   sensitivity=sens)
    with pytest.raises(ValueError, match="budget"):
        plan_ranks(result, eps=0.1, method="data", allocation="taylor", sensitivity=sens)
    drawn = head_sensitivity(model, TEXTS, tokenizer=tok, labels="model")
    with pytest.raises(ValueError, match="labels='data'"):
        plan_ranks(result, budget=0.5, method="data", allocation="taylor", sensitivity=drawn)
    with pytest.raises(ValueError, match="no 'weight' forms"):
        result.bases(0, 0, "weight")


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 3), st.integers(1, 4), st.data())
def test_spending_greedy_is_optimal_on_convex_prices(n_heads, d_h, data):
    """Separable convex prices (of any sign): the greedy's total is the exhaustive minimum."""
    units = data.draw(st.integers(0, n_heads * d_h))
    steps = data.draw(st.lists(st.lists(st.floats(-2.0, 2.0), min_size=d_h, max_size=d_h),
                               min_size=n_heads, max_size=n_heads))
    # a convex curve: increments sorted increasing
    price = np.array([np.concatenate([[0.0], np.cumsum(sorted(s))]) for s in steps])[None]
    ranks = _greedy(price, units, spend=True)
    assert ranks.sum() == units
    best = min(sum(price[0, h, r] for h, r in enumerate(combo))
               for combo in itertools.product(range(d_h + 1), repeat=n_heads)
               if sum(combo) == units)
    got = sum(price[0, h, r] for h, r in enumerate(ranks[0]))
    assert got == pytest.approx(best, abs=1e-9)
