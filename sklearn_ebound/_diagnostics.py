"""Residual diagnostics: do the least-squares residuals meet what the Tracy–Widom edges assume?

The edges of :mod:`._null_edges` are exact for Gaussian noise that is independent from row to
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

Every family is tested at ``DIAGNOSTIC_LEVEL / 4`` (Bonferroni over its projections), so clean
Gaussian data switch away from the Tracy–Widom calibration with probability at most
``DIAGNOSTIC_LEVEL`` (1e-5). Pure functions of the residual rows: nothing here sets state.
"""

import math
from dataclasses import dataclass

import numpy as np
from scipy import special

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
    basis : ndarray of shape (n_rows, rank_x)
        Orthonormal columns spanning the centred inputs: ``Q`` with fitted values ``Q Qᵀ Y``.
    leverage : ndarray of shape (n_rows,)
        Diagonal of the hat matrix, ``||Q_i||^2``.
    projections : ndarray of shape (n_rows, n_projections)
        The residuals' projections on the leading eigenvectors of their cross-products.
    inputs : ndarray of shape (n_rows, n_inputs)
        The centred inputs, standardised (their leading principal components where they are
        too many for the rows).
    groups : ndarray of shape (n_rows,) of int, or None
        Group codes ``0 .. n_groups - 1``, where groups are known.
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
    projections are computed (``n (p + q) k`` operations for ``k`` projections); the basis,
    the leverages and the residuals themselves (for resampling) with ``with_residual``.
    """
    Xc = X / moments.scale_x - moments.mean_x
    directions = _leading_directions(operator.residual)
    # Yc V - Xc B V without a centred copy of Y: Y V / s_y - mean_y V - Xc (B V).
    projections = ((Y @ directions) / moments.scale_y - moments.mean_y @ directions
                   - Xc @ (operator.coef @ directions))
    basis = leverage = residual = None
    if with_residual:
        basis = Xc @ operator.input_basis
        leverage = np.einsum("ij,ij->i", basis, basis)
        residual = (Y / moments.scale_y - moments.mean_y) - basis @ (
            operator.input_basis.T @ moments.xy)
    return ResidualRows(projections, _test_inputs(Xc, moments), groups, basis, leverage,
                        residual)


def _leading_directions(residual, n_steps=2):
    """Orthonormal directions near the leading eigenvectors of the residual cross-products:
    a few steps of subspace iteration from the targets of largest residual variance (a full
    eigendecomposition would cost more than the diagnostics themselves)."""
    q = residual.shape[0]
    if q <= _N_PROJECTIONS:
        return np.eye(q)
    start = np.argsort(np.diag(residual))[-_N_PROJECTIONS:][::-1]
    directions = residual[:, start]
    for _ in range(n_steps):
        directions = np.linalg.qr(residual @ directions)[0]
    return directions


def _test_inputs(Xc, moments):
    """Standardised inputs for the variance test: all of them where the rows allow 40 per
    input (a linear and a square term each), else the leading principal components of their
    correlations."""
    n = Xc.shape[0]
    sd = np.sqrt(np.clip(np.diag(moments.xx), 0, None) / max(moments.dof, 1))
    keep = sd > 0
    z = Xc * (1 / sd) if keep.all() else Xc[:, keep] / sd[keep]
    room = max(1, (n - 2) // 40)
    if z.shape[1] > min(room, 2 * _MAX_INPUTS):
        k = min(room, _MAX_INPUTS)
        corr = moments.xx[np.ix_(keep, keep)] / np.outer(sd[keep], sd[keep]) / max(moments.dof, 1)
        values, vectors = np.linalg.eigh(corr)
        top = vectors[:, ::-1][:, :k]
        z = (z @ top) / np.sqrt(np.clip(values[::-1][:k], 1e-300, None))
    return z


def _column_means(A):
    """Column means by a matrix-vector product (a reduction along the rows costs several
    times more for row-major arrays)."""
    return (np.ones(A.shape[0]) @ A) / A.shape[0]


def _min_p(p_values, n_tests=None):
    """Bonferroni combination of ``p_values``."""
    p_values = np.asarray(p_values, dtype=np.float64)
    return float(min(1.0, p_values.min() * (n_tests or p_values.size)))


def _lm_tests(designs, target, total):
    """``n R^2`` of ``target`` (centred, sum of squares ``total``) on each of ``designs`` (of
    one shape) with an intercept, and their degrees of freedom: both as arrays, one entry per
    design, the designs' Gram matrices factored in one batched call."""
    n, k = designs[0].shape
    ones = np.ones(n)
    grams, crosses = [], []
    for design in designs:
        mean = (ones @ design) / n
        # The target is centred: the design's mean drops from the cross-products.
        crosses.append(design.T @ target)
        grams.append(design.T @ design - n * np.outer(mean, mean))
    grams, crosses = np.stack(grams), np.stack(crosses)
    # R^2 = cᵀ G⁻¹ c / total with G the centred design's Gram (pseudo-inverse where singular).
    ridge = 1e-12 * np.trace(grams, axis1=1, axis2=2)[:, None, None] * np.eye(k)
    try:
        factor = np.linalg.cholesky(grams + ridge)
        half = np.linalg.solve(factor, crosses[..., None])[..., 0]
        explained = np.einsum("ij,ij->i", half, half)
        df = np.full(len(designs), k)
    except np.linalg.LinAlgError:
        explained, df = np.empty(len(designs)), np.empty(len(designs), dtype=int)
        for i, (gram, cross) in enumerate(zip(grams, crosses, strict=True)):
            values, vectors = np.linalg.eigh(gram)
            keep = values > 1e-10 * values[-1]
            half = (vectors[:, keep].T @ cross) / np.sqrt(values[keep])
            explained[i], df[i] = half @ half, np.count_nonzero(keep)
    return n * np.clip(explained / total, 0.0, 1.0), df


