"""Forms that shrink, written as a directory plain transformers loads in a fresh process.

For tiny random LLaMA (grouped keys), Qwen2 (query and key biases), GPT-2 and BERT models:
:func:`compress_model` writes the compressed model with query and key projections of the
kept widths; a new interpreter loads it with ``trust_remote_code=True``; its ``generate()``
is the in-memory compressed model's, its key cache has the kept widths, every other weight
is the original's bit for bit, in the original's dtype; keeping every channel reproduces the
original. A tiny random Gemma 3 (a sliding and a global layer, two rotary bases, its own
logit scale, query and key gains far from one) likewise, its projections and norms written
whole: only the kept channels of its normalised heads enter the logits and the cache, and its
planes are priced and fitted on the normalised queries and keys.
"""

import json
import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from sklearn_ebound.heads import compress_model, docstring_sentences, next_token_kl, plan_ranks
from sklearn_ebound.heads._compression import distill_compressed
from sklearn_ebound.heads._shrink import (
    channel_masks,
    fold_plane_maps,
    kept_channels,
    plane_maps,
    plane_plan,
    save_shrunk,
    shrunk_model,
    zero_dropped,
)

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

TEXTS = [s for s in docstring_sentences(["json", "textwrap"]) if len(s.split()) >= 5][:16]
PROMPT = [[3, 17, 5, 29, 11, 8]]
QK = (".q_proj.", ".k_proj.", ".query.", ".key.", ".c_attn.")
NORMALISED = ("gemma3", "qwen3")  # heads normalised before the rotation: projections whole


def _model(kind, dtype=torch.float32):
    torch.manual_seed(0)
    if kind == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            vocab_size=60, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=32, num_hidden_layers=2, rope_theta=500.0))
    elif kind == "qwen2":
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
            vocab_size=60, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=32, num_hidden_layers=2, rope_theta=500.0))
    elif kind == "gemma3":
        model = transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(
            vocab_size=60, hidden_size=32, intermediate_size=32, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=8,
            sliding_window=3, layer_types=["sliding_attention", "full_attention"],
            rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 50.0},
                             "full_attention": {"rope_type": "default",
                                                "rope_theta": 5000.0}},
            attn_implementation="eager", tie_word_embeddings=False))
    elif kind == "qwen3":  # normalised heads with the gains themselves, biases, a window
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(
            vocab_size=60, hidden_size=32, intermediate_size=32, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=8, attention_bias=True,
            use_sliding_window=True, sliding_window=3, max_window_layers=1,
            rope_parameters={"rope_type": "default", "rope_theta": 500.0},
            attn_implementation="eager", tie_word_embeddings=False))
    elif kind == "qwen3_moe":  # Qwen 3's attention before a mixture of experts
        model = transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(
            vocab_size=60, hidden_size=32, intermediate_size=32, moe_intermediate_size=16,
            num_experts=4, num_experts_per_tok=2, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=8,
            attn_implementation="eager", tie_word_embeddings=False))
    elif kind == "gpt2":
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=60, n_embd=32, n_head=4, n_layer=2, n_positions=64))
    else:
        model = transformers.BertModel(transformers.BertConfig(
            vocab_size=60, hidden_size=32, num_attention_heads=4, intermediate_size=32,
            num_hidden_layers=2))
    with torch.no_grad():  # attention far from uniform, biases that count
        for name, parameter in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight", "query.weight", "key.weight",
                              "c_attn.weight")):
                parameter.mul_(8.0)
            if name.endswith(("q_proj.bias", "k_proj.bias")):
                parameter.normal_(0.0, 0.5)
            if name.endswith(("q_norm.weight", "k_norm.weight")):  # gains in (0.2, 4)
                parameter.uniform_(-0.8, 3.0) if kind == "gemma3" else parameter.uniform_(
                    0.2, 4.0)
    return model.to(dtype).eval()


def _compress(kind, dtype, tmp, word_tokenizer, budget=0.5):
    model = _model(kind, dtype)
    options = dict(train_steps=0, refine="none", refit="none") if kind == "bert" else {}
    compressed, report = compress_model(model, TEXTS, tokenizer=word_tokenizer(60),
                                        budget=budget, out=tmp, max_length=16, form="shrunk",
                                        **options)
    return model, compressed, report


