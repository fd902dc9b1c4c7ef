"""Planted-rank tasks for the static surrogate ``Y = X B + E``."""

from numbers import Integral, Real

import numpy as np
from scipy.linalg import sqrtm, toeplitz
from sklearn.utils import Bunch, check_random_state, check_scalar

from .._utils.random import random_orthonormal

__all__ = ["make_static_task", "ar1_covariance"]


def ar1_covariance(n, rho):
    """Covariance ``C_ij = rho^|i-j|`` (unit variances), positive definite for ``|rho| < 1``."""
    return toeplitz(rho ** np.arange(n))


def planted_singular_values(rank, singular_values=None, decay=1.0):
    """Singular values of a planted operator: given explicitly, or ``s_k = decay^k``."""
    if singular_values is not None:
        s = np.asarray(singular_values, dtype=np.float64)
        if s.shape != (rank,) or not np.all(np.isfinite(s)) or np.any(s <= 0):
            raise ValueError(
                f"`singular_values` must hold `rank`={rank} positive finite numbers. Got "
                f"{singular_values!r} instead."
            )
        return np.sort(s)[::-1]
    check_scalar(decay, "decay", Real, min_val=0, max_val=1, include_boundaries="right")
    return decay ** np.arange(rank, dtype=np.float64)


def padded_spectrum(s, length):
    """The planted singular values followed by zeros up to ``length`` (the full spectrum)."""
    full = np.zeros(length)
    full[: len(s)] = s
    return full


def make_static_task(
    n_samples=1000,
    n_features=20,
    n_targets=None,
    *,
    rank=3,
    singular_values=None,
    decay=1.0,
    noise=0.1,
    input_correlation=0.0,
    noise_correlation=0.0,
    random_state=None,
    return_params=False,
):
    """Generate a multivariate regression task ``Y = X B + E`` with a planted rank.

    The operator is planted so that ``Sigma_X^{1/2} B`` has exactly ``rank`` non-zero singular
    values: those are the task's intrinsic rank ``r*`` and the spectrum behind the deficiency
    bound ``T(r)``. Scalar-token sequences are this case with ``n_features = n_targets = n``
    tokens and ``B = M^T`` the token-mixing matrix.

    Parameters
    ----------
    n_samples : int, default=1000
        Number of rows ``N``.
    n_features : int, default=20
        Number of inputs ``p``.
    n_targets : int, default=None
        Number of outputs ``q``; ``None`` means ``q = p``.
    rank : int, default=3
        The planted rank ``r* <= min(p, q)``; 0 gives pure noise.
    singular_values : array-like of shape (rank,), default=None
        Singular values of ``Sigma_X^{1/2} B``. ``None`` uses ``decay**k``, ``k = 0..rank-1``.
    decay : float, default=1.0
        Geometric decay of the default singular values, in ``(0, 1]``.
    noise : float, default=0.1
        Standard deviation of each noise entry.
    input_correlation : float, default=0.0
        ``rho`` of the AR(1) input covariance ``Sigma_X[i, j] = rho^|i-j|``, in ``(-1, 1)``.
    noise_correlation : float, default=0.0
        ``rho`` of the AR(1) correlation between the noise of different outputs.
    random_state : int, RandomState instance or None, default=None
        Seed of the draw.
    return_params : bool, default=False
        Also return a :class:`~sklearn.utils.Bunch` with the ground truth.

    Returns
    -------
    X : ndarray of shape (n_samples, n_features)
    Y : ndarray of shape (n_samples, n_targets)
    params : Bunch, only when ``return_params=True``
        ``coef`` (``B``, ``p x q``), ``singular_values`` (of ``Sigma_X^{1/2} B``, length
        ``min(p, q)``), ``rank``, ``noise``, ``input_covariance``, ``noise_covariance``, and
        ``noise_floor`` = ``noise^2 * q``, the population risk ``E||y - x B||^2`` of the true
        operator (per sample, summed over outputs).

    Examples
    --------
    >>> from sklearn_ebound.datasets import make_static_task
    >>> X, Y, params = make_static_task(500, 10, rank=2, random_state=0, return_params=True)
    >>> X.shape, Y.shape, params.rank
    ((500, 10), (500, 10), 2)
    """
    check_scalar(n_samples, "n_samples", Integral, min_val=1)
    check_scalar(n_features, "n_features", Integral, min_val=1)
    n_targets = n_features if n_targets is None else n_targets
    check_scalar(n_targets, "n_targets", Integral, min_val=1)
    check_scalar(rank, "rank", Integral, min_val=0, max_val=min(n_features, n_targets))
    check_scalar(noise, "noise", Real, min_val=0)
    correlations = {"input_correlation": input_correlation,
                    "noise_correlation": noise_correlation}
    for name, rho in correlations.items():
        check_scalar(rho, name, Real, min_val=-1, max_val=1, include_boundaries="neither")
    rng = check_random_state(random_state)

    s = planted_singular_values(rank, singular_values, decay) if rank else np.zeros(0)
    cov_x = ar1_covariance(n_features, input_correlation)
    cov_e = ar1_covariance(n_targets, noise_correlation)
    sqrt_cov_x = np.real(sqrtm(cov_x))

    # Sigma_X^{1/2} B = U diag(s) V^T, so B = Sigma_X^{-1/2} U diag(s) V^T.
    U = random_orthonormal(n_features, rank, rng)
    V = random_orthonormal(n_targets, rank, rng)
    coef = np.linalg.solve(sqrt_cov_x, (U * s) @ V.T)

    X = rng.standard_normal((n_samples, n_features)) @ sqrt_cov_x
    E = rng.standard_normal((n_samples, n_targets)) @ np.linalg.cholesky(cov_e).T
    Y = X @ coef + noise * E
    if not return_params:
        return X, Y
    params = Bunch(
        coef=coef,
        singular_values=padded_spectrum(s, min(n_features, n_targets)),
        rank=rank,
        noise=noise,
        input_covariance=cov_x,
        noise_covariance=noise**2 * cov_e,
        noise_floor=noise**2 * n_targets,
    )
    return X, Y, params
