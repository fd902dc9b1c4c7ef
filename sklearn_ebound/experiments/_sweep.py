"""Rank sweeps: the deficiency curve of any estimator with a ``rank`` parameter."""

import json
import math
import os
import tempfile
from pathlib import Path

import joblib
import numpy as np
from sklearn.base import clone, is_classifier
from sklearn.model_selection import GridSearchCV, check_cv
from sklearn.utils import check_array

from .._deficiency import deficiency_columns, estimated_noise_floor
from .._least_squares import solve_static
from .._moments import Moments
from .._scoring import get_sequence_scorer
from .._utils.results import ResultTable

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


def _data_fingerprint(A):
    """Shape, dtype and content hash of a numpy array; shape only for other containers."""
    if isinstance(A, np.ndarray):
        return f"{A.shape} {A.dtype} {joblib.hash(A)}"
    return f"{tuple(A.shape)} (content not hashed: {type(A).__name__})"


def _checkpoint_settings(estimator, X, Y, splits, param_name, scoring):
    """What a rank's fold scores depend on; a checkpoint file is valid only under the same."""
    # The rank itself varies from file to file: blank it before hashing the parameters.
    template = clone(estimator).set_params(**{param_name: None})
    return {
        "format": 1,
        "param_name": param_name,
        "scoring": scoring,
        "estimator": f"{type(estimator).__module__}.{type(estimator).__qualname__}",
        # joblib.hash pickles the parameter values: stable across sessions, exact for arrays
        # (a repr elides long arrays). The repr is kept for people reading the file.
        "estimator_params": joblib.hash(template.get_params(deep=False)),
        "estimator_repr": repr(template),
        "n_splits": len(splits),
        "cv_splits": joblib.hash([(np.asarray(train, dtype=np.int64),
                                   np.asarray(test, dtype=np.int64)) for train, test in splits]),
        "X": _data_fingerprint(X),
        "Y": _data_fingerprint(Y),
    }


def _checkpoint_file(directory, rank):
    return directory / f"rank-{rank}.json"


def _encode_score(value):
    # Strict JSON has no NaN or infinity; repr of a finite float round-trips exactly.
    value = float(value)
    return value if math.isfinite(value) else repr(value)