_RELOAD = textwrap.dedent("""
    import json, sys, torch, transformers
    torch.manual_seed(0)
    out = {}
    for name, path, auto in json.loads(sys.argv[1]):
        try:  # the stock class would ignore what the compression wrote
            getattr(transformers, auto).from_pretrained(path, trust_remote_code=False)
            untrusted = "loaded"
        except ValueError as error:
            untrusted = str(error)
        model = getattr(transformers, auto).from_pretrained(path, trust_remote_code=True)
        model.eval()
        ids = torch.tensor(%r)
        entry = {"class": type(model).__name__, "untrusted": untrusted,
                 "model_type": model.config.model_type,
                 "config": json.loads(model.config.to_json_string(use_diff=False)),
                 "dtypes": sorted({str(p.dtype) for p in model.parameters()}),
                 "state": {k: v.float().tolist() for k, v in model.state_dict().items()}}
        with torch.no_grad():
            run = model(ids, use_cache=auto != "AutoModel")
        if auto == "AutoModelForCausalLM":
            entry["cache"] = [list(layer.keys.shape) for layer in run.past_key_values.layers]
            entry["values"] = [list(layer.values.shape) for layer in run.past_key_values.layers]
            entry["generated"] = model.generate(ids, max_new_tokens=5, do_sample=False,
                                                pad_token_id=0).tolist()
            entry["logits"] = run.logits.float().tolist()
        else:
            entry["hidden"] = run.last_hidden_state.float().tolist()
        out[name] = entry
    print(json.dumps(out))
""") % (PROMPT,)


