"""Recovery by gradient descent: the learned query–key kernel's spectrum and ranks."""

import itertools

import numpy as np
from sklearn.utils import check_random_state

from .._spectrum import energy_rank, entropy_rank, stable_rank
from .._utils.results import ResultTable
from ..datasets import make_attention_task

__all__ = ["recovery_experiment", "RecoveryResult"]

_TRAINING = {"lr": 0.05, "max_epochs": 150, "batch_size": -1, "init_scale": 1e-2}


class RecoveryResult(ResultTable):
    """Learned-kernel spectra over attention classes, logit scales and seeds.

    Columns: ``attention``, ``logit_scale``, ``seed``, ``true_rank``, ``energy_rank``,
    ``entropy_rank``, ``stable_rank``, ``recovered`` (energy rank equals ``r*``),
    ``singular_values`` (of the learned kernel ``W_Q W_K^T``, largest first).
    """


def recovery_experiment(*, attention=("linear", "softmax"), logit_scales=(0.5, 2.0, 8.0),
                        seeds=range(3), n_samples=256, n_tokens=8, n_features=6, rank=2,
                        noise=0.05, value="random", tau=0.99, device="cpu",
                        training=None, progress=None):
    """Train full-width attention from a small initialisation and read the learned rank.

    For every attention class, logit scale (softmax only) and seed, a planted task of
    query–key rank ``rank`` is fitted by :class:`~sklearn_ebound.nn.LowRankAttentionRegressor`
    with ``rank=None`` (``k = d``, no rank constraint): gradient descent from a small
    initialisation finds a kernel whose energy rank is ``r*``, while its entropy effective rank
    drifts with the logit scale.

    Parameters
    ----------
    attention : sequence of {"linear", "softmax"}
    logit_scales : sequence of float
        Logit scales of the softmax tasks and models.
    seeds : iterable of int
        One task and one training run per seed.
    n_samples, n_tokens, n_features, rank : int
        Size of each planted task and its query–key rank.
    noise : float, default=0.05
    value : str, default="random"
        Value map of the planted tasks (learned by the model).
    tau : float, default=0.99
        Energy level of the energy rank.
    device : str, default="cpu"
        Where to train.
    training : dict, default=None
        Overrides of the training parameters (``lr=0.05, max_epochs=150, batch_size=-1,
        init_scale=0.01``).
    progress : callable, default=None
        Called as ``progress(done, total)`` after each run.

    Returns
    -------
    result : RecoveryResult
    """
    from ..nn import LowRankAttentionRegressor  # torch is only needed here

    params = {**_TRAINING, **(training or {})}
    classes = attention  # below, `attention` is one of these classes
    runs = [(attention, beta, seed) for attention in classes
            for beta, seed in itertools.product(
                logit_scales if attention == "softmax" else [None], seeds)]
    rows = []
    for done, (attention, beta, seed) in enumerate(runs, start=1):
        X, Y = make_attention_task(attention, n_samples, n_tokens, n_features, rank=rank,
                                   logit_scale=beta or 1.0, value=value, noise=noise,
                                   random_state=check_random_state(seed))
        net = LowRankAttentionRegressor(attention=attention, logit_scale=beta or 1.0,
                                        random_state=seed, device=device, **params).fit(X, Y)
        s = np.linalg.svd(net.qk_kernel_, compute_uv=False)
        rows.append({
            "attention": attention, "logit_scale": beta, "seed": seed, "true_rank": rank,
            "energy_rank": energy_rank(s, tau), "entropy_rank": entropy_rank(s),
            "stable_rank": stable_rank(s), "recovered": energy_rank(s, tau) == rank,
            "singular_values": s,
        })
        if progress is not None:
            progress(done, len(runs))
    return RecoveryResult(rows, rank=rank, tau=tau, n_samples=n_samples, n_tokens=n_tokens,
                          n_features=n_features)
