"""Rank-selection rules of the literature, as the accuracy benchmark runs them.

Each peer takes the task ``(X, Y)`` of a multivariate regression ``Y = X B + E`` and returns the
rank it selects for ``B``. They all start from the same least-squares step: the centred data,
an orthonormal basis ``Q`` of the column space of ``X`` (``rank(X) = r_x`` columns) and the
fitted values in that basis, ``Z = Q^T Y`` (an ``r_x x q`` matrix with the singular values of
the fitted values ``P_X Y``; its noise ``Q^T E`` has the rows of ``E``'s law when those are
i.i.d. Gaussian). What each rule then does with ``Z`` follows its paper, and each docstring says
where the benchmark had to choose.
"""

from functools import lru_cache

import numpy as np

__all__ = ["fitted_basis", "strs_rank", "screenot_rank", "bcv_rank"]


def fitted_basis(X, Y, *, center=True, rank_tol=None):
    """The least-squares step every peer shares.

    Returns ``(Z, residual_ss, n_eff, x_rank)``: the fitted values ``Q^T Y`` in an
    orthonormal basis of the column space of ``X``, the residual sum of squares
    ``||Y - P_X Y||_F^2``, the number of rows left after centring (``n - 1`` with ``center``)
    and ``rank(X)`` (singular values above ``rank_tol`` times the largest; by default numpy's
    ``matrix_rank`` tolerance).
    """
    X = np.asarray(X, dtype=np.float64)
    Y = np.asarray(Y, dtype=np.float64)
    if center:
        X = X - X.mean(axis=0)
        Y = Y - Y.mean(axis=0)
    U, s, _ = np.linalg.svd(X, full_matrices=False)
    if rank_tol is None:
        rank_tol = max(X.shape) * np.finfo(np.float64).eps
    x_rank = int(np.sum(s > rank_tol * s[0])) if s.size and s[0] > 0 else 0
    Q = U[:, :x_rank]
    Z = Q.T @ Y
    residual_ss = float(np.sum(Y**2) - np.sum(Z**2))
    return Z, max(residual_ss, 0.0), X.shape[0] - int(center), x_rank


@lru_cache(maxsize=64)
def _mean_squared_singular_values(n_rows, n_cols, n_sim=200, seed=0):
    """Monte-Carlo mean of the squared singular values of an ``n_rows x n_cols`` N(0, 1) matrix."""
    rng = np.random.default_rng(seed)
    values = [np.linalg.svd(rng.standard_normal((n_rows, n_cols)), compute_uv=False) ** 2
              for _ in range(n_sim)]
    return np.mean(values, axis=0)


