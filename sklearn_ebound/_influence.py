"""Influential directions: is an accepted direction carried by a handful of rows?

Outliers that are also leverage points (a few rows whose inputs lie far from the others and
whose targets are shifted) give the least-squares operator a direction of their own: the
fitted values along it are large on those rows and near zero elsewhere. The resampled test
of :func:`._rules.static_rank_test.resampled_rank_test` counts it as signal, since it is as
strong as one; what tells it apart is how few rows carry it, and that the other rows
contradict them.

For an accepted direction ``v_k`` (a right singular vector of the fitted values in the metric
the rule read, on the target side), the rows' fitted values along it, ``a_i = f_iᵀ v_k``, have
the participation ratio ``m_k = (sum a_i^2)^2 / sum a_i^4``: about ``n / 3`` for a direction
spread over ``n`` Gaussian rows, about the number of rows for a direction carried by a few of
them. Its null law is that of a direction spread over the rows as the inputs spread them:
the participation ratio of ``Q a`` for ``a`` uniform on the sphere of the inputs' column space
(``Q`` its orthonormal basis on the rows), which heavy-tailed inputs lower along with that of a
real direction. A concentrated direction (the lower tail of that law, a normal law of
``log m`` fitted to ``N_DIRECTIONS`` random directions, below the test's ``significance``) is
flagged where the rows that carry it also contradict what the other rows predict for them
(:func:`influential_directions`): a real direction of heavy-tailed inputs is concentrated too,
but its rows follow the same model as the rest.

A combination of the accepted directions gets a third test where its concentration alone does
not decide: the inputs' own leverage rows make the same search in a random subspace nearly as
concentrated as a cluster of outlying rows, so that even a subspace aligned with the cluster
cannot be told apart at the test's level. Its rows' residuals, whitened by the noise of the
other rows, are then tested for pointing along fewer target directions than noise does
(:func:`_anisotropy`): a cluster's shift (or the model it was drawn from) is one of a few
directions, noise spreads over all of them, and the test's statistic does not change with each
row's noise scale, so that input-dependent noise leaves it valid where it is not for the
deletion test.

Pure functions: nothing here sets state or warns.
"""

import math

import numpy as np
from scipy import special, stats

__all__ = ["N_DIRECTIONS", "participation_ratio", "influential_directions", "influence_caveat",
           "widened_interval"]

# Random directions of the inputs' column space drawn for the null law.
N_DIRECTIONS = 200
# Residual degrees of freedom beyond the targets' number for the deletion test to whiten them.
_MIN_EXTRA_DOF = 10
# The smallest eigenvalue of I - H_SS below which the rows S alone span an input direction.
_SINGULAR = 1e-10
# The most rows of S the anisotropy test reads (those of largest |values|): a cluster of
# outlying rows is a handful, and its row-side decorrelation and null cost O(m^3) and
# O(m q) per draw (rows of S beyond these still leave the other rows' noise).
_ANISOTROPY_ROWS = 1024
# A combination whose concentration p-value is above the test's level is still flagged where it
# is at least as concentrated as the median random subspace's, its rows contradict the others
# (deletion) and their residuals point along fewer directions than noise (anisotropy), by at
# least this share of the room between the noise's top share and all of them along one.
_MAX_COMBINATION_CONCENTRATION = 0.5
_MIN_EXCESS_SHARE = 0.1


def participation_ratio(values, axis=0):
    """``(sum a^2)^2 / sum a^4`` along ``axis``: the number of entries ``a`` spreads over."""
    square = np.square(values)
    second = np.add.reduce(square, axis=axis)
    fourth = np.add.reduce(square * square, axis=axis)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(fourth > 0, second**2 / fourth, 0.0)


