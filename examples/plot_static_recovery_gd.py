"""
===================================
Static recovery by gradient descent
===================================

Factorise the token-mixing matrix ``M = A B^T`` with full inner width (``k = n``), start
from a small initialisation and run gradient descent. The implicit bias of factorised
models towards low rank (Gunasekar et al. 2017; Arora et al. 2019) makes the learned ``M``
end with energy rank ``r*``, without any rank constraint.

We plant a static mixing task ``Y_s = M X_s + E_s`` with ``rank(M) = r*`` and train
:class:`~sklearn_ebound.nn.LowRankAttentionRegressor` with ``attention="static"`` and
``rank=None`` (full width).
"""

# %%
import os

import matplotlib.pyplot as plt
import numpy as np
import torch

from sklearn_ebound import energy_rank, entropy_rank
from sklearn_ebound.datasets import make_static_mixing_task
from sklearn_ebound.display import SpectrumDisplay
from sklearn_ebound.nn import LowRankAttentionRegressor

torch.set_num_threads(1)  # tiny problems: one thread is fastest
SMALL = os.environ.get("EBOUND_EXAMPLE_SIZE") == "small"
n_samples, n_tokens, r_star = (200, 8, 2) if SMALL else (500, 16, 3)

X, Y, params = make_static_mixing_task("linear", n_samples, n_tokens, 4, rank=r_star,
                                       noise=0.05, random_state=0, return_params=True)

# %%
# Full-width factorisation from a small initialisation
# ----------------------------------------------------
net = LowRankAttentionRegressor(rank=None, attention="static", value="identity",
                                init_scale=1e-2, lr=0.05, max_epochs=150, batch_size=-1,
                                random_state=0).fit(X, Y)
s = np.linalg.svd(net.qk_kernel_, compute_uv=False)
print(f"inner width k = {net.module_.rank} of n = {n_tokens} tokens; planted r* = {r_star}")
print(f"learned singular values: {np.round(s, 4)}")
print(f"energy rank of the learned M: {energy_rank(s)} (planted {r_star})")
print(f"entropy effective rank: {entropy_rank(s):.3f}")

# %%
# The learned spectrum: ``r*`` values near the planted ones, the rest near zero.
fig, ax = plt.subplots()
SpectrumDisplay.from_spectrum(s, ax=ax, name="learned M = A B^T")
ax.plot(np.arange(1, n_tokens + 1), params.singular_values, "k+", label="planted M")
ax.legend()
plt.show()
