"""Display of a spectrum of singular values with the ranks read from it."""

import numpy as np
from sklearn.utils.validation import check_is_fitted

from .._spectrum import energy_rank, entropy_rank, optimal_hard_threshold
from ._matplotlib import import_pyplot, new_axes

__all__ = ["SpectrumDisplay"]


class SpectrumDisplay:
    """Singular values with the energy rank, the entropy rank and the threshold marked.

    The ``k``-th singular value is drawn at ``x = k`` (1-based), on a logarithmic axis by
    default, so that the noise values, the threshold and the detection limit stand apart. A
    vertical line at ``x = r`` passes through the last value a rank ``r`` keeps: one for the
    energy rank at level ``tau``, one for the entropy effective rank (a real number) and,
    where a threshold is known, one for the threshold rank, with the threshold itself as a
    horizontal line. The energy rank is the estimator of the intrinsic rank; the entropy rank
    drifts upwards when small singular values are inflated, as softmax does.
    :meth:`from_estimator` draws only the rank the estimator chose (``rank_lines="chosen"``).

    Create it with :meth:`from_estimator` or :meth:`from_spectrum`; all parameters are stored
    as attributes.

    Parameters
    ----------
    singular_values : array-like of shape (n_values,)
        The spectrum, drawn largest first.
    energy_rank : int, default=None
        Energy rank at level ``tau``.
    entropy_rank : float, default=None
        Entropy effective rank (Roy & Vetterli).
    threshold : float, default=None
        Cut on the singular values.
    threshold_rank : int, default=None
        Number of singular values above ``threshold``.
    tau : float, default=0.99
        Energy level of ``energy_rank``, quoted in the legend.
    name : str, default=None
        Legend label of the spectrum.
    rank_interval : tuple of int, default=None
        ``(low, high)``, the ranks consistent with the data among directions of the stated
        strength (``rank_interval_``), shaded between ``x = low`` and ``x = high``.
    detection_limit : float, default=None
        The smallest population singular value the data can show (``detection_limit_``), as a
        horizontal line: a direction weaker than it is invisible.

    Attributes
    ----------
    line_ : matplotlib Line2D
        The spectrum.
    energy_rank_line_ : matplotlib Line2D or None
        Vertical line at the energy rank.
    entropy_rank_line_ : matplotlib Line2D or None
        Vertical line at the entropy rank.
    threshold_line_ : matplotlib Line2D or None
        Horizontal line at the threshold.
    threshold_rank_line_ : matplotlib Line2D or None
        Vertical line at the threshold rank.
    rank_interval_span_ : matplotlib patch or None
        Shaded span of the rank interval (where it holds more than one rank).
    detection_limit_line_ : matplotlib Line2D or None
        Horizontal line at the detection limit.
    ax_ : matplotlib Axes
        Axes with the spectrum.
    figure_ : matplotlib Figure
        Figure containing the spectrum.

    See Also
    --------
    sklearn_ebound.energy_rank, sklearn_ebound.entropy_rank : The ranks marked.
    sklearn_ebound.optimal_hard_threshold : The default threshold of :meth:`from_spectrum`.

    Examples
    --------
    >>> import matplotlib.pyplot as plt
    >>> from sklearn_ebound import IntrinsicRankEstimator
    >>> from sklearn_ebound.datasets import make_static_task
    >>> from sklearn_ebound.display import SpectrumDisplay
    >>> X, Y = make_static_task(1000, 10, rank=3, noise=0.5, random_state=0)
    >>> estimator = IntrinsicRankEstimator().fit(X, Y)
    >>> display = SpectrumDisplay.from_estimator(estimator)
    >>> display.threshold_rank == estimator.rank_
    True
    >>> plt.close("all")
    """

    def __init__(self, *, singular_values, energy_rank=None, entropy_rank=None, threshold=None,
                 threshold_rank=None, tau=0.99, name=None, rank_interval=None,
                 detection_limit=None):
        self.singular_values = singular_values
        self.rank_interval = rank_interval
        self.detection_limit = detection_limit
        self.energy_rank = energy_rank
        self.entropy_rank = entropy_rank
        self.threshold = threshold
        self.threshold_rank = threshold_rank
        self.tau = tau
        self.name = name

    def plot(self, ax=None, *, name=None, log_scale=True, line_kw=None, rank_lines="all"):
        """Draw the spectrum and its ranks.

        Parameters
        ----------
        ax : matplotlib Axes, default=None
            Axes to draw on; ``None`` creates a new figure.
        name : str, default=None
            Legend label of the spectrum; ``None`` uses the ``name`` attribute.
        log_scale : bool, default=True
            Logarithmic y axis (zero singular values are then not drawn).
        line_kw : dict, default=None
            Keyword arguments of :meth:`matplotlib.axes.Axes.plot` for the spectrum.
        rank_lines : {"all", "chosen"}, default="all"
            ``"all"`` marks the energy, entropy and threshold ranks; ``"chosen"`` only the
            rank read (the threshold rank, or the energy rank where no threshold is known),
            labelled ``r*``.

        Returns
        -------
        display : SpectrumDisplay
            Object that stores the computed values and the matplotlib handles.
        """
        if rank_lines not in ("all", "chosen"):
            raise ValueError(f'`rank_lines` must be "all" or "chosen". Got {rank_lines!r} '
                             "instead.")
        self.figure_, self.ax_ = new_axes(ax, f"{type(self).__name__}.plot")
        ax = self.ax_
        s = np.sort(np.asarray(self.singular_values, dtype=float))[::-1]
        index = np.arange(1, s.size + 1)
        name = self.name if name is None else name
        (self.line_,) = ax.plot(index, s, **{"marker": "o", "label": name or "singular values",
                                             **(line_kw or {})})
        self.energy_rank_line_ = self.entropy_rank_line_ = None
        self.threshold_line_ = self.threshold_rank_line_ = None
        chosen = rank_lines == "chosen"
        # Only the rank read: the threshold's where it is known, else the energy rank.
        chosen_energy = chosen and (self.threshold is None or self.threshold_rank is None)
        if self.energy_rank is not None and (not chosen or chosen_energy):
            self.energy_rank_line_ = ax.axvline(
                self.energy_rank, color="tab:green", linestyle="--",
                label=(f"r* = {self.energy_rank} (energy, tau={self.tau:g})" if chosen else
                       f"energy rank (tau={self.tau:g}) = {self.energy_rank}"))
        if self.entropy_rank is not None and not chosen:
            self.entropy_rank_line_ = ax.axvline(
                self.entropy_rank, color="tab:purple", linestyle=":",
                label=f"entropy rank = {self.entropy_rank:.2f}")
        if self.threshold is not None:
            self.threshold_line_ = ax.axhline(
                self.threshold, color="tab:red", linestyle="-.", linewidth=1,
                label=f"threshold = {self.threshold:.3g}")
            if self.threshold_rank is not None:
                self.threshold_rank_line_ = ax.axvline(
                    self.threshold_rank, color="tab:red", linestyle="--",
                    label=(f"r* = {self.threshold_rank}" if chosen
                           else f"threshold rank = {self.threshold_rank}"))
        self.rank_interval_span_ = self.detection_limit_line_ = None
        if self.rank_interval is not None:
            low, high = (int(v) for v in self.rank_interval)
            if high > low:
                self.rank_interval_span_ = ax.axvspan(
                    low, high, color="tab:red", alpha=0.12,
                    label=f"ranks consistent with the data = {low}..{high}")
        if self.detection_limit is not None:
            self.detection_limit_line_ = ax.axhline(
                self.detection_limit, color="tab:gray", linestyle=":", linewidth=1,
                label=f"detection limit = {self.detection_limit:.3g}")
        if log_scale:
            ax.set_yscale("log")
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # k counts values
        ax.set_xlabel("index k")
        ax.set_ylabel("singular value s_k")
        ax.legend(loc="lower left")  # a spectrum falls from the upper left
        return self

    @classmethod
    def from_spectrum(cls, singular_values, *, tau=0.99, threshold="auto", sigma=None,
                      shape=None, ax=None, name=None, **kwargs):
        """Draw a spectrum with its energy, entropy and threshold ranks.

        Parameters
        ----------
        singular_values : array-like of shape (n_values,)
            Non-negative singular values, in any order.
        tau : float, default=0.99
            Energy level of the energy rank.
        threshold : "auto", float or None, default="auto"
            The cut. ``"auto"`` uses :func:`~sklearn_ebound.optimal_hard_threshold` with
            ``sigma`` and ``shape``; ``None`` draws no threshold.
        sigma : float, default=None
            Noise level for the ``"auto"`` threshold; ``None`` estimates it from the median.
        shape : tuple of int, default=None
            ``(m, n)`` of the matrix the spectrum came from, for the ``"auto"`` threshold.
        ax : matplotlib Axes, default=None
            Axes to draw on; ``None`` creates a new figure.
        name : str, default=None
            Legend label of the spectrum.
        **kwargs : dict
            Passed to :meth:`plot`.

        Returns
        -------
        display : SpectrumDisplay
        """
        import_pyplot(f"{cls.__name__}.from_spectrum")
        s = np.asarray(singular_values, dtype=float)
        if s.ndim != 1:
            raise ValueError(
                f"`singular_values` must be 1-D. Got an array of shape {s.shape} instead.")
        if isinstance(threshold, str):
            if threshold != "auto":
                raise ValueError(
                    f'`threshold` must be "auto", a number or None. Got {threshold!r} instead.')
            threshold = optimal_hard_threshold(s, sigma, shape=shape)
        rank = None if threshold is None else int(np.sum(s > threshold))
        return cls._draw(s, tau, threshold, rank, name, ax, kwargs)

    @classmethod
    def _draw(cls, s, tau, threshold, threshold_rank, name, ax, plot_kwargs,
              rank_interval=None, detection_limit=None):
        display = cls(
            singular_values=s,
            energy_rank=energy_rank(s, tau),
            entropy_rank=entropy_rank(s),
            threshold=None if threshold is None else float(threshold),
            threshold_rank=threshold_rank,
            tau=tau,
            name=name,
            rank_interval=rank_interval,
            detection_limit=None if detection_limit is None else float(detection_limit),
        )
        return display.plot(ax=ax, **plot_kwargs)

    @classmethod
    def from_estimator(cls, estimator, *, tau=None, ax=None, name=None, **kwargs):
        """Draw the spectrum a fitted estimator read its rank from.

        Parameters
        ----------
        estimator : IntrinsicRankEstimator
            A fitted estimator with ``singular_values_`` and ``threshold_`` (such as
            :class:`~sklearn_ebound.IntrinsicRankEstimator`); its ``rank_interval_`` and
            ``detection_limit_`` are drawn where it has them.
        tau : float, default=None
            Energy level of the energy rank; ``None`` uses the estimator's ``tau`` (or 0.99).
        ax : matplotlib Axes, default=None
            Axes to draw on; ``None`` creates a new figure.
        name : str, default=None
            Legend label; ``None`` names the estimator and its criterion.
        **kwargs : dict
            Passed to :meth:`plot`; ``rank_lines`` defaults to ``"chosen"`` here (the rank
            the estimator read, not the energy and entropy ranks beside it).

        Returns
        -------
        display : SpectrumDisplay
        """
        import_pyplot(f"{cls.__name__}.from_estimator")
        kwargs = {"rank_lines": "chosen", **kwargs}
        check_is_fitted(estimator, "singular_values_")
        tau = getattr(estimator, "tau", 0.99) if tau is None else tau
        s = np.asarray(estimator.singular_values_, dtype=float)
        threshold = getattr(estimator, "threshold_", None)
        if name is None:
            criterion = getattr(estimator, "criterion", None)
            name = type(estimator).__name__ + (f" ({criterion})" if criterion else "")
        # The estimator's own rank: its threshold tests may be sequential, one edge per root.
        rank = None if threshold is None else int(getattr(estimator, "rank_",
                                                          np.sum(s > threshold)))
        return cls._draw(s, tau, threshold, rank, name, ax, kwargs,
                         rank_interval=getattr(estimator, "rank_interval_", None),
                         detection_limit=getattr(estimator, "detection_limit_", None))
