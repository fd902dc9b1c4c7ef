"""``criterion="threshold"``: a noise-adaptive cut of the spectrum, by the statistics read.

- a static operator (2-D ``X`` and ``y``, and the 2-D rows of sequence data): the static rank
  test (:mod:`.static_rank_test`);
- ``X`` alone: the Gavish–Donoho threshold with unknown noise (:func:`input_threshold_rule`);
- the query–key kernel: the Gavish–Donoho threshold of the noise-whitened kernel, which its
  solver applies (:func:`kernel_threshold_rule`).
"""

import numpy as np

from .._spectrum import optimal_hard_threshold
from .reading import RankReading

__all__ = ["input_threshold_rule", "kernel_threshold_rule"]


def input_threshold_rule(s, moments):
    """Rank of ``X`` alone from its singular values ``s``: the Gavish–Donoho threshold with
    unknown noise."""
    spectrum = s / np.sqrt(moments.n)
    shape = (max(moments.dof, 1), moments.xx.shape[0])
    threshold = optimal_hard_threshold(s, shape=shape) / np.sqrt(moments.n)
    return RankReading(int(np.sum(spectrum > threshold)), spectrum, threshold, "x")


def kernel_threshold_rule(fit):
    """Rank of the query–key kernel's least squares ``fit`` (the attention solver's result):
    the Gavish–Donoho threshold of the noise-whitened kernel, as the solver cut it."""
    return RankReading(int(fit.rank), fit.singular_values, float(fit.threshold), "y",
                       fit.noise_variance)
