"""Residual diagnostics: do the least-squares residuals meet what the Tracy–Widom edges assume?

The laws of :mod:`._null_laws` are exact for Gaussian noise that is independent from row to
row and of one covariance for every row. Conditionally on the inputs, the noise part of the
fitted values is then a Gaussian matrix whatever the inputs are, so only the noise matters:

* **input-dependent variance** (heteroscedasticity): Koenker's studentised Breusch–Pagan
  test, the squared residual norms regressed on the leading whitened inputs and their
  squares (``n R^2``, chi-square);
* **dependence along the row order**: a portmanteau test of the residuals' leading principal
  projections over five lags, self-normalised so that heteroscedastic or heavy-tailed but
  independent rows do not fail it (time series, tokens of a sequence);
* **dependence within groups**: the one-way analysis of variance of the same projections
  across the groups (an intra-class correlation makes the group means vary too much);
* **heavy tails**: D'Agostino's test of the projections' excess kurtosis.

Each test is named for the assumption it tests (as statsmodels' ``het_*`` and ``acorr_*``):
:func:`heteroscedasticity_test`, :func:`serial_dependence_test`,
:func:`group_dependence_test`, :func:`heavy_tails_test`; :func:`diagnose_residuals` runs them
on the residual rows. :func:`residuals_are_spherical` (John's and the largest root's tests)
says whether the residuals are white across the targets, which decides between the white and
the correlated null laws.

Every family is tested at ``DIAGNOSTIC_LEVEL / 4`` (Bonferroni over its projections), so clean
Gaussian data switch away from the Tracy–Widom calibration with probability at most
``DIAGNOSTIC_LEVEL`` (1e-5). Pure functions of the residual rows: nothing here sets state.
"""

import functools
import math
from dataclasses import dataclass

import numpy as np
from scipy import special
from scipy.linalg import blas, lapack

from ._null_laws import tracy_widom_p_value, white_edge_law

__all__ = [
    "DIAGNOSTIC_LEVEL",
    "ASSUMPTIONS",
    "RowSample",
    "RowKeeper",
    "MAX_KEPT_ROWS",
    "DIAGNOSTIC_ROWS",
    "ResidualRows",
    "residual_rows",
    "diagnose_residuals",
    "failed_assumptions",
    "absorbed_group_contrasts",
    "heteroscedasticity_test",
    "serial_dependence_test",
    "group_dependence_test",
    "heavy_tails_test",
    "residuals_are_spherical",
]

# Rows that partial_fit and dask keep for the diagnostics and the resampling.
MAX_KEPT_ROWS = 20_000
# Rows the diagnostics read (the first of those kept).
DIAGNOSTIC_ROWS = 1024
# Chance that clean Gaussian data fail any of the four families.
DIAGNOSTIC_LEVEL = 1e-5
# The assumptions, in the order they are reported, and their description in a warning.
ASSUMPTIONS = {
    "heteroscedasticity": "the noise variance depends on the inputs",
    "serial_dependence": "the rows are dependent along their order",
    "group_dependence": "the rows of a group are dependent",
    "heavy_tails": "the noise has heavy tails",
}
# Residual projections tested, the most lags, and the inputs of the variance test (all up to
# twice this many, else this many principal components).
_N_PROJECTIONS = 3
_MAX_LAGS = 5
_MAX_INPUTS = 10
# Fewer rows than this leave the asymptotic laws of the tests unreliable: they are skipped.
_MIN_ROWS = 20


