"""Data-only intrinsic rank: read ``r*`` from data before training any model."""

import copy
import warnings
from numbers import Real

import numpy as np
from sklearn.base import (
    BaseEstimator,
    ClassNamePrefixFeaturesOutMixin,
    TransformerMixin,
    _fit_context,
)
from sklearn.utils import check_array
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_is_fitted, validate_data

from ._attention_operators import KernelMoments, per_token_data, token_mixing_data
from ._dask import dask_sample_blocks, is_dask_array, tree_merge
from ._moments import Moments, power_of_two_scale
from ._operators import (
    canonical_correlations,
    edge_matched_noise_covariance,
    largest_eigenvalue_law,
    null_edge_canonical,
    null_edge_correlated,
    null_edge_ratio,
    null_edge_white,
    residuals_look_white,
    solve_static,
)
from ._reduced_rank import rank_path_scores
from ._spectrum import energy_rank, optimal_hard_threshold
from ._validation import check_sequence_pair, check_sequences
from .exceptions import RankEstimationWarning

__all__ = ["IntrinsicRankEstimator"]


class _NotEnoughData(ValueError):
    """Too few samples so far to read a rank (partial_fit waits for more)."""


def _one_standard_error_rank(ranks, scores):
    """Smallest rank whose mean score is within one standard error of the best mean."""
    mean = scores.mean(axis=0)
    sem = scores.std(axis=0, ddof=1) / np.sqrt(scores.shape[0]) if scores.shape[0] > 1 else 0 * mean
    best = int(np.argmax(mean))
    return int(ranks[np.flatnonzero(mean >= mean[best] - sem[best])[0]])


def _sequential_count(values, edge):
    """Number of leading ``values`` (decreasing) above their own ``edge(k)``, stopping at the
    first that is not, and the last edge computed (the cut; ``None`` for no values). The
    edges are computed only as far as the count goes; a missing edge (``None``) stops it."""
    cut = None
    for k, value in enumerate(values):
        cut = edge(k)
        if cut is None or value <= cut:
            return k, cut
    return len(values), cut


def _orthonormal_directions(directions):
    """Orthonormal basis of the columns' span, keeping their order (first k span the top k)."""
    if directions.shape[1] == 0:
        return directions.T
    Q, R = np.linalg.qr(directions)
    # Keep each basis vector pointing like its direction: diag(R) > 0.
    Q *= np.where(np.diag(R) < 0, -1.0, 1.0)
    return Q.T


def _n_dims(X):
    shape = getattr(X, "shape", None)
    return len(shape) if shape is not None else np.asarray(X).ndim


