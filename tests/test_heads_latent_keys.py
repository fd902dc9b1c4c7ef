"""Latent keys: any subspace of the rotated keys, cached at the width the planes would take.

Tiny random LLaMA (grouped keys), Qwen2 (query and key biases) and Gemma 3 (normalised heads,
a sliding layer) models are compressed with ``form="latent"`` (a latent per key head) and
``form="latent-shared"`` (one per layer, reading every key head), written, and loaded in a
fresh interpreter: their ``generate()`` is the in-memory model's, the key cache holds the latent
channels only, every original weight is kept bit for bit beside the two maps per layer, and
keeping every channel is the original. The fitted maps are the best of their rank in the
metric they are fitted in (no plane selection beats them there).
"""

import json

import numpy as np
import pytest
from test_heads_shrink import PROMPT, TEXTS, _model, _reload

from sklearn_ebound.heads import compress_model, load_pretrained
from sklearn_ebound.heads._head_forms import layers_of
from sklearn_ebound.heads._latent_keys import (
    latent_channels,
    latent_maps,
    latent_widths,
    shared_widths,
)
from sklearn_ebound.heads._shrink import shrunk_model

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

CASES = [("llama", torch.float32, "latent"), ("llama", torch.bfloat16, "latent"),
         ("qwen2", torch.float32, "latent"), ("gemma3", torch.float32, "latent"),
         ("llama", torch.float32, "latent-shared"), ("qwen2", torch.bfloat16, "latent-shared"),
         ("gemma3", torch.float32, "latent-shared"), ("qwen3", torch.float32, "latent-shared"),
         ("qwen3_moe", torch.float32, "latent")]


def _name(kind, dtype, form):
    return f"{kind}-{str(dtype).split('.')[-1]}-{form}"


@pytest.fixture(scope="module")
def written(tmp_path_factory, word_tokenizer):
    tmp = tmp_path_factory.mktemp("latent")
    runs, cases = {}, []
    for case in CASES:
        model = _model(*case[:2])
        compressed, report = compress_model(model, TEXTS, tokenizer=word_tokenizer(60),
                                            budget=0.5, form=case[2], max_length=16,
                                            out=tmp / _name(*case))
        runs[_name(*case)] = (model, compressed, report)
        cases.append((_name(*case), str(tmp / _name(*case)), "AutoModelForCausalLM"))
    return runs, _reload(cases, tmp)