def _read_checkpoint(directory, rank, settings):
    """The fold scores of ``rank`` stored under ``directory``, or None if not there yet."""
    path = _checkpoint_file(directory, rank)
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text())
        stored, scores = record["settings"], [float(v) for v in record["scores"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(
            f"`checkpoint` file {path.name} is not a rank-sweep checkpoint ({exc}). Use a "
            "directory that only rank_sweep writes to."
        ) from exc
    # The repr is informative only: object reprs may hold memory addresses.
    differ = sorted(key for key in settings.keys() | stored.keys()
                    if key != "estimator_repr" and stored.get(key) != settings.get(key))
    if differ:
        raise ValueError(
            f"`checkpoint` holds rank {rank} from a sweep with other settings (differing: "
            f"{', '.join(differ)}). Its scores would not be comparable. Pass a new `checkpoint`"
            " directory, or empty this one to recompute every rank. Random cv splitters need "
            "an integer `random_state` to give the same splits on a rerun."
        )
    return np.asarray(scores)


def _write_checkpoint(directory, rank, scores, settings):
    """Write one rank's fold scores atomically: a temporary file, then ``os.replace``."""
    record = {"rank": rank, "scores": [_encode_score(v) for v in scores], "settings": settings}
    fd, tmp = tempfile.mkstemp(prefix=f".rank-{rank}-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(record, f, indent=1)
        os.replace(tmp, _checkpoint_file(directory, rank))
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _checkpointed_scores(estimator, X, Y, ranks, *, cv, n_jobs, scoring, scoring_name,
                         param_name, verbose, checkpoint):
    """Per-rank fold scores, read from ``checkpoint`` where present, computed and stored else."""
    directory = Path(checkpoint)
    directory.mkdir(parents=True, exist_ok=True)
    # The splits are drawn once: every group below, and a rerun, must use the same folds.
    splits = list(check_cv(cv, Y, classifier=is_classifier(estimator)).split(X, Y))
    X_arr = np.asarray(X) if not hasattr(X, "shape") else X
    Y_arr = np.asarray(Y) if not hasattr(Y, "shape") else Y
    settings = _checkpoint_settings(estimator, X_arr, Y_arr, splits, param_name, scoring_name)
    scores = {}
    for rank in dict.fromkeys(ranks):
        stored = _read_checkpoint(directory, rank, settings)
        if stored is not None:
            scores[rank] = stored
    missing = [rank for rank in dict.fromkeys(ranks) if rank not in scores]
    # Enough ranks per group to keep every worker busy: n_jobs fits run at once.
    group = max(1, math.ceil(joblib.effective_n_jobs(n_jobs) / len(splits)))
    for start in range(0, len(missing), group):
        search = GridSearchCV(estimator, {param_name: missing[start:start + group]},
                              scoring=scoring, cv=splits, n_jobs=n_jobs, refit=False,
                              verbose=verbose, error_score="raise")
        search.fit(X, Y)
        results = search.cv_results_
        for i, params in enumerate(results["params"]):
            rank = params[param_name]
            scores[rank] = np.array([results[f"split{k}_test_score"][i]
                                     for k in range(len(splits))])
            _write_checkpoint(directory, rank, scores[rank], settings)
    return scores, len(splits)


def rank_sweep(estimator, X, y, ranks, *, cv=5, n_jobs=None, noise_floor=None,
               singular_values=None, param_name="rank", tolerance=0.01, verbose=0,
               checkpoint=None):
    """Sweep the rank of a model and locate the knee of its held-out risk.

    Built on :class:`~sklearn.model_selection.GridSearchCV`: ``n_jobs`` and any joblib backend
    (``with joblib.parallel_backend("dask"): ...``) apply. Works for 2-D regressors such as
    :class:`~sklearn_ebound.ReducedRankRegressor` and for sequence regressors such as
    :class:`~sklearn_ebound.nn.LowRankAttentionRegressor`.

    Parameters
    ----------
    estimator : estimator
        A regressor with a rank parameter (``param_name``).
    X, y : array-like
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
    checkpoint : str or path-like, default=None
        A directory that keeps every finished rank, so that an interrupted sweep loses only
        the ranks in progress. Each rank's per-fold scores go to their own file
        ``rank-<rank>.json``, written atomically (a temporary file, then a rename), with the
        settings they are valid under: the estimator class and a hash of its other
        parameters, ``param_name``, the scoring, a hash of the cv split indices, and the shape
        and a content hash of ``X`` and ``y`` (numpy arrays; other containers by shape only).
        A rerun with the same directory computes only the ranks without a file; a file
        written under other settings raises ``ValueError`` rather than being mixed in or
        silently overwritten. Ranks stored but not asked for are left alone, so a later sweep
        can extend the grid. ``None`` keeps nothing.

    Returns
    -------
    result : RankSweepResult

    Notes
    -----
    With a ``checkpoint`` the splits are drawn once and the missing ranks are searched in
    groups, one :class:`~sklearn.model_selection.GridSearchCV` per group, each rank written as
    its group finishes. A group holds ``ceil(n_jobs / n_splits)`` ranks, so each still runs at
    least ``n_jobs`` fits in parallel (one rank at a time when ``n_jobs`` is ``None`` or 1);
    the price is the wait for a group's slowest fit before the next group starts. All files
    are written by the calling process, never by the workers: this works unchanged with a
    dask cluster whose workers do not share the disk, and parallel workers never write the
    same file. The splits must be reproducible for a rerun to reuse anything: an integer
    ``cv``, or a splitter with an integer ``random_state``.

    :class:`~sklearn_ebound.nn.LowRankAttentionRegressor` lets a ``KeyboardInterrupt`` during
    training propagate (plain skorch networks swallow it and keep a partly trained model), so
    an interrupted sweep of it never records a partly trained rank.
    """
    ranks = [int(r) for r in ranks]
    if not ranks:
        raise ValueError("`ranks` must hold at least one rank.")
    X_arr = np.asarray(X) if not hasattr(X, "shape") else X
    Y_arr = np.asarray(y) if not hasattr(y, "shape") else y
    sequences = np.ndim(Y_arr) == 3
    scoring = (get_sequence_scorer("neg_mean_squared_error") if sequences
               else "neg_mean_squared_error")
    if checkpoint is None:
        search = GridSearchCV(estimator, {param_name: ranks}, scoring=scoring, cv=cv,
                              n_jobs=n_jobs, refit=False, verbose=verbose, error_score="raise")
        search.fit(X, y)
        results = search.cv_results_
        n_splits = search.n_splits_
        scores = np.array([results[f"split{k}_test_score"] for k in range(n_splits)])
    else:
        by_rank, n_splits = _checkpointed_scores(
            estimator, X, y, ranks, cv=cv, n_jobs=n_jobs, scoring=scoring,
            scoring_name="neg_mean_squared_error", param_name=param_name, verbose=verbose,
            checkpoint=checkpoint)
        scores = np.column_stack([by_rank[rank] for rank in ranks])
    n_outputs = _outputs(Y_arr)
    folds = -scores * n_outputs
    order = np.argsort(ranks, kind="stable")
    folds = folds[:, order]
    ranks = [ranks[i] for i in order]
    risk, risk_std = folds.mean(axis=0), folds.std(axis=0)
    if noise_floor is None and not sequences:
        X2 = check_array(X_arr, dtype=np.float64)
        Y2 = check_array(Y_arr, dtype=np.float64, ensure_2d=False)
        Y2 = Y2[:, None] if Y2.ndim == 1 else Y2
        noise_floor = estimated_noise_floor(solve_static(Moments.from_arrays(X2, Y2)))
    excess, bound = deficiency_columns(ranks, risk, noise_floor, singular_values)
    sem = risk_std / np.sqrt(max(n_splits - 1, 1))
    best = int(np.argmin(risk))
    slack = max(sem[best], tolerance * (risk.max() - risk[best]))
    knee = ranks[int(np.flatnonzero(risk <= risk[best] + slack)[0])]
    rows = [
        {"rank": r, "risk": m, "risk_std": s, "excess_risk": e, "bound": b}
        for r, m, s, e, b in zip(ranks, risk, risk_std, excess, bound, strict=True)
    ]
    return RankSweepResult(rows, knee=knee, noise_floor=noise_floor, n_splits=n_splits)
