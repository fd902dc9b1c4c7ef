"""
===================================================
Static deficiency and achievability: the bound T(r)
===================================================

A static linear task ``Y = X B + E`` has intrinsic rank ``r*``: the number of non-zero
singular values ``s_k`` of ``Sigma_X^{1/2} B``. The best model of rank ``r < r*`` keeps a
population excess risk of exactly the tail energy ``T(r) = sum_{k>r} s_k^2``
(Eckart–Young–Mirsky): that is **deficiency**. At ``r = r*`` the tail is empty and the
held-out risk reaches the noise floor: that is **achievability**.

We plant a task of known rank, sweep the rank of
:class:`~sklearn_ebound.ReducedRankRegressor` with cross-validation, and compare the held-out
excess risk with ``T(r)``.
"""

# %%
import os

import matplotlib.pyplot as plt
import numpy as np

from sklearn_ebound import ReducedRankRegressor
from sklearn_ebound.datasets import make_static_task
from sklearn_ebound.display import RankSweepDisplay

SMALL = os.environ.get("EBOUND_EXAMPLE_SIZE") == "small"
n_samples, n_features, r_star = (2000, 10, 3) if SMALL else (20000, 16, 4)

X, Y, params = make_static_task(n_samples, n_features, rank=r_star, noise=0.5, decay=0.8,
                                random_state=0, return_params=True)
print(f"planted r* = {params.rank}, singular values {np.round(params.singular_values, 3)}")
print(f"noise floor (risk of the true operator) = {params.noise_floor:.4f}")

# %%
# The deficiency curve
# --------------------
# :class:`~sklearn_ebound.display.RankSweepDisplay` runs
# :func:`~sklearn_ebound.experiments.rank_sweep` (a grid search over the rank) and draws the
# held-out risk, the noise floor, the bound ``noise floor + T(r)`` and the knee.
display = RankSweepDisplay.from_estimator(
    ReducedRankRegressor(), X, Y, ranks=range(n_features + 1), cv=5,
    noise_floor=params.noise_floor, singular_values=params.singular_values,
)
result = display.result_
print(result.format())

# %%
# Deficiency: below ``r*`` the excess risk matches ``T(r)``; achievability: at ``r*`` it is
# at the noise floor (a small positive excess remains from estimating the operator).
excess, bound = result.column("excess_risk"), result.column("bound")
for r in range(r_star):
    print(f"r={r}: excess risk {excess[r]:.4f} vs T(r) {bound[r]:.4f} "
          f"(ratio {excess[r] / bound[r]:.3f})")
print(f"r=r*={r_star}: excess risk {excess[r_star]:.4f} "
      f"({excess[r_star] / params.noise_floor:.2%} of the noise floor)")
print(f"knee of the sweep: {result.knee} (planted {r_star})")
plt.show()