def influential_directions(basis, fitted, residual, directions, significance, rng,
                           n_directions=N_DIRECTIONS):
    """Test whether each accepted direction is carried by a handful of rows that the other
    rows contradict.

    Two tests, each at ``significance``, and a direction is flagged where both reject:

    - *concentration*: the participation ratio of the rows' fitted values along the
      direction against the null law of a direction spread over the rows as the inputs
      spread them (the module docstring);
    - *deletion*: the rows that carry it (the ``ceil(m_k)`` of largest fitted value along it)
      against what the other rows predict for them. The deleted residuals
      ``(I - H_SS)^{-1} r_S`` of those rows ``S`` (``H`` the hat matrix, ``r`` the residual
      rows) have the covariance ``(I - H_SS)^{-1}`` times the noise's ``Sigma`` under the
      linear model, so ``tr(Sigma^{-1} r_Sᵀ (I - H_SS)^{-1} r_S)``, ``Sigma`` estimated from
      the residuals of the fit without the rows ``S``, is about chi-square with ``m q``
      degrees of freedom: the mean-shift outlier test of the set ``S`` (Cook & Weisberg
      1982), on every target.
      Heavy-tailed inputs make real directions concentrated, but the rows that carry them
      follow the same model as the rest: the deletion test tells them from outliers (heavy-
      tailed noise on those rows can still make it reject: 4 of 100 draws of Student t (2.5
      dof) inputs and noise named a real direction).

    Parameters
    ----------
    basis : ndarray of shape (n_rows, rank_x)
        The centred inputs' basis on the rows (``Q`` of the fitted values ``Q Qᵀ Y``).
    fitted, residual : ndarray of shape (n_rows, n_targets)
        The rows' fitted values and residuals.
    directions : ndarray of shape (n_targets, n_accepted)
        The accepted directions, orthonormal columns on the target side.
    significance : float
        Level of each test.
    rng : numpy Generator
        Draws the random directions of the concentration test's null law.
    n_directions : int, default=N_DIRECTIONS

    Returns
    -------
    result : dict
        ``"participation"`` (per accepted direction, about how many rows carry it),
        ``"null_median"`` (that of a direction spread as the inputs spread it),
        ``"concentration_p_values"`` and ``"deletion_p_values"`` (``1.0`` where the first test
        did not reject, so the second was not run), ``"flagged"`` (indices from 0 of the
        accepted directions both tests reject), ``"n_rows"`` and ``"level"``; where more
        than one direction is accepted and none is flagged, ``"combination"``: the same
        tests on the most concentrated combination of them (its ``"participation"``,
        ``"concentration_p_value"``, ``"deletion_p_value"``, ``"anisotropy_p_value"`` and
        ``"excess_share"`` (``1.0`` and ``0.0`` where that test was not run) and
        ``"flagged"``).
    """
    n_rows, n_accepted = fitted.shape[0], directions.shape[1]
    result = {"n_rows": int(n_rows), "level": float(significance), "participation": [],
              "null_median": None, "concentration_p_values": [], "deletion_p_values": [],
              "flagged": ()}
    k_x = basis.shape[1]
    if n_accepted == 0 or k_x == 0 or n_rows <= k_x + 2:
        return result
    values = fitted @ directions
    observed = participation_ratio(values)
    null = participation_ratio(basis @ rng.standard_normal((k_x, n_directions)))
    null = np.log(null[null > 0])
    centre, spread = float(np.mean(null)), float(np.std(null, ddof=1))
    with np.errstate(divide="ignore"):
        z = (np.log(observed) - centre) / spread if spread > 0 else np.zeros_like(observed)
    concentration = special.ndtr(z)
    deletion = np.ones(n_accepted)
    gram_inverse = np.linalg.pinv(basis.T @ basis)
    for k in np.flatnonzero(concentration <= significance):
        deletion[k] = _deletion_p_value(basis, gram_inverse, residual, values[:, k],
                                        observed[k])
    flagged = (concentration <= significance) & (deletion <= significance)
    result.update(participation=observed.tolist(), null_median=float(np.exp(np.median(null))),
                  concentration_p_values=concentration.tolist(),
                  deletion_p_values=deletion.tolist(),
                  flagged=tuple(int(k) for k in np.flatnonzero(flagged)))
    if n_accepted > 1 and not flagged.any():
        result["combination"] = _concentrated_combination(
            basis, gram_inverse, residual, values, significance, rng, n_directions)
    return result


# Starts (the rows of largest energy, besides the axes) and fixed-point steps of the search
# for the most concentrated combination of the accepted directions.
_PURSUIT_STARTS = 5
_PURSUIT_STEPS = 30