def _reload(cases, tmp_path):
    """Load every ``(name, directory, auto class)`` in one fresh interpreter."""
    env = dict(os.environ, HF_MODULES_CACHE=str(tmp_path / "modules"),
               TRANSFORMERS_VERBOSITY="error", OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", _RELOAD, json.dumps(cases)], env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def _widths(channels):
    return [sum(len(c) for c in entry["key"]) for entry in channels]


CASES = [("llama", torch.float32), ("llama", torch.bfloat16), ("qwen2", torch.float32),
         ("gpt2", torch.float32), ("gpt2", torch.float16), ("bert", torch.float32),
         ("gemma3", torch.float32), ("gemma3", torch.bfloat16), ("qwen3", torch.float32)]


@pytest.fixture(scope="module")
def written(tmp_path_factory, word_tokenizer):
    tmp = tmp_path_factory.mktemp("shrunk")
    runs, cases = {}, []
    for kind, dtype in CASES:
        name = f"{kind}-{str(dtype).split('.')[-1]}"
        model, compressed, report = _compress(kind, dtype, tmp / name, word_tokenizer)
        runs[name] = (model, compressed, report)
        cases.append((name, str(tmp / name),
                      "AutoModel" if kind == "bert" else "AutoModelForCausalLM"))
    return runs, _reload(cases, tmp)


@pytest.mark.parametrize(("kind", "dtype"), CASES)
def test_written_model_reloads_with_the_kept_widths(written, kind, dtype):
    runs, reloaded = written
    name = f"{kind}-{str(dtype).split('.')[-1]}"
    model, compressed, report = runs[name]
    got = reloaded[name]
    # the stock class's name with kept channels, in the original's dtype, under a model
    # type of its own: without the written modeling file transformers refuses the directory
    assert got["class"] == "Kept" + type(model).__name__
    assert got["model_type"] == "kept_" + model.config.model_type
    assert "trust_remote_code=True" in got["untrusted"]
    stock = json.loads(model.config.to_json_string(use_diff=False))
    lost = {k: v for k, v in stock.items() if got["config"].get(k) != v}
    assert set(lost) <= {"model_type", "architectures", "transformers_version", "dtype",
                         "_name_or_path"}, lost  # the class's, the load's, the version's
    assert got["dtypes"] == [str(dtype)]
    widths = _widths(report.channels)
    assert report.key_cache_channels["compressed"] == sum(widths)
    full = report.key_cache_channels["original"]
    assert sum(widths) < full
    normalised = kind in NORMALISED
    if normalised:  # projections whole, and two numbers (a, b) per kept query channel
        assert report.qk_parameters["compressed"] == report.qk_parameters["original"] + 2 * sum(
            len(c) for entry in report.channels for c in entry["query"])
    else:
        assert report.qk_parameters["compressed"] < report.qk_parameters["original"]
    # every weight but the query and key maps is the original's, bit for bit; for Gemma 3
    # the query and key projections and their norms too (the kept channels are taken after
    # the norm), the written attention adding only its q_turn
    original = model.state_dict()
    state = got["state"]
    for key, value in original.items():
        if any(part in key for part in QK) and not normalised:
            continue
        assert np.array_equal(np.asarray(state[key]), value.float().numpy()), key
    if normalised:
        assert sorted(set(state) - set(original)) == [
            f"model.layers.{i}.self_attn.q_turn" for i in range(2)]
        turn = np.asarray(state["model.layers.0.self_attn.q_turn"])
        assert turn.shape == (2, 2 * widths[0]) and np.any(turn[1] != 0)  # the fitted maps
    if kind == "gpt2":  # the fused map's value columns are the original's too
        d = model.config.n_embd
        for i in range(len(report.channels)):
            w = original[f"transformer.h.{i}.attn.c_attn.weight"].float().numpy()
            kept = np.asarray(state[f"transformer.h.{i}.attn.c_attn.weight"])
            assert kept.shape[1] == 2 * widths[i] + d
            assert np.array_equal(kept[:, -d:], w[:, 2 * d:])
    ids = torch.tensor(PROMPT)
    with torch.no_grad():
        if kind == "bert":
            mine = compressed(ids).last_hidden_state.float().numpy()
            np.testing.assert_allclose(np.asarray(got["hidden"]), mine, atol=1e-5, rtol=1e-5)
            return
        run = compressed(ids, use_cache=True)
        stock = model(ids, use_cache=True).past_key_values.layers
        generated = compressed.generate(ids, max_new_tokens=5, do_sample=False,
                                        pad_token_id=0).tolist()
    # the key cache holds the kept channels only, as many tokens as the original's (a
    # sliding layer's window); the values keep their shape
    lengths = [layer.keys.shape[2] for layer in stock]
    assert got["cache"] == [[1, 1, m, w] for m, w in zip(lengths, widths, strict=True)]
    if normalised:  # a sliding layer keeps its window, a full one every token
        assert lengths == [model.config.sliding_window - 1 if t == "sliding_attention"
                           else len(PROMPT[0]) for t in model.config.layer_types]
        assert sorted(model.config.layer_types) == ["full_attention", "sliding_attention"]
    assert got["values"] == [list(layer.values.shape) for layer in run.past_key_values.layers]
    assert got["generated"] == generated
    tolerance = 1e-4 if dtype == torch.float32 else 0.1
    np.testing.assert_allclose(np.asarray(got["logits"]), run.logits.float().numpy(),
                               atol=tolerance, rtol=tolerance)


def test_rotary_planes_are_whole_shared_by_the_group_and_within_the_budget(written):
    runs, _ = written
    model, _, report = runs["llama-float32"]
    d_h = model.config.hidden_size // model.config.num_attention_heads
    half = d_h // 2
    planned = int(report.plan.column("rank").sum())
    kept = 0
    for entry in report.channels:
        assert len(entry["key"]) == 2 and len(entry["query"]) == 4
        for h, channels in enumerate(entry["query"]):
            assert channels == entry["key"][h // 2]  # the group's key planes
        for channels in entry["key"]:
            firsts = [c for c in channels if c < half]
            assert sorted(c - half for c in channels if c >= half) == firsts
            kept += 2 * len(firsts) * 2  # planes x 2 channels x 2 query heads
    assert kept <= planned
    assert report.form == "shrunk" and report.language_model


@pytest.mark.parametrize("kind", ["llama", "qwen2", "gpt2", "bert", "gemma3", "qwen3"])
def test_keeping_every_channel_is_the_original(kind, tmp_path, word_tokenizer):
    model = _model(kind)
    if model.config.model_type in ("llama", "qwen2", "gemma3_text", "qwen3"):
        half = model.config.hidden_size // model.config.num_attention_heads // 2
        planes = {i: [list(range(half))] * 2 for i in range(2)}
        channels = kept_channels(model, planes=planes)
    else:
        channels = kept_channels(model)
    shrunk = save_shrunk(model, channels, tmp_path / "full")
    ids = torch.tensor(PROMPT)
    with torch.no_grad():
        a, b = model(ids), shrunk(ids)
    key = "last_hidden_state" if kind == "bert" else "logits"
    np.testing.assert_allclose(getattr(b, key).numpy(), getattr(a, key).numpy(), atol=1e-5,
                               rtol=1e-5)


def test_only_a_model_whose_dropped_channels_are_zero_is_written(tmp_path):
    # writing the kept channels of a model that still uses the others would change it
    model = _model("llama")
    channels = kept_channels(model, planes={i: [[0, 2], [1]] for i in range(2)})
    with pytest.raises(ValueError, match="drops is not zero"):
        save_shrunk(model, channels, tmp_path / "bad")
    zeroed = zero_dropped(model, channels)
    shrunk = save_shrunk(zeroed, channels, tmp_path / "good")
    ids = torch.tensor(PROMPT)
    with torch.no_grad():
        np.testing.assert_allclose(shrunk(ids).logits.numpy(), zeroed(ids).logits.numpy(),
                                   atol=1e-5, rtol=1e-5)
    assert shrunk.model.layers[0].self_attn.k_proj.weight.shape == (6, 32)  # 3 planes
    assert shrunk.model.layers[0].self_attn.q_proj.weight.shape == (4 + 4 + 2 + 2, 32)


def test_distillation_trains_the_kept_planes_only(tmp_path, word_tokenizer):
    # next-token distillation of a rotary shrunk form in the original's shapes moves the kept
    # query and key channels only (queries and the keys their group shares): the dropped
    # ones stay zero, every other weight is the shrunk form's, the model comes closer to the
    # original and save_shrunk writes it
    model, tok = _model("llama"), word_tokenizer(60)
    texts = [s for s in docstring_sentences(["json", "textwrap", "argparse"])
             if len(s.split()) >= 5][:40]
    channels = kept_channels(model, planes={i: [[0, 2], [1]] for i in range(2)})
    zeroed = zero_dropped(model, channels)
    before = {k: v.clone() for k, v in zeroed.state_dict().items()}
    distilled = distill_compressed(model, zeroed, None, texts, tokenizer=tok,
                                   channels=channels, objective="next_token", max_epochs=3,
                                   learning_rate=1e-2, batch_size=8, max_length=16)
    assert all(torch.equal(before[k], v) for k, v in zeroed.state_dict().items())
    kept, dropped = (channel_masks(model, channels, kept=k) for k in (True, False))
    assert set(kept) == {f"model.layers.{i}.self_attn.{p}_proj.weight"
                         for i in range(2) for p in "qk"}
    state = distilled.state_dict()
    for name, value in state.items():
        if name in kept:
            assert torch.all(value[dropped[name]] == 0), name
            assert torch.equal(value[~kept[name]], before[name][~kept[name]]), name
            assert not torch.equal(value[kept[name]], before[name][kept[name]]), name
        else:
            assert torch.equal(value, before[name]), name
    kl = [next_token_kl(model, m, texts, tok, max_length=16).mean_kl
          for m in (zeroed, distilled)]
    assert kl[1] < kl[0]
    shrunk = save_shrunk(distilled, channels, tmp_path / "distilled")
    ids = torch.tensor(PROMPT)
    with torch.no_grad():
        np.testing.assert_allclose(shrunk(ids).logits.numpy(), distilled(ids).logits.numpy(),
                                   atol=1e-5, rtol=1e-5)
    for bad, match in (("planes", "`channels` must be a list"),
                       ([{"layer": 0}], "`channels` must be a list")):
        with pytest.raises(ValueError, match=match):
            distill_compressed(model, zeroed, None, texts, tokenizer=tok, channels=bad)
    with pytest.raises(ValueError, match="drops is not zero"):  # not a shrunk form
        distill_compressed(model, model, None, texts, tokenizer=tok, channels=channels)
    gemma = _model("gemma3")
    gemma_channels = kept_channels(gemma, planes={i: [[0, 2], [1]] for i in range(2)})
    with pytest.raises(ValueError, match="normalises its heads"):
        distill_compressed(gemma, gemma, None, texts, tokenizer=tok, channels=gemma_channels)


def test_compress_model_distils_the_rotary_shrunk_form(tmp_path, word_tokenizer):
    # refine="distill": the same planes, their kept channels trained on the calibration half
    # (the measure on the other half says how it went); the written directory holds them
    model, tok = _model("llama"), word_tokenizer(60)
    texts = [s for s in docstring_sentences(["json", "textwrap", "argparse"])
             if len(s.split()) >= 5][:40]
    runs = {refine: compress_model(model, texts, tokenizer=tok, budget=0.5, max_length=16,
                                   refine=refine, form="shrunk", out=tmp_path / refine)
            for refine in ("none", "distill")}
    (plain, plain_report), (distilled, report) = runs.values()
    assert report.channels == plain_report.channels
    assert report.refine == "distill" and "distillation_" in vars(distilled)
    masks = channel_masks(model, report.channels)
    before, after = plain.state_dict(), distilled.state_dict()
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert moved and moved <= set(masks)
    written = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "distill",
                                                               trust_remote_code=True)
    ids = torch.tensor(PROMPT)
    with torch.no_grad():
        np.testing.assert_allclose(written(ids).logits.numpy(), distilled(ids).logits.numpy(),
                                   atol=1e-5, rtol=1e-5)


def test_plane_count_follows_the_plan(word_tokenizer):
    # key head g keeps ceil(mean rank of its query heads / 2) planes, fewer when that
    # overshoots the plan's total; the planes are the group's most used
    model = _model("llama")
    d_h = 8
    plan = {(i, h): r for i in range(2) for h, r in enumerate([6, 2, 8, 8])}
    planes = plane_plan(model, plan, TEXTS, tokenizer=word_tokenizer(60), max_length=16)
    counts = [[len(p) for p in planes[i]] for i in range(2)]
    # ceil(4 / 2) = 2 and ceil(8 / 2) = 4 planes: 2 * 2 * (2 + 4) = 24 = the plan's 24
    assert counts == [[2, 4], [2, 4]]
    assert all(max(p) < d_h // 2 for layer in planes.values() for p in layer if p)
    odd = {(i, h): r for i in range(2) for h, r in enumerate([3, 2, 1, 1])}
    planes = plane_plan(model, odd, TEXTS, tokenizer=word_tokenizer(60), max_length=16)
    kept = sum(2 * 2 * len(p) for layer in planes.values() for p in layer)
    assert kept <= sum(odd.values())
    assert math.isfinite(kept)


def test_planes_priced_by_their_share_of_the_logits(word_tokenizer):
    # planes 1 and 3 of key head 0 add nothing to its group's logits (their key channels are
    # zero): at two planes per key head, key head 0 keeps planes 0 and 2
    model = _model("llama")
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.k_proj.weight[[1, 5, 3, 7]] = 0.0
    plan = {(i, h): 4 for i in range(2) for h in range(4)}
    planes = plane_plan(model, plan, TEXTS, tokenizer=word_tokenizer(60), max_length=16)
    assert all(planes[i][0] == [0, 2] and len(planes[i][1]) == 2 for i in range(2))


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_plane_maps_make_up_for_the_dropped_planes(kind, word_tokenizer):
    # with every plane kept the fitted map is the identity; with planes dropped, the kept
    # planes' fitted scaled rotations bring the next-token distributions closer to the
    # original's on the calibration text
    model, tok = _model(kind), word_tokenizer(60)
    full = {i: [list(range(4))] * 2 for i in range(2)}
    for a, b in plane_maps(model, full, TEXTS, tokenizer=tok, max_length=16).values():
        np.testing.assert_allclose(a, 1.0, atol=1e-8)
        np.testing.assert_allclose(b, 0.0, atol=1e-8)
    planes = {i: [[0, 2], [1, 3]] for i in range(2)}
    channels = kept_channels(model, planes=planes)
    maps = plane_maps(model, planes, TEXTS, tokenizer=tok, max_length=16)
    assert all(len(a) == len(b) == 2 for a, b in maps.values())
    kept = zero_dropped(model, channels)
    fitted = fold_plane_maps(zero_dropped(model, channels), planes, maps)
    kl = [next_token_kl(model, m, TEXTS, tok, max_length=16).mean_kl for m in (kept, fitted)]
    assert kl[1] < kl[0]
    # the fold touches the kept query rows only: the keys and the dropped rows stay
    for name, value in fitted.state_dict().items():
        if "q_proj" not in name:
            assert torch.equal(value, kept.state_dict()[name]), name


def test_compress_model_checks_its_arguments(word_tokenizer):
    model = _model("gpt2")
    tok = word_tokenizer(60)
    for options, match in [({"budget": 1.5}, "`budget` must be"),
                           ({"eps": 0.0}, "`eps` must be"),
                           ({"budget": 0.5, "eps": 0.1}, "one of `budget` and `eps`"),
                           ({"allocation": "best"}, "`allocation` must be one of"),
                           ({"form": "small"}, "`form` must be one of"),
                           ({"train_steps": -1}, "`train_steps` must be"),
                           ({"refine": "more"}, "`refine` must be one of"),
                           ({"calibration": 1.0}, "`calibration` must be"),
                           ({"max_length": 0}, "`max_length` must be"),
                           ({"fit_planes": 1}, "`fit_planes` must be")]:
        with pytest.raises(ValueError, match=match):
            compress_model(model, TEXTS, tokenizer=tok, **options)
    with pytest.raises(ValueError, match="at least 4"):
        compress_model(model, TEXTS[:3], tokenizer=tok)
    with pytest.raises(ValueError, match="needs a causal language model"):
        compress_model(_model("bert"), TEXTS, tokenizer=tok, allocation="fisher")
    with pytest.raises(ValueError, match="no trained pairs"):
        compress_model(_model("llama"), TEXTS, tokenizer=tok, refine="sequential")
    with pytest.raises(ValueError, match="not for heads normalised"):
        compress_model(_model("gemma3"), TEXTS, tokenizer=tok, refine="distill")
    assert plan_ranks  # the plan's own checks are plan_ranks's


# --- Gemma 3: the planes of the normalised heads ------------------------------------------


def test_gemma3_planes_are_priced_on_the_normalised_keys(word_tokenizer):
    # k_norm's gains are zero on planes 1 and 3, so the normalised keys have nothing there,
    # while the projection's rows of planes 0 and 2 are a thousandth of the others: priced
    # on the projections the planes kept would be 1 and 3, on the normalised keys they are
    # 0 and 2 for both key heads
    model = _model("gemma3")
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.k_norm.weight[[1, 5, 3, 7]] = -1.0  # gain 1 + w = 0
            for g in range(2):
                layer.self_attn.k_proj.weight[[8 * g + c for c in (0, 4, 2, 6)]] *= 1e-3
    plan = {(i, h): 4 for i in range(2) for h in range(4)}
    planes = plane_plan(model, plan, TEXTS, tokenizer=word_tokenizer(60), max_length=16)
    assert planes == {i: [[0, 2], [0, 2]] for i in range(2)}


def test_gemma3_plane_maps_fit_under_the_model_s_own_attention(word_tokenizer, monkeypatch):
    # the attention the fit weighs by is the model's (norms, gains, its logit scale, the
    # sliding window, each layer's rotary base); every plane kept, the fit is the identity;
    # planes dropped, the fitted q_turn brings the next-token distributions closer
    from sklearn_ebound.heads import _shrink

    model, tok = _model("gemma3"), word_tokenizer(60)
    texts = TEXTS[:4]
    seen = []

    def recording(*args):
        out = attention(*args)
        seen.append(out[2])
        return out

    attention = _shrink._attention
    monkeypatch.setattr(_shrink, "_attention", recording)
    full = {i: [list(range(4))] * 2 for i in range(2)}
    for a, b in plane_maps(model, full, texts, tokenizer=tok, max_length=16).values():
        np.testing.assert_allclose(a, 1.0, atol=1e-8)
        np.testing.assert_allclose(b, 0.0, atol=1e-8)
    monkeypatch.setattr(_shrink, "_attention", attention)
    batch = tok(texts, max_length=16)
    with torch.no_grad():
        real = model(**batch, output_attentions=True).attentions
    valid = batch["attention_mask"].bool()
    assert len(seen) == 2 * 4  # one batch: layers, then heads in order
    for i, p in enumerate(seen):
        stock = real[i // 4][:, i % 4].double()
        np.testing.assert_allclose(p[valid].numpy(), stock[valid].numpy(), atol=1e-6)
    n = valid.shape[1]
    far = np.subtract.outer(np.arange(n), np.arange(n)) >= 3
    assert np.all(seen[0].numpy()[:, far] == 0) and np.any(seen[4].numpy()[:, far] > 0)
    # planes dropped: the fitted q_turn brings every layer's attention closer to the
    # original's (the KL divergence of each real query's attention, whose second-order term
    # the fit minimises; this random model's next-token distributions hardly depend on it)
    planes = {i: [[0, 2], [1, 3]] for i in range(2)}
    channels = kept_channels(model, planes=planes)
    maps = plane_maps(model, planes, TEXTS, tokenizer=tok, max_length=16)
    batch = tok(TEXTS, max_length=16)
    valid = batch["attention_mask"].bool()
    with torch.no_grad():
        original = model(**batch, output_attentions=True).attentions
        kl = []
        for m in (None, maps):
            kept = shrunk_model(model, channels, maps=m)(**batch, output_attentions=True)
            kl.append([float((p * (p.clamp_min(1e-30).log() - q.clamp_min(1e-30).log())).sum(
                -1).transpose(1, 2)[valid].mean()) for p, q in zip(
                original, kept.attentions, strict=True)])
    assert all(fitted < plain for plain, fitted in zip(*kl, strict=True)), kl


def test_gemma3_projections_are_not_cut_nor_folded(tmp_path):
    # zeroing a projection's rows, or folding a map into it, acts before the norm
    model = _model("gemma3")
    planes = {i: [[0, 2], [1]] for i in range(2)}
    channels = kept_channels(model, planes=planes)
    with pytest.raises(ValueError, match="normalises each query and key head"):
        zero_dropped(model, channels)
    maps = {(i, h): (np.ones(len(planes[i][h // 2])), np.zeros(len(planes[i][h // 2])))
            for i in range(2) for h in range(4)}
    with pytest.raises(ValueError, match="normalises each query and key head"):
        fold_plane_maps(model, planes, maps)
    shrunk = save_shrunk(model, channels, tmp_path / "kept", maps=maps)
    attention = shrunk.model.layers[0].self_attn
    assert attention.q_proj.weight.shape == (4 * 8, 32)  # whole
    assert attention.q_turn.shape == (2, 4 + 4 + 2 + 2)
    with pytest.raises(ValueError, match="folded into its query projection"):
        save_shrunk(_model("llama"), kept_channels(_model("llama"), planes=planes),
                    tmp_path / "llama", maps=maps)


@pytest.mark.parametrize("n", [5, 1])
@pytest.mark.parametrize("mask", ["float", "bool", "heads", "causal", None])
def test_fused_attention_equals_the_eager_one(mask, n):
    # torch's fused kernel (several queries) and the two matrix products of a decoding step
    # (one query) against the eager logits and softmax: key heads of unequal widths (one of
    # width 0: every key the logit 0), two queries a key head. Masks: a padded key masked out
    # of the first row (float or bool; "heads": bool, one per head, head 3 sees no last key);
    # "causal": none, in a causal block, whose queries see
    # the keys up to their own (of m > n keys the first n: an empty static cache's tail; one
    # query sees every key); None: none, in a block that is not causal
    from sklearn_ebound.heads._shrunk_modeling import KeptChannels

    kept = KeptChannels([[0, 1], [2, 3], [], [], [0, 2, 4, 6], [1, 3, 5, 7]],
                        [[0, 1], [], [0, 2, 4, 6]], head_dim=8, rotary=False)
    gen = torch.Generator().manual_seed(0)
    b, m = 2, 7
    query = torch.randn(b, n, kept.q_size, generator=gen)
    key = torch.randn(b, 1, m, kept.k_size, generator=gen)
    value = torch.randn(b, 3, m, 8, generator=gen)
    allowed = torch.ones(b, 1, n, m, dtype=torch.bool)
    allowed[0, ..., 0] = False
    allowed &= torch.ones(n, m, dtype=torch.bool).tril(m - n)
    per_head = allowed.expand(b, 6, n, m).clone()
    per_head[:, 3, :, -1] = False
    attention_mask = {"bool": allowed, None: None, "causal": None, "heads": per_head,
                      "float": torch.zeros(b, 1, n, m).masked_fill(
                          ~allowed, torch.finfo(torch.float32).min)}[mask]
    seen = {"bool": allowed[:, 0], "float": allowed[:, 0], "heads": allowed[:, 0],
            None: torch.ones(b, n, m),
            "causal": torch.ones(b, n, m) if n == 1 else torch.cat(
                [torch.ones(n, n).tril(), torch.zeros(n, m - n)], 1).expand(b, n, m)}[mask]
    options = {"is_causal": mask == "causal"}
    fused, none = kept.attention(query, key, value, attention_mask, 0.3, 0.0, False,
                                 weights=False, **options)
    eager, weights = kept.attention(query, key, value, attention_mask, 0.3, 0.0, False,
                                    weights=True, **options)
    assert none is None and weights.shape[:3] == (b, 6, n)
    torch.testing.assert_close(fused, eager, rtol=1e-5, atol=1e-6)
    seen = seen.float()
    # head 0: softmax(q . k * 0.3) over the keys it sees, of key head 0's channels 0, 1
    logits = (query[..., 0:2] @ key[:, 0, :, 0:2].transpose(1, 2)) * 0.3
    logits = logits.masked_fill(seen == 0, -torch.inf)
    torch.testing.assert_close(fused[..., 0:8], logits.softmax(-1) @ value[:, 0],
                               rtol=1e-5, atol=1e-6)
    # the width-0 key head's queries (heads 2 and 3) average the values they may see
    mean = (seen @ value[:, 1]) / seen.sum(-1, keepdim=True)
    torch.testing.assert_close(fused[..., 16:24], mean, rtol=1e-5, atol=1e-6)
    if mask == "heads":
        seen = per_head[:, 3].float()
        mean = (seen @ value[:, 1]) / seen.sum(-1, keepdim=True)
    torch.testing.assert_close(fused[..., 24:32], mean, rtol=1e-5, atol=1e-6)


def test_attention_weights_are_returned_when_asked(tmp_path):
    # the fused kernel returns no weights: output_attentions=True runs the eager attention
    model = _model("llama")
    channels = kept_channels(model, planes={i: [[0, 2], [1]] for i in range(2)})
    shrunk = shrunk_model(zero_dropped(model, channels), channels)
    with torch.no_grad():
        plain = shrunk(torch.tensor(PROMPT)).logits
        asked = shrunk(torch.tensor(PROMPT), output_attentions=True)
    assert len(asked.attentions) == 2 and all(a is not None for a in asked.attentions)
    assert asked.attentions[0].shape == (1, 4, 6, 6)
    torch.testing.assert_close(asked.logits, plain, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["llama", "gemma3", "qwen3", "gpt2", "bert"])
def test_kept_model_takes_the_eager_and_the_sdpa_masks(kind):
    # built on a model run eagerly, the kept model builds the stock eager masks (additive);
    # otherwise the SDPA ones (boolean, or none where causality alone says it): on a
    # left-padded batch both give the stock model's outputs at every real token, and the same
    # greedy continuation
    model = _model(kind)
    if kind in ("gpt2", "bert"):
        channels = kept_channels(model, plan={(i, h): 1 + h % 3 for i in range(2)
                                              for h in range(4)})
    else:
        channels = kept_channels(model, planes={i: [[0, 2], [1]] for i in range(2)})
    ids = torch.tensor([[0, 0, 3, 17, 5, 29], [3, 17, 5, 29, 11, 8]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1] * 6])
    real = mask.bool()
    outputs, continued = {}, {}
    for implementation in ("eager", "sdpa"):
        model.set_attn_implementation(implementation)
        stock = model if kind in NORMALISED else zero_dropped(model, channels)
        shrunk = shrunk_model(stock, channels)
        assert shrunk.config._attn_implementation == implementation
        with torch.no_grad():
            run = shrunk(ids, attention_mask=mask)
            out = run.last_hidden_state if kind == "bert" else run.logits
            outputs[implementation] = out[real]
            if kind not in NORMALISED:  # the stock model with the dropped channels zero
                expected = stock(ids, attention_mask=mask)
                expected = expected.last_hidden_state if kind == "bert" else expected.logits
                torch.testing.assert_close(out[real], expected[real], rtol=1e-5, atol=1e-5)
            if kind != "bert":
                continued[implementation] = shrunk.generate(
                    ids, attention_mask=mask, max_new_tokens=4, do_sample=False,
                    pad_token_id=0).tolist()
    torch.testing.assert_close(outputs["eager"], outputs["sdpa"], rtol=1e-5, atol=1e-5)
    assert continued.get("eager") == continued.get("sdpa")