@dataclass(frozen=True)
class RowSample:
    """Rows of the 2-D statistics kept for the diagnostics, in the units of the data.

    Attributes
    ----------
    X, Y : ndarray of shape (n_rows, n_inputs) and (n_rows, n_targets)
    groups : ndarray of shape (n_rows,) or None
        Group labels per row (any labels ``np.unique`` sorts), where known.
    complete : bool
        Whether these are all the rows the moments saw (``fit``), or the first of them
        (``partial_fit`` and dask keep a bounded number).
    """

    X: np.ndarray
    Y: np.ndarray
    groups: np.ndarray | None = None
    complete: bool = True

    @property
    def n_rows(self):
        return self.X.shape[0]

    def group_codes(self):
        """The groups as codes ``0 .. n_groups - 1`` (``None`` without groups)."""
        if self.groups is None:
            return None
        return np.unique(self.groups, return_inverse=True)[1].ravel()


class RowKeeper:
    """Keeps the first ``max_rows`` rows of the chunks it is given, with their groups."""

    def __init__(self, max_rows=MAX_KEPT_ROWS):
        self.max_rows = max_rows
        self.parts = []
        self.n_kept = 0

    def add(self, X, Y, groups=None):
        room = self.max_rows - self.n_kept
        if room <= 0:
            return
        X, Y = X[:room], Y[:room]
        self.parts.append((X, Y, None if groups is None else np.asarray(groups)[:room]))
        self.n_kept += X.shape[0]

    def sample(self, n_total):
        """The :class:`RowSample` kept, of ``n_total`` rows seen; ``None`` before any row."""
        if not self.parts:
            return None
        if len(self.parts) > 1:  # consolidate once, so the next read does not concatenate
            Xs, Ys, gs = zip(*self.parts, strict=True)
            groups = None if any(g is None for g in gs) else np.concatenate(gs)
            self.parts = [(np.concatenate(Xs), np.concatenate(Ys), groups)]
        X, Y, groups = self.parts[0]
        return RowSample(X, Y, groups, complete=self.n_kept == n_total)


@dataclass(frozen=True)
class ResidualRows:
    """Per-row quantities of a least-squares fit, for diagnostics and resampling.

    Attributes
    ----------
    projections : ndarray of shape (n_rows, n_projections)
        The residuals' projections on the leading eigenvectors of their cross-products.
    inputs : ndarray of shape (n_rows, n_inputs)
        The inputs of the variance test: the inputs centred at the moments' means and
        standardised (to unit variance over every row the moments saw; their leading
        principal components where they are too many for the rows).
    groups : ndarray of shape (n_rows,) of int, or None
        Group codes ``0 .. n_groups - 1``, where groups are known.
    basis : ndarray of shape (n_rows, rank_x)
        Orthonormal columns spanning the centred inputs: ``Q`` with fitted values ``Q Qᵀ Y``.
    leverage : ndarray of shape (n_rows,)
        Diagonal of the hat matrix, ``||Q_i||^2``.
    residual : ndarray of shape (n_rows, n_targets) or None
        The residual rows themselves (``with_residual=True``).
    """

    projections: np.ndarray
    inputs: np.ndarray
    groups: np.ndarray | None = None
    basis: np.ndarray | None = None
    leverage: np.ndarray | None = None
    residual: np.ndarray | None = None

    @property
    def n_rows(self):
        return self.projections.shape[0]