@pytest.mark.parametrize(("kind", "dtype", "form"), CASES)
def test_latent_keys_reload_with_the_latent_widths(written, kind, dtype, form):
    runs, reloaded = written
    model, compressed, report = runs[_name(kind, dtype, form)]
    got = reloaded[_name(kind, dtype, form)]
    assert got["class"] == "Kept" + type(model).__name__
    # the stock class would load the whole projections, ignore the maps and run the original
    assert "trust_remote_code=True" in got["untrusted"]
    assert got["dtypes"] == [str(dtype)]
    assert report.form == form and not report.fit_planes
    # a latent key head per key head, or one per layer reading both key heads
    share = 2 if form == "latent-shared" else 1
    assert all(len(entry["key"]) == 2 // share for entry in report.channels)
    widths = [sum(len(c) for c in entry["key"]) for entry in report.channels]
    assert report.key_cache_channels["compressed"] == sum(widths)
    assert 0 < sum(widths) < report.key_cache_channels["original"]
    # the projections whole, and d_h numbers per latent channel of every key head's query
    # map (one for its query heads) and per key head a latent key channel reads
    d_h = layers_of(model)[1][0].head_dim
    assert report.qk_parameters["compressed"] == report.qk_parameters["original"] + d_h * (
        2 * share * sum(widths))
    original, state = model.state_dict(), got["state"]
    for key, value in original.items():  # every original weight, bit for bit
        assert np.array_equal(np.asarray(state[key]), value.float().numpy()), key
    assert sorted(set(state) - set(original)) == sorted(
        f"model.layers.{i}.self_attn.{m}" for i in range(2) for m in ("key_map", "query_map"))
    key_map = np.asarray(state["model.layers.0.self_attn.key_map"])
    assert key_map.shape == (widths[0], share * d_h)
    assert np.asarray(state["model.layers.0.self_attn.query_map"]).shape == (share * widths[0],
                                                                            d_h)
    assert np.count_nonzero(key_map) > widths[0]  # not a selection of channels
    ids = torch.tensor(PROMPT)
    with torch.no_grad():
        run = compressed(ids, use_cache=True)
        stock = model(ids, use_cache=True).past_key_values.layers
        generated = compressed.generate(ids, max_new_tokens=5, do_sample=False,
                                        pad_token_id=0).tolist()
    lengths = [layer.keys.shape[2] for layer in stock]  # a sliding layer keeps its window
    assert got["cache"] == [[1, 1, m, w] for m, w in zip(lengths, widths, strict=True)]
    assert got["values"] == [list(layer.values.shape) for layer in stock]
    assert got["generated"] == generated
    tolerance = 1e-4 if dtype == torch.float32 else 0.1
    np.testing.assert_allclose(np.asarray(got["logits"]), run.logits.float().numpy(),
                               atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("kind", ["llama", "qwen2", "gemma3", "qwen3"])
def test_latent_keys_of_every_channel_are_the_original(kind, shared, word_tokenizer):
    model = _model(kind)
    layers = layers_of(model)[1]
    widths = {layer.index: [layer.n_kv_heads * layer.head_dim] if shared else
              [layer.head_dim] * layer.n_kv_heads for layer in layers}
    maps = latent_maps(model, widths, TEXTS, tokenizer=word_tokenizer(60), max_length=16)
    shrunk = shrunk_model(model, latent_channels(model, widths), latent=maps)
    ids = torch.tensor(PROMPT)
    with torch.no_grad():
        np.testing.assert_allclose(shrunk(ids).logits.numpy(), model(ids).logits.numpy(),
                                   atol=1e-4, rtol=1e-4)
    # and fewer channels change the logits
    half = {i: [w // 2 for w in ws] for i, ws in widths.items()}
    maps = latent_maps(model, half, TEXTS, tokenizer=word_tokenizer(60), max_length=16)
    shrunk = shrunk_model(model, latent_channels(model, half), latent=maps)
    with torch.no_grad():
        assert not torch.allclose(shrunk(ids).logits, model(ids).logits, atol=1e-3)


@pytest.mark.parametrize("kind", ["llama", "gemma3"])
@pytest.mark.parametrize("shares", [(12, 10), (5, 0, 8, 3)])
def test_the_query_map_on_the_keys_is_the_query_map_on_the_queries(kind, shares,
                                                                  word_tokenizer):
    # Several queries may meet the latent keys expanded by each key head's query map (the
    # fused kernel at the values' width) instead of mapped queries: the same logits, with
    # and without a padding mask, for a shared latent wider than a head (one per layer) and
    # latents per key head of unequal widths (one of them 0)
    model = _model(kind)
    layers = layers_of(model)[1]
    widths = {layer.index: [shares[layer.index]] if len(shares) == 2 else
              list(shares[2 * layer.index:2 * layer.index + 2]) for layer in layers}
    maps = latent_maps(model, widths, TEXTS, tokenizer=word_tokenizer(60), max_length=16)
    shrunk = shrunk_model(model, latent_channels(model, widths), latent=maps)
    model.set_attn_implementation("sdpa")
    ids = torch.tensor([[0, 0, 3, 17, 5, 29, 11, 8, 4, 9, 13], [3, 17, 5, 29, 11, 8, 4, 9,
                                                                 13, 21, 6]])
    mask = torch.tensor([[0, 0] + [1] * 9, [1] * 11])
    kept = [shrunk.model.layers[layer.index].self_attn.kept for layer in layers]
    runs = {}
    for expand in (False, True, None):
        for channels in kept:
            channels.expand = expand
        with torch.no_grad():
            runs[expand] = (shrunk(ids, attention_mask=mask).logits[mask.bool()],
                            shrunk(ids[1:]).logits)
    for ours, theirs in zip(runs[True], runs[False], strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    # the rule: a prompt pass over grouped keys expands (fewer key heads than query heads
    # to map), a decoding step does not; without groups only a latent wider than a head
    head_dim = layers[0].head_dim
    for channels, layer in zip(kept, layers, strict=True):
        channels.expand = None
        wide = max(widths[layer.index]) > head_dim
        assert channels._expands(500, 500, layer.n_kv_heads, head_dim)
        assert channels._expands(500, 500, layer.n_heads, head_dim) == wide
        assert not channels._expands(1, 500, layer.n_kv_heads, head_dim)


def test_a_static_cache_is_refused_by_name(word_tokenizer):
    # transformers' static cache preallocates keys of the values' shape: the kept widths do
    # not fit it, and the error says which cache to use instead of failing in a copy
    model = _model("llama")
    widths = {layer.index: [6, 4] for layer in layers_of(model)[1]}
    maps = latent_maps(model, widths, TEXTS, tokenizer=word_tokenizer(60), max_length=16)
    shrunk = shrunk_model(model, latent_channels(model, widths), latent=maps)
    ids = torch.tensor(PROMPT)
    with pytest.raises(ValueError, match=r"StaticLayer holds keys and values of one shape"):
        shrunk.generate(ids, max_new_tokens=2, do_sample=False, pad_token_id=0,
                        cache_implementation="static")
    dynamic = shrunk.generate(ids, max_new_tokens=2, do_sample=False, pad_token_id=0)
    assert dynamic.shape == (1, len(PROMPT[0]) + 2)


def _error(cq, ck, a, b):
    """``E (q^T (I - B^T A) k)^2`` for independent ``q``, ``k`` of second moments ``cq``,
    ``ck``."""
    m = np.eye(len(ck)) - b.T @ a
    return np.trace(m.T @ cq @ m @ ck)


@pytest.mark.parametrize("seed", range(5))
def test_fitted_maps_beat_every_selection_of_planes(seed):
    # Eckart-Young in the fitted metric: no choice of whole planes (the planes' own best
    # query map) comes below the latent maps of the same width
    from sklearn_ebound.heads._latent_keys import _top_maps, _whitened

    rng = np.random.RandomState(seed)
    d_h, width = 8, 4
    x, y = rng.randn(200, d_h) * rng.gamma(1, size=d_h), rng.randn(200, d_h) @ rng.randn(d_h,
                                                                                        d_h)
    cq, ck = x.T @ x / 200, y.T @ y / 200
    a, b = _top_maps(_whitened(cq, ck), width)
    assert a.shape == b.shape == (width, d_h)
    best = _error(cq, ck, a, b)
    half = d_h // 2
    for first in range(half):
        for second in range(first + 1, half):
            rows = np.eye(d_h)[[first, second, first + half, second + half]]
            b_planes = (ck @ rows.T @ np.linalg.inv(rows @ ck @ rows.T)).T
            assert best <= _error(cq, ck, rows, b_planes) + 1e-9
    a, b = _top_maps(_whitened(cq, ck), d_h)  # every channel: the identity
    np.testing.assert_allclose(b.T @ a, np.eye(d_h), atol=1e-8)


def test_latent_keys_are_refused_where_they_do_not_apply(word_tokenizer):
    tok = word_tokenizer(60)
    with pytest.raises(ValueError, match="form of rotary heads"):
        compress_model(_model("bert"), TEXTS, tokenizer=tok, form="latent", train_steps=0,
                       refine="none", refit="none", max_length=16)
    with pytest.raises(ValueError, match="no trained pairs"):
        compress_model(_model("llama"), TEXTS, tokenizer=tok, form="latent", refine="distill",
                       max_length=16)
    model = _model("llama")
    with pytest.raises(ValueError, match="a width in 0..8"):
        latent_channels(model, {0: [4, 9], 1: [4, 4]})
    with pytest.raises(ValueError, match="dividing its 2 key heads"):
        latent_channels(model, {0: [4, 4, 4], 1: [4, 4]})
    with pytest.raises(ValueError, match="a width in 0..16"):  # one latent reads both
        latent_channels(model, {0: [17], 1: [4, 4]})
    assert latent_widths({0: [[0, 2], []]}) == {0: [4, 0]}
    assert shared_widths({0: [[0, 2], [1]]}) == {0: [6]}


def test_a_written_directory_is_not_read_as_its_stock_class(tmp_path, word_tokenizer):
    # the stock class would load the whole projections, ignore the maps and run the original
    compress_model(_model("llama"), TEXTS, tokenizer=word_tokenizer(60), budget=0.5,
                   form="latent", max_length=16, out=tmp_path)
    with pytest.raises(ValueError, match="holds a model of its own code"):
        load_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["model_type"] = "llama"  # as the package wrote it before its own model type
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="holds a model of its own code"):
        load_pretrained(tmp_path)


def test_projection_of_heads_of_unequal_widths():
    # each kept entry is its row dotted with its own head's channels, heads of width 0
    # included; rows that take a gradient are not kept between calls
    from sklearn_ebound.heads._shrunk_modeling import KeptChannels

    widths = [3, 0, 5]
    kept = KeptChannels([list(range(w)) for w in widths], [list(range(w)) for w in widths], 6,
                        rotary=False)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 3, 6, generator=generator)
    rows = torch.randn(8, 6, generator=generator, requires_grad=True)
    heads = [0, 0, 0, 2, 2, 2, 2, 2]
    expected = torch.stack([x[..., h, :] @ rows[i] for i, h in enumerate(heads)], -1)
    got = kept.project(x, rows, "k")
    torch.testing.assert_close(got, expected)
    got.sum().backward()
    assert rows.grad is not None and not any(k[0] == "padded" for k in kept._tables)
    with torch.no_grad():
        torch.testing.assert_close(kept.project(x, rows, "k"), expected)
        rows.mul_(2.0)  # a changed map is read again
        torch.testing.assert_close(kept.project(x, rows, "k"), 2 * expected)
    # a map kept from a call without gradients still takes one when it is trained
    rows.grad = None
    kept.project(x, rows, "k").sum().backward()
    assert rows.grad is not None and rows.grad.abs().sum() > 0


def test_query_heads_of_a_group_share_their_key_head_map():
    # one block of rows per key head, read by each of its query heads (widths 3, 0, 2)
    from sklearn_ebound.heads._shrunk_modeling import KeptChannels

    widths, group = [3, 0, 2], 2
    query = [list(range(w)) for w in widths for _ in range(group)]
    kept = KeptChannels(query, [list(range(w)) for w in widths], 4, rotary=False)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 6, 4, generator=generator)
    rows = torch.randn(5, 4, generator=generator)
    block = [[0, 1, 2], [], [3, 4]]
    expected = torch.stack([x[..., h, :] @ rows[i] for h in range(6)
                            for i in block[h // group]], -1)
    torch.testing.assert_close(kept.project(x, rows, "q", group), expected)


@pytest.mark.parametrize(("kind", "kv_heads", "form"), [
    ("bert", 4, "shrunk"), ("gpt2", 4, "shrunk"), ("llama", 2, "latent-shared"),
    ("gemma3", 2, "latent-shared"), ("qwen3", 2, "latent-shared"), ("llama", 1, "latent")])
def test_auto_form_follows_what_the_heads_compute(kind, kv_heads, form):
    from sklearn_ebound.heads._workflow import _resolve_form

    model = _model(kind)
    if kv_heads == 1:  # the tiny LLaMA with one key head per layer
        config = model.config
        config.num_key_value_heads = 1
        model = transformers.LlamaForCausalLM(config)
    assert _resolve_form("auto", model) == form
    assert _resolve_form("query", model) == "query"


@pytest.mark.parametrize("seed", range(5))
def test_shared_latent_beats_a_latent_per_key_head_of_the_same_width(seed):
    # a latent per key head is one candidate of the shared latent (its maps block-diagonal),
    # so in the fitted metric, sum_h E (q_h^T (E_g - B_h^T A) k)^2 / tr(C_q,h C_k,g) over all
    # the layer's keys k, the shared maps are never worse; at the keys' whole width they are
    # exact; and pooling the widths over the latent key heads never loses either
    from types import SimpleNamespace

    from sklearn_ebound.heads._latent_keys import _layer_maps, _pooled, _problems, _whitened

    rng = np.random.RandomState(seed)
    layer = SimpleNamespace(index=0, head_dim=4, n_heads=4, n_kv_heads=2)
    n, d_h, group = 300, 4, 2
    q = rng.randn(4, n, d_h) @ rng.randn(4, d_h, d_h)
    shared = rng.randn(n, 3)  # what the two key heads have in common
    k = np.stack([shared @ rng.randn(3, d_h) + 0.3 * rng.randn(n, d_h) for _ in range(2)])
    cq = torch.from_numpy(np.einsum("htc,hte->hce", q, q))
    joint = k.transpose(1, 0, 2).reshape(1, n, 2 * d_h)
    solved = {count: [_whitened(*p) for p in _problems(
        layer, count, cq, torch.from_numpy(np.einsum("gtc,gte->gce", keys, keys)),
        torch.from_numpy(keys.sum(1)), n, {})] for count, keys in ((2, k), (1, joint))}
    centred = joint[0] - joint[0].mean(0)
    c_k = centred.T @ centred / n

    def error(query_map, key_map, widths):
        total, start = 0.0, np.cumsum([0, *widths])
        latent = [g // (2 // len(widths)) for g in range(2)]  # each key head's latent
        q_start = np.cumsum([0, *(widths[s] for s in latent)])
        assert len(query_map) == q_start[-1]  # one map per key head, shared by its queries
        for h in range(4):
            g = h // group
            s = latent[g]
            b = query_map[q_start[g]:q_start[g + 1]]
            product = np.zeros((d_h, 2 * d_h))  # B_h^T A, placed at the keys it reads
            rows = key_map[start[s]:start[s + 1]]
            if len(widths) == 2:
                product[:, g * d_h:(g + 1) * d_h] = b.T @ rows
            else:
                product[:] = b.T @ rows
            m = np.eye(2 * d_h)[g * d_h:(g + 1) * d_h] - product
            c_q = q[h].T @ q[h] / n
            block = c_k[g * d_h:(g + 1) * d_h, g * d_h:(g + 1) * d_h]
            total += np.trace(m.T @ c_q @ m @ c_k) / np.trace(c_q @ block)
        return total

    for width in (1, 2, 3):
        per_head = error(*_layer_maps(layer, [width, width], solved[2]), [width, width])
        together = _layer_maps(layer, [2 * width], solved[1])
        assert together[1].shape == (2 * width, 2 * d_h)
        assert error(*together, [2 * width]) <= per_head * (1 + 1e-9)
        pooled = _pooled([layer], {0: [width, width]}, {0: solved[2]})[0]
        assert sum(pooled) == 2 * width
        assert error(*_layer_maps(layer, pooled, solved[2]), pooled) <= per_head * (1 + 1e-9)
    assert error(*_layer_maps(layer, [2 * d_h], solved[1]), [2 * d_h]) < 1e-8