def _most_concentrated(U):
    """The values ``a = U c`` of smallest participation ratio over unit ``c``, for ``U`` with
    orthonormal columns (a stack of them, ``(..., n_rows, r)``): ``sum a^4`` is maximised
    by the fixed point ``c <- Uᵀ a^3 / ||Uᵀ a^3||`` (the kurtosis projection pursuit of
    Peña & Prieto 2001, which finds a cluster of outlying rows as the direction they share),
    started at the rows of largest energy and at the axes; the best of the starts."""
    r = U.shape[-1]
    energy = np.einsum("...ij,...ij->...i", U, U)
    top = np.argsort(-energy, axis=-1)[..., :_PURSUIT_STARTS]
    rows = np.take_along_axis(U, top[..., None], axis=-2)  # (..., starts, r)
    C = np.concatenate([np.swapaxes(rows, -1, -2),
                        np.broadcast_to(np.eye(r), (*U.shape[:-2], r, r))], axis=-1)
    for _ in range(_PURSUIT_STEPS):
        A = U @ C
        C = np.swapaxes(U, -1, -2) @ (A * A * A)
        C = C / np.maximum(np.linalg.norm(C, axis=-2, keepdims=True), 1e-300)
    A = U @ C
    best = np.argmin(participation_ratio(A, axis=-2), axis=-1)
    return np.take_along_axis(A, best[..., None, None], axis=-1)[..., 0]


def _concentrated_combination(basis, gram_inverse, residual, values, significance, rng,
                              n_subspaces):
    """The check of :func:`influential_directions` on the most concentrated combination of
    the accepted directions: outlying rows that share a direction can mix with the signal
    in every singular direction, and stand apart only in a combination of them.

    The deletion test of its rows first (under Gaussian noise it keeps its level whatever
    the fitted values chose); where it rejects, the concentration against the same search
    run in random subspaces of the inputs' column space of the same dimension (a subspace
    spread over the rows as the inputs spread them), ``n_subspaces`` of them. Where that is
    not below ``significance`` but the combination is at least as concentrated as the median
    random subspace's, the anisotropy test of its rows (:func:`_anisotropy`) decides: the
    combination is flagged where it rejects at ``significance`` with an excess share of at
    least ``_MIN_EXCESS_SHARE``."""
    U = np.linalg.svd(values, full_matrices=False)[0]
    a = _most_concentrated(U)
    observed = float(participation_ratio(a))
    deletion = _deletion_p_value(basis, gram_inverse, residual, a, observed)
    concentration = 1.0
    anisotropy, excess = 1.0, 0.0
    if deletion <= significance:
        # Independent streams: the null stops when it is clear, the anisotropy test's draws
        # stay the same whatever it took.
        # (``rng`` may be a RandomState or a Generator: both draw ``random``.)
        null_rng, anisotropy_rng = (np.random.default_rng(int(u * 2**53))
                                    for u in rng.random(2))
        concentration = _subspace_concentration(
            basis, U.shape[1], math.log(observed),
            (significance, _MAX_COMBINATION_CONCENTRATION), null_rng, n_subspaces)
        if significance < concentration <= _MAX_COMBINATION_CONCENTRATION:
            anisotropy, excess = _anisotropy(basis, gram_inverse, residual, a, observed,
                                             anisotropy_rng, n_subspaces)
    flagged = deletion <= significance and (
        concentration <= significance
        or (concentration <= _MAX_COMBINATION_CONCENTRATION and anisotropy <= significance
            and excess >= _MIN_EXCESS_SHARE))
    return {"participation": observed, "concentration_p_value": concentration,
            "deletion_p_value": deletion, "anisotropy_p_value": anisotropy,
            "excess_share": excess, "flagged": bool(flagged)}


# Subspaces of the concentration null drawn in stages (a share of ``n_subspaces`` each), and
# the standard errors by which the p-value's normal quantile must clear the cuts' to stop.
_NULL_STAGES = (0.125, 0.25, 0.5, 1.0)
_NULL_MARGIN = 4.0