def _heteroscedasticity(rows):
    """Koenker's studentised Breusch–Pagan test of the squared projections' norms on the
    standardised inputs and, separately, on their squares (Bonferroni over the two)."""
    z = rows.inputs
    target = np.einsum("ij,ij->i", rows.projections, rows.projections)
    target -= target.sum() / target.size
    total = float(target @ target)
    if total <= 0 or z.shape[1] == 0:
        return {"statistic": 0.0, "df": 0, "p_value": 1.0}
    statistic, df = _lm_tests((z, z * z), target, total)
    p_values = np.where(df > 0, special.chdtrc(np.maximum(df, 1), statistic), 1.0)
    return {"statistic": float(statistic.max()), "df": int(df.sum()),
            "p_value": _min_p(p_values)}


def _serial_dependence(centred, square):
    """Portmanteau test of each projection over ``h`` lags, Bonferroni over projections.

    The lag-``l`` statistic is self-normalised, ``sum_t u_t u_{t-l} / sqrt(sum_t u_t^2
    u_{t-l}^2)``, standard normal for independent rows whatever their variances and tails
    (the Ljung–Box form assumes both away, and rejects for heteroscedastic noise alone). The
    sums run over the rows ``t >= h`` for every lag (one product of lagged views for all).
    ``centred`` are the centred projections and ``square`` their squares.
    """
    n = centred.shape[0]
    lags = min(_MAX_LAGS, max(1, n // 10))
    # window[t, j, l] = u_{t + l}: the current row is l = lags, lag l is index lags - l.
    window = np.lib.stride_tricks.sliding_window_view(centred, lags + 1, axis=0)
    window_sq = np.lib.stride_tricks.sliding_window_view(square, lags + 1, axis=0)
    products = np.einsum("tj,tjl->jl", window[:, :, lags], window[:, :, lags - 1::-1])
    scales = np.einsum("tj,tjl->jl", window_sq[:, :, lags], window_sq[:, :, lags - 1::-1])
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(scales > 0, products / np.sqrt(np.clip(scales, 0, None)), 0.0)
    statistic = np.einsum("jl,jl->j", z, z)
    p_values = special.chdtrc(lags, statistic)
    denominator = np.ones(n) @ square
    lag_one = products[:, 0] / np.where(denominator > 0, denominator, 1.0)
    return {"statistic": float(statistic.max()), "lags": lags,
            "lag1_autocorrelation": float(lag_one[np.argmax(np.abs(lag_one))]),
            "p_value": _min_p(p_values)}


def _group_dependence(centred, square, groups):
    """One-way analysis of variance of each projection across the groups (upper tail)."""
    n = centred.shape[0]
    counts = np.bincount(groups)
    n_groups = int(np.count_nonzero(counts))
    if n_groups < 2 or n_groups >= n:
        return None
    sums = np.stack([np.bincount(groups, weights=c, minlength=counts.size) for c in centred.T],
                    axis=1)
    present = counts > 0
    between = np.sum(sums[present] ** 2 / counts[present, None], axis=0)
    within = np.ones(n) @ square - between
    df_between, df_within = n_groups - 1, n - n_groups
    with np.errstate(divide="ignore", invalid="ignore"):
        f = np.where(within > 0, (between / df_between) / (within / df_within), 0.0)
    p_values = special.fdtrc(df_between, df_within, f)
    return {"statistic": float(f.max()), "n_groups": n_groups, "p_value": _min_p(p_values)}


def _kurtosis_z(b2, n):
    """Anscombe & Glynn's (1983) normal transform of the sample kurtosis ``b2`` of ``n``
    normal values (the transform of scipy's ``kurtosistest``, whose call costs a fifth of a
    fit here; the constants, functions of ``n`` alone, in scalar arithmetic)."""
    mean = 3.0 * (n - 1) / (n + 1)
    variance = 24.0 * n * (n - 2) * (n - 3) / ((n + 1) ** 2 * (n + 3) * (n + 5))
    root_beta = (6.0 * (n * n - 5 * n + 2) / ((n + 7) * (n + 9))
                 * math.sqrt(6.0 * (n + 3) * (n + 5) / (n * (n - 2) * (n - 3))))
    a = 6.0 + 8.0 / root_beta * (2.0 / root_beta + math.sqrt(1 + 4.0 / root_beta**2))
    denominator = 1 + (b2 - mean) * (math.sqrt(2 / (a - 4.0)) / math.sqrt(variance))
    with np.errstate(divide="ignore", invalid="ignore"):
        term = np.sign(denominator) * np.cbrt((1 - 2.0 / a) / np.abs(denominator))
    z = (1 - 2 / (9.0 * a) - term) / math.sqrt(2 / (9.0 * a))
    return np.where(denominator == 0, -np.inf, z)


def _heavy_tails(centred, square):
    """Test of each projection's excess kurtosis (upper tail), Bonferroni over projections."""
    n = centred.shape[0]
    ones = np.ones(n)
    second = (ones @ square) / n
    b2 = ((ones @ (square * square)) / n) / np.where(second > 0, second, 1.0) ** 2
    p_values = special.ndtr(-_kurtosis_z(b2, n))
    return {"statistic": float(np.max(b2) - 3), "p_value": _min_p(p_values)}


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
    projections = rows.projections
    if rows.n_rows < _MIN_ROWS or projections.shape[1] == 0:
        return diagnostics
    if not np.any(projections):
        return diagnostics
    centred = projections - _column_means(projections)
    square = centred * centred
    diagnostics["heteroscedasticity"] = _heteroscedasticity(rows)
    if serial:
        diagnostics["serial_dependence"] = _serial_dependence(centred, square)
    if rows.groups is not None:
        groups = _group_dependence(centred, square, rows.groups)
        if groups is not None:
            diagnostics["group_dependence"] = groups
    diagnostics["heavy_tails"] = _heavy_tails(centred, square)
    return diagnostics


def failed_assumptions(diagnostics):
    """The assumptions (keys of :data:`ASSUMPTIONS`) the ``diagnostics`` reject, each family
    at ``DIAGNOSTIC_LEVEL / 4``."""
    level = diagnostics.get("level", DIAGNOSTIC_LEVEL) / len(ASSUMPTIONS)
    return tuple(name for name in ASSUMPTIONS
                 if name in diagnostics and diagnostics[name]["p_value"] <= level)
