"""
================================================
Energy rank vs entropy rank under growing logits
================================================

Softmax distorts small singular values, and the entropy effective rank
``exp(H(p))``, ``p_i = s_i / sum_j s_j``, is sensitive to them: it moves with the logit scale
``beta``. The energy rank, the fewest singular values holding 99% of the energy, stays at
``r*_att`` at every scale. The energy rank is the estimator to use.

For softmax tasks at growing ``beta`` we train full-width attention from a small
initialisation and read the learned kernel's energy and entropy ranks side by side, together
with the entropy rank of the attention maps the kernel produces.
"""

# %%
import os

import matplotlib.pyplot as plt
import numpy as np
import torch
from scipy.special import softmax

from sklearn_ebound import energy_rank, entropy_rank
from sklearn_ebound.datasets import make_attention_task
from sklearn_ebound.display import SpectrumDisplay
from sklearn_ebound.nn import LowRankAttentionRegressor

torch.set_num_threads(1)  # tiny problems: one thread is fastest
SMALL = os.environ.get("EBOUND_EXAMPLE_SIZE") == "small"
betas = [0.5, 8.0] if SMALL else [0.5, 1.0, 2.0, 4.0, 8.0]
n_samples, n_tokens, n_features, r_star = 256, 8, 6, 2

rows = []
fig, ax = plt.subplots()
for beta in betas:
    X, Y = make_attention_task("softmax", n_samples, n_tokens, n_features, rank=r_star,
                               logit_scale=beta, noise=0.05, random_state=0)
    net = LowRankAttentionRegressor(attention="softmax", value="identity", logit_scale=beta,
                                    lr=0.05, max_epochs=150, batch_size=-1,
                                    random_state=0).fit(X, Y)
    s = np.linalg.svd(net.qk_kernel_, compute_uv=False)
    # The attention maps softmax(beta X W X^T / sqrt(d)) of the learned kernel.
    maps = softmax(beta * (X @ net.qk_kernel_ @ X.transpose(0, 2, 1)) / np.sqrt(n_features),
                   axis=-1)
    rows.append((beta, energy_rank(s), entropy_rank(s), float(np.mean(entropy_rank(maps)))))
    SpectrumDisplay.from_spectrum(s, threshold=None, ax=ax, name=f"beta={beta:g}",
                                  log_scale=True)

# %%
# Side by side
# ------------
print(" beta  energy rank  entropy rank (kernel)  entropy rank (attention maps)")
for beta, energy, entropy, maps_entropy in rows:
    print(f"{beta:5g}  {energy:11d}  {entropy:21.3f}  {maps_entropy:29.3f}")
print(f"energy rank equals r*_att = {r_star} at every scale: "
      f"{all(row[1] == r_star for row in rows)}")

# %%
fig, ax = plt.subplots()
table = np.array(rows)
ax.plot(table[:, 0], table[:, 1], "o-", label="energy rank (kernel)")
ax.plot(table[:, 0], table[:, 2], "s--", label="entropy rank (kernel)")
ax.plot(table[:, 0], table[:, 3], "^:", label="entropy rank (attention maps)")
ax.axhline(r_star, color="black", linewidth=1, label="r*_att")
ax.set_xscale("log")
ax.set_xlabel("logit scale beta")
ax.set_ylabel("rank")
ax.legend()
plt.show()