def _subspace_concentration(basis, dimension, log_observed, cuts, rng, n_subspaces):
    """Lower-tail p-value of ``log_observed`` under the most concentrated combination of a
    random ``dimension``-dimensional subspace of the inputs' column space (a normal law of
    ``log m`` fitted to ``n_subspaces`` of them).

    Sequential Monte Carlo (Besag & Clifford 1991): the subspaces come in stages of one
    seeded stream, and the search stops once the p-value's normal quantile ``z`` is more than
    ``_NULL_MARGIN`` standard errors from that of every p-value in ``cuts`` (the ones the
    caller compares it with), ``sqrt((1 + z^2 / 2) / n)`` for a normal law fitted to ``n``
    draws. Where it never is, the law is that of all the draws, bit for bit; a p-value far
    from the cuts (common where the deletion test rejects on heteroscedastic rows) costs an
    eighth of them. Where ``dimension`` reaches the inputs' rank, every subspace is their
    whole column space, the combination is that space's own, and nothing can be told: 1."""
    if dimension >= basis.shape[1]:
        return 1.0
    quantiles = special.ndtri(np.asarray(cuts, dtype=float))
    null, z = np.empty(0), 0.0
    for share in _NULL_STAGES:
        n_new = max(2, math.ceil(share * n_subspaces)) - null.size
        if n_new > 0:
            draws = basis @ rng.standard_normal((n_new, basis.shape[1], dimension))
            more = participation_ratio(_most_concentrated(np.linalg.qr(draws)[0]), axis=-1)
            null = np.concatenate([null, np.log(more[more > 0])])
        spread = float(np.std(null, ddof=1)) if null.size > 1 else 0.0
        if spread <= 0:
            return 1.0
        z = (log_observed - float(np.mean(null))) / spread
        if np.all(np.abs(z - quantiles) > _NULL_MARGIN * math.sqrt((1 + z * z / 2) / null.size)):
            break
    return float(special.ndtr(z))


def _n_flagged(result):
    """How many accepted directions the check of ``result`` takes for the rows' own."""
    combination = result.get("combination") or {}
    return len(result["flagged"]) or int(bool(combination.get("flagged")))


def _deleted_rows(basis, gram_inverse, residual, values, participation):
    """The rows ``S`` (the ``ceil(participation)`` of largest ``|values|``) and what the
    deletion and anisotropy tests read of them: their deleted residuals, the noise covariance
    of the fit without them (full where the degrees of freedom allow it, else its diagonal),
    its bias factor and degrees of freedom, the inputs' basis ``A`` and the other rows' Gram;
    ``None`` where ``I - H_SS`` is singular.

    ``H_SS = A_S G^-1 A_Sᵀ`` has the rank of the inputs' basis ``A`` (the intercept's column
    ``1 / sqrt(n)`` included; ``G = AᵀA``), so Woodbury's identity gives the deleted residuals
    ``(I - H_SS)^-1 r_S = r_S + A_S (G - A_SᵀA_S)^-1 A_Sᵀ r_S`` from the Gram of the other
    rows, in ``O(m k^2)`` for ``m`` rows and ``k`` inputs instead of ``O(m^3)``. That Gram
    is singular exactly where ``I - H_SS`` is: where the rows ``S`` alone span an input
    direction (its eigenvalues, relative to ``G``, are those of ``I - H_SS`` below 1)."""
    n_rows, k_x = basis.shape
    m = min(max(1, math.ceil(participation)), n_rows - k_x - 2)
    rows = np.argsort(-np.abs(values), kind="stable")[:m]
    dof = n_rows - m - k_x - 1
    # The inputs' basis with the intercept (the basis is centred: orthogonal to it).
    design = np.hstack([basis, np.full((n_rows, 1), 1 / math.sqrt(n_rows))])
    n_targets = residual.shape[1]
    gram = np.zeros((k_x + 1, k_x + 1))
    gram[:k_x, :k_x] = np.linalg.pinv(gram_inverse)
    gram[k_x, k_x] = 1.0
    at_rows = design[rows]
    others = gram - at_rows.T @ at_rows
    # I - H_SS's eigenvalues below 1: those of the other rows' Gram relative to G.
    spectrum, vectors = np.linalg.eigh(gram)
    kept = spectrum > spectrum.max() * 1e-12
    whiten = vectors[:, kept] / np.sqrt(spectrum[kept])
    if np.linalg.eigvalsh(whiten.T @ others @ whiten)[0] <= _SINGULAR:
        return None
    deleted = residual[rows] + at_rows @ np.linalg.solve(others, at_rows.T @ residual[rows])
    # The residual cross-products of the fit without the rows S: R^T R - r_S^T (I - H_SS)^-1
    # r_S (what the full fit's residuals of the other rows would overstate where the rows S
    # pull the fit). They whiten the targets where they estimate the covariance well
    # (corrected for the bias of its inverse), else their diagonal scales them.
    refit = residual.T @ residual - residual[rows].T @ deleted
    full = dof > n_targets + _MIN_EXTRA_DOF
    if full:
        covariance = refit / dof
        factor = (dof - n_targets - 1) / dof
    else:
        covariance = np.diag(np.clip(np.diagonal(refit), 0, None) / max(dof, 1))
        factor = 1.0
    return {"rows": rows, "deleted": deleted, "covariance": covariance, "full": full,
            "factor": factor, "dof": dof, "design": design, "other_gram": others}


