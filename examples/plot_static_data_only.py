"""
=================================================
Static data-only recovery: r* before any training
=================================================

The intrinsic rank can be read from data before any model is trained:
:class:`~sklearn_ebound.IntrinsicRankEstimator` solves the second moments of the data for
the least-squares operator and counts the singular values of its fitted values above the
largest value the noise in them reaches, for the noise covariance the residuals show.
Correlated inputs and correlated noise do not fool it.
"""

# %%
import os

import matplotlib.pyplot as plt

from sklearn_ebound import IntrinsicRankEstimator
from sklearn_ebound.datasets import make_static_task
from sklearn_ebound.display import SpectrumDisplay

SMALL = os.environ.get("EBOUND_EXAMPLE_SIZE") == "small"
n_samples, n_features, r_star = (1000, 10, 3) if SMALL else (5000, 20, 4)

X, Y = make_static_task(n_samples, n_features, rank=r_star, noise=0.5, decay=0.8,
                        input_correlation=0.3, noise_correlation=0.2, random_state=0)

# %%
# Every rank-selection rule of the estimator
# ------------------------------------------
for criterion in ["threshold", "rsc", "cv", "energy"]:
    rank = IntrinsicRankEstimator(criterion=criterion).fit(X, Y).rank_
    print(f"criterion={criterion!r:12} rank_ = {rank} (planted {r_star})")

# %%
# The spectrum the default rule reads, with its threshold
# -------------------------------------------------------
estimator = IntrinsicRankEstimator().fit(X, Y)
print(f"IntrinsicRankEstimator().fit(X, Y).rank_ = {estimator.rank_}")
SpectrumDisplay.from_estimator(estimator)
plt.show()
