"""A diverging fit of the torch regressor stops with an error that names its cause."""

import warnings

import numpy as np
import pytest
import torch
from sklearn.base import clone
from sklearn.exceptions import FitFailedWarning
from sklearn.model_selection import GridSearchCV

from sklearn_ebound.datasets import make_attention_task
from sklearn_ebound.exceptions import TrainingDivergedError
from sklearn_ebound.nn import DivergenceCheck, LowRankAttentionRegressor, get_sequence_scorer

_X, _Y = make_attention_task("linear", 64, 6, 4, rank=1, noise=0.05, random_state=0)
# Plain SGD: a learning rate far too large blows the weights up within a few steps (Adam's
# steps are bounded by `lr`, so it needs a far larger one to overflow).
_SGD = dict(attention="linear", optimizer=torch.optim.SGD, batch_size=16, max_epochs=20,
            random_state=0)


def test_divergent_lr_raises_and_names_lr():
    net = LowRankAttentionRegressor(lr=100.0, **_SGD)
    with pytest.raises(TrainingDivergedError,
                       match=r"training diverged at epoch \d+, batch \d+ \(train loss = "
                             r"(nan|inf)\); lower `lr` \(now 100.0\) or `init_scale` "
                             r"\(now 0.01\)"):
        net.fit(_X, _Y)
    assert issubclass(TrainingDivergedError, ValueError)


def test_divergent_lr_with_default_optimizer_raises():
    net = LowRankAttentionRegressor(attention="linear", lr=1e6, max_epochs=10, random_state=0)
    with pytest.raises(TrainingDivergedError, match=r"lower `lr` \(now 1000000.0\)"):
        net.fit(_X, _Y)


def test_normal_fit_is_not_stopped():
    net = LowRankAttentionRegressor(lr=0.1, **_SGD).fit(_X, _Y)
    losses = net.history_[:, "train_loss"]
    assert len(losses) == 20 and np.isfinite(losses).all()
    assert losses[0] > losses[-1]
    assert np.isfinite(net.predict(_X)).all()
    assert "divergence_check" in dict(net.callbacks_)


def test_non_finite_weights_are_caught_at_epoch_end():
    # A step can turn finite loss into non-finite weights; the epoch-end check sees them.
    net = LowRankAttentionRegressor(lr=0.1, **{**_SGD, "max_epochs": 2}).fit(_X, _Y)
    with torch.no_grad():
        net.module_.W_Q[0, 0] = float("inf")
    with pytest.raises(TrainingDivergedError, match="weights are no longer finite.*`lr`"):
        DivergenceCheck().on_epoch_end(net)


def test_check_can_be_turned_off():
    # Off (and still off after clone), an overflowing loss no longer stops training: Adam's
    # bounded steps keep the weights finite, and the fit completes.
    net = LowRankAttentionRegressor(attention="linear", lr=1e6, max_epochs=5, random_state=0,
                                    callbacks__divergence_check=None)
    fitted = clone(net).fit(_X, _Y)
    assert not np.isfinite(fitted.history_[:, "train_loss"]).all()
    # Weights that are no longer finite still fail the fit, when the kernel is read.
    net = LowRankAttentionRegressor(lr=100.0, callbacks__divergence_check=None, **_SGD)
    with pytest.raises(TrainingDivergedError, match="kernel is not finite.*`lr` \\(now 100.0"):
        net.fit(_X, _Y)


def test_grid_search_scores_diverged_candidate_nan():
    search = GridSearchCV(LowRankAttentionRegressor(**_SGD), {"lr": [0.1, 100.0]}, cv=2,
                          scoring=get_sequence_scorer("neg_mean_squared_error"),
                          error_score=np.nan)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        search.fit(_X, _Y)
    failed = [w for w in caught if issubclass(w.category, FitFailedWarning)]
    assert failed and "TrainingDivergedError" in str(failed[0].message)
    assert "lower `lr` (now 100.0)" in str(failed[0].message)
    scores = search.cv_results_["mean_test_score"]
    assert np.isfinite(scores[0]) and np.isnan(scores[1])
    assert search.best_params_ == {"lr": 0.1}
    assert np.isfinite(search.predict(_X)).all()


def test_keyboard_interrupt_propagates_instead_of_a_partly_trained_model():
    from skorch.callbacks import Callback

    class InterruptAtEpoch3(Callback):
        def on_epoch_end(self, net, **kwargs):
            if len(net.history) == 3:
                raise KeyboardInterrupt

    X, Y = make_attention_task("linear", 32, 4, 3, rank=1, random_state=0)
    net = LowRankAttentionRegressor(attention="linear", max_epochs=10, batch_size=-1,
                                    callbacks=[("stop", InterruptAtEpoch3())], random_state=0)
    with pytest.raises(KeyboardInterrupt, match="after 3 epoch"):
        net.fit(X, Y)
    assert len(net.history_) == 3  # the partial module is still there to inspect


def test_training_that_stops_while_the_loss_falls_warns():
    from sklearn.exceptions import ConvergenceWarning

    X, Y = make_attention_task("softmax", 256, 16, 6, rank=3, value="random", logit_scale=2.0,
                               noise=0.1, random_state=0)
    params = dict(rank=3, attention="softmax", lr=0.05, batch_size=-1, random_state=0)
    with pytest.warns(ConvergenceWarning, match=r"`max_epochs` \(now 40\) or `lr` \(now 0.05\)"):
        LowRankAttentionRegressor(max_epochs=40, **params).fit(X, Y)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        LowRankAttentionRegressor(max_epochs=150, **params).fit(X, Y)  # settled: no warning
        LowRankAttentionRegressor(max_epochs=40, callbacks__convergence_check=None,
                                  **params).fit(X, Y)


def test_convergence_warning_quotes_the_fall_against_the_earlier_window_at_the_callers_line():
    import math
    import re

    from sklearn.exceptions import ConvergenceWarning

    X, Y = make_attention_task("softmax", 256, 16, 6, rank=3, value="random", logit_scale=2.0,
                               noise=0.1, random_state=0)
    net = LowRankAttentionRegressor(rank=3, attention="softmax", lr=0.05, batch_size=-1,
                                    max_epochs=40, random_state=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        net.fit(X, Y)
    (warning,) = [w for w in caught if issubclass(w.category, ConvergenceWarning)]
    # Attributed to the line above that called fit, not to skorch's training loop.
    assert warning.filename == __file__, warning.filename
    # The fall of the mean loss over the last k = ceil(0.1 * 40) = 4 epochs, relative to the
    # mean of the 4 before (the reference): (before - last) / before, at most 100%.
    losses = np.asarray(net.history_[:, "train_loss"])
    k = math.ceil(0.1 * len(losses))
    before, last = losses[-2 * k:-k].mean(), losses[-k:].mean()
    quoted = re.search(r"is ([0-9.]+)% below the 4 before", str(warning.message))
    assert quoted, str(warning.message)
    assert float(quoted.group(1)) == pytest.approx(100 * (before - last) / before, abs=0.06)
    assert 0 < float(quoted.group(1)) < 100
