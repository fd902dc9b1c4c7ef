"""Deficiency and achievability: held-out excess risk of rank-``r`` models against ``T(r)``."""

import numpy as np
from sklearn.model_selection import train_test_split
from sklearn.utils import Bunch, check_array, check_consistent_length

from ._least_squares import path_squared_errors, solve_static
from ._moments import Moments
from ._spectrum import tail_energy
from ._utils.deprecation import renamed_keyword

__all__ = ["excess_risk_curve", "estimated_noise_floor", "deficiency_columns"]


def estimated_noise_floor(operator):
    """The noise floor a static task's least squares estimates: the residual variance per
    target entry times the number of targets (the risk per sample of the true operator)."""
    return operator.noise_variance() * operator.residual.shape[0]


def deficiency_columns(ranks, risk, noise_floor=None, singular_values=None):
    """Excess risk ``risk(r) - noise floor`` and the bound ``T(r) = sum_{k>r} s_k^2`` of each
    rank; NaN where the noise floor or the spectrum is not known."""
    ranks = np.asarray(ranks, dtype=int)
    risk = np.asarray(risk, dtype=np.float64)
    excess = risk - noise_floor if noise_floor is not None else np.full(risk.shape, np.nan)
    if singular_values is None:
        return excess, np.full(risk.shape, np.nan)
    return excess, tail_energy(np.asarray(singular_values, dtype=np.float64), ranks)


def excess_risk_curve(
    X,
    y,
    *,
    ranks=None,
    X_test=None,
    y_test=None,
    test_size=0.5,
    noise_floor=None,
    singular_values=None,
    alpha=0.0,
    random_state=None,
    Y_test=None,
):
    """Held-out excess risk of the best rank-``r`` model next to the bound ``T(r)``.

    The rank-``r`` model is :class:`ReducedRankRegressor` fitted on the training part (all ranks
    from one decomposition). Its risk is the mean held-out squared error per sample, summed over
    targets; the excess risk subtracts the noise floor. The Entropic Bound says the excess risk
    is at least ``T(r) = sum_{k>r} s_k^2`` for ``r < r*`` and reaches zero at ``r*``.

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features)
    y : array-like of shape (n_samples, n_targets)
    ranks : array-like of int, default=None
        Ranks to evaluate; ``None`` means ``0..min(n_features, n_targets)``.
    X_test, y_test : array-like, default=None
        Held-out data. ``None`` splits ``X, y`` with ``test_size``.
    test_size : float, default=0.5
        Held-out fraction when no test data is given.
    noise_floor : float, default=None
        Population risk of the true operator (``params.noise_floor`` of a planted task).
        ``None`` estimates it from the training residuals (``trace`` of the residual
        covariance).
    singular_values : array-like, default=None
        Spectrum of ``Sigma_X^{1/2} B`` behind the bound (``params.singular_values`` of a
        planted task). ``None`` uses the training estimate, which noise biases upwards.
    alpha : float, default=0.0
        Ridge penalty of the rank-``r`` models.
    random_state : int, RandomState instance or None, default=None
        Seed of the train/test split.
    Y_test : array-like
        Deprecated spelling of ``y_test``, kept for one release.

    Returns
    -------
    curve : Bunch
        ``ranks``, ``risk``, ``excess_risk``, ``bound`` (``T(r)``), ``noise_floor``.
    """
    y_test = renamed_keyword("Y_test", "y_test", Y_test, y_test,
                             reason="scikit-learn's spelling of targets")
    X = check_array(X, dtype=np.float64, input_name="X")
    Y = check_array(y, dtype=np.float64, ensure_2d=False, input_name="y")
    Y = Y[:, None] if Y.ndim == 1 else Y
    check_consistent_length(X, Y)
    if X_test is None:
        X, X_test, Y, Y_held_out = train_test_split(X, Y, test_size=test_size,
                                                    random_state=random_state)
    else:
        X_test = check_array(X_test, dtype=np.float64, input_name="X_test")
        Y_held_out = check_array(y_test, dtype=np.float64, ensure_2d=False, input_name="y_test")
        Y_held_out = Y_held_out[:, None] if Y_held_out.ndim == 1 else Y_held_out
        check_consistent_length(X_test, Y_held_out)
    bound_rank = min(X.shape[1], Y.shape[1])
    ranks = np.arange(bound_rank + 1) if ranks is None else np.asarray(ranks, dtype=int)
    if ranks.ndim != 1 or ranks.size == 0 or ranks.min() < 0 or ranks.max() > bound_rank:
        raise ValueError(f"`ranks` must be integers in [0, {bound_rank}]. Got {ranks!r}.")
    moments = Moments.from_arrays(X, Y)
    operator = solve_static(moments, alpha)
    risk = path_squared_errors(operator, moments, X_test, Y_held_out)[ranks].sum(axis=1)
    risk /= X_test.shape[0]
    if noise_floor is None:
        noise_floor = estimated_noise_floor(operator)
    if singular_values is None:
        singular_values = operator.fitted_singular_values / np.sqrt(moments.n)
    excess, bound = deficiency_columns(ranks, risk, noise_floor, singular_values)
    return Bunch(ranks=ranks, risk=risk, excess_risk=excess, bound=bound,
                 noise_floor=float(noise_floor))
