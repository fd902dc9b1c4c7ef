"""
==========================================================
Attention-native rank: deficiency, achievability, recovery
==========================================================

The attention-native intrinsic rank ``r*_att`` is the smallest rank of the query–key kernel
``W = W_Q W_K^T`` with which an attention layer reaches the noise floor. For linear and
softmax attention alike:

* **deficiency**: an attention model with ``rank(W) < r*_att`` keeps a held-out risk above
  the noise floor;
* **achievability**: at ``rank(W) = r*_att`` it reaches the noise floor;
* **recovery**: trained at full width (``k = d``) from a small initialisation, the learned
  kernel has energy rank ``r*_att``.
"""

# %%
import os

import matplotlib.pyplot as plt
import torch

from sklearn_ebound.datasets import make_attention_task
from sklearn_ebound.display import RankSweepDisplay
from sklearn_ebound.experiments import recovery_experiment
from sklearn_ebound.nn import LowRankAttentionRegressor

torch.set_num_threads(1)  # tiny problems: one thread is fastest
SMALL = os.environ.get("EBOUND_EXAMPLE_SIZE") == "small"
n_samples, n_tokens, n_features, r_star = (128, 8, 4, 2) if SMALL else (256, 8, 6, 2)
cv = 2 if SMALL else 3
training = dict(lr=0.05, max_epochs=150, batch_size=-1)

# %%
# Deficiency and achievability: sweep the rank of the query–key kernel
# --------------------------------------------------------------------
fig, axes = plt.subplots(1, 2, figsize=(11, 4))
for ax, attention in zip(axes, ["linear", "softmax"], strict=True):
    X, Y, params = make_attention_task(attention, n_samples, n_tokens, n_features, rank=r_star,
                                       noise=0.05, random_state=0, return_params=True)
    net = LowRankAttentionRegressor(attention=attention, value="identity", random_state=0,
                                    **training)
    display = RankSweepDisplay.from_estimator(net, X, Y, ranks=range(n_features + 1), cv=cv,
                                              noise_floor=params.noise_floor, ax=ax, name=attention)
    ax.set_title(f"{attention} attention, r*_att = {r_star}")
    ax.set_yscale("log")
    result = display.result_
    print(f"{attention} attention")
    print(result.format())
    print(f"knee: {result.knee} (planted {r_star})")

# %%
# Recovery: full-width training from a small initialisation
# ---------------------------------------------------------
recovery = recovery_experiment(attention=("linear", "softmax"), logit_scales=(1.0,),
                               seeds=range(2), n_samples=n_samples, n_tokens=n_tokens,
                               n_features=n_features, rank=r_star)
print(recovery.format())
print(f"energy rank equals r*_att in {int(recovery.column('recovered').sum())}"
      f"/{len(recovery.rows)} runs")
plt.show()
