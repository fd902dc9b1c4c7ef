"""Training callbacks: stop a diverging fit with an error that names its cause."""

import math

import torch
from skorch.callbacks import Callback

from ..exceptions import TrainingDivergedError

__all__ = ["DivergenceCheck"]


def _remedy(net):
    """The parameters to lower, with their current values, for the error message."""
    lr = getattr(net, "optimizer__lr", net.lr)
    parts = [f"`lr` (now {lr})"]
    init_scale = getattr(net, "init_scale", None)
    if init_scale is not None:
        parts.append(f"`init_scale` (now {init_scale})")
    return "lower " + " or ".join(parts)


class DivergenceCheck(Callback):
    """Raise :class:`~sklearn_ebound.exceptions.TrainingDivergedError` when training diverges.

    A default callback of :class:`LowRankAttentionRegressor`, registered as
    ``"divergence_check"``. After every training batch it reads the batch loss that skorch has
    just recorded (no extra device synchronisation); after every epoch it checks that the
    module's parameters are finite, which catches the last optimizer step of an epoch that
    produced finite loss but non-finite weights. Without it a diverged fit ends quietly and
    ``predict`` returns ``nan``.

    Turn it off with ``LowRankAttentionRegressor(callbacks__divergence_check=None)``;
    ``callbacks="disable"`` turns off every callback, this one included. It works with any
    :class:`skorch.NeuralNet`: pass ``callbacks=[DivergenceCheck()]``.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_ebound.datasets import make_attention_task
    >>> from sklearn_ebound.exceptions import TrainingDivergedError
    >>> from sklearn_ebound.nn import LowRankAttentionRegressor
    >>> X, Y = make_attention_task("linear", 64, 6, 4, rank=1, random_state=0)
    >>> net = LowRankAttentionRegressor(attention="linear", lr=1e6, max_epochs=5,
    ...                                 random_state=0)
    >>> try:
    ...     net.fit(X, Y)
    ... except TrainingDivergedError as exc:
    ...     print(str(exc).split("; ")[1])
    lower `lr` (now 1000000.0) or `init_scale` (now 0.01).
    """

    def on_batch_end(self, net, batch=None, training=None, **kwargs):
        if not training:
            return
        # skorch has recorded the batch loss as a float: reading it costs no device sync.
        row = net.history[-1]
        loss = row["batches"][-1]["train_loss"]
        if not math.isfinite(loss):
            raise TrainingDivergedError(
                f"training diverged at epoch {row['epoch']}, batch {len(row['batches'])} "
                f"(train loss = {loss}); {_remedy(net)}."
            )

    def on_epoch_end(self, net, dataset_train=None, dataset_valid=None, **kwargs):
        module = getattr(net, "module_", None)
        if module is None:
            return
        with torch.no_grad():
            finite = [torch.isfinite(p).all() for p in module.parameters()]
            if not finite or bool(torch.stack(finite).all()):
                return
        row = net.history[-1]
        loss = row.get("train_loss", float("nan"))
        raise TrainingDivergedError(
            f"training diverged at epoch {row['epoch']}: the weights are no longer finite "
            f"(train loss = {loss}); {_remedy(net)}."
        )