def _strs_step(d2, losses, n_eff, m, lam, lower):
    """The rank of the criterion ``||Y - (P Y)_k||^2 / (n m - lam k)`` searched upwards.

    ``k`` grows from ``lower`` while ``d_{k+1}^2 >= lam ||Y - (P Y)_k||^2 / (n m - lam k)``
    (the next direction pays for its penalty), and never past the largest ``k`` with a positive
    denominator.
    """
    k_max = min(len(d2), int((n_eff * m - 1) // lam))
    k = lower
    while k < k_max:
        if d2[k] < lam * losses[k] / (n_eff * m - lam * k):
            return k
        k += 1
    return k_max


def strs_rank(X, Y, *, C=2.01, update="mc", n_sim=200):
    """Self-tuning rank selection (STRS) of Bing & Wegkamp (2019).

    The rank minimises ``||Y - (P_X Y)_k||_F^2 / (n m - lambda k)``, the residual of the
    rank-``k`` truncation of the fitted values over a penalised count of degrees of freedom,
    searched upwards from the current estimate. The penalty starts at ``lambda_0 = C E[d_1^2(G)]``
    with ``G`` an ``r_x x m`` standard Gaussian matrix (``C = 2.01``, the authors' default; the
    noise variance is never estimated) and is then lowered, given the current rank ``r``, to a
    value that depends only on ``(n, r_x, m, r)``; the rank is re-read from ``r`` upwards until it
    stops changing (at each step it can only grow, and with high probability it does not pass
    the true rank). The update of ``lambda`` is the authors' ``STRS-MC`` (``update="mc"``,
    their default: Monte-Carlo means of the ``d_j^2(G)``, computed once per shape with a fixed
    seed) or ``STRS-DB`` (``update="db"``: deterministic bounds).

    Choices of this benchmark: the data are centred, so ``n`` is the number of rows less one;
    ``E[chi^2_{(n - r_x) m}]`` is used exactly where the authors draw it; when the new
    ``lambda`` would not be smaller than the old one (their code stops with an error there) the
    current rank is kept.

    Reference: X. Bing and M. H. Wegkamp, "Adaptive estimation of the rank of the coefficient
    matrix in high-dimensional multivariate response regression models", Annals of Statistics
    47(6), 2019, 3157-3184.
    """
    Z, residual_ss, n_eff, x_rank = fitted_basis(X, Y)
    m = Z.shape[1]
    if x_rank == 0 or n_eff <= x_rank:
        return 0
    d2 = np.linalg.svd(Z, compute_uv=False)[: min(x_rank, m)] ** 2
    total = residual_ss + np.sum(d2)
    losses = total - np.concatenate([[0.0], np.cumsum(d2)])  # losses[k] = ||Y - (PY)_k||^2
    L, H = min(x_rank, m), max(x_rank, m)
    if update == "mc":
        mean_d2 = _mean_squared_singular_values(x_rank, m, n_sim)[:L]
        lam = C * mean_d2[0]
    elif update == "db":
        lam = C * (np.sqrt(m) + np.sqrt(x_rank)) ** 2
    else:
        raise ValueError(f"`update` must be 'mc' or 'db'. Got {update!r} instead.")
    rank = _strs_step(d2, losses, n_eff, m, lam, 0)
    while rank > 0:
        if update == "mc":
            resid = (n_eff - x_rank) * m  # E chi^2 of the residual sum of squares (unit noise)
            rest = resid + np.sum(mean_d2[min(2 * rank, L):])
            new = 1.05 * n_eff * m / (rest / mean_d2[0] + rank)
            if 2 * rank <= L:
                tail = mean_d2[2 * rank] + mean_d2[2 * rank + 1] if 2 * rank <= L - 2 else 0.0
                if tail > 0:
                    new = max(new, 1.05 * n_eff * m / (rest / tail + rank))
        else:
            edge = (np.sqrt(x_rank) + np.sqrt(m)) ** 2
            if 2 * rank >= L:
                new = n_eff * m * edge / (0.99 * (n_eff - x_rank) * m + rank * edge)
            else:
                top = np.arange(1, 2 * rank + 1)
                low = np.arange(2 * rank + 1, L + 1)
                kept = min(np.sum((np.sqrt(H) + np.sqrt(L - top + 1)) ** 2),
                           L * H - np.sum((np.sqrt(H) - np.sqrt(low - 1)) ** 2))
                u = max(edge, (np.sqrt(H) + np.sqrt(L - 2 * rank)) ** 2
                        + (np.sqrt(H) + np.sqrt(L - 2 * rank - 1)) ** 2)
                new = n_eff * m * u / (0.99 * n_eff * m - kept + rank * u)
        if not 0 < new < lam:
            break
        lam = new
        next_rank = _strs_step(d2, losses, n_eff, m, lam, rank)
        if next_rank == rank:
            break
        rank = next_rank
    return int(rank)


def screenot_rank(X, Y, *, k=None):
    """ScreeNOT of Donoho, Gavish & Romanov (2023) on the fitted values.

    ScreeNOT hard-thresholds the singular values of a matrix at the threshold that minimises
    the asymptotic mean squared error of the recovered low-rank part for the noise's *own*
    singular-value distribution, estimated from the data (the bulk below the top ``k`` values,
    with the top ``k`` imputed), so that it adapts to correlated noise; the rank is the number of
    singular values above the threshold. Run through the ``screenot`` package
    (``adaptiveHardThresholding``) on ``Z = Q^T Y``, the ``r_x x q`` matrix that carries the
    fitted values (whose shape sets the aspect ratio, as for ``optht``).

    Choice of this benchmark: ``k``, which the method needs as a (possibly loose) upper bound on
    the rank, is ``min(10, (min(r_x, q) - 2) // 2)`` (the largest the imputation allows, capped
    at 10, above every rank planted here except where the matrix is too small to allow it).

    Reference: D. L. Donoho, M. Gavish and E. Romanov, "ScreeNOT: exact MSE-optimal singular
    value thresholding in correlated noise", Annals of Statistics 51(1), 2023, 122-148.
    """
    from screenot import adaptiveHardThresholding

    Z, _, _, _ = fitted_basis(X, Y)
    small = min(Z.shape)
    if k is None:
        k = max(0, min(10, (small - 2) // 2))
    if small < 2:
        return 0
    _, _, rank = adaptiveHardThresholding(Z, k)
    return int(rank)


def bcv_rank(X, Y, *, n_row_folds=2, n_col_folds=2, random_state=0):
    """Bi-cross-validation of the SVD (Owen & Perry 2009) on the fitted values.

    The rows and columns of ``Z = Q^T Y`` are permuted and cut into ``n_row_folds x
    n_col_folds`` blocks. Each block ``A`` is held out in turn; writing the permuted matrix as
    ``[[A, B], [C, D]]``, ``A`` is predicted at rank ``k`` by ``B D_k^+ C`` with ``D_k`` the
    rank-``k`` truncated SVD of the retained block ``D``, and the rank is the ``k`` of least
    total squared prediction error, ``k = 0 .. min`` dimension of ``D``. Two by two folds
    (leaving out half of the rows and half of the columns) is the setting the authors found to
    perform well.

    Choices of this benchmark: BCV is run on ``Z`` (a matrix method, given the regression's
    fitted values in the column space of ``X``) rather than on ``Y``; the permutation is drawn
    with a fixed seed.

    Reference: A. B. Owen and P. O. Perry, "Bi-cross-validation of the SVD and the nonnegative
    matrix factorization", Annals of Applied Statistics 3(2), 2009, 564-594.
    """
    Z, _, _, _ = fitted_basis(X, Y)
    n, m = Z.shape
    if min(n, m) < 2:
        return 0
    rng = np.random.default_rng(random_state)
    rows = np.array_split(rng.permutation(n), n_row_folds)
    cols = np.array_split(rng.permutation(m), n_col_folds)
    k_max = min(n - max(map(len, rows)), m - max(map(len, cols)))
    errors = np.zeros(k_max + 1)
    for held_rows in rows:
        kept_rows = np.setdiff1d(np.arange(n), held_rows)
        for held_cols in cols:
            kept_cols = np.setdiff1d(np.arange(m), held_cols)
            A = Z[np.ix_(held_rows, held_cols)]
            B = Z[np.ix_(held_rows, kept_cols)]
            C = Z[np.ix_(kept_rows, held_cols)]
            U, s, Vt = np.linalg.svd(Z[np.ix_(kept_rows, kept_cols)], full_matrices=False)
            # B D_k^+ C = sum_{j <= k} (B v_j)(u_j^T C) / s_j, accumulated over k.
            prediction = np.zeros_like(A)
            errors[0] += np.sum(A**2)
            for j in range(k_max):
                if s[j] <= s[0] * 1e-12:
                    errors[j + 1:] += np.sum((A - prediction) ** 2)
                    break
                prediction += np.outer(B @ Vt[j], U[:, j] @ C) / s[j]
                errors[j + 1] += np.sum((A - prediction) ** 2)
    return int(np.argmin(errors))