def residual_rows(X, Y, moments, operator, groups=None, with_residual=False):
    """The :class:`ResidualRows` of the rows ``(X, Y)`` whose ``moments`` ``operator`` solves.

    ``X`` and ``Y`` are in the units of the data; ``moments`` divided them by its scales.
    ``groups`` are codes per row or ``None``. For the diagnostics only the residuals' leading
    projections and the variance test's inputs are computed (``n (p + q) k`` operations for
    ``k`` projections); the basis, the leverages and the residuals themselves (for
    resampling) with ``with_residual``.
    """
    directions = _leading_directions(operator)
    coef = operator.coef @ directions
    sd = np.sqrt(np.maximum(np.diagonal(moments.xx), 0) / max(moments.dof, 1))
    keep = sd > 0
    # The inputs centred at the moments' means in the units of the data, w = s_x Xc, in one
    # pass over the rows: Xc B V = w (B V / s_x), and the standardised inputs are w / (s_x sd).
    centre = moments.scale_x * moments.mean_x
    if keep.all():
        w = X - centre
        unit = 1 / (moments.scale_x * sd)
    else:  # constant inputs (their rows of B are zero) are left out
        w = X[:, keep] - centre[keep]
        coef = coef[keep]
        unit = 1 / (moments.scale_x * sd[keep])
    fitted = (coef / moments.scale_x).T @ w.T
    # Vᵀ Ycᵀ - (B V)ᵀ Xcᵀ without a centred copy of Y, one row per projection (so that the
    # tests reduce along contiguous rows): Vᵀ Yᵀ / s_y - Vᵀ mean_y - (B V)ᵀ Xcᵀ.
    projections = (directions.T / moments.scale_y) @ Y.T
    projections -= fitted
    projections -= (moments.mean_y @ directions)[:, None]
    components = _test_components(X.shape[0], w.shape[1], keep, sd, moments)
    if components is None:
        w *= unit  # w is ours: standardised in place
    else:  # the leading principal components, standardised
        w = w @ (unit[:, None] * components)
    basis = leverage = residual = None
    if with_residual:
        Xc = X / moments.scale_x - moments.mean_x
        basis = Xc @ operator.input_basis
        leverage = np.einsum("ij,ij->i", basis, basis)
        residual = (Y / moments.scale_y - moments.mean_y) - basis @ (
            operator.input_basis.T @ moments.xy)
    return ResidualRows(projections.T, w, groups, basis, leverage, residual)


def _leading_directions(operator):
    """Orthonormal leading eigenvectors of the residual cross-products (those the noise
    edges computed already: :attr:`StaticOperator.residual_covariance_eigh`); all the
    targets where they are few."""
    q = operator.residual.shape[0]
    if q <= _N_PROJECTIONS:
        return np.eye(q)
    return operator.residual_covariance_eigh[1][:, : -_N_PROJECTIONS - 1: -1]