def _deletion_p_value(basis, gram_inverse, residual, values, participation):
    """P-value of the mean-shift outlier test of the ``ceil(participation)`` rows of largest
    ``|values|`` (:func:`influential_directions`), on every target."""
    rows = _deleted_rows(basis, gram_inverse, residual, values, participation)
    if rows is None:
        return 1.0
    try:
        whitened = np.linalg.solve(rows["covariance"], residual[rows["rows"]].T)
    except np.linalg.LinAlgError:
        return 1.0
    statistic = rows["factor"] * float(np.einsum("ij,ji->", rows["deleted"], whitened))
    if not np.isfinite(statistic) or statistic < 0:
        return 1.0
    return float(special.chdtrc(len(rows["rows"]) * residual.shape[1], statistic))


def _top_share(directions):
    """The largest eigenvalue of ``Uᵀ U / m`` for the ``m`` unit rows ``U`` of ``directions``
    (a stack ``(..., m, q)``): the share of the rows' directions along the one they most share
    (``1 / q`` on average for directions uniform on the sphere, ``1`` for all along one)."""
    m, q = directions.shape[-2:]
    T = np.swapaxes(directions, -1, -2)
    gram = T @ directions if q <= m else directions @ T
    return np.linalg.eigvalsh(gram)[..., -1] / m


def _inverse_sqrt(matrix):
    """``matrix^{-1/2}`` of a symmetric positive definite matrix (a stack of them)."""
    values, vectors = np.linalg.eigh(matrix)
    floor = np.maximum(values.max(axis=-1, keepdims=True), 0) * 1e-12
    scale = 1 / np.sqrt(np.maximum(values, np.maximum(floor, np.finfo(float).tiny)))
    return (vectors * scale[..., None, :]) @ np.swapaxes(vectors, -1, -2)


def _row_decorrelated(basis, gram_inverse, residual, rows, others):
    """The deleted residuals of the rows ``S``, whitened on the target side by the noise
    covariance of the fit without them and decorrelated on the row side by their
    heteroscedasticity-consistent covariance.

    A deleted residual is the row's own noise less the error of the fit without the rows
    ``S`` at its inputs, ``e_S = E_S - A_S (beta_(-S) - beta)``, ``A`` the inputs' basis with
    the intercept. The fit's error is shared by the rows (it has ``rank X`` directions), and
    where a row's own noise is far weaker than the others' it is what the row's residual
    shows, so its covariance is estimated from the other rows' residual scales (the sandwich
    ``A_S G_(-S)^-1 (sum_j a_j a_jᵀ s_j^2) G_(-S)^-1 A_Sᵀ``, ``s_j^2`` the row's whitened
    residual energy per target over ``1 - h_jj``), and each row's own scale is what its
    energy holds beyond it; rows whose own scale is not above the fit's error at them are left
    out. Under noise of one scale this is about ``(I - H_SS)^{-1/2} r_S``. ``None`` where
    fewer than two rows are left."""
    S = rows["rows"]
    n_rows, n_targets = residual.shape
    whitening = _inverse_sqrt(rows["covariance"])
    deleted = rows["deleted"] @ whitening
    design = rows["design"]
    gram_pinv = np.linalg.pinv(rows["other_gram"])
    white = residual[others] @ whitening
    hat = np.einsum("ij,jk,ik->i", design[others], gram_pinv, design[others])
    scales = np.einsum("ij,ij->i", white, white) / n_targets / np.clip(1 - hat, 1e-3, None)
    meat = (design[others] * scales[:, None]).T @ design[others]
    bread = design[S] @ gram_pinv
    shared = bread @ meat @ bread.T
    own = np.einsum("ij,ij->i", deleted, deleted) / n_targets - np.diagonal(shared)
    # A row whose residual is mostly the fit's error tells nothing of its own noise's
    # direction (several such rows share the error's few directions): it is left out.
    informative = own > np.diagonal(shared)
    if informative.sum() < 2:
        return None
    covariance = shared[np.ix_(informative, informative)] + np.diag(own[informative])
    if not np.all(np.isfinite(covariance)):
        return None
    return _inverse_sqrt(covariance) @ deleted[informative]


