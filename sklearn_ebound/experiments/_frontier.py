"""The predictability frontier: when can ``r*`` be read from data alone, before training?"""

import itertools
import warnings

import numpy as np
from sklearn.utils import check_random_state

from .._intrinsic_rank import IntrinsicRankEstimator
from .._utils.random import random_orthonormal
from .._utils.results import ResultTable
from ..datasets import make_attention_task
from ..exceptions import RankEstimationWarning

__all__ = ["predictability_frontier", "FrontierResult", "conditioned_value_map"]


class FrontierResult(ResultTable):
    """Recovery rate of the data-only attention-native rank over a grid.

    Columns: ``attention``, ``value_known``, ``vocabulary_size`` (``None``: Gaussian tokens),
    ``logit_scale``, ``n_tokens``,
    ``value_condition`` (condition number of the value map; ``inf`` when it annihilates a key
    direction of the kernel), ``noise``, ``recovery_rate`` (fraction of repeats with
    ``rank_ == r*``), ``mean_abs_error`` (mean ``|rank_ - r*|``).
    """


def conditioned_value_map(n_features, condition, rng):
    """A random value map with singular values spaced geometrically from 1 to 1/condition."""
    U = random_orthonormal(n_features, n_features, rng)
    R = random_orthonormal(n_features, n_features, rng)
    return (U * np.geomspace(1.0, 1.0 / condition, n_features)) @ R.T


def predictability_frontier(*, attention=("linear", "softmax"), value_known=(True, False),
                            logit_scales=(0.5, 1.0, 2.0, 4.0, 8.0), n_tokens=(16, 64),
                            value_conditions=(1.0, 10.0, np.inf), noises=(0.1,),
                            vocabulary_sizes=(None, 32), n_samples=300, n_features=6, rank=2,
                            n_repeats=5, mask=None,
                            random_state=None, progress=None):
    """Recovery rate of :class:`~sklearn_ebound.IntrinsicRankEstimator` over a grid of tasks.

    Every cell plants ``n_repeats`` attention tasks of query–key rank ``rank`` and counts how
    often the data-only estimate equals it. Linear attention is one cell per other setting
    (the logit scale does not apply to it).

    Parameters
    ----------
    attention : sequence of {"linear", "softmax"}
    value_known : sequence of bool
        Whether the estimator is given the value map.
    logit_scales : sequence of float
        Logit scales of softmax attention.
    n_tokens : sequence of int
        Sequence lengths.
    value_conditions : sequence of float
        Condition numbers of the value map; ``np.inf`` uses a value map that annihilates a key
        direction of the kernel (kernel–value identifiability).
    noises : sequence of float
        Noise standard deviations.
    vocabulary_sizes : sequence of int or None, default=(None, 32)
        Token laws: ``None`` for Gaussian tokens, an integer for tokens drawn from a fixed
        vocabulary of that many embeddings (see
        :func:`~sklearn_ebound.datasets.make_attention_task`).
    n_samples, n_features, rank, n_repeats : int
        Sequences per task, channels, planted rank, tasks per cell.
    mask : None, "causal" or array-like of shape (n_tokens, n_tokens), default=None
        The attention mask of every task, given to the generator and to the estimator (an
        array needs a single sequence length in ``n_tokens``).
    random_state : int, RandomState instance or None, default=None
    progress : callable, default=None
        Called as ``progress(done, total)`` after each cell.

    Returns
    -------
    result : FrontierResult
    """
    rng = check_random_state(random_state)
    cells = []
    grid = itertools.product(attention, value_known, vocabulary_sizes, n_tokens,
                             value_conditions, noises)
    for attention, known, vocab, n, cond, noise in grid:
        for beta in (logit_scales if attention == "softmax" else [None]):
            cells.append((attention, known, vocab, beta, n, cond, noise))
    rows = []
    for done, (attention, known, vocab, beta, n, cond, noise) in enumerate(cells, start=1):
        estimates = []
        for _ in range(n_repeats):
            value = ("low_rank" if np.isinf(cond)
                     else conditioned_value_map(n_features, cond, rng))
            X, Y, params = make_attention_task(attention, n_samples, n, n_features, rank=rank,
                                               logit_scale=beta or 1.0, value=value,
                                               noise=noise, vocabulary_size=vocab, mask=mask,
                                               random_state=rng, return_params=True)
            estimator = IntrinsicRankEstimator("attention", attention=attention, mask=mask,
                                               value=params.V if known else None)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RankEstimationWarning)
                estimates.append(estimator.fit(X, Y).rank_)
        estimates = np.array(estimates)
        rows.append({
            "attention": attention, "value_known": known, "vocabulary_size": vocab,
            "logit_scale": beta, "n_tokens": n,
            "value_condition": cond, "noise": noise,
            "recovery_rate": float(np.mean(estimates == rank)),
            "mean_abs_error": float(np.mean(np.abs(estimates - rank))),
        })
        if progress is not None:
            progress(done, len(cells))
    return FrontierResult(rows, n_samples=n_samples, n_features=n_features, rank=rank,
                          n_repeats=n_repeats,
                          mask=mask if mask is None or isinstance(mask, str) else "array")