def _test_components(n, n_kept, keep, sd, moments):
    """The variance test takes the ``n_kept`` inputs of positive ``sd`` (``keep``) where the
    ``n`` rows allow 40 per input (a linear and a square term each): ``None``; else the
    leading principal components of their correlations, whose directions this returns, each
    divided by the square root of its eigenvalue."""
    room = max(1, (n - 2) // 40)
    if n_kept <= min(room, 2 * _MAX_INPUTS):
        return None
    k = min(room, _MAX_INPUTS)
    corr = moments.xx[np.ix_(keep, keep)] / np.outer(sd[keep], sd[keep]) / max(moments.dof, 1)
    values, vectors = np.linalg.eigh(corr)
    top = vectors[:, ::-1][:, :k]
    return top / np.sqrt(np.clip(values[::-1][:k], 1e-300, None))


def _min_p(p_values, n_tests=None):
    """Bonferroni combination of ``p_values`` (a sequence or an array)."""
    if isinstance(p_values, np.ndarray):
        p_values = p_values.tolist()
    return float(min(1.0, min(p_values) * (n_tests or len(p_values))))


def _chi2_upper(df, x):
    """``P(chi2_df > x)`` for an integer ``df``, a Python float.

    In closed form (Abramowitz & Stegun 26.4.4-26.4.5: a Poisson sum for even ``df``, the
    normal tail plus such a sum for odd ``df``, every term positive), as scipy's ``chdtrc``
    costs more for the few values tested here than the arithmetic; through ``chdtrc`` where
    the sum would be long or its terms underflow.
    """
    if not x > 0:
        return 1.0 if x <= 0 else float(special.chdtrc(df, x))
    if df > 60 or x > 1200:
        return float(special.chdtrc(df, x))
    half = 0.5 * x
    if df % 2 == 0:
        term = total = math.exp(-half)
        for i in range(1, df // 2):
            term *= half / i
            total += term
    else:
        total = math.erfc(math.sqrt(half))
        term = math.exp(-half) * math.sqrt(half / math.pi) * 2.0
        for i in range(1, (df + 1) // 2):
            total += term
            term *= half / (i + 0.5)
    return min(total, 1.0)


def _lm_statistics(designs, target, total):
    """``n R^2`` of the centred target (row 0 of ``target``, sum of squares ``total``; row 1
    is ones) regressed with an intercept on each of the standardised ``designs`` of ``n``
    rows, and the degrees of freedom: two lists.

    The explained sum of squares is ``c^T G^-1 c``, ``G`` the centred Gram matrix of the
    design (one product, the outer product of its column sums its start) and ``c`` its
    centred cross-products with the target: one Cholesky factor and one triangular solve.
    """
    n = designs[0].shape[0]
    statistics, dfs = [], []
    for design in designs:
        k = design.shape[1]
        cross, sums = target @ design
        gram = blas.dgemm(1.0, design.T, design.T, trans_b=1, beta=1.0,
                          c=np.multiply.outer(sums, sums / -n), overwrite_c=1)
        # A ridge of 1e-12 of the design's trace keeps nearly collinear designs factorable.
        diagonal = gram.T.reshape(-1)[:: k + 1]
        diagonal += 1e-12 * np.add.reduce(diagonal)
        factor, info = lapack.dpotrf(gram, lower=1, clean=0, overwrite_a=1)
        if info == 0:
            half = lapack.dtrtrs(factor, cross, lower=1)[0]
            df = k
        else:  # a singular design, or a target in its span
            values, vectors = np.linalg.eigh(design.T @ design - np.multiply.outer(sums, sums / n))
            keep = values > 1e-10 * values[-1]
            half = (vectors[:, keep].T @ cross) / np.sqrt(values[keep])
            df = int(np.count_nonzero(keep))
        statistics.append(n * min(max(float(half @ half) / total, 0.0), 1.0))
        dfs.append(df)
    return statistics, dfs


def heteroscedasticity_test(both, means, inputs):
    """Koenker's studentised Breusch–Pagan test of the squared projections' norms on the
    standardised inputs and, separately, on their squares (Bonferroni over the two).

    ``both`` holds the centred projections ``c``, then their squares, one row each, and
    ``means`` the projections' means ``m``: the squared norms ``||c + m||^2`` are
    ``sum_j c_j^2 + 2 m . c`` plus a constant, which the intercept absorbs (one product).
    """
    n, k = inputs.shape
    if k == 0:
        return {"statistic": 0.0, "df": 0, "p_value": 1.0}
    # The target (centred below) and ones, one row each: their products with a design are
    # its centred cross-products with the target and its column sums, in one product.
    target = np.empty((2, n))
    np.matmul(np.array([2.0 * m for m in means] + [1.0] * len(means)), both, out=target[0])
    target[1] = 1.0
    square_sum, target_sum = (target @ target[0]).tolist()
    total = square_sum - target_sum * (target_sum / n)
    # The target's spread is lost to rounding where its centring cancels all of it.
    if not total > 64 * np.finfo(float).eps * square_sum:
        return {"statistic": 0.0, "df": 0, "p_value": 1.0}
    target[0] -= target_sum / n
    statistics, dfs = _lm_statistics((inputs, np.square(inputs)), target, total)
    p_values = [_chi2_upper(df, s) if df > 0 else 1.0 for s, df in zip(statistics, dfs,
                                                                          strict=True)]
    return {"statistic": max(statistics), "df": sum(dfs), "p_value": _min_p(p_values)}


def _lagged_sums(both, k):
    """The sums the serial and the tail tests read, one correlation per row.

    ``both`` holds the ``k`` centred projections ``u``, then their squares, one row each.
    Returns the number of lags ``h``, and per projection (lists of Python numbers): the lag
    products ``sum_{t >= h} u_t u_{t-l}`` and ``sum_{t >= h} u_t^2 u_{t-l}^2`` for ``l = 1 ..
    h``, and the sums ``sum_t u_t^2`` and ``sum_t u_t^4`` over every row.
    """
    n = both.shape[1]
    lags = min(_MAX_LAGS, max(1, n // 10))
    # sums[j, m] = sum_t both[j, t + m] both[j, t + h]: lag l is m = h - l (a correlation
    # per row costs less than one product of lagged views).
    sums = np.array([np.correlate(row, row[lags:], "valid") for row in both])
    # Lag 0 over the rows t >= h, plus the first h rows: the sums over every row.
    head = both[:, :lags]
    totals = (sums[:, lags] + np.add.reduce(head * head, axis=1)).tolist()
    sums = sums[:, lags - 1:: -1].tolist()
    return lags, sums[:k], sums[k:], totals[:k], totals[k:]


def serial_dependence_test(lags, products, scales, second):
    """Portmanteau test of each projection over ``h`` lags, Bonferroni over projections.

    The lag-``l`` statistic is self-normalised, ``sum_t u_t u_{t-l} / sqrt(sum_t u_t^2
    u_{t-l}^2)``, standard normal for independent rows whatever their variances and tails
    (the Ljung–Box form assumes both away, and rejects for heteroscedastic noise alone). The
    sums run over the rows ``t >= h`` for every lag (:func:`_lagged_sums`); ``second`` is
    ``sum_t u_t^2`` over every row.
    """
    # The scales are sums of products of squares: zero only where every product is.
    statistic = [sum(x * x / y for x, y in zip(row, scale, strict=True) if y > 0)
                 for row, scale in zip(products, scales, strict=True)]
    p_values = [_chi2_upper(lags, s) for s in statistic]
    lag_one = [row[0] / (total if total > 0 else 1.0)
               for row, total in zip(products, second, strict=True)]
    return {"statistic": max(statistic), "lags": lags,
            "lag1_autocorrelation": max(lag_one, key=abs), "p_value": _min_p(p_values)}


def group_dependence_test(centred, second, groups):
    """One-way analysis of variance of each projection across the groups (upper tail);
    ``second`` are the sums of the centred projections' squares."""
    n = centred.shape[1]
    counts = np.bincount(groups)
    n_groups = int(np.count_nonzero(counts))
    if n_groups < 2 or n_groups >= n:
        return None
    sums = np.stack([np.bincount(groups, weights=c, minlength=counts.size) for c in centred],
                    axis=1)
    present = counts > 0
    between = np.sum(sums[present] ** 2 / counts[present, None], axis=0)
    within = np.asarray(second) - between
    df_between, df_within = n_groups - 1, n - n_groups
    with np.errstate(divide="ignore", invalid="ignore"):
        f = np.where(within > 0, (between / df_between) / (within / df_within), 0.0)
    p_values = special.fdtrc(df_between, df_within, f)
    return {"statistic": float(f.max()), "n_groups": n_groups, "p_value": _min_p(p_values)}


@functools.lru_cache(maxsize=8)
def _kurtosis_constants(n):
    """The constants of :func:`_kurtosis_z` for ``n`` values (the diagnostics read a fixed
    number of rows)."""
    mean = 3.0 * (n - 1) / (n + 1)
    variance = 24.0 * n * (n - 2) * (n - 3) / ((n + 1) ** 2 * (n + 3) * (n + 5))
    root_beta = (6.0 * (n * n - 5 * n + 2) / ((n + 7) * (n + 9))
                 * math.sqrt(6.0 * (n + 3) * (n + 5) / (n * (n - 2) * (n - 3))))
    a = 6.0 + 8.0 / root_beta * (2.0 / root_beta + math.sqrt(1 + 4.0 / root_beta**2))
    slope = math.sqrt(2 / (a - 4.0)) / math.sqrt(variance)
    centre, unit = 1 - 2 / (9.0 * a), math.sqrt(2 / (9.0 * a))
    return mean, slope, centre, unit, a


def _kurtosis_z(b2, n):
    """Anscombe & Glynn's (1983) normal transform of the sample kurtosis ``b2`` (a sequence)
    of ``n`` normal values (the transform of scipy's ``kurtosistest``, whose call costs a
    fifth of a fit here; in scalar arithmetic, for the few projections tested): a list."""
    mean, slope, centre, unit, a = _kurtosis_constants(n)
    z = []
    for value in b2:
        denominator = 1 + (value - mean) * slope
        if denominator == 0:
            z.append(-math.inf)
            continue
        term = math.copysign(math.cbrt((1 - 2.0 / a) / abs(denominator)), denominator)
        z.append((centre - term) / unit)
    return z


def heavy_tails_test(n, second, fourth):
    """Test of each projection's excess kurtosis (upper tail), Bonferroni over projections,
    from the sums of the centred projections' second and fourth powers over ``n`` rows."""
    b2 = [(f / n) / ((s / n if s > 0 else 1.0) ** 2) for s, f in zip(second, fourth, strict=True)]
    # The standard normal upper tail, P(Z > z) = erfc(z / sqrt 2) / 2 (no cancellation).
    p_values = [0.5 * math.erfc(z / math.sqrt(2.0)) for z in _kurtosis_z(b2, n)]
    return {"statistic": max(b2) - 3, "p_value": _min_p(p_values)}


def diagnose_residuals(rows, serial=True):
    """Test the residual rows for what the Tracy–Widom edges assume.

    Parameters
    ----------
    rows : ResidualRows
    serial : bool, default=True
        Whether the row order means something (not for rows of several chunks whose order
        was lost); without it the serial test is skipped.

    Returns
    -------
    diagnostics : dict
        ``{assumption: {"statistic": ..., "p_value": ..., ...}}`` for each family tested (of
        :data:`ASSUMPTIONS`), with ``"n_rows"`` and ``"level"``; empty families are absent
        (no groups, or too few rows).
    """
    diagnostics = {"n_rows": rows.n_rows, "level": DIAGNOSTIC_LEVEL}
    k = rows.projections.shape[1]
    if rows.n_rows < _MIN_ROWS or k == 0:
        return diagnostics
    # One row per projection, so that every test reduces along contiguous rows; the centred
    # projections and their squares in one array (the serial test reads both at once).
    raw = rows.projections.T
    n = raw.shape[1]
    both = np.empty((2 * k, n))
    centred, square = both[:k], both[k:]
    means = np.add.reduce(raw, axis=1) / n
    np.subtract(raw, means[:, None], out=centred)
    np.multiply(centred, centred, out=square)
    lags, products, scales, second, fourth = _lagged_sums(both, k)
    means = means.tolist()
    if not (any(second) or any(means)):  # no residual in these directions
        return diagnostics
    diagnostics["heteroscedasticity"] = heteroscedasticity_test(both, means, rows.inputs)
    if serial:
        diagnostics["serial_dependence"] = serial_dependence_test(lags, products, scales, second)
    if rows.groups is not None:
        groups = group_dependence_test(centred, second, rows.groups)
        if groups is not None:
            diagnostics["group_dependence"] = groups
    diagnostics["heavy_tails"] = heavy_tails_test(n, second, fourth)
    return diagnostics


def failed_assumptions(diagnostics):
    """The assumptions (keys of :data:`ASSUMPTIONS`) the ``diagnostics`` reject, each family
    at ``DIAGNOSTIC_LEVEL / 4``."""
    level = diagnostics.get("level", DIAGNOSTIC_LEVEL) / len(ASSUMPTIONS)
    return tuple(name for name in ASSUMPTIONS
                 if name in diagnostics and diagnostics[name]["p_value"] <= level)


def absorbed_group_contrasts(basis, groups):
    """How much of the group contrasts the inputs' column space holds.

    With ``Q`` (``basis``) orthonormal columns spanning the centred inputs and ``P_G`` the
    projection on the group indicators, ``tr(Qᵀ P_G Q) = sum_g n_g ||mean_g(Q)||^2`` is the sum
    of the squared canonical correlations between the two spaces: of the ``G - 1`` directions
    that separate the groups, about that many lie in the inputs' span (by chance about
    ``k (G - 1) / n``). Noise shared within a group along those directions goes into the
    fitted values and leaves the residuals, where no test can see it.

    Returns ``(absorbed, n_contrasts)``, ``n_contrasts = G - 1``.
    """
    codes = np.asarray(groups).ravel()
    counts = np.bincount(codes)
    sums = np.zeros((counts.size, basis.shape[1]))
    np.add.at(sums, codes, basis)
    present = counts > 0
    absorbed = float(np.sum(sums[present] ** 2 / counts[present, None]))
    return absorbed, int(present.sum()) - 1


# Levels of the two sphericity tests: John's (its standard normal quantile) and the largest
# root's.
_Z_JOHN = 1.6449  # 5%
_LARGEST_ROOT_LEVEL = 0.025


def residuals_are_spherical(residual, dof, eigenvalues=None):
    """Whether residual cross-products are consistent with white noise ``sigma^2 I``.

    White is kept unless one of two tests of sphericity rejects it:

    - John's statistic ``U = q tr(S^2) / tr(S)^2 - 1`` of the residual covariance ``S``, at the
      5% level; under sphericity ``dof U - q`` tends to ``N(1, 4)`` as ``dof`` and ``q`` grow
      in any proportion (Ledoit & Wolf 2002), so ``q > dof`` is allowed. It sees correlation
      spread over many directions (AR(1) noise across the targets);
    - the largest root (Roy's test), ``l_1 q / tr(S)`` against Johnstone's (2001) Tracy–Widom
      law of the largest eigenvalue of a white ``dof x q`` Wishart matrix, at the 2.5% level:
      the powerful test against one strong noise direction (Onatski, Moreira & Hallin 2013),
      which John's test misses when the spike's own sample eigenvalue comes out low (a spike
      of 6 at ``dof = 49, q = 60``: John's test kept white in 2 of 400 draws, the two tests
      together in none). Dividing by the trace instead of a known ``sigma^2`` narrows its
      law (Nadler 2011), so the test is conservative: 1.5-2.7% of white draws at ``dof``
      20-2000, far fewer with a handful of targets or degrees of freedom.

    White draws leave the white path in 5-6% of cases by John's test alone and 6-7.5% by
    either (4000 draws at ``dof, q`` from ``49, 50`` to ``1979, 60``). Rejecting white noise
    only sends it to the test for correlated noise, which holds its level for any covariance
    at a little power, while keeping correlated noise as white puts the edge too low: John's
    test keeps its 5% (AR(1) 0.2 noise at ``rank(X) = 50, dof = 49``, 300 draws: 3.7% false
    positives when sphericity was kept at the 0.1% level, 1.3% at 5%; 400 draws: 0.75% with
    John's test at 2.5%, 0.25% at 5%). ``eigenvalues``, where given, are those of
    ``residual / dof`` (computed before).
    """
    q = residual.shape[0]
    trace = np.trace(residual)
    if q < 2 or dof < 2 or trace <= 0:
        return True
    unit = residual / trace  # tr = 1: no under- or overflow in tr(S^2) / tr(S)^2
    u = q * np.sum(unit * unit) - 1
    if (dof * u - q - 1) / 2 > _Z_JOHN:
        return False
    largest = (np.linalg.eigvalsh(unit)[-1] if eigenvalues is None
               else max(float(eigenvalues[-1]), 0.0) * dof / trace)
    mu, scale = white_edge_law(dof, q)
    return tracy_widom_p_value((largest * q * dof - mu) / scale) >= _LARGEST_ROOT_LEVEL
