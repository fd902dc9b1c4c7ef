"""Data-only intrinsic rank: read ``r*`` from data before training any model.

The estimator does the plumbing (validation, dask, the power-of-two scaling of the data and
its undoing), chooses the statistics (:mod:`._rank_statistics`), calls one rank rule
(:func:`._rules.read_rank`) and assigns every fitted attribute in one place.
"""

import warnings
from numbers import Real

import numpy as np
from sklearn.base import (
    BaseEstimator,
    ClassNamePrefixFeaturesOutMixin,
    TransformerMixin,
    _fit_context,
)
from sklearn.utils import check_random_state
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_is_fitted, validate_data

from ._attention_operators import check_attention_pattern, check_lengths, own_share_energy
from ._diagnostics import RowKeeper
from ._lack_of_fit import lack_of_fit, lack_of_fit_message, per_token_lack_of_fit
from ._rank_statistics import CV_NEEDS_ALL_DATA, STATISTICS, choose_statistics
from ._rules import NotEnoughData, read_rank
from ._utils.dask import dask_statistics, is_dask_array
from ._utils.validation import (
    check_groups,
    check_same_sequence_shape,
    check_sequence_pair,
    check_sequences,
    refuse_strings,
)
from .exceptions import LackOfFitWarning, RankEstimationWarning

__all__ = ["IntrinsicRankEstimator"]

# Fitted attributes that only some statistics or criteria set.
_OPTIONAL_ATTRIBUTES = ("qk_kernel_", "logit_rms_", "cv_results_", "n_samples_seen_",
                        "noise_model_", "diagnostics_", "p_values_", "rank_interval_",
                        "detection_limit_", "lack_of_fit_")
# Reading attributes that come from a reading's field of the same name.
_READING_ATTRIBUTES = ("noise_model", "diagnostics", "p_values", "rank_interval")
# Attributes read from the solved statistics, set by every fit and partial_fit (removed while
# the chunks seen so far are too few to read a rank).
_READ_ATTRIBUTES = ("rank_", "singular_values_", "threshold_", "noise_variance_", "mean_",
                    "qk_kernel_", "logit_rms_", "cv_results_", "explained_energy_",
                    "components_", "noise_model_", "diagnostics_", "p_values_",
                    "rank_interval_", "detection_limit_")


def _in_data_units(values, unit, scales):
    """Values computed on the scaled data, in the units of the data (``unit`` of a reading)."""
    sx, sy = scales
    if unit == "kernel":  # y = V S Wᵀ x is cubic in x: W carries 1 / s^2 (divided twice:
        return values / sx / sx  # s^2 itself may leave the float64 range)
    return values * {"x": sx, "y": sy, None: 1.0}[unit]


