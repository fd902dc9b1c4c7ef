"""Random draws shared by the subpackages (planted tasks, experiments)."""

import numpy as np
from scipy.stats import ortho_group

__all__ = ["random_orthonormal"]


def random_orthonormal(n, k, rng):
    """An ``n x k`` matrix with orthonormal columns, drawn uniformly (Haar).

    Parameters
    ----------
    n : int
        Rows, the dimension of the space.
    k : int
        Columns, ``0 <= k <= n``.
    rng : RandomState instance
        The generator of the draw.

    Returns
    -------
    Q : ndarray of shape (n, k)
        The first ``k`` columns of a Haar-random orthogonal ``n x n`` matrix.
    """
    if n == 1:
        # ortho_group needs n >= 2; in one dimension +1 is taken without a draw.
        return np.ones((1, 1))[:, :k]
    return ortho_group.rvs(n, random_state=rng)[:, :k]