class IntrinsicRankEstimator(ClassNamePrefixFeaturesOutMixin, TransformerMixin, BaseEstimator):
    """Intrinsic rank ``r*`` of a task, read from data before any model is trained.

    For the static surrogate ``Y = X B + E`` the intrinsic rank is ``rank(Sigma_X^{1/2} B)``:
    below it every model keeps an excess risk of at least the tail energy ``T(r)``, at it the
    task is solved. The estimator solves the data's second moments for the least-squares
    operator and reads its rank with a noise-adaptive cut. Without ``Y`` it reads the rank of
    ``X`` itself.

    For attention the intrinsic rank is attention-native: the rank of the query–key kernel
    ``W = W_Q W_Kᵀ`` with which the attention class realises the task. On sequence data
    ``X (N, n, d) -> Y (N, n, d_out)`` with ``operator="attention"`` the estimator reads it
    from moments of the data, before training:

    - value map known (``value="identity"`` or a matrix): token ``i`` obeys
      ``y_i = V S Wᵀ x_i`` with ``S`` the sequence's second moment, linear in ``W``; least
      squares recovers ``W`` (``qk_kernel_``) and its rank exactly;
    - value map unknown (``value=None``): the per-token channel operator ``y_i ~ V Sigma Wᵀ
      x_i`` of rank ``rank(W)``, exact as ``n`` grows;
    - softmax attention is linearised around uniform weights (centred moments). Recovery is
      partial: it degrades as logits grow, and a direction of ``W`` that ``V`` annihilates is
      invisible. With a known value map ``logit_rms_`` measures the fitted logits, and a
      :class:`~sklearn_ebound.exceptions.RankEstimationWarning` says when it passes 1.

    Parameters
    ----------
    operator : {"static", "attention"}, default="static"
        The operator whose rank is read. ``"static"``: the linear operator ``Y ~ X B`` of 2-D
        data (scalar-token sequences: the token-mixing matrix); on 3-D data, the naive static
        transfer, one token-mixing matrix ``Y_s ~ M X_s`` for all sequences and channels (its
        rank does not describe attention; kept to show why). ``"attention"``: the rank of the
        query–key kernel of 3-D sequence data.
    attention : {"softmax", "linear"}, default="softmax"
        The attention class, for ``operator="attention"``.
    value : None, "identity" or array-like of shape (n_targets, n_features), default=None
        The value map ``V`` of attention, if known.
    criterion : {"threshold", "rsc", "cv", "energy"}, default="threshold"
        How the rank is read from the spectrum:

        - ``"threshold"``: a sequential test of each singular value of the fitted values against the
          largest value the noise in them reaches with probability ``1 - significance`` (99.9% by
          default; Tracy–Widom approximations). When the residuals are white (John's sphericity test
          at the 5% level), the edge is that of a ``rank(X) x q`` Gaussian matrix scaled by the
          residual noise level (Johnstone 2001), widened by any spread the residuals' largest
          eigenvalue shows. When they are correlated, two tests run and the larger rank is kept (a
          Bonferroni union, false positives at most ``2 significance``): the fitted values against
          the residuals: the largest fitted-value eigenvalue left must exceed the largest residual
          eigenvalue in the same directions times the ``1 - significance`` quantile of the ratio of
          their two laws (El Karoui 2007, with a detached noise spike's own law, Baik, Ben Arous &
          Péché 2005), a ratio nearly free of the noise covariance, whose shape comes from a
          shrinkage matched to that residual eigenvalue; and the canonical correlations between
          ``X`` and ``Y`` (the noise-whitened spectrum) against the Jacobi ensemble's edge
          (Johnstone 2008). The first keeps its power when there are many targets per residual
          degree of freedom, the second when the signal lies where the noise is weak. With fewer
          residual degrees of freedom than targets (``n_samples <= n_features + n_targets + 1``)
          only the first applies, its level is approximate, and the estimator warns; with none at
          all it uses the Gavish–Donoho threshold with unknown noise, and warns. Without ``Y``: the
          Gavish–Donoho threshold with unknown noise on ``X``'s spectrum. This is the default
          because it recovered ``r*`` most reliably: 100% of the test suite's planted grid, and the
          best exact-recovery rate of the accuracy benchmark
          (``benchmarks/bench_recovery_accuracy.py``) against PCA-mle, optht, cross-validated grid
          search and AIC/BIC.
        - ``"rsc"``: Bunea, She & Wegkamp's rank selection criterion: singular values of the
          fitted values above ``sigma * sqrt(2 (n_targets + rank(X)))``.
        - ``"cv"``: K-fold cross-validation over the reduced-rank path (the machinery of
          :class:`ReducedRankRegressorCV`), smallest rank within one standard error of the best.
        - ``"energy"``: energy rank of the fitted values' spectrum at level ``tau``; a
          descriptor, not noise-adaptive.

        For attention, ``"threshold"`` is the Gavish–Donoho threshold of the noise-whitened
        kernel (value map known) or the sequential test above on the per-token operator
        (unknown). Where the model is only approximate (softmax, or an unknown value map at
        finite ``n``) its error is a systematic, signal-proportional term rather than noise,
        so of the directions that pass the threshold only those holding a fraction ``tau`` of
        their energy count (their energy rank).
    significance : float, default=1e-3
        Significance level (false-positive rate) of each sequential test of
        ``criterion="threshold"``, in ``[1e-12, 0.5)``: noise alone passes a test's edge with this
        probability (the edges are the ``1 - significance`` quantiles). With correlated residuals
        the two tests' union has a rate of at most ``2 * significance``. Smaller values guard
        better against reading noise as rank, larger ones find weaker directions
        (``benchmarks/bench_recovery_accuracy.py`` measures both, at 0.01, 0.001 and 0.0001).
        The Gavish–Donoho thresholds (no residual degrees of freedom, no ``Y``, attention with a
        known value map) have no level and ignore it.
    tau : float, default=0.99
        Energy fraction for ``criterion="energy"``, in ``(0, 1]``.
    cv : int, cross-validation generator or iterable, default=5
        Folds for ``criterion="cv"``.
    fit_intercept : bool, default=True
        Centre the data first.

    Attributes
    ----------
    rank_ : int
        The estimated intrinsic rank.
    singular_values_ : ndarray
        The spectrum the rank was read from: the canonical correlations where the
        ``"threshold"`` test on them gave the rank, otherwise the singular values of the fitted
        values (of ``X`` without ``Y``) divided by ``sqrt(n_samples)``.
    threshold_ : float or None
        The cut applied to ``singular_values_`` (``"threshold"`` and ``"rsc"``).
    noise_variance_ : float or None
        Noise variance per target entry estimated from the residuals, where one was used.
    components_ : ndarray of shape (rank, n_features)
        Orthonormal input directions of the rank-``rank_`` operator, in order of importance;
        :meth:`transform` projects the centred inputs on them. For attention: the query
        directions (column space of ``W``); :meth:`transform` projects every token.
    qk_kernel_ : ndarray of shape (n_features, n_features), only with a known value map
        The least-squares query–key kernel ``W`` (for softmax, times ``beta / sqrt(d)``).
    logit_rms_ : float, only with a known value map
        Root-mean-square of the fitted attention logits.
    explained_energy_ : ndarray
        Fraction of the operator's energy (sum of squared singular values of the fitted values)
        carried by each component.
    cv_results_ : dict, only for ``criterion="cv"``
        ``"rank"`` and ``"mean_test_score"``/``"std_test_score"`` (negative mean squared error).
    mean_ : ndarray of shape (n_features,)
    n_features_in_ : int
    feature_names_in_ : ndarray of str

    See Also
    --------
    ReducedRankRegressor : The rank-``r`` model whose risk the intrinsic rank bounds.
    threshold_rank, energy_rank : The spectral rules on their own.

    References
    ----------
    Johnstone, "On the distribution of the largest eigenvalue in principal components
    analysis", Ann. Statist., 2001. El Karoui, "Tracy–Widom limit for the largest eigenvalue of
    a large class of complex sample covariance matrices", Ann. Probab., 2007. Baik, Ben Arous &
    Péché, "Phase transition of the largest eigenvalue for nonnull complex sample covariance
    matrices", Ann. Probab., 2005. Bai & Yao, "Central limit theorems for eigenvalues in a
    spiked population model", Ann. Inst. H. Poincaré Probab. Statist., 2008. Chiani,
    "Distribution of the largest eigenvalue for real Wishart and Gaussian random matrices and a
    simple approximation for the Tracy–Widom distribution", J. Multivariate Anal., 2014.
    Johnstone, "Multivariate analysis and Jacobi ensembles", Ann. Statist., 2008. Gavish &
    Donoho, "The optimal hard threshold for singular values is 4/sqrt(3)", IEEE Trans. Inf.
    Theory, 2014. Bunea, She & Wegkamp, "Optimal selection of reduced rank estimators of
    high-dimensional matrices", Ann. Statist., 2011.

    Examples
    --------
    >>> from sklearn_ebound import IntrinsicRankEstimator
    >>> from sklearn_ebound.datasets import make_static_task
    >>> X, Y = make_static_task(2000, 20, rank=4, noise=0.5, random_state=0)
    >>> IntrinsicRankEstimator().fit(X, Y).rank_
    4
    """

    _parameter_constraints = {
        "operator": [StrOptions({"static", "attention"})],
        "attention": [StrOptions({"softmax", "linear"})],
        "value": [None, StrOptions({"identity"}), "array-like"],
        "criterion": [StrOptions({"threshold", "rsc", "cv", "energy"})],
        # Below 1e-12 the level 1 - significance is no longer resolved in float64.
        "significance": [Interval(Real, 1e-12, 0.5, closed="left")],
        "tau": [Interval(Real, 0, 1, closed="right")],
        "cv": ["cv_object"],
        "fit_intercept": ["boolean"],
    }

    def __init__(self, operator="static", *, attention="softmax", value=None,
                 criterion="threshold", significance=1e-3, tau=0.99, cv=5, fit_intercept=True):
        self.operator = operator
        self.attention = attention
        self.value = value
        self.criterion = criterion
        self.significance = significance
        self.tau = tau
        self.cv = cv
        self.fit_intercept = fit_intercept

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, Y=None):
        """Estimate the intrinsic rank.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features) or (n_samples, n_tokens, n_features)
            Also a dask array, whose moments are then computed as dask reductions on any
            scheduler (a ``dask.distributed`` cluster included).
        Y : array-like of shape (n_samples, n_targets) or (n_samples, n_tokens, n_targets), \
                default=None
            Targets; without them the rank of ``X`` itself is read (2-D data only).

        Returns
        -------
        self : object
        """
        self._statistics = None
        if is_dask_array(X):
            if self.criterion == "cv":
                raise ValueError("criterion='cv' refits on held-out folds in memory; with dask "
                                 "arrays use 'threshold', 'rsc' or 'energy'.")
            self._accumulate_dask(X, Y)
            return self._read()
        self._accumulate(X, Y, min_samples=2)
        if self.criterion == "cv":
            return self._read(cv_data=self._cv_data(X, Y))
        return self._read()

    def partial_fit(self, X, Y=None):
        """Add a chunk of data and re-read the rank from everything seen so far.

        The accumulated second moments equal those of one :meth:`fit` on all the chunks, so
        the result is the same (to rounding) with memory independent of the number of samples.
        Chunks of any size work, a single row or sequence included: until the chunks hold
        enough samples to read a rank (two, or more for ``criterion="rsc"``), ``rank_`` is not
        set. ``criterion="cv"`` needs all the data at once and is not available.

        Parameters
        ----------
        X, Y : array-like
            As in :meth:`fit`; every chunk must have the same number of features (and tokens).

        Returns
        -------
        self : object
        """
        if getattr(self, "_statistics", None) is None:
            self._validate_params()
            self._statistics = None
        if self.criterion == "cv":
            raise ValueError("criterion='cv' scores held-out folds of all the data and cannot "
                             "be accumulated; use fit, or another criterion with partial_fit.")
        self._accumulate(X, Y, min_samples=1)
        self.n_samples_seen_ = self._n_samples_seen()
        try:
            return self._read()
        except _NotEnoughData:
            return self  # the rank is read once enough chunks have arrived

    def _n_samples_seen(self):
        statistics = self._statistics
        return statistics.n_sequences if self._fit_mode == "kernel" else statistics.n

    # --- accumulation of statistics ------------------------------------------------------

    def _mode(self, X, Y):
        """Which statistics the data feed: fixed at the first chunk."""
        for name, array in (("X", X), ("Y", Y)):
            if array is not None and _n_dims(array) > 3:
                raise ValueError(
                    f"`{name}` must be 2-D (n_samples, n_features) or 3-D sequences (n_samples, "
                    f"n_tokens, n_channels). Got a {_n_dims(array)}-D array.")
        if Y is not None and self.operator == "static" and (_n_dims(X) == 3) != (
                _n_dims(Y) == 3):
            raise ValueError(
                "`X` and `Y` must both be 2-D (n_samples, n_features) or both be 3-D sequences "
                f"(n_samples, n_tokens, n_channels). Got {_n_dims(X)}-D X and {_n_dims(Y)}-D Y.")
        if self.operator == "attention" or _n_dims(X) == 3:
            if Y is None:
                raise ValueError("Sequence data (3-D `X`) needs the target sequences `Y`.")
            if self.operator == "static":
                return "token_mixing"
            return "per_token" if self.value is None else "kernel"
        return "inputs" if Y is None else "static"

    def _accumulate(self, X, Y, min_samples):
        first = self._statistics is None
        mode = self._mode(X, Y) if first else self._fit_mode
        if not first and (Y is None) != (mode == "inputs"):
            raise ValueError("Every chunk must come with targets `Y`, or none of them.")
        if mode in ("inputs", "static"):
            X2, Y2 = self._validate_2d(X, Y, first, min_samples)
        else:
            X2, Y2 = self._validate_sequences(X, Y, first)
        if first:
            self._fit_mode = mode
            self._statistics = self._new_statistics(X2, Y2)
        self._statistics.update(*self._statistic_rows(X2, Y2))

    def _validate_2d(self, X, Y, reset, min_samples):
        self._sequences = False
        if Y is None:
            X = validate_data(self, X, reset=reset, ensure_min_samples=min_samples,
                              dtype=np.float64)
            return X, np.zeros((X.shape[0], 0))
        X, Y = validate_data(self, X, Y, reset=reset, multi_output=True, y_numeric=True,
                             ensure_min_samples=min_samples, dtype=np.float64)
        Y = Y if Y.ndim == 2 else Y[:, None]
        if not reset and Y.shape[1] != self._n_targets:
            raise ValueError(f"Y has {Y.shape[1]} targets, but {type(self).__name__} was fitted "
                             f"with {self._n_targets}.")
        self._n_targets = Y.shape[1]
        return X, Y

    def _validate_sequences(self, X, Y, reset):
        self._sequences = True
        X, Y = check_sequence_pair(X, Y)
        if reset:
            self.n_features_in_ = X.shape[2]
            self._sequence_shape = (X.shape[1], Y.shape[2])
        elif (X.shape[2],) + (X.shape[1], Y.shape[2]) != (self.n_features_in_,) + tuple(
                self._sequence_shape):
            raise ValueError(
                f"Every chunk must have {self._sequence_shape[0]} tokens, "
                f"{self.n_features_in_} features and {self._sequence_shape[1]} targets. Got "
                f"X {X.shape} and Y {Y.shape}.")
        return X, Y

    def _statistic_rows(self, X, Y):
        """The rows the statistics are made of, for one validated chunk."""
        if self._fit_mode == "token_mixing":
            # The naive transfer: one token-mixing matrix shared by all sequences.
            return token_mixing_data(X, Y)
        if self._fit_mode == "per_token":
            return per_token_data(X, Y, center_sequences=self.attention == "softmax")
        return X, Y

    def _new_statistics(self, X, Y):
        # Scales fixed by the first chunk keep the products of extreme data finite.
        self._scales = (power_of_two_scale(X), power_of_two_scale(Y))
        if self._fit_mode == "kernel":
            # The value map V takes X's units to Y's: one common scale keeps it valid.
            self._scales = (max(self._scales),) * 2
            if self.criterion in ("rsc", "cv"):
                raise ValueError(f"criterion={self.criterion!r} is not available with a known "
                                 "value map; use 'threshold' or 'energy'.")
            return KernelMoments(self._value_map(X.shape[2], Y.shape[2]), self.attention,
                                 scale=self._scales[0])
        X2, Y2 = self._statistic_rows(X[:1], Y[:1])
        return Moments.empty(X2.shape[1], Y2.shape[1], center=self.fit_intercept,
                             scale_x=self._scales[0], scale_y=self._scales[1])

    def _accumulate_dask(self, X, Y):
        """Statistics of dask arrays: one task per block of samples, merged as a tree."""
        import dask

        mode = self._mode(X, Y)
        sequences = mode not in ("inputs", "static")
        blocks_x, blocks_y = dask_sample_blocks(X, Y)
        # Validate and size from the first block, then reduce every block on the cluster.
        first_x = blocks_x[0].compute() if hasattr(blocks_x[0], "compute") else blocks_x[0]
        first_y = None if Y is None else blocks_y[0].compute()
        X0, Y0 = (self._validate_sequences(first_x, first_y, True) if sequences
                  else self._validate_2d(first_x, first_y, True, 1))
        self._fit_mode = mode
        template = self._new_statistics(X0, Y0)

        def block_statistics(xb, yb):
            xb, yb = (self._validate_sequences(xb, yb, False) if sequences
                      else self._validate_2d(xb, yb, False, 1))
            statistics = copy.deepcopy(template)
            return statistics.update(*self._statistic_rows(xb, yb))

        parts = [dask.delayed(block_statistics)(bx, by)
                 for bx, by in zip(blocks_x, blocks_y, strict=True)]
        self._statistics = dask.compute(tree_merge(parts))[0]
        if X.shape[0] < 2:
            raise ValueError(f"Found array with {X.shape[0]} sample(s) while a minimum of 2 is "
                             "required.")

    def _cv_data(self, X, Y):
        X2, Y2 = self._validate_2d(X, Y, reset=False, min_samples=2)
        X2, Y2 = self._statistic_rows(X2, Y2)
        return X2 / self._scales[0], Y2 / self._scales[1]

    # --- reading the rank from the statistics --------------------------------------------

    def _read(self, cv_data=None):
        statistics = self._statistics
        self._spectrum_unit = "y"  # the unit of singular_values_ and threshold_
        if self._fit_mode == "kernel":
            self._read_kernel(statistics)
        else:
            if statistics.n < 2:
                raise _NotEnoughData("At least 2 samples are needed to read a rank; got "
                                     f"{statistics.n} so far.")
            if self._fit_mode == "inputs":
                self._read_inputs(statistics)
            else:
                self._read_static(statistics, cv_data)
                if self._fit_mode == "per_token":
                    self._cap_by_energy()
                    self._warn_short_sequences()
        return self._unscale()

    def _warn_short_sequences(self):
        """Warn where the per-token operator's systematic term may pass the energy cap.

        A token's own share ``x_i x_iᵀ / n`` of its sequence's moment adds ``V (W + tr(W) I) / n``
        to the operator ``V Wᵀ`` (Gaussian tokens): a full-rank term of relative energy up to
        about ``2 / n^2`` (0.3-1.7 / n^2 measured beyond the planted directions, d = 8, n = 4-32).
        """
        n_tokens = self._sequence_shape[0]
        if self.criterion == "threshold" and 2 / n_tokens**2 > 1 - self.tau:
            warnings.warn(
                f"With an unknown value map and {n_tokens} tokens per sequence, the per-token "
                f"operator carries a full-rank systematic term of relative energy up to about "
                f"2 / n_tokens^2 = {2 / n_tokens**2:.3g}, more than 1 - tau = {1 - self.tau:.3g}: "
                "the rank may be overestimated. Pass the value map, use longer sequences, or "
                "lower tau.", RankEstimationWarning, stacklevel=4)

    def _unscale(self):
        """Express the fitted attributes in the units of the data (ranks do not change)."""
        with np.errstate(over="ignore", invalid="ignore"):
            self._unscale_attributes()
        values = [self.singular_values_, self.mean_, self.threshold_, self.noise_variance_,
                  getattr(self, "qk_kernel_", None)]
        if not all(np.all(np.isfinite(v)) for v in values if v is not None):
            warnings.warn(
                "Some fitted values (spectrum, noise variance or means) exceed the float64 range "
                "in the units of the data and are infinite; the rank itself was read on scaled "
                "data and is unaffected.", RankEstimationWarning, stacklevel=4)
        return self

    def _unscale_attributes(self):
        sx, sy = self._scales
        unit = {"x": sx, "y": sy, None: 1.0}[self._spectrum_unit]
        if self._fit_mode == "kernel":
            # X and Y share the scale s (sx == sy): y = V S Wᵀ x is cubic in x, so the kernel
            # carries 1 / s^2 (divided twice: s^2 itself may leave the float64 range) and its
            # logits x_iᵀ W x_j none.
            self.qk_kernel_ = self.qk_kernel_ / sx / sx
            if self.criterion == "energy":
                self.singular_values_ = self.singular_values_ / sx / sx
                unit = 1.0
        self.singular_values_ = self.singular_values_ * unit
        if self.threshold_ is not None:
            self.threshold_ = self.threshold_ * unit
        if self.noise_variance_ is not None:
            self.noise_variance_ = self.noise_variance_ * sy * sy  # may overflow to inf
        self.mean_ = self.mean_ * sx
        if hasattr(self, "cv_results_") and self.criterion == "cv":
            for key in ("mean_test_score", "std_test_score"):
                self.cv_results_[key] = self.cv_results_[key] * sy * sy

    def _read_kernel(self, statistics):
        fit = statistics.solve()
        U, s, _ = np.linalg.svd(fit.kernel)
        self.qk_kernel_ = fit.kernel
        self.logit_rms_ = fit.logit_rms
        self.noise_variance_ = fit.noise_variance
        if self.criterion == "energy":
            self.threshold_ = None
            rank = energy_rank(s, self.tau) if s[0] > 0 else 0
            spectrum = s
        else:
            self.threshold_ = float(fit.threshold)
            rank, spectrum = fit.rank, fit.singular_values
        self.rank_ = int(rank)
        self.mean_ = np.zeros(self.n_features_in_)
        self.singular_values_ = spectrum
        self.explained_energy_ = s**2 / np.sum(s**2) if s[0] > 0 else np.zeros_like(s)
        self.components_ = U[:, : self.rank_].T.copy()
        if self.attention == "softmax":
            if self.logit_rms_ > 1:
                warnings.warn(
                    f"The fitted attention logits have root-mean-square {self.logit_rms_:.2f} > 1: "
                    "the linearisation of the softmax is strained and the rank may be wrong.",
                    RankEstimationWarning, stacklevel=4)
            self._cap_by_energy(s)
        return self

    def _value_map(self, n_features, n_targets):
        if self.value is None:
            return None
        if isinstance(self.value, str):  # "identity"
            if n_targets != n_features:
                raise ValueError(f"value='identity' needs n_targets == n_features. Got "
                                 f"{n_targets} and {n_features}.")
            return np.eye(n_features)
        V = check_array(self.value, dtype=np.float64, input_name="value")
        if V.shape != (n_targets, n_features):
            raise ValueError(f"`value` must have shape (n_targets, n_features) = "
                             f"{(n_targets, n_features)}. Got {V.shape} instead.")
        return V

    def _cap_by_energy(self, s=None):
        """Cap the rank by the energy rank where the model error is systematic, not noise."""
        if self.criterion == "threshold":
            s = self._operator_spectrum if s is None else s
            # The energy of the directions that passed the noise test: the noise's own energy
            # in the other directions would otherwise loosen the cap as the noise grows.
            signal = s[: self.rank_]
            if signal.size and signal[0] > 0:
                self.rank_ = int(min(self.rank_, energy_rank(signal, self.tau)))
                self.components_ = self.components_[: self.rank_]
        return self

    def _read_inputs(self, moments):
        if self.criterion in ("rsc", "cv"):
            raise ValueError(f"criterion={self.criterion!r} needs targets `Y`; pass Y or use "
                             "criterion='threshold' or 'energy' to read the rank of X.")
        n_features = moments.xx.shape[0]
        evals, evecs = np.linalg.eigh(moments.xx)
        evals, evecs = np.clip(evals[::-1], 0, None), evecs[:, ::-1]
        s = np.sqrt(evals)[: min(moments.dof, n_features)]
        self.threshold_ = self.noise_variance_ = None
        if self.criterion == "energy":
            rank = energy_rank(s, self.tau) if s.size else 0
        else:
            shape = (max(moments.dof, 1), n_features)
            self.threshold_ = optimal_hard_threshold(s, shape=shape) / np.sqrt(moments.n)
            rank = int(np.sum(s / np.sqrt(moments.n) > self.threshold_))
        self._set_common(moments, s, rank, evecs[:, :rank], s / np.sqrt(moments.n))
        self._spectrum_unit = "x"
        return self

    def _read_static(self, moments, cv_data=None):
        operator = solve_static(moments)
        n_features, n_targets = moments.xy.shape
        s = operator.fitted_singular_values[: min(operator.input_rank, n_targets)]
        self.threshold_ = self.noise_variance_ = None
        spectrum = s / np.sqrt(moments.n)
        if self.criterion == "energy":
            rank = energy_rank(s, self.tau) if s.size and s[0] > 0 else 0
        elif self.criterion == "cv":
            ranks = np.arange(min(n_features, n_targets) + 1)
            scores = rank_path_scores(*cv_data, ranks, cv=self.cv,
                                      scoring="neg_mean_squared_error",
                                      fit_intercept=self.fit_intercept)
            self.cv_results_ = {"rank": ranks, "mean_test_score": scores.mean(axis=0),
                                "std_test_score": scores.std(axis=0)}
            rank = _one_standard_error_rank(ranks, scores)
        elif self.criterion == "rsc":
            sigma = self._residual_sigma(operator)
            # Bunea, She & Wegkamp (2011): mu = 2 S^2 (n_targets + rank(X)).
            cut = sigma * np.sqrt(2 * (n_targets + operator.input_rank))
            rank = int(np.sum(s > cut))
            self.threshold_ = cut / np.sqrt(moments.n)
        else:
            rank, spectrum = self._threshold_rank(moments, operator, s, n_targets)
        # Input directions of the rank-r operator B V_r, the reduced-rank regression factors.
        directions = operator.coef @ operator.output_directions[:, :rank]
        self._set_common(moments, s, rank, directions, spectrum)
        return self

    def _residual_sigma(self, operator):
        if operator.residual_dof < 1:
            raise _NotEnoughData(
                f"criterion={self.criterion!r} estimates the noise from the residuals and needs "
                "n_samples > rank(X) + 1 (with fit_intercept). Got no residual degrees of freedom."
            )
        self.noise_variance_ = operator.noise_variance()
        return np.sqrt(self.noise_variance_)

    def _threshold_rank(self, moments, operator, s, n_targets):
        """Count the directions that stand above what noise alone reaches (at ``significance``).

        The noise part of the fitted values' Gram is a Wishart matrix with ``rank(X)`` degrees
        of freedom and the noise covariance ``Sigma``, independent of the residuals' (``dof``
        degrees of freedom, same ``Sigma``). Every test is sequential: once ``k`` directions
        are accepted, the next is compared with the edge of the noise left in the remaining
        ``rank(X) - k`` by ``q - k`` dimensions.

        White residuals (John's sphericity test keeps ``sigma^2 I``): the fitted values'
        largest eigenvalue has a Tracy–Widom law around ``sigma^2 (sqrt(rank X) + sqrt(q))^2``
        (Johnstone 2001), an edge widened by the ratio of El Karoui's edge for the shape
        matched to the residuals (:func:`edge_matched_noise_covariance`) to the white one, for
        correlation too mild for the sphericity test. Correlated residuals: two tests, each at
        ``significance``, and the larger rank (a Bonferroni union: a false-positive rate of at
        most ``2 significance``):

        - the fitted values against the residuals: both noises have the covariance ``Sigma``, so the
          ratio of their largest eigenvalues in the directions left is nearly free of it (exactly so
          at ``rank(X) = dof``). The edge is the observed largest residual eigenvalue times the
          ratio's ``1 - significance`` quantile (:func:`null_edge_ratio`, the two Tracy–Widom laws
          of El Karoui 2007), ``Sigma``'s shape in that ratio coming from
          :func:`edge_matched_noise_covariance`. It keeps its power when ``q / dof`` is not small,
          where whitening with the sample covariance costs much, and works for ``dof <= q``;
        - the canonical correlations (the spectrum whitened by the sample noise covariance)
          against the Jacobi ensemble's edge (Johnstone 2008), exact for any ``Sigma`` and
          powerful when the signal lies where the noise is weak; it needs
          ``dof > n_targets``.
        """
        spectrum = s / np.sqrt(moments.n)
        level = 1.0 - self.significance
        dof = operator.residual_dof
        k_x = max(operator.input_rank, 1)
        if dof < 1:
            warnings.warn(
                "No residual degrees of freedom: the noise level is estimated from the median "
                "singular value, which assumes the rank is small.",
                RankEstimationWarning, stacklevel=4)
            cut = optimal_hard_threshold(s, shape=(k_x, n_targets)) if s.size else 0.0
            self.threshold_ = cut / np.sqrt(moments.n)
            return int(np.sum(s > cut)), spectrum
        sigma = self._residual_sigma(operator)
        white = residuals_look_white(operator.residual, dof)
        if white:
            # Sphericity kept does not make the noise exactly white: mild correlation widens
            # the edge. The shape matched to the largest residual eigenvalue says by how much
            # (1 when white noise of the same level explains it).
            shape, _ = edge_matched_noise_covariance(operator.residual, dof)
            white_edge = sigma**2 * null_edge_white(k_x, n_targets, level)
            widening = (max(1.0, null_edge_correlated(shape, k_x, level) / white_edge)
                        if white_edge > 0 else 1.0)

            def edge(k):
                return widening * sigma**2 * null_edge_white(k_x - k, n_targets - k, level)
        else:
            values, vectors = edge_matched_noise_covariance(operator.residual, dof)
            # Noise covariance and residual cross-products in the basis of the output
            # directions: after k accepted directions the noise left is in the trailing
            # (q - k) x (q - k) blocks.
            directions = operator.output_directions
            basis = vectors.T @ directions
            noise = (basis.T * values) @ basis
            residual = directions.T @ operator.residual @ directions

            def edge(k):
                shape = np.linalg.eigvalsh(noise[k:, k:])
                observed = np.linalg.eigvalsh(residual[k:, k:])[-1]
                # A noise spike's eigenvalue fluctuates more than TW1: its own law for the
                # observed one, whose low draws would otherwise pass for signal; El Karoui's
                # law over all eigenvalues (conservative above) for the fitted values.
                fitted_law = largest_eigenvalue_law(shape, k_x - k, detach_spike=False)
                residual_law = largest_eigenvalue_law(shape, dof)
                if observed <= 0 or residual_law.mean <= 0:
                    return 0.0  # no noise left in these directions
                return observed * null_edge_ratio(fitted_law, residual_law, level)
        rank, cut = _sequential_count(s**2, edge)
        if not white:
            whitened = self._canonical_rank(moments, level)
            if whitened is None:
                warnings.warn(
                    "The residuals are not white and fewer residual degrees of freedom than "
                    "targets remain (n_samples <= n_features + n_targets + 1): the noise "
                    "covariance is a shrinkage estimate and the test's level is "
                    "approximate.", RankEstimationWarning, stacklevel=4)
            elif whitened[0] > rank:
                rank, rho, cut = whitened
                self.threshold_ = float(np.sqrt(cut)) if cut is not None else None
                self._spectrum_unit = None  # canonical correlations have no unit
                return rank, rho
        self.threshold_ = float(np.sqrt(cut / moments.n)) if cut is not None else 0.0
        return rank, spectrum

    def _canonical_rank(self, moments, level):
        """Sequential test of the canonical correlations against the Jacobi edge: the rank,
        the correlations and the squared cut; ``None`` where the residual degrees of freedom
        cannot estimate the noise covariance."""
        rho, x_rank, y_rank = canonical_correlations(moments)
        if rho.size == 0 or null_edge_canonical(x_rank, y_rank, moments.dof, level) is None:
            return None

        def edge(k):  # removing k roots leaves k fewer dimensions on each side
            return null_edge_canonical(x_rank - k, y_rank - k, moments.dof - k, level)

        rank, cut = _sequential_count(rho**2, edge)
        return rank, rho, cut

    def _set_common(self, moments, s, rank, directions, spectrum):
        self._operator_spectrum = s
        self.rank_ = int(rank)
        self.mean_ = moments.mean_x.copy()
        self.singular_values_ = spectrum
        energy = s**2
        total = energy.sum()
        self.explained_energy_ = energy / total if total > 0 else np.zeros_like(energy)
        self.components_ = _orthonormal_directions(directions)

    def transform(self, X):
        """Project the centred inputs onto the ``rank_`` input directions.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features) or (n_samples, n_tokens, n_features)

        Returns
        -------
        X_new : ndarray of shape (n_samples, rank) or (n_samples, n_tokens, rank)
        """
        check_is_fitted(self)
        if self._sequences:
            X = check_sequences(X, "X", dtype=[np.float64, np.float32])
            if X.shape[2] != self.n_features_in_:
                raise ValueError(f"X has {X.shape[2]} features per token, but "
                                 f"{type(self).__name__} is expecting {self.n_features_in_}.")
        else:
            X = validate_data(self, X, reset=False, dtype=[np.float64, np.float32])
        return (X - self.mean_) @ self.components_.T

    @property
    def _n_features_out(self):
        return self.components_.shape[0]

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.required = False
        tags.target_tags.multi_output = True
        return tags