class IntrinsicRankEstimator(ClassNamePrefixFeaturesOutMixin, TransformerMixin, BaseEstimator):
    """Intrinsic rank ``r*`` of a task, read from data before any model is trained.

    For the static surrogate ``Y = X B + E`` the intrinsic rank is ``rank(Sigma_X^{1/2} B)``:
    below it every model keeps an excess risk of at least the tail energy ``T(r)``, at it the
    task is solved. The estimator solves the data's second moments for the least-squares
    operator and reads its rank with a noise-adaptive cut. Without targets ``y`` it reads the
    rank of ``X`` itself.

    For attention the intrinsic rank is attention-native: the rank of the query–key kernel
    ``W = W_Q W_Kᵀ`` with which the attention class realises the task. On sequence data
    ``X (N, n, d) -> Y (N, n, d_out)`` with ``operator="attention"`` the estimator reads it
    from moments of the data, before training:

    - value map known (``value="identity"`` or a matrix): token ``i`` obeys
      ``y_i = V S Wᵀ x_i`` with ``S`` the sequence's second moment, linear in ``W``; least
      squares recovers ``W`` (``qk_kernel_``) and its rank exactly;
    - value map unknown (``value=None``): the per-token channel operator ``y_i ~ V Sigma Wᵀ
      x_i`` of rank ``rank(W)``, exact as ``n`` grows;
    - softmax attention is linearised around uniform weights (centred moments). With a known
      value map the linearised kernel is refined by Gauss–Newton steps on the softmax itself,
      so the kernel is that of the exact model for the tokens at hand (vocabulary embeddings,
      skewed laws), ``logit_rms_`` measures its logits, and near the threshold the noise along
      each singular direction comes from the normal matrix itself (a
      :class:`~sklearn_ebound.exceptions.RankEstimationWarning` says when that decided the
      count, when only the linearisation was fitted and its logits pass 1, when the fit
      stopped before converging, or when the sequences give fewer equations on the kernel,
      ``min(rank V, keys - 1)`` a query, than it has entries: then it is not identified and
      not refined). Without it the
      per-token operator is a linearisation, and a direction of ``W`` that ``V`` annihilates
      is invisible.
    - masks and padding: ``mask="causal"`` (or a 0/1 array) restricts each query to its
      allowed keys, and ``fit(X, y, lengths=...)`` marks the padding of shorter sequences; the
      moments above are then those of each token's allowed keys. Up to ``d = 48`` without a
      mask the kernel's normal matrix is formed (``d^4 / 4`` floats); beyond, a matrix-free
      conjugate-gradient solver keeps the sequences and ``O(d^2)`` floats.

    Parameters
    ----------
    operator : {"auto", "static", "attention"}, default="auto"
        The operator whose rank is read. ``"auto"``: static for 2-D data, attention for 3-D
        sequences. ``"static"``: the linear operator ``Y ~ X B`` of 2-D data (scalar-token
        sequences: the token-mixing matrix); asked for on 3-D data, the naive static transfer,
        one token-mixing matrix ``Y_s ~ M X_s`` for all sequences and channels (its rank does
        not describe attention; kept to show why). ``"attention"``: the rank of the query–key
        kernel of 3-D sequence data.
    attention : {"softmax", "linear"}, default="softmax"
        The attention class, for ``operator="attention"``.
    value : None, "identity" or array-like of shape (n_targets, n_features), default=None
        The value map ``V`` of attention, if known.
    mask : None, "causal" or array-like of shape (n_tokens, n_tokens), default=None
        The attention mask, for ``operator="attention"``: every query attends to every key
        (``None``), to the keys ``j <= i`` (``"causal"``, a decoder), or to the 1 entries of
        its row of a 0/1 array (each row must allow a key). Linear attention averages over the
        allowed keys, the softmax is taken over them. For linear attention also an array of
        non-negative weights, ``m_ij`` the weight of key ``j`` for query ``i`` (0: not a key),
        used as ``mask_normalization`` says. Padded sequences of different lengths are passed
        as ``fit(X, y, lengths=...)``.
    mask_normalization : {None, "mean", "none"}, default=None
        How linear attention uses row ``i`` of the mask: ``"mean"`` averages over the visible
        keys, ``a_ij = m_ij / sum_k m_ik`` (``1 / |K_i|`` for 0/1, ``1 / n`` without a mask);
        ``"none"`` takes the weights as given, ``y_i = sum_j m_ij (x_iᵀ W x_j) V x_j``
        (``mask=np.tril(np.ones((n, n))) / n`` is the unnormalised causal convention ``(1/n)
        sum_{j <= i}`` of in-context-learning theory; ``"causal"`` or ``None`` give plain
        sums). ``None`` is ``"mean"`` for 0/1 masks; weights must state it. For softmax only
        ``None`` or ``"mean"``. The rank does not depend on it, the kernel's scale does.
    logit_bias : None, array-like of shape (n_tokens, n_tokens) or ("alibi", slope), \
            default=None
        For ``attention="softmax"``: a finite bias ``b_ij`` added to every sequence's logits,
        ``softmax(x_iᵀ A x_j + b_ij)`` with ``A`` the kernel times ``beta / sqrt(d)``
        (relative-position tables), or ALiBi's ``b_ij = -slope |i - j|``
        (:func:`~sklearn_ebound.datasets.alibi_bias`; with ``mask="causal"`` the decoders'
        ``-slope (i - j)``). The softmax is then linearised around the bias's own weights.
    criterion : {"threshold", "rsc", "cv", "energy"}, default="threshold"
        How the rank is read from the spectrum:

        - ``"threshold"``: a sequential test of each singular value of the fitted values against the
          largest value the noise in them reaches with probability ``1 - significance``
          (Tracy–Widom edges: Johnstone's for white residuals, John's and the largest root's
          sphericity tests deciding;
          for correlated residuals the larger rank of an edge relative to the residuals' own
          largest eigenvalue, El Karoui's laws, and of the canonical correlations against the
          Jacobi edge). Below 20 residual degrees of freedom the white edge includes the
          spread of the estimated noise level (the edge of their ratio). With too few residual
          degrees of freedom it warns; with none (``rank(X) =
          n_samples - 1``, as with more features than samples) the same sequential test runs
          on the centred targets with the noise level of the Marchenko–Pastur median (each
          step at about ``significance`` while the rank is small beside ``min(n_samples,
          n_targets)``, conservative beyond), and warns; without ``y`` it uses the
          Gavish–Donoho threshold with unknown noise. Where the residual diagnostics reject
          the Gaussian, independent, homoscedastic noise the edges assume, the null is
          resampled instead (``noise_model_``). The user guide's "How the threshold test
          works" and "When the assumptions fail" give the details. It is the default because it
          recovered ``r*`` most reliably: 100% of the test suite's planted grid, and the best
          exact-recovery rate of ``benchmarks/bench_recovery_accuracy.py`` against PCA-mle,
          optht, cross-validated grid search and AIC/BIC.
        - ``"rsc"``: Bunea, She & Wegkamp's rank selection criterion: singular values of the
          fitted values above ``sigma * sqrt(2 (n_targets + rank(X)))``.
        - ``"cv"``: K-fold cross-validation over the reduced-rank path (the machinery of
          :class:`ReducedRankRegressorCV`), smallest rank within one standard error of the best.
        - ``"energy"``: energy rank of the fitted values' spectrum at level ``tau``; a
          descriptor, not noise-adaptive.

        For attention, ``"threshold"`` is the Gavish–Donoho threshold of the noise-whitened
        kernel (value map known) or the sequential test on the per-token operator (unknown).
        Where the model is approximate (softmax, or an unknown value map at finite ``n``) its
        error is systematic, so of the directions that pass only those holding a fraction
        ``tau`` of their energy count.

        Which criteria can read which statistics (an error names the others):

        - 2-D ``X`` alone: ``"threshold"``, ``"energy"``
        - 2-D ``X`` and ``y``: ``"threshold"``, ``"rsc"``, ``"cv"``, ``"energy"``
        - sequences, ``operator='static'``: ``"threshold"``, ``"rsc"``, ``"energy"``
        - sequences, ``operator='auto'`` or ``'attention'``, ``value=None``: ``"threshold"``,
          ``"rsc"``, ``"energy"``
        - sequences, ``operator='auto'`` or ``'attention'``, known ``value``: ``"threshold"``,
          ``"energy"``

    significance : float, default=1e-3
        False-positive rate of each sequential test of ``criterion="threshold"``, in
        ``[1e-12, 0.5)`` (with correlated residuals the two tests' union has at most twice it).
        Smaller values guard better against reading noise as rank, larger ones find weaker
        directions (``benchmarks/bench_recovery_accuracy.py`` measures both). The Gavish–Donoho
        thresholds (no residual degrees of freedom, no ``y``, a known value map) ignore it.
    interval_strength : float, default=2.0
        The strength, in multiples of ``detection_limit_``, of the directions that
        ``rank_interval_``'s upper end counts: it is the number of directions that could be at
        least that strong. Weaker ones may hide beyond it (nothing can show those below the
        detection limit); near or below 1 the end counts directions of any strength, as the
        sequential test's own top does (a few noise values wide).
    tau : float, default=0.99
        Energy fraction for ``criterion="energy"``, in ``(0, 1]``.
    cv : int, cross-validation generator or iterable, default=5
        Folds for ``criterion="cv"``.
    fit_intercept : bool, default=True
        Centre the data first.
    random_state : int, RandomState instance or None, default=None
        Seed of the resampled null (the bootstrap of ``criterion="threshold"`` where the
        residual diagnostics fail); clean Gaussian data draw nothing. With ``None`` a switched
        reading's p-values (rarely its rank) vary from fit to fit; pass an int to repeat them.
    lack_of_fit : bool, default=True
        For attention, test after :meth:`fit` whether the fitted attention model explains
        the data: whether its residuals are still explained by the inputs (by the values'
        mean over the visible keys, which softmax outputs carry and linear attention's do
        not, and with a mask or padding by a gain that grows with the visible keys, as
        ``1 / n_tokens`` weighting has). With a known value map the kernel's residuals are
        tested; with an unknown one those of the per-token operator (against the mean of the
        other keys, ``V`` being unknown). Where that test rejects at level 1e-5, the other
        attention models are fitted on half of the sequences and compared on the other half,
        and a :class:`~sklearn_ebound.exceptions.LackOfFitWarning` names the misfit and what
        fits better (for the per-token reading, only where one fits materially better: its
        operator is exact only as ``n_tokens`` grows); ``lack_of_fit_`` holds the numbers.
        Data of the model asked for pass (and the test costs a few percent of the fit);
        ``False`` skips it. :meth:`partial_fit` and dask arrays never run it.

    Attributes
    ----------
    rank_ : int
        The estimated intrinsic rank.
    singular_values_ : ndarray
        The spectrum the rank was read from: the canonical correlations where the
        ``"threshold"`` test on them gave the rank, otherwise the singular values of the fitted
        values (of ``X`` without ``y``) divided by ``sqrt(n_samples)``.
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
        Root-mean-square of the fitted attention logits ``x_iᵀ W x_j`` (times ``beta /
        sqrt(d)`` for softmax) over independent tokens of the data's second moment.
    explained_energy_ : ndarray
        Fraction of the operator's energy (squared singular values) carried by each component.
    cv_results_ : dict, only for ``criterion="cv"``
        ``"rank"`` and ``"mean_test_score"``/``"std_test_score"`` (negative mean squared error).
    noise_model_ : str, only for ``criterion="threshold"`` with residual degrees of freedom
        How the sequential test was calibrated: ``"gaussian"`` (the Tracy–Widom edges), or,
        where the residual diagnostics reject what they assume, a resampled null:
        ``"wild-bootstrap"`` (input-dependent variance, heavy tails: one Rademacher sign per
        row), ``"group-bootstrap"`` (dependence within the groups: one normal multiplier per group),
        ``"block-bootstrap"`` (dependence along the rows: an AR(1) prewhitening of the rows,
        then one normal multiplier per block of contiguous rows spanning the dependence the filter
        leaves). A
        :class:`~sklearn_ebound.exceptions.RankEstimationWarning` names the failed assumption
        and the path taken. The user guide's "When the assumptions fail" gives the details.
    diagnostics_ : dict, only for 2-D statistics with ``criterion="threshold"``
        The residual diagnostics: for ``"heteroscedasticity"`` (Koenker's Breusch–Pagan test
        on the inputs and their squares), ``"serial_dependence"`` (Ljung–Box),
        ``"group_dependence"`` (analysis of variance across ``groups``) and ``"heavy_tails"``
        (D'Agostino's kurtosis test) a dict with ``"statistic"`` and ``"p_value"``;
        ``"failed"`` the rejected ones, each at ``level / 4`` (``level`` = 1e-5: clean Gaussian
        data switch with at most that probability); ``"n_rows"`` the rows tested (the first
        1,024). Where input-dependent variance or heavy tails failed, or either's p-value is
        at most ``significance`` (not by construction of the rows), ``"influential_directions"``
        holds the check of the accepted directions for being carried by a handful of rows that
        the other rows contradict (outliers that are leverage points): per direction its
        ``"participation"`` (about how many rows carry it), ``"concentration_p_values"`` and
        ``"deletion_p_values"``, and ``"flagged"`` (indices from 0 of the directions both
        tests reject at ``significance``), named in a warning; where more than one direction
        is accepted and none is flagged, ``"combination"``: the same tests on their most
        concentrated combination, and where its concentration alone does not decide, an
        anisotropy test of its rows' residual directions (``"anisotropy_p_value"``,
        ``"excess_share"``).
    p_values_ : ndarray, only where ``noise_model_`` is set
        P-value of each tested direction: entry ``k`` tests direction ``k + 1`` once ``k``
        are accepted (``rank_`` is the number of leading p-values at most ``significance``).
        The tests run past ``rank_`` up to the first direction too weak to be one (the end
        of ``rank_interval_``).
    rank_interval_ : tuple of int, only where ``noise_model_`` is set
        ``(low, high)``, inclusive: the ranks consistent with the data among directions at least
        ``interval_strength`` times ``detection_limit_`` (at least ``low`` directions are real,
        at most ``high`` are that strong; weaker ones may hide above ``high``). ``low = rank_``,
        less the accepted directions (or the one combination of them) flagged as carried by a
        handful of contradicting rows (``diagnostics_["influential_directions"]``: the rank may
        count outliers that are leverage points, and is left as read). ``high`` counts the
        leading directions up to the first whose sample value is too small, at level about
        0.025, for one of that strength, equal directions' mutual repulsion allowed for (the
        user guide's "How sure the rank is"), and at most the sequential test's own top (the
        directions whose value noise alone would not exceed in ``1 - significance`` of draws;
        below 20 residual degrees of freedom, those above the centre of the noise's edge at the
        smallest noise level the residuals allow): where the planted directions are 0 or at
        least that strong the interval holds their number in at least ``1 - 2 significance -
        0.025`` of draws. On canonical correlations ``high`` is the sequential test's top. Where
        the energy cap of an approximate attention model set the rank (below what the noise test
        passed), ``(rank_, rank_)``.
    detection_limit_ : float, only where ``noise_model_`` is set
        The smallest population singular value, in the units of ``singular_values_``, that
        this ``n_samples``, ``rank(X)``, ``n_targets`` and noise level can detect at all: the
        phase transition ``sigma (rank(X) q)^{1/4} / sqrt(n)`` (Baik, Ben Arous & Péché 2005),
        ``sigma^2`` the noise variance per entry (resampled, for a resampled null). A direction
        weaker than it is invisible here whatever the level; for canonical correlations, the
        correlation below which a direction sinks into the noise (Bao et al. 2019). It is the
        asymptotic edge, not a level's: a test at ``significance`` needs somewhat more at
        finite size (with ``rank(X) = 20, q = 60``, four equal directions at 2.1 times the
        limit are all found in 90% of draws at 1e-3 even with the noise level known), and
        with few residual degrees of freedom ``sigma`` is itself estimated, to a relative
        error of about ``1 / sqrt(2 dof q)``.
    lack_of_fit_ : dict, only for attention after :meth:`fit` with ``lack_of_fit``
        The lack-of-fit test of the fitted attention model: ``"reading"`` (``"kernel"``
        with a known value map, ``"per-token"`` without), ``"statistic"`` (Hotelling's
        ``F`` of the per-sequence scores of the residuals on the ``"terms"``), ``"df"``,
        ``"p_value"``, ``"level"`` (1e-5), ``"failed"`` (warned; for the per-token reading
        also ``"rejected"``, the test alone, ``"failed"`` needing ``"better"`` besides),
        ``"model"`` (the one fitted:
        ``"linear"`` or ``"softmax"``) and ``"better"`` (``None``, or the model that fits
        significantly better on held-out sequences: ``"linear"``, ``"softmax"`` or
        ``"linear-1/n"``, linear attention weighted ``1 / n_tokens`` instead of averaged over
        the visible keys); where the test failed, ``"held_out"`` (each model's held-out mean
        squared error per token, cross-fitted on the two halves of the sequences) and
        ``"held_out_p_values"`` (the one-sided paired tests of each alternative against the
        model fitted; per-token: the per-token models, errors of the rows weighted by
        ``sqrt(|K_i| / n)``). The user guide's "Data that are not the attention model asked for"
        explains it.
    mean_ : ndarray of shape (n_features,)
    n_features_in_ : int
    feature_names_in_ : ndarray of str

    See Also
    --------
    ReducedRankRegressor : The rank-``r`` model whose risk the intrinsic rank bounds.
    threshold_rank, energy_rank : The spectral rules on their own.

    References
    ----------
    Johnstone (2001, 2008), El Karoui (2007), Baik, Ben Arous & Péché (2005), Bai & Yao (2008),
    Chiani (2014), Gavish & Donoho (2014), Bunea, She & Wegkamp (2011); the user guide's "How the
    threshold test works" lists them in full.

    Examples
    --------
    >>> from sklearn_ebound import IntrinsicRankEstimator
    >>> from sklearn_ebound.datasets import make_static_task
    >>> X, Y = make_static_task(2000, 20, rank=4, noise=0.5, random_state=0)
    >>> IntrinsicRankEstimator().fit(X, Y).rank_
    4
    """

    _parameter_constraints = {
        "operator": [StrOptions({"auto", "static", "attention"})],
        "attention": [StrOptions({"softmax", "linear"})],
        "value": [None, StrOptions({"identity"}), "array-like"],
        "mask": [None, StrOptions({"causal"}), "array-like"],
        "mask_normalization": [None, StrOptions({"mean", "none"})],
        "logit_bias": [None, "array-like"],
        "criterion": [StrOptions({"threshold", "rsc", "cv", "energy"})],
        # Below 1e-12 the level 1 - significance is no longer resolved in float64.
        "significance": [Interval(Real, 1e-12, 0.5, closed="left")],
        "interval_strength": [Interval(Real, 0, None, closed="left")],
        "tau": [Interval(Real, 0, 1, closed="right")],
        "cv": ["cv_object"],
        "fit_intercept": ["boolean"],
        "random_state": ["random_state"],
        "lack_of_fit": ["boolean"],
    }

    def __init__(self, operator="auto", *, attention="softmax", value=None, mask=None,
                 mask_normalization=None, logit_bias=None, criterion="threshold",
                 significance=1e-3, interval_strength=2.0, tau=0.99, cv=5, fit_intercept=True,
                 random_state=None, lack_of_fit=True):
        self.operator = operator
        self.attention = attention
        self.value = value
        self.mask = mask
        self.mask_normalization = mask_normalization
        self.logit_bias = logit_bias
        self.criterion = criterion
        self.significance = significance
        self.interval_strength = interval_strength
        self.tau = tau
        self.cv = cv
        self.fit_intercept = fit_intercept
        self.random_state = random_state
        self.lack_of_fit = lack_of_fit

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y=None, groups=None, lengths=None):
        """Estimate the intrinsic rank.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features) or (n_samples, n_tokens, n_features)
            Also a dask array: its moments are reduced block by block on any dask scheduler.
        y : array-like of shape (n_samples, n_targets) or (n_samples, n_tokens, n_targets), \
                default=None
            Targets; without them the rank of ``X`` itself is read (2-D data only).
        groups : array-like of shape (n_samples,), default=None
            Group labels of the samples (subjects, sessions, documents), as scikit-learn's
            group splitters take them: rows of one group may be dependent, rows of different
            groups are not. The residual diagnostics test the dependence within them, the
            resampled null keeps it (``noise_model_="group-bootstrap"``) and
            ``criterion="cv"`` splits by them (:class:`~sklearn.model_selection.GroupKFold`
            for an integer ``cv``). The tokens of 3-D sequences are grouped by sequence
            without it; with it, by the sequences' groups.
        lengths : array-like of shape (n_samples,), default=None
            For padded sequences (attention only): sequence ``s`` holds ``lengths[s]`` tokens
            followed by padding, which is neither query nor key and whose values are ignored.

        Returns
        -------
        self : object
        """
        self._reset()
        if is_dask_array(X):
            if lengths is not None:
                raise ValueError("`lengths` is not supported with dask arrays.")
            if self.criterion == "cv":
                raise ValueError(f"{CV_NEEDS_ALL_DATA}; with dask arrays use 'threshold', "
                                 "'rsc' or 'energy'.")
            self._accumulate_dask(X, y, groups)
            return self._read()
        groups = self._accumulate(X, y, min_samples=2, groups=groups, lengths=lengths)
        if self.criterion == "cv":
            return self._read(cv_data=(*self._cv_data(X, y), groups))
        self._read()
        if self._kind.attention and self.lack_of_fit:
            self._check_lack_of_fit(X, y, lengths)
        return self

    def partial_fit(self, X=None, y=None, groups=None, lengths=None, *, solve=True):
        """Add a chunk of data and read the rank from everything seen so far.

        The accumulated moments equal those of one :meth:`fit` on all the chunks (to rounding),
        in memory independent of the number of samples (the attention kernel's matrix-free
        solver and the softmax fit keep the sequences themselves). Every call solves them and
        sets the fitted attributes (and emits that reading's warnings), as :meth:`fit` does: each
        call pays one solve, so chunks should be large, or all but the last added with
        ``solve=False`` (then ``partial_fit()`` without data reads the rank, as
        :class:`~sklearn.cluster.Birch` does). Until the chunks hold enough samples to read a
        rank (two, more for ``criterion="rsc"``), ``rank_`` is not set.
        ``criterion="cv"`` needs all the data at once and is not available.

        The residual diagnostics and the resampled null need rows, which moments do not keep:
        the first 20,000 rows (tokens, for sequences) are kept for them, in the order they
        came. Their residuals are those of the operator of all the chunks, and a resampled
        null is rescaled to all the rows; dependence along the rows is then resampled in
        blocks without the prewhitening that :meth:`fit` applies. The same holds for dask
        arrays in :meth:`fit`, with the rows of the first block.

        Parameters
        ----------
        X, y : array-like, default=None
            As in :meth:`fit`; every chunk must have the same number of features (and tokens).
            ``X=None`` adds nothing and reads the rank of the chunks added so far.
        groups : array-like of shape (n_samples,), default=None
            As in :meth:`fit`; a label means the same group in every chunk.
        lengths : array-like of shape (n_samples,), default=None
            As in :meth:`fit`.
        solve : bool, default=True
            Read the rank after adding the chunk. With ``False`` the chunk is only accumulated
            and the attributes of an earlier reading are removed, since they no longer describe
            the chunks seen.

        Returns
        -------
        self : object
        """
        if X is None:
            if getattr(self, "_statistics", None) is None:
                raise ValueError("partial_fit() without data reads the chunks added so far; "
                                 "none were added. Pass X (and y).")
            self._read(stacklevel=3)
            return self
        if getattr(self, "_statistics", None) is None:
            self._validate_params()
            self._reset()
        if self.criterion == "cv":
            raise ValueError(f"{CV_NEEDS_ALL_DATA}; use fit, or another criterion with "
                             "partial_fit.")
        self._accumulate(X, y, min_samples=1, groups=groups, lengths=lengths)
        stats = self._statistics
        self.n_samples_seen_ = self._kind.n_seen(stats)
        for name in (*_READ_ATTRIBUTES, "lack_of_fit_"):  # a fit's check, not of the chunks
            self.__dict__.pop(name, None)
        if not solve:
            return self
        try:
            self._read(stacklevel=3)
        except NotEnoughData:
            pass  # not fitted to a rank yet: the next chunks may give enough samples
        return self

    def transform(self, X):
        """Project the centred inputs onto the ``rank_`` input directions.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features) or (n_samples, n_tokens, n_features)

        Returns
        -------
        X_new : ndarray of shape (n_samples, rank) or (n_samples, n_tokens, rank)
            Of ``X``'s dtype for float32 and float64 input.
        """
        check_is_fitted(self)
        if self._sequences:
            X = check_sequences(X, "X", [np.float64, np.float32], self.n_features_in_, self)
        else:
            X = validate_data(self, refuse_strings(X), reset=False,
                              dtype=[np.float64, np.float32])
        # float32 in, float32 out: X_new = (X - mean) C^T in the input's precision.
        return (X - self.mean_.astype(X.dtype)) @ self.components_.T.astype(X.dtype)

    def fit_transform(self, X, y=None):
        """Fit, then project ``X`` (see :meth:`transform`); warns where the rank is 0."""
        X_new = self.fit(X, y).transform(X)
        if self.rank_ == 0:
            warnings.warn(f"The intrinsic rank is 0: no direction stands above the noise, so the "
                          f"projection has no column (shape {X_new.shape}); a next step that "
                          "needs features will reject it.", RankEstimationWarning, stacklevel=2)
        return X_new

    @property
    def _n_features_out(self):
        return self.components_.shape[0]

    # --- input plumbing: validation, dask, scaling ----------------------------------------

    def _accumulate(self, X, y, min_samples, groups=None, lengths=None):
        """Add a chunk to the statistics (and its rows to the kept ones); returns the chunk's
        validated ``groups``."""
        first = self._statistics is None
        if first:
            self._fit_mode = choose_statistics(X, y, self.operator, self.value, self.criterion)
        elif (y is None) == self._kind.targets:
            raise ValueError("Every chunk must come with targets `y`, or none of them.")
        kind = self._kind
        if not kind.attention and (self.mask is not None or lengths is not None
                                   or self.mask_normalization is not None
                                   or self.logit_bias is not None):
            raise ValueError("`mask`, `mask_normalization`, `logit_bias` and `lengths` describe "
                             "the attention of sequence data and apply only to "
                             "operator='attention' (or 'auto' on 3-D data).")
        X2, Y2 = self._validate_chunk(X, y, first, min_samples)
        if kind.attention:
            # a clear error before any work
            check_attention_pattern(self.mask, X2.shape[1], self.attention,
                                    self.mask_normalization, self.logit_bias)
            lengths = check_lengths(lengths, X2.shape[0], X2.shape[1])
        groups = check_groups(groups, X2.shape[0])
        if first:
            self._statistics, self._scales = kind.new(
                X2, Y2, self.attention, self.value, self.fit_intercept, **self._pattern_params())
        if kind.kernel:
            self._statistics.update(X2, Y2, lengths)
        else:
            rows = kind.rows(X2, Y2, self.attention, lengths=lengths, **self._pattern_params())
            self._keep_rows(X2, rows, groups, lengths)
            self._statistics.update(*rows)
        self._samples_seen += X2.shape[0]
        return groups

    @property
    def _kind(self):
        """The kind of statistics fitted (:data:`._rank_statistics.STATISTICS`, a strategy)."""
        return STATISTICS[self._fit_mode]

    def _pattern_params(self):
        """The attention pattern's parameters, as the statistics take them."""
        return dict(mask=self.mask, mask_normalization=self.mask_normalization,
                    logit_bias=self.logit_bias)

    def _keep_rows(self, X2, rows, groups, lengths=None):
        """Keep the rows of the 2-D statistics (and their groups) for the diagnostics."""
        if not self._kind.diagnosed or self.criterion != "threshold":
            return
        # Sequences of earlier chunks are labelled from the number of samples seen so far.
        self._rows.add(*rows, self._kind.row_groups(X2, groups, self._samples_seen, lengths))

    def _reset(self):
        self._statistics = None
        self._rows = RowKeeper()
        self._samples_seen = 0
        for name in _READ_ATTRIBUTES:
            self.__dict__.pop(name, None)
        for name in _OPTIONAL_ATTRIBUTES:  # set by some statistics or criteria only
            self.__dict__.pop(name, None)

    def _validate_chunk(self, X, y, reset, min_samples=1):
        if not self._kind.sequences:
            return self._validate_2d(X, y, reset, min_samples)
        return self._validate_sequences(X, y, reset)

    def _validate_2d(self, X, y, reset, min_samples):
        self._sequences = False
        X = refuse_strings(X)
        if y is None:
            X = validate_data(self, X, reset=reset, ensure_min_samples=min_samples,
                              dtype=np.float64)
            return X, np.zeros((X.shape[0], 0))
        X, Y = validate_data(self, X, y, reset=reset, multi_output=True, y_numeric=True,
                             ensure_min_samples=min_samples, dtype=np.float64)
        Y = Y if Y.ndim == 2 else Y[:, None]
        if not reset and Y.shape[1] != self._n_targets:
            raise ValueError(f"y has {Y.shape[1]} targets, but {type(self).__name__} was fitted "
                             f"with {self._n_targets}.")
        self._n_targets = Y.shape[1]
        return X, Y

    def _validate_sequences(self, X, y, reset):
        self._sequences = True
        X, Y = check_sequence_pair(X, y)
        if reset:
            self.n_features_in_ = X.shape[2]
            self._sequence_shape = (X.shape[1], Y.shape[2])
        else:
            check_same_sequence_shape(X, Y, self.n_features_in_, *self._sequence_shape)
        return X, Y

    def _accumulate_dask(self, X, y, groups):
        """Statistics of dask arrays: one task per block of samples, merged as a tree."""
        self._fit_mode = choose_statistics(X, y, self.operator, self.value, self.criterion)
        kind, attention, pattern = self._kind, self.attention, self._pattern_params()
        groups = check_groups(groups, X.shape[0])

        def start(first_x, first_y):  # validates and sizes from the first block
            X2, Y2 = self._validate_chunk(first_x, first_y, True)
            statistics, self._scales = kind.new(
                X2, Y2, attention, self.value, self.fit_intercept, **pattern)
            # The first block's rows are kept for the diagnostics (the rest stay on workers).
            self._keep_rows(X2, kind.rows(X2, Y2, attention, **pattern),
                            None if groups is None else groups[: X2.shape[0]])
            return statistics

        def add(statistics, xb, yb):
            return statistics.update(*kind.rows(
                *self._validate_chunk(xb, yb, False), attention, **pattern))

        self._statistics = dask_statistics(X, y, start, add)
        if X.shape[0] < 2:
            raise ValueError(f"Found array with {X.shape[0]} sample(s) while a minimum of 2 is "
                             "required.")

    def _cv_data(self, X, y):
        # criterion="cv" reads 2-D data only (the table): the rows are the samples.
        X2, Y2 = self._validate_2d(X, y, reset=False, min_samples=2)
        return X2 / self._scales[0], Y2 / self._scales[1]

    def _check_lack_of_fit(self, X, y, lengths):
        """Test the fitted attention model's residuals (:mod:`._lack_of_fit`), on the data
        scaled as the kernel was fitted; warn where it fails."""
        X, Y = np.asarray(X, dtype=np.float64), np.asarray(y, dtype=np.float64)  # validated
        lengths = check_lengths(lengths, X.shape[0], X.shape[1])
        if not self._kind.kernel:  # the per-token operator of the statistics, at their scales
            self.lack_of_fit_ = result = per_token_lack_of_fit(
                X, Y, self.attention, self.mask, lengths,
                mask_normalization=self.mask_normalization, logit_bias=self.logit_bias,
                fit_intercept=self.fit_intercept, moments=self._statistics)
            if result["failed"]:
                warnings.warn(lack_of_fit_message(result), LackOfFitWarning, stacklevel=4)
            return
        # Extreme data are tested scaled by the power of two they were fitted at (exact), so
        # that the cubic and quartic products stay finite; the others as they are, uncopied.
        scale = self._scales[0]  # one power of two for X and Y (a known value map)
        if 2.0**-60 <= scale <= 2.0**60:
            scale = 1.0
        with np.errstate(over="ignore"):
            kernel = self.qk_kernel_ * scale * scale
        if not np.all(np.isfinite(kernel)):
            return
        if scale != 1.0:
            X, Y = X / scale, Y / scale
        self.lack_of_fit_ = result = lack_of_fit(
            X, Y, kernel, self._statistics.V, self.attention, self.mask, lengths,
            mask_normalization=self.mask_normalization, logit_bias=self.logit_bias)
        if "held_out" in result and scale != 1.0:  # squared errors, in the units of the data
            with np.errstate(over="ignore"):
                result["held_out"] = {m: e * scale * scale for m, e in result["held_out"].items()}
        if self.lack_of_fit_["failed"]:
            warnings.warn(lack_of_fit_message(self.lack_of_fit_), LackOfFitWarning,
                          stacklevel=4)

    # --- reading the rank --------------------------------------------------------------------

    def _read(self, cv_data=None, stacklevel=4):
        """Read the rank by the criterion's rule and set every fitted attribute from it
        (``stacklevel``: of the warnings, the user's call of fit or partial_fit)."""
        n_rows = getattr(self._statistics, "n", 0)
        reading, s, components, mean, kernel = read_rank(
            self._kind, self._statistics, self.criterion, significance=self.significance,
            interval_strength=self.interval_strength, tau=self.tau, attention=self.attention,
            cv=self.cv, cv_data=cv_data, fit_intercept=self.fit_intercept,
            n_tokens=self._sequence_shape[0] if self._sequences else None,
            own_energy=self._own_share_energy(),
            sample=self._rows.sample(n_rows), rng=check_random_state(self.random_state))
        self._set_fitted_attributes(reading, s, components, mean, kernel)
        for caveat in filter(None, [*reading.caveats, self._overflow_caveat()]):
            warnings.warn(caveat, RankEstimationWarning, stacklevel=stacklevel)
        return self

    def _own_share_energy(self):
        """The per-token reading's systematic energy under the attention pattern (``None``
        without a mask, weights or bias: then ``2 / n^2``)."""
        if (not self._kind.attention or self._kind.kernel
                or (self.mask is None and self.logit_bias is None)):
            return None
        pattern = check_attention_pattern(self.mask, self._sequence_shape[0], self.attention,
                                          self.mask_normalization, self.logit_bias)
        return own_share_energy(pattern, self._sequence_shape[0])

    def _set_fitted_attributes(self, reading, s, components, mean, kernel):
        """Every fitted attribute, in the units of the data (the rank does not change)."""
        scales, sy = self._scales, self._scales[1]
        with np.errstate(over="ignore", invalid="ignore"):
            self.rank_ = int(reading.rank)
            self.singular_values_ = _in_data_units(reading.singular_values, reading.unit, scales)
            self.threshold_ = (None if reading.threshold is None
                               else _in_data_units(reading.threshold, reading.unit, scales))
            self.noise_variance_ = (None if reading.noise_variance is None
                                    else reading.noise_variance * sy * sy)  # may overflow
            self.mean_ = mean * scales[0]
            if kernel is not None:
                self.qk_kernel_ = _in_data_units(kernel.kernel, "kernel", scales)
                self.logit_rms_ = kernel.logit_rms
            for name in _READING_ATTRIBUTES:
                if getattr(reading, name) is not None:
                    setattr(self, f"{name}_", getattr(reading, name))
            if reading.detection_limit is not None:
                self.detection_limit_ = float(
                    _in_data_units(reading.detection_limit, reading.unit, scales))
            if reading.cv_results is not None:
                self.cv_results_ = {
                    "rank": reading.cv_results["rank"],
                    **{key: reading.cv_results[key] * sy * sy
                       for key in ("mean_test_score", "std_test_score")}}
        energy = s**2
        total = energy.sum()
        self.explained_energy_ = energy / total if total > 0 else np.zeros_like(energy)
        self.components_ = components

    def _overflow_caveat(self):
        values = [self.singular_values_, self.mean_, self.threshold_, self.noise_variance_,
                  getattr(self, "qk_kernel_", None)]
        if not all(np.all(np.isfinite(v)) for v in values if v is not None):
            return ("Some fitted values (spectrum, noise variance or means) exceed the float64 "
                    "range in the units of the data and are infinite; the rank itself was read on "
                    "scaled data and is unaffected.")
        return None

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.required = False
        tags.target_tags.multi_output = True
        tags.transformer_tags.preserves_dtype = ["float64", "float32"]
        return tags
