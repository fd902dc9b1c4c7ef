"""A scikit-learn regressor for sequences: one attention layer with a rank-limited QK kernel."""

from collections.abc import Mapping
from contextlib import contextmanager, nullcontext
from numbers import Integral, Real

import numpy as np
import torch
from sklearn import get_config
from sklearn.metrics import r2_score
from sklearn.utils import check_array, check_random_state
from sklearn.utils._param_validation import (
    Interval,
    StrOptions,
    validate_parameter_constraints,
)
from sklearn.utils.validation import check_is_fitted
from skorch import NeuralNetRegressor
from skorch.dataset import Dataset
from skorch.utils import is_dataset, to_tensor
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, Subset
from torch.utils.data import Dataset as TorchDataset

from .._attention_operators import check_attention_pattern, check_lengths
from .._spectrum import energy_rank
from .._utils.validation import check_sequences
from ..exceptions import TrainingDivergedError
from ._callbacks import ConvergenceCheck, DivergenceCheck
from ._modules import LowRankAttention, StaticTokenMixer, resolve_learned

__all__ = ["LowRankAttentionRegressor"]

_STATIC = ("static", "static_softmax")


@contextmanager
def _forked_seed(seed):
    """Fork the CPU torch generator, seed it, and restore the outer state on exit."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


class _Sequences(TorchDataset):
    """Sequences held as tensors; a list of indices returns a whole batch in one step.

    With ``lengths`` an item's input is the dict ``{"X": X, "lengths": lengths}``, which
    skorch passes to the module's ``forward`` as keyword arguments.
    """

    def __init__(self, X, y=None, lengths=None):
        self.X = torch.as_tensor(X)
        self.y = None if y is None else torch.as_tensor(y)
        self.lengths = None if lengths is None else torch.as_tensor(lengths, dtype=torch.long)

    def __len__(self):
        return len(self.X)

    def __getitem__(self, index):
        if isinstance(index, (list, np.ndarray)):
            # A batch of indices: index_select gathers several times faster than X[index].
            index = torch.as_tensor(index, dtype=torch.long)
        X, y, lengths = (_take(t, index) for t in (self.X, self.y, self.lengths))
        # skorch's placeholder when there is no target.
        y = torch.zeros(X.shape[:-2] or 1) if y is None else y
        return (X, y) if lengths is None else ({"X": X, "lengths": lengths}, y)


def _take(tensor, index):
    """``tensor[index]`` (``None`` stays ``None``); a tensor of indices is gathered."""
    if tensor is None:
        return None
    return tensor.index_select(0, index) if torch.is_tensor(index) else tensor[index]


def _valid_tokens(lengths, n_tokens, device=None):
    """Boolean ``(b, n, 1)`` tensor: the tokens that are not padding."""
    lengths = torch.as_tensor(lengths, device=device)
    return (torch.arange(n_tokens, device=lengths.device) < lengths[:, None])[..., None]


class LowRankAttentionRegressor(NeuralNetRegressor):
    """Regress target sequences on input sequences with one rank-limited attention layer.

    A :class:`skorch.NeuralNetRegressor` around :class:`LowRankAttention` (or
    :class:`StaticTokenMixer` for the static surrogate), trained on the mean squared error.
    ``X`` has shape ``(n_samples, n_tokens, n_features)``, ``Y`` shape ``(n_samples, n_tokens,
    n_targets)``; both are cast to float32. The sizes are read from the data at ``fit``.

    Fitting with ``rank=r`` answers *deficiency* and *achievability* (the held-out risk of the
    best rank-``r`` attention model); fitting with ``rank=None`` (``k = d``) from a small
    ``init_scale`` answers *recovery*: ``effective_rank_`` is the energy rank of the learned
    kernel.

    Parameters
    ----------
    rank : int, default=None
        Inner width ``k`` of the kernel factors, the rank limit of the kernel. ``None`` means
        full width: ``n_features`` for attention, ``n_tokens`` for static mixing.
    attention : {"softmax", "linear", "static", "static_softmax"}, default="softmax"
        The token mixing: softmax attention ``softmax(beta X W X^T / sqrt(d)) X V^T``, linear
        attention ``(1/n) (X W X^T) X V^T``, static linear mixing ``M X V^T`` or static softmax
        mixing ``softmax(beta L) X V^T``, with ``W = W_Q W_K^T``, ``M = A B^T``, ``L = A B^T``.
    value : None, "identity" or array-like of shape (n_targets, n_features), default=None
        The value map ``V``: ``None`` learns it (an unknown value map, the spelling of
        :class:`~sklearn_ebound.IntrinsicRankEstimator`; ``"learned"`` is its deprecated
        spelling, kept for one release), ``"identity"`` fixes the identity (``n_targets ==
        n_features``), an array fixes that matrix.
    init_scale : float, default=1e-2
        Standard deviation of the factor entries at initialisation. Small values give the
        implicit bias of gradient descent towards low rank.
    logit_scale : float, default=1.0
        ``beta``, the inverse temperature of the softmax variants.
    mask : None, "causal" or array-like of shape (n_tokens, n_tokens), default=None
        The attention mask of ``attention="softmax"`` or ``"linear"``: every query attends to
        every key, to the keys ``j <= i`` (``"causal"``), or to the 1 entries of its row of a
        0/1 array; for ``attention="linear"`` also an array of non-negative weights; see
        :class:`LowRankAttention`.
    mask_normalization : {None, "mean", "none"}, default=None
        How linear attention uses each row of the mask: averaged over the visible keys
        (``"mean"``; ``None`` means it for 0/1 masks) or as given (``"none"``, e.g. ``mask=
        np.tril(np.ones((n, n))) / n``); weights must state it. The conventions of
        :func:`~sklearn_ebound.datasets.make_attention_task`.
    logit_bias : None, array-like of shape (n_tokens, n_tokens) or ("alibi", slope), \
            default=None
        For ``attention="softmax"``: a bias added to every sequence's scaled logits, or
        ALiBi's ``-slope |i - j|`` (:func:`~sklearn_ebound.datasets.alibi_bias`).
    optimizer : torch optimizer class, default=torch.optim.Adam
        Its own parameters go through ``optimizer__<name>``.
    lr : float, default=0.02
        Learning rate.
    max_epochs : int, default=200
        Number of passes over the data.
    batch_size : int, default=128
        Sequences per gradient step; -1 uses all of them (full batch).
    train_split : callable or None, default=None
        skorch's internal validation split; ``None`` trains on all data (use scikit-learn's
        model selection for held-out scores).
    verbose : int, default=0
        skorch's progress printing.
    device : str or torch.device, default="cpu"
        Where to train, e.g. ``"cuda"``. A model pickled on CUDA unpickles on a machine
        without CUDA onto the CPU.
    random_state : int, RandomState instance or None, default=None
        Seeds the initialisation and the batch order of ``fit``. The seed is applied inside a
        forked torch random state, so the global torch generator is left as it was. ``None``
        draws from the global torch generator.
    **kwargs
        Any other parameter of :class:`skorch.NeuralNetRegressor` (``callbacks``,
        ``criterion``, ``warm_start``, ``iterator_train__shuffle``, ...). Training batches
        are shuffled unless ``iterator_train__shuffle=False`` is given. The default callbacks
        ``"divergence_check"`` (:class:`DivergenceCheck`) and ``"convergence_check"``
        (:class:`ConvergenceCheck`, a warning when the loss is still falling at the last
        epoch) are turned off by ``callbacks__divergence_check=None`` and
        ``callbacks__convergence_check=None``.

    Attributes
    ----------
    qk_kernel_ : ndarray of shape (n_features, n_features) or (n_tokens, n_tokens)
        The learned kernel as float64: ``W = W_Q W_K^T`` for attention; for
        ``attention="static"`` the mixing matrix ``M = A B^T``, and for ``"static_softmax"``
        the logit matrix ``L = A B^T`` (not its softmax, which has full rank).
    effective_rank_ : int
        ``energy_rank(qk_kernel_, tau=0.99)``: the fewest singular values holding 99% of the
        kernel's energy.
    n_features_in_ : int
        Channels ``d`` of the input tokens.
    n_tokens_in_ : int
        Tokens per sequence seen at ``fit``; predictions of static mixing need the same.
    n_outputs_ : int
        Output channels ``d_out``.
    module_ : torch.nn.Module
        The trained :class:`LowRankAttention` or :class:`StaticTokenMixer`.
    history_ : skorch.history.History
        Per-epoch and per-batch training record (``history_[:, "train_loss"]``).

    Raises
    ------
    sklearn_ebound.exceptions.TrainingDivergedError
        From ``fit``/``partial_fit`` when a training loss or the weights stop being finite
        (a learning rate or ``init_scale`` too large), instead of a model that predicts
        ``nan``. A subclass of ``ValueError``: ``GridSearchCV(error_score=np.nan)`` scores
        such a candidate ``nan`` and goes on.

    See Also
    --------
    LowRankAttention : the module trained for the attention variants.
    DivergenceCheck : the default callback that stops a diverging fit.
    StaticTokenMixer : the module trained for the static variants.
    get_sequence_scorer : named scorers that accept 3-D targets, for ``GridSearchCV``.

    Notes
    -----
    ``predict(X)`` returns float32 sequences of shape ``(n_samples, n_tokens, n_targets)``;
    ``X`` is checked as at ``fit`` (3-D, finite, the fitted ``n_features``, and for static
    mixing the fitted ``n_tokens``). The parameters are checked when ``fit`` (or a first
    ``partial_fit``) starts, against ``_parameter_constraints`` with scikit-learn's parameter
    validation, and against the data's sizes; the errors are ``ValueError`` or its subclass
    ``InvalidParameterError``, and name the parameter and the accepted forms.

    Padded batches (sequences of different lengths, as a model's batches have) pass
    ``lengths``, one per sequence, to ``fit``, ``partial_fit``, ``predict`` and ``score``: the
    padding is no key, predicts zero, and enters neither the loss nor ``R^2``. As a fit
    parameter of one value per sample, model selection splits it with the sequences.

    ``score`` is the R^2 of all target entries flattened into one column. scikit-learn's own
    named scorers reject 3-D targets; pass ``scoring=get_sequence_scorer(name)`` instead of
    ``scoring=name`` in model selection.

    Persistence: ``pickle`` and ``joblib`` round-trip a fitted model, and a model fitted with
    ``device="cuda"`` loads onto the CPU where CUDA is absent (skorch maps the tensors, with a
    warning). ``skops.io`` also saves and loads it, but gains no safety from doing so: skorch
    stores the torch module and optimizer as an embedded pickle that skops does not audit, so
    the types ``skops.io.get_untrusted_types`` lists are not all that loading runs. Load only
    files you trust, as with ``pickle``.

    On a CPU shared with other work, torch's intra-op threads can slow the small problems of
    this package by an order of magnitude; ``torch.set_num_threads(1)`` avoids that.

    Examples
    --------
    >>> from sklearn_ebound.datasets import make_attention_task
    >>> from sklearn_ebound.nn import LowRankAttentionRegressor
    >>> X, Y = make_attention_task("linear", 200, 8, 4, rank=1, noise=0.05, random_state=0)
    >>> net = LowRankAttentionRegressor(
    ...     attention="linear", value="identity", max_epochs=100, batch_size=-1,
    ...     lr=0.05, random_state=0).fit(X, Y)
    >>> net.qk_kernel_.shape, net.effective_rank_
    ((4, 4), 1)
    """

    _parameter_constraints = {
        "rank": [Interval(Integral, 0, None, closed="left"), None],
        "attention": [StrOptions({"softmax", "linear", *_STATIC})],
        "value": [StrOptions({"learned", "identity"}, deprecated={"learned"}), None, "array-like"],
        "init_scale": [Interval(Real, 0, None, closed="neither")],
        "logit_scale": [Interval(Real, 0, None, closed="left")],
        "mask": [None, StrOptions({"causal"}), "array-like"],
        "mask_normalization": [None, StrOptions({"mean", "none"})],
        "logit_bias": [None, "array-like"],
        "random_state": ["random_state"],
    }

    def __init__(
        self,
        rank=None,
        *,
        attention="softmax",
        value=None,
        init_scale=1e-2,
        logit_scale=1.0,
        mask=None,
        mask_normalization=None,
        logit_bias=None,
        optimizer=torch.optim.Adam,
        lr=0.02,
        max_epochs=200,
        batch_size=128,
        train_split=None,
        verbose=0,
        device="cpu",
        random_state=None,
        **kwargs,
    ):
        # The module is built from `attention` and the data at fit; skorch stores `module`.
        kwargs.pop("module", None)
        kwargs.setdefault("iterator_train__shuffle", True)
        super().__init__(
            None,
            optimizer=optimizer,
            lr=lr,
            max_epochs=max_epochs,
            batch_size=batch_size,
            train_split=train_split,
            verbose=verbose,
            device=device,
            **kwargs,
        )
        self.rank = rank
        self.attention = attention
        self.value = value
        self.init_scale = init_scale
        self.logit_scale = logit_scale
        self.mask = mask
        self.mask_normalization = mask_normalization
        self.logit_bias = logit_bias
        self.random_state = random_state

    @property
    def _default_callbacks(self):
        # skorch's defaults (epoch timer, loss recording, printing) and the two checks.
        return [*super()._default_callbacks, ("divergence_check", DivergenceCheck()),
                ("convergence_check", ConvergenceCheck())]

    # `fit` and `partial_fit` are overridden, not hooked: skorch builds the module in
    # `initialize` before any hook sees the data, and the module's sizes are the data's.

    def fit(self, X, y, lengths=None, **fit_params):
        """Initialise the module from the data and train it.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_tokens, n_features)
            Input sequences.
        y : array-like of shape (n_samples, n_tokens, n_targets)
            Target sequences.
        lengths : array-like of shape (n_samples,), default=None
            For padded sequences (attention only): sequence ``s`` holds ``lengths[s]`` tokens
            followed by padding. Padding is no key, its outputs are zero and its targets do not
            enter the loss, which is the mean over the real tokens; the conventions of
            :class:`~sklearn_ebound.IntrinsicRankEstimator`.
        **fit_params : dict
            Passed on to :meth:`skorch.NeuralNet.fit`.

        Returns
        -------
        self : LowRankAttentionRegressor
        """
        reset = not (self.warm_start and self.initialized_)
        X, y, lengths = self._validate_fit_data(X, y, lengths, reset=reset)
        # One seeded torch state covers the initialisation and the batch order.
        with self._seeded():
            return super().fit(*self._padded(X, y, lengths), **fit_params)

    def partial_fit(self, X, y, classes=None, lengths=None, **fit_params):
        """Train for ``max_epochs`` more epochs, initialising first if needed.

        ``lengths`` marks padding as in :meth:`fit`. A ``KeyboardInterrupt`` stops training
        and propagates (skorch alone would swallow it and return the partly trained model as if
        finished): a sweep interrupted mid-fit never records a partly trained rank. The partly
        trained module stays in ``module_``.
        """
        if not isinstance(X, _Sequences):  # from `fit`, the data are checked already
            X, y, lengths = self._validate_fit_data(X, y, lengths, reset=not self.initialized_)
            X, y = self._padded(X, y, lengths)
        self._interrupted = False
        super().partial_fit(X, y, classes=classes, **fit_params)
        if self._interrupted:
            self._interrupted = False
            raise KeyboardInterrupt(
                f"training interrupted after {len(self.history_)} epoch(s); the model is only "
                "partly trained")
        return self

    def predict(self, X, lengths=None):
        """Predicted sequences, float32 of shape ``(n_samples, n_tokens, n_targets)``.

        With ``lengths`` (as in :meth:`fit`) the predictions at padding are zero.
        """
        if lengths is None:
            return super().predict(X)
        check_is_fitted(self)
        X, _ = self._validate_sequences(X, reset=False)
        lengths = self._check_lengths(lengths, X)
        return super().predict(_Sequences(X, lengths=lengths))

    def get_loss(self, y_pred, y_true, X=None, training=False):
        """The criterion; with padding, its mean over the real tokens only.

        Padding enters as a perfect fit (the prediction set to the target), and the mean over
        all entries is rescaled by ``n_tokens_total / n_real_tokens``.
        """
        if not (isinstance(X, Mapping) and "lengths" in X):
            return super().get_loss(y_pred, y_true, X=X, training=training)
        y_true = to_tensor(y_true, device=y_pred.device)
        valid = _valid_tokens(X["lengths"], y_pred.shape[1], device=y_pred.device)
        y_pred = torch.where(valid, y_pred, y_true.to(y_pred.dtype))
        loss = super().get_loss(y_pred, y_true, X=X, training=training)
        return loss * (valid.numel() / valid.sum().clamp(min=1))

    def fit_loop(self, X, y=None, *args, **kwargs):
        # skorch's partial_fit catches KeyboardInterrupt around this loop; remember it.
        try:
            return super().fit_loop(X, y, *args, **kwargs)
        except KeyboardInterrupt:
            self._interrupted = True
            raise

    def score(self, X, y, sample_weight=None, lengths=None):
        """R^2 over all tokens and channels: the targets flattened into one column.

        ``1 - sum (Y - Y_pred)^2 / sum (Y - mean(Y))^2`` with one overall mean, over the real
        tokens only when ``lengths`` marks padding (as in :meth:`fit`).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_tokens, n_features)
        y : array-like of shape (n_samples, n_tokens, n_targets)
        sample_weight : array-like of shape (n_samples,), default=None
            Weight of each sequence.
        lengths : array-like of shape (n_samples,), default=None
            Tokens per sequence before its padding.

        Returns
        -------
        score : float
        """
        # Overridden: scikit-learn's RegressorMixin.score hands the 3-D targets to r2_score,
        # which rejects them.
        check_is_fitted(self)
        # The targets stay in float64: R^2 near 0 is sensitive to float32 round-off.
        X, y = self._validate_sequences(X, y, reset=False, y_dtype=np.float64)
        lengths = self._check_lengths(lengths, X)
        y_pred = self.predict(X, lengths=lengths).astype(np.float64)
        weight = np.ones(X.shape[:2]) if sample_weight is None else np.broadcast_to(
            np.asarray(sample_weight, dtype=np.float64)[:, None], X.shape[:2])
        if lengths is not None:
            weight = weight * _valid_tokens(lengths, X.shape[1]).numpy()[..., 0]
        # One weight per token, repeated over its channels.
        weight = np.repeat(weight.reshape(-1), y.shape[2])
        if sample_weight is None and lengths is None:
            weight = None
        return r2_score(y.reshape(-1), y_pred.reshape(-1), sample_weight=weight)

    def initialize_module(self):
        """Build the module from the parameters and the sizes seen at ``fit``."""
        # 'learned' is the deprecated spelling of None, warned about at fit.
        value = None if isinstance(self.value, str) and self.value == "learned" else self.value
        kwargs = dict(
            rank=self.rank,
            value=value,
            n_targets=self.n_outputs_,
            logit_scale=self.logit_scale,
            init_scale=self.init_scale,
        )
        if self.attention in _STATIC:
            module_cls = StaticTokenMixer
            attention = "linear" if self.attention == "static" else "softmax"
            kwargs.update(n_tokens=self.n_tokens_in_, n_features=self.n_features_in_,
                          attention=attention)
        else:
            module_cls = LowRankAttention
            kwargs.update(n_features=self.n_features_in_, attention=self.attention,
                          mask=self.mask, mask_normalization=self.mask_normalization,
                          logit_bias=self.logit_bias)
        # `module__<name>` parameters override the ones above.
        kwargs.update(self.get_params_for("module"))
        self.module_ = module_cls(**kwargs)
        return self

    def get_dataset(self, X, y=None):
        """Checked sequences, wrapped as tensors (no copy) unless a custom ``dataset`` is set.

        Every array that ``fit``, ``predict`` or ``forward`` trains on or predicts from passes
        here: ``X`` (and ``y``) must be 3-D, finite, and have the sizes seen at ``fit``. Predictions
        are float32 arrays of shape ``(n_samples, n_tokens, n_targets)``. A torch ``Dataset``
        goes through unchanged, as in skorch.
        """
        if is_dataset(X):
            return X
        X, y = self._validate_sequences(X, y, reset=False)
        if self.dataset is Dataset and not self.get_params_for("dataset"):
            return _Sequences(X, y)
        return super().get_dataset(X, y)

    def get_iterator(self, dataset, training=False):
        """Mini-batches taken with one index per batch, not one per sequence.

        For the arrays given to ``fit``/``predict`` and the default ``DataLoader`` with no
        options besides ``batch_size``, ``shuffle`` and ``drop_last``, each batch is read from
        the tensors at once: a slice (a view) when the order is kept, one gather of the
        shuffled indices otherwise. Anything else goes through skorch unchanged. Reading
        sequence by sequence and collating cost a third of an epoch.
        """
        prefix = "iterator_train" if training else "iterator_valid"
        iterator, kwargs = getattr(self, prefix), self.get_params_for(prefix)
        base = dataset.dataset if isinstance(dataset, Subset) else dataset
        if (
            not isinstance(base, _Sequences)
            or iterator is not DataLoader
            or set(kwargs) - {"batch_size", "shuffle", "drop_last"}
        ):
            return super().get_iterator(dataset, training=training)
        n_samples, drop_last = len(dataset), kwargs.get("drop_last", False)
        batch_size = kwargs.get("batch_size", self.batch_size)
        batch_size = n_samples if batch_size == -1 else batch_size
        if kwargs.get("shuffle"):
            batches = BatchSampler(RandomSampler(dataset), batch_size, drop_last=drop_last)
        else:
            stop = n_samples - n_samples % batch_size if drop_last else n_samples
            batches = [slice(i, min(i + batch_size, stop)) for i in range(0, stop, batch_size)]
        # batch_size=None: each item of `batches` is one call dataset[indices].
        return DataLoader(dataset, sampler=batches, batch_size=None)

    def on_train_end(self, net, X=None, y=None, **kwargs):
        """Read the learned kernel and its energy rank."""
        super().on_train_end(net, X=X, y=y, **kwargs)
        with torch.no_grad():
            if isinstance(self.module_, StaticTokenMixer):
                kernel = self.module_.mixing_kernel()
            else:
                kernel = self.module_.qk_kernel()
        self.qk_kernel_ = kernel.detach().cpu().double().numpy()
        if not np.isfinite(self.qk_kernel_).all():
            # Reached only with the divergence check off: nothing usable was learned.
            raise TrainingDivergedError(
                "training diverged: the learned kernel is not finite after the last epoch; "
                f"lower `lr` (now {getattr(self, 'optimizer__lr', self.lr)}) or `init_scale` "
                f"(now {self.init_scale})."
            )
        # tau = 0.99: the fewest directions that hold 99% of the squared Frobenius norm.
        self.effective_rank_ = energy_rank(self.qk_kernel_, tau=0.99)

    def _seeded(self):
        """A forked torch random state seeded from ``random_state`` (no-op for ``None``)."""
        if self.random_state is None:
            return nullcontext()
        seed = check_random_state(self.random_state).randint(np.iinfo(np.int32).max)
        return _forked_seed(seed)

    def _validate_fit_data(self, X, y, lengths, reset):
        """Check the parameters (with ``reset``) and the data of ``fit``/``partial_fit``."""
        if reset:
            self._validate_parameter_constraints()
        X, y = self._validate_sequences(X, y, reset=reset)
        return X, y, self._check_lengths(lengths, X)

    def _check_lengths(self, lengths, X):
        """``lengths`` checked against the sequences ``X``, or ``None``."""
        if lengths is None:
            return None
        if self.attention in _STATIC:
            raise ValueError(f"`lengths` applies to attention='softmax' or 'linear'. Got "
                             f"attention={self.attention!r}.")
        if self.dataset is not Dataset or self.get_params_for("dataset"):
            raise ValueError("`lengths` needs the default `dataset`; with a custom one, pass "
                             "the lengths inside it as the module's `lengths` input.")
        return check_lengths(lengths, X.shape[0], X.shape[1])

    @staticmethod
    def _padded(X, y, lengths):
        """``(X, y)`` for skorch: the arrays, or with padding one dataset carrying it."""
        return (X, y) if lengths is None else (_Sequences(X, y, lengths), None)

    def _validate_parameter_constraints(self):
        """Enforce ``_parameter_constraints`` with scikit-learn's parameter validation.

        scikit-learn's message names the parameter, its accepted forms and the value given;
        ``sklearn.set_config(skip_parameter_validation=True)`` skips the check, as it does for
        scikit-learn's estimators.
        """
        if get_config()["skip_parameter_validation"]:
            return
        validate_parameter_constraints(
            self._parameter_constraints,
            {name: getattr(self, name) for name in self._parameter_constraints},
            caller_name=type(self).__name__,
        )
        # stacklevel 5: the warning points at the caller of fit or partial_fit.
        resolve_learned(self.value, stacklevel=5)

    def _validate_sequences(self, X, y=None, *, reset, y_dtype=np.float32):
        """Check the data; with ``reset`` record the sizes, else compare them to ``fit``'s."""
        X = check_sequences(X, "X", dtype=np.float32)
        if y is not None:
            y = check_sequences(y, "y", dtype=y_dtype)
            if y.shape[:2] != X.shape[:2]:
                raise ValueError(
                    "`y` must have shape (n_samples, n_tokens, n_targets) with the same "
                    f"n_samples and n_tokens as `X` {X.shape[:2]}. Got {y.shape} instead."
                )
        if reset:
            self._check_params_against_data(X, y)
            self.n_tokens_in_, self.n_features_in_ = X.shape[1:]
            self.n_outputs_ = y.shape[2]
            return X, y
        if X.shape[2] != self.n_features_in_:
            raise ValueError(
                f"`X` has {X.shape[2]} features per token, but {type(self).__name__} was "
                f"fitted with n_features={self.n_features_in_}."
            )
        if self.attention in _STATIC and X.shape[1] != self.n_tokens_in_:
            raise ValueError(
                f"`X` has {X.shape[1]} tokens, but static mixing was fitted with "
                f"n_tokens={self.n_tokens_in_}."
            )
        if y is not None and y.shape[2] != self.n_outputs_:
            raise ValueError(
                f"`y` has {y.shape[2]} channels per token, but {type(self).__name__} was "
                f"fitted with n_targets={self.n_outputs_}."
            )
        return X, y

    def _check_params_against_data(self, X, y):
        """The limits of ``rank`` and ``value`` that depend on the data's sizes."""
        n_tokens, n_features = X.shape[1:]
        n_targets = y.shape[2]
        if self.attention in _STATIC:
            width, width_name = n_tokens, "n_tokens"
        else:
            width, width_name = n_features, "n_features"
        for name in ("mask", "mask_normalization", "logit_bias"):
            if getattr(self, name) is not None and self.attention in _STATIC:
                raise ValueError(f"`{name}` applies to attention='softmax' or 'linear'. Got "
                                 f"attention={self.attention!r}.")
        if self.attention not in _STATIC:
            check_attention_pattern(self.mask, n_tokens, self.attention,
                                    self.mask_normalization, self.logit_bias)
        if self.rank is not None and self.rank > width:
            raise ValueError(
                f"`rank` upper bound is {width} ({width_name}). Got {self.rank} instead. "
                "Reduce `rank` or pass None for full width."
            )
        if isinstance(self.value, str):
            if self.value == "identity" and n_targets != n_features:
                raise ValueError(
                    f"`value='identity'` needs `y` with n_targets == n_features = {n_features}"
                    f" channels. Got n_targets={n_targets} instead."
                )
        elif self.value is not None:
            V = check_array(self.value, input_name="value")
            if V.shape != (n_targets, n_features):
                raise ValueError(
                    f"`value` as an array must have shape (n_targets, n_features) = "
                    f"({n_targets}, {n_features}). Got {V.shape} instead."
                )

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.two_d_array = False
        tags.input_tags.three_d_array = True
        tags.target_tags.multi_output = True
        tags.target_tags.single_output = False
        return tags
