"""Rank sweeps: the deficiency curve of any estimator with a ``rank`` parameter."""

import numpy as np
from sklearn.model_selection import GridSearchCV
from sklearn.utils import check_array

from .._moments import Moments
from .._operators import solve_static
from .._scoring import get_sequence_scorer
from .._spectrum import tail_energy
from ._results import ResultTable

__all__ = ["rank_sweep", "RankSweepResult"]


class RankSweepResult(ResultTable):
    """Per-rank held-out risk of a rank sweep.

    Columns: ``rank``, ``risk`` (mean over folds of the held-out squared error per sample, or
    per token for sequences, summed over outputs), ``risk_std`` (spread over folds),
    ``excess_risk`` (risk minus the noise floor), ``bound`` (the tail energy ``T(r)`` where the
    operator's spectrum is known). Metadata: ``knee`` (the selected ``r*``: the smallest rank
    whose risk is within the noise of the best; see :func:`rank_sweep`), ``noise_floor``,
    ``n_splits``.
    """


def _outputs(Y):
    return Y.shape[-1] if Y.ndim > 1 else 1


def rank_sweep(estimator, X, Y, ranks, *, cv=5, n_jobs=None, noise_floor=None,
               singular_values=None, param_name="rank", tolerance=0.01, verbose=0):
    """Sweep the rank of a model and locate the knee of its held-out risk.

    Built on :class:`~sklearn.model_selection.GridSearchCV`: ``n_jobs`` and any joblib backend
    (``with joblib.parallel_backend("dask"): ...``) apply. Works for 2-D regressors such as
    :class:`~sklearn_ebound.ReducedRankRegressor` and for sequence regressors such as
    :class:`~sklearn_ebound.nn.LowRankAttentionRegressor`.

    Parameters
    ----------
    estimator : estimator
        A regressor with a rank parameter (``param_name``).
    X, Y : array-like
        2-D ``(n_samples, n_features)`` / ``(n_samples, n_targets)`` or sequences
        ``(n_samples, n_tokens, n_features)`` / ``(n_samples, n_tokens, n_targets)``.
    ranks : iterable of int
        The ranks to try.
    cv : int, cross-validation generator or iterable, default=5
        As in :class:`~sklearn.model_selection.GridSearchCV`.
    n_jobs : int, default=None
        Parallel jobs over ranks and folds.
    noise_floor : float, default=None
        Risk of the true model (``params.noise_floor`` of a planted task). ``None`` estimates
        it for 2-D data from the least-squares residuals; for sequences the excess risk is
        then left empty.
    singular_values : array-like, default=None
        Spectrum of the true operator, for the bound ``T(r)``.
    param_name : str, default="rank"
        The estimator's rank parameter.
    tolerance : float, default=0.01
        Optimisation tolerance of the knee, as a fraction of the risk range (worst rank minus
        best): the knee is the smallest rank whose risk is within one standard error of the
        best, or within ``tolerance`` of the range above it. Trained models stop a little
        short of their optimum; ``tolerance=0`` keeps the plain one-standard-error rule.
    verbose : int, default=0
        Passed to ``GridSearchCV``.

    Returns
    -------
    result : RankSweepResult
    """
    ranks = [int(r) for r in ranks]
    if not ranks:
        raise ValueError("`ranks` must hold at least one rank.")
    X_arr = np.asarray(X) if not hasattr(X, "shape") else X
    Y_arr = np.asarray(Y) if not hasattr(Y, "shape") else Y
    sequences = np.ndim(Y_arr) == 3
    scoring = (get_sequence_scorer("neg_mean_squared_error") if sequences
               else "neg_mean_squared_error")
    search = GridSearchCV(estimator, {param_name: ranks}, scoring=scoring, cv=cv, n_jobs=n_jobs,
                          refit=False, verbose=verbose, error_score="raise")
    search.fit(X, Y)
    results = search.cv_results_
    n_splits = search.n_splits_
    n_outputs = _outputs(Y_arr)
    folds = -np.array([results[f"split{k}_test_score"] for k in range(n_splits)]) * n_outputs
    order = np.argsort(ranks, kind="stable")
    folds = folds[:, order]
    ranks = [ranks[i] for i in order]
    risk, risk_std = folds.mean(axis=0), folds.std(axis=0)
    if noise_floor is None and not sequences:
        X2 = check_array(X_arr, dtype=np.float64)
        Y2 = check_array(Y_arr, dtype=np.float64, ensure_2d=False)
        Y2 = Y2[:, None] if Y2.ndim == 1 else Y2
        noise_floor = solve_static(Moments.from_arrays(X2, Y2)).noise_variance() * n_outputs
    excess = risk - noise_floor if noise_floor is not None else np.full(len(ranks), np.nan)
    if singular_values is not None:
        bound = tail_energy(np.asarray(singular_values, dtype=np.float64), np.array(ranks))
    else:
        bound = np.full(len(ranks), np.nan)
    sem = risk_std / np.sqrt(max(n_splits - 1, 1))
    best = int(np.argmin(risk))
    slack = max(sem[best], tolerance * (risk.max() - risk[best]))
    knee = ranks[int(np.flatnonzero(risk <= risk[best] + slack)[0])]
    rows = [
        {"rank": r, "risk": m, "risk_std": s, "excess_risk": e, "bound": b}
        for r, m, s, e, b in zip(ranks, risk, risk_std, excess, bound, strict=True)
    ]
    return RankSweepResult(rows, knee=knee, noise_floor=noise_floor, n_splits=n_splits)
