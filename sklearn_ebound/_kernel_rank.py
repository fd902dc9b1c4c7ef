"""The rank of a solved query–key kernel: the Gavish–Donoho cut of its whitened spectrum.

:func:`._attention_solver.solve_kernel` gives the kernel whitened by the Kronecker
approximation ``N T̄ ⊗ P̄`` of its normal matrix, so that its noise is i.i.d. of variance
``sigma^2``, and :func:`kernel_threshold_rank` counts its singular values above the optimal
hard threshold for that noise. Near the cut the Kronecker approximation is checked: the noise
along each singular direction there is computed from the normal matrix itself, and the cut
of that direction scaled by it.
"""

from math import isqrt

import numpy as np
from sklearn.utils import Bunch

from ._spectrum import optimal_hard_threshold

__all__ = ["kernel_threshold_rank"]

# Directions whose own noise is computed, at most (each costs one solve).
MAX_CHECKED = 6


def kernel_threshold_rank(fit, direction_noise):
    """The threshold rank of the whitened kernel of ``fit``
    (:func:`._attention_solver.solve_kernel`), ``direction_noise(k)`` the noise variance along
    its ``k``-th singular direction relative to the whitening's ``sigma^2``.

    Returns a Bunch with ``threshold`` (the Gavish–Donoho cut of the singular values of the
    ``k x k`` identifiable block, ``k^2 = fit.n_unknowns``), ``rank``, ``kronecker_rank``
    (the count above the uncorrected cut) and ``local_noise`` (``{k: ratio}`` of the
    directions checked; the cut of direction ``k`` is scaled by the square root of its ratio).
    """
    s = fit.singular_values
    k = isqrt(fit.n_unknowns)
    threshold = optimal_hard_threshold(s[:k], np.sqrt(fit.noise_variance), shape=(k, k))
    kronecker_rank = rank = int(np.sum(s > threshold))
    local = {}
    # For the softmax fit the noise along a direction can exceed the Kronecker one by any
    # factor (saturated weights leave kernel directions all but undetermined: ratios up to
    # 2e4 measured on a vocabulary of 8 +- pairs at logit rms 3), so on the way down every
    # counted direction is checked, not only those within a factor 2 of the cut.
    saturable = fit.refined

    def passes(j, down=False):  # s_j against the cut scaled by the noise along itself
        near = threshold / 2 < s[j] < 2 * threshold or (down and saturable)
        if not fit.identified or not near:
            return s[j] > threshold
        local[j] = direction_noise(j)
        return s[j] > threshold * np.sqrt(max(local[j], 0.0))

    # Only the values next to the cut decide the count: walk down while the last one
    # counted fails its corrected cut, or up while the first one left out passes it.
    while rank > 0 and len(local) < MAX_CHECKED and not passes(rank - 1, down=True):
        rank -= 1
    if rank == kronecker_rank:
        while rank < len(s) and len(local) < MAX_CHECKED and passes(rank):
            rank += 1
    return Bunch(threshold=threshold, rank=rank, kronecker_rank=kronecker_rank,
                 local_noise=local)
