"""The interpolation ladder: from the static surrogate to softmax attention, one property at a
time, asking at each rung whether a static reading still recovers the planted rank."""

import warnings

import numpy as np
from sklearn.model_selection import train_test_split
from sklearn.utils import check_random_state

from .._attention_operators import token_mixing_data
from .._intrinsic_rank import IntrinsicRankEstimator
from .._reduced_rank import ReducedRankRegressor, ReducedRankRegressorCV
from .._spectrum import energy_rank
from .._utils.results import ResultTable
from ..datasets import make_attention_task, make_static_mixing_task
from ..exceptions import RankEstimationWarning

__all__ = ["interpolation_ladder", "LadderResult"]

RUNGS = {
    0: "static linear M",
    1: "static linear M = A B^T, rank-constrained fit",
    2: "static softmax(L)",
    3: "linear attention",
    4: "softmax attention",
}


class LadderResult(ResultTable):
    """The rung-by-rung table of the interpolation ladder.

    Columns: ``rung``, ``mixing``, ``logit_scale``, ``true_rank``, ``static_estimate`` (the
    rank a static reading finds; for rung 2 the energy rank of the row-centred log of the
    fitted mixing matrix, empty where a fitted weight is not positive), ``attention_estimate``
    (the attention-native data-only rank, rungs 3-4), ``static_excess_risk`` (held-out risk
    per token of the best static token-mixing model minus the noise floor),
    ``static_relative_excess`` (that excess as a fraction of the signal power per token) and
    ``static_recovers``: the static reading finds ``r*`` *and* the static model reaches the
    noise floor (relative excess below ``solved_tolerance``).
    """


def _static_excess_risk(X, Y, noise_floor, rng):
    """Held-out excess risk per token of the least-squares static token-mixing model."""
    Xt, Yt = token_mixing_data(X, Y)  # rows: (sequence, channel) token vectors
    X_train, X_test, Y_train, Y_test = train_test_split(Xt, Yt, test_size=0.3,
                                                        random_state=rng.randint(2**31))
    model = ReducedRankRegressor().fit(X_train, Y_train)
    per_row = np.mean(np.sum((Y_test - model.predict(X_test)) ** 2, axis=1))
    # A row holds one channel of n tokens: per token and summed over d channels.
    per_token = per_row * X.shape[2] / X.shape[1]
    return float(per_token - noise_floor)


def _log_mixing_rank(X, Y, tau):
    """Energy rank of the row-centred log of the fitted static mixing matrix, or None."""
    M = ReducedRankRegressor().fit(*token_mixing_data(X, Y)).coef_  # (n, n): y = M x
    if np.any(M <= 0):
        return None  # the smallest weights drown in noise: log is undefined
    log_m = np.log(M)
    return energy_rank(log_m - log_m.mean(axis=1, keepdims=True), tau)


def interpolation_ladder(*, n_samples=2000, n_tokens=16, n_features=4, rank=3,
                         logit_scales=(0.5, 1.0, 2.0, 4.0), noise=0.05, tau=0.99,
                         solved_tolerance=0.05, mask=None, random_state=None):
    """Run the interpolation ladder of the Entropic Bound.

    Rung 0: static linear mixing ``Y_s = M X_s`` with ``rank(M) = r*``. Rung 1: the same task
    fitted with a rank constraint (:class:`~sklearn_ebound.ReducedRankRegressorCV`). Rung 2:
    static softmax mixing ``softmax(beta L)`` with ``rank(L) = r*``, read from the log of the
    fitted mixing matrix, once per logit scale. Rungs 3 and 4: linear and softmax attention
    with ``rank(W_Q W_K^T) = r*`` (softmax once per logit scale), read statically (the naive
    transfer) and attention-natively. The value map is the identity throughout.

    Parameters
    ----------
    n_samples, n_tokens, n_features : int
        Sequences, tokens per sequence and channels of every planted task.
    rank : int, default=3
        The planted rank at every rung.
    logit_scales : sequence of float, default=(0.5, 1.0, 2.0, 4.0)
        Logit scales of the softmax rungs.
    noise : float, default=0.05
        Noise standard deviation.
    tau : float, default=0.99
        Energy level of the log-mixing rank at rung 2.
    solved_tolerance : float, default=0.05
        Largest relative excess risk at which the static model counts as solving the task.
    mask : None, "causal" or array-like of shape (n_tokens, n_tokens), default=None
        The attention mask of the attention rungs 3 and 4, given to the generator and to the
        attention-native estimator (the static rungs have no attention to mask).
    random_state : int, RandomState instance or None, default=None

    Returns
    -------
    result : LadderResult
    """
    rng = check_random_state(random_state)
    sizes = {"n_samples": n_samples, "n_tokens": n_tokens, "n_features": n_features,
             "rank": rank, "noise": noise}
    rows = []

    def row(rung, beta, X, Y, params, static_estimate, attention_estimate=None):
        excess = _static_excess_risk(X, Y, params.noise_floor, rng)
        signal = np.mean(np.sum(Y**2, axis=2)) - params.noise_floor
        relative = excess / signal
        rows.append({
            "rung": rung, "mixing": RUNGS[rung], "logit_scale": beta, "true_rank": rank,
            "static_estimate": static_estimate, "attention_estimate": attention_estimate,
            "static_excess_risk": excess, "static_relative_excess": relative,
            "static_recovers": static_estimate == rank and relative < solved_tolerance,
        })

    X, Y, params = make_static_mixing_task("linear", **sizes, random_state=rng,
                                           return_params=True)
    row(0, None, X, Y, params, IntrinsicRankEstimator("static").fit(X, Y).rank_)
    constrained = ReducedRankRegressorCV().fit(*token_mixing_data(X, Y))
    row(1, None, X, Y, params, constrained.rank_)
    for beta in logit_scales:
        X, Y, params = make_static_mixing_task("softmax", **sizes, logit_scale=beta,
                                               random_state=rng, return_params=True)
        row(2, beta, X, Y, params, _log_mixing_rank(X, Y, tau))
    for attention, rung, betas in [("linear", 3, [None]), ("softmax", 4, logit_scales)]:
        for beta in betas:
            X, Y, params = make_attention_task(attention, **sizes, logit_scale=beta or 1.0,
                                               mask=mask, random_state=rng,
                                               return_params=True)
            with warnings.catch_warnings():
                # The static rung misfits attention data on purpose: its residuals fail the
                # diagnostics (input-dependent, heavy-tailed), which is the ladder's point.
                warnings.simplefilter("ignore", RankEstimationWarning)
                native = IntrinsicRankEstimator("attention", attention=attention,
                                                value="identity", mask=mask).fit(X, Y)
                static = IntrinsicRankEstimator("static").fit(X, Y)
            row(rung, beta, X, Y, params, static.rank_, native.rank_)
    return LadderResult(rows, **sizes, tau=tau, solved_tolerance=solved_tolerance,
                        mask=mask if mask is None or isinstance(mask, str) else "array")
