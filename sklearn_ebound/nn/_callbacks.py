"""Training callbacks: stop a diverging fit with an error that names its cause, and warn when
training ends before the loss has settled."""

import math
import os
import sys
import warnings

import numpy as np
import torch
from sklearn.exceptions import ConvergenceWarning
from skorch.callbacks import Callback

from ..exceptions import TrainingDivergedError

__all__ = ["DivergenceCheck", "ConvergenceCheck"]


def _library_folders():
    """The folders of the libraries a fit passes through on its way to a callback."""
    import sklearn
    import skorch

    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return tuple(os.path.dirname(os.path.abspath(m.__file__)) + os.sep
                 for m in (sklearn, skorch)) + (package + os.sep,)


def _caller_stacklevel():
    """The ``stacklevel`` that attributes a warning, issued by the function calling this one,
    to the first frame outside scikit-learn, skorch and this package: the user's line that
    called ``fit`` (or ``partial_fit``), however many library frames lie between."""
    folders = _library_folders()
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and os.path.abspath(frame.f_code.co_filename).startswith(
            folders):
        frame, level = frame.f_back, level + 1
    return level


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


class ConvergenceCheck(Callback):
    """Warn with a :class:`~sklearn.exceptions.ConvergenceWarning` when training ends while
    the loss is still falling.

    A default callback of :class:`LowRankAttentionRegressor`, registered as
    ``"convergence_check"``. At the end of training it compares the mean training loss of the
    last ``window`` of the epochs with that of the ``window`` before: a relative fall of more
    than ``tol`` means the optimizer was still making progress, so the risk, the learned rank
    and a rank sweep's knee describe an unfinished model. The warning names ``max_epochs`` and
    ``lr``. Fewer than four epochs are too few to tell, and are not checked.

    Measured on planted softmax tasks (``d=6``, ``n=16``, rank 3, ``lr=0.05``, full batch): the
    fall over the last 10% of the epochs, relative to the mean of the 10% before, was about 0.37
    after 40 epochs (not converged: a sweep's knee read 5) and at most 0.0002 after 150 or 300;
    under-ranked models settle too (0.0000 at rank 1 after 150 epochs). The warning points at
    the line that called ``fit``.

    Parameters
    ----------
    window : float, default=0.1
        Fraction of the epochs in each of the two compared windows (at least two epochs).
    tol : float, default=0.01
        Largest relative fall of the mean loss between the windows that counts as settled.
    """

    def __init__(self, window=0.1, tol=0.01):
        self.window = window
        self.tol = tol

    def on_train_end(self, net, X=None, y=None, **kwargs):
        if not net.history or "train_loss" not in net.history[-1]:
            return  # no epoch ran (max_epochs=0)
        losses = np.asarray(net.history[:, "train_loss"], dtype=np.float64)
        k = max(2, math.ceil(self.window * len(losses)))
        if len(losses) < 2 * k or not np.all(np.isfinite(losses[-2 * k:])):
            return  # too short to tell, or diverged (DivergenceCheck's concern)
        last, before = losses[-k:].mean(), losses[-2 * k:-k].mean()
        # The relative fall, against the earlier window (the reference): (before - last) / before.
        fall = (before - last) / abs(before) if before != 0 else 0.0
        if fall > self.tol:
            lr = getattr(net, "optimizer__lr", net.lr)
            warnings.warn(
                f"Training stopped while the loss was still falling: its mean over the last "
                f"{k} of {len(losses)} epochs is {fall:.1%} below the {k} before. Raise "
                f"`max_epochs` (now {net.max_epochs}) or `lr` (now {lr}); the fitted model, its "
                "risk and its learned rank may not be the converged ones.",
                ConvergenceWarning, stacklevel=_caller_stacklevel())