def _anisotropy(basis, gram_inverse, residual, values, participation, rng, n_draws):
    """Do the residuals of the rows ``S`` that carry ``values`` point along fewer target
    directions than noise does? ``(p_value, excess_share)``.

    The rows' deleted residuals are whitened by the noise covariance of the fit without them,
    decorrelated on the row side (:func:`_row_decorrelated`: rows of covariance ``Sigma``
    each under the linear model, whatever their noise scales) and scaled to unit length: a
    row's direction, whatever its noise scale (input-dependent noise changes the scale of a
    row, not the direction of its noise). The
    statistic is the share of these directions along the one they most share
    (:func:`_top_share`). Its null law is that of ``m`` Gaussian rows whitened by an independent
    Wishart estimate of their covariance, ``n_draws`` of them, with the degrees of freedom the
    other rows' residual energies leave it (``(sum w)^2 / sum w^2`` for energies ``w``: fewer
    where the noise scale varies over the rows); a normal law of its logarithm fitted to them
    gives the p-value. ``excess_share`` is the observed share's excess over the null median, as
    a part of the room between that median and ``1``.
    """
    n_targets = residual.shape[1]
    rows = _deleted_rows(basis, gram_inverse, residual, values, participation)
    if rows is None or n_targets < 2:
        return 1.0, 0.0
    S = rows["rows"]
    others = np.ones(len(residual), dtype=bool)
    others[S] = False
    if len(S) > _ANISOTROPY_ROWS:  # the first rows of S carry most of ``values``
        rows = dict(rows, rows=S[:_ANISOTROPY_ROWS],
                    deleted=rows["deleted"][:_ANISOTROPY_ROWS])
    energy = np.einsum("ij,ij->i", residual[others], residual[others])
    total = float(energy.sum())
    if total <= 0:
        return 1.0, 0.0
    dof = min(float(rows["dof"]), total**2 / float(energy @ energy))
    if dof <= n_targets + 1:
        return 1.0, 0.0
    decorrelated = _row_decorrelated(basis, gram_inverse, residual, rows, others)
    if decorrelated is None:
        return 1.0, 0.0
    m = len(decorrelated)
    lengths = np.linalg.norm(decorrelated, axis=1, keepdims=True)
    if np.any(lengths <= 0):
        return 1.0, 0.0
    observed = float(_top_share(decorrelated / lengths))
    # The null: Gaussian rows whitened as the observed ones were, by a Wishart estimate of
    # their covariance (its diagonal where the observed whitening is diagonal).
    scale = np.eye(n_targets) / dof
    estimate = stats.wishart(df=dof, scale=scale).rvs(size=n_draws, random_state=rng)
    estimate = estimate.reshape(n_draws, n_targets, n_targets)
    if not rows["full"]:
        estimate = estimate * np.eye(n_targets)
    draws = rng.standard_normal((n_draws, m, n_targets)) @ _inverse_sqrt(estimate)
    null = np.log(_top_share(draws / np.linalg.norm(draws, axis=-1, keepdims=True)))
    spread = float(np.std(null, ddof=1))
    if not spread > 0:
        return 1.0, 0.0
    p_value = float(special.ndtr(-(math.log(observed) - np.mean(null)) / spread))
    median = float(np.exp(np.median(null)))
    excess = (observed - median) / (1 - median) if median < 1 else 0.0
    return p_value, float(excess)


def influence_caveat(result):
    """The warning naming the flagged directions of ``result`` (``None`` where none is)."""
    if not _n_flagged(result):
        return None
    n_rows = result["n_rows"]
    parts = [f"direction {k + 1} is carried by about "
             f"{max(1, round(result['participation'][k]))} of {n_rows} rows"
             for k in result["flagged"]]
    if not parts:
        parts = [f"a combination of the accepted directions is carried by about "
                 f"{max(1, round(result['combination']['participation']))} of {n_rows} rows"]
    many = len(parts) > 1
    text = "; ".join(parts)
    return (f"{text[0].upper()}{text[1:]} (a direction spread over the rows as the inputs "
            f"spread them is carried by about {round(result['null_median'])}): outliers or "
            f"leverage points; the rank may count {'them' if many else 'it'}. rank_interval_ "
            f"starts below {'them' if many else 'it'} (diagnostics_['influential_directions']).")


def widened_interval(interval, rank, result):
    """``interval`` whose low end excludes the flagged directions of ``result``."""
    if interval is None or not _n_flagged(result):
        return interval
    low, high = interval
    return (max(0, min(low, rank - _n_flagged(result))), high)
