"""Display of a rank sweep: the deficiency curve."""

import numpy as np

from ._matplotlib import import_pyplot, new_axes

__all__ = ["RankSweepDisplay"]


class RankSweepDisplay:
    """Deficiency curve: held-out risk against the rank of the model.

    The curve shows the mean held-out risk of the rank-``r`` model with its spread over the
    folds, the noise floor (the risk of the true operator), the bound ``noise floor + T(r)``
    where the operator's spectrum is known, and the knee of the curve (the selected ``r*``).
    Below ``r*`` the risk stays above the bound's floor by the tail energy ``T(r)``
    (deficiency); at ``r*`` it reaches the noise floor (achievability).

    Create it with :meth:`from_estimator` (which runs
    :func:`~sklearn_ebound.experiments.rank_sweep`) or :meth:`from_result`; all parameters
    are stored as attributes.

    Parameters
    ----------
    ranks : array-like of shape (n_ranks,)
        The ranks of the sweep.
    risk : array-like of shape (n_ranks,)
        Mean held-out risk per rank.
    risk_std : array-like of shape (n_ranks,), default=None
        Spread of the risk over folds, drawn as a band of one standard deviation.
    noise_floor : float, default=None
        Risk of the true operator, drawn as a horizontal line.
    bound : array-like of shape (n_ranks,), default=None
        Tail energy ``T(r)``; drawn as ``noise_floor + T(r)`` when the noise floor is known.
        NaN entries are left out.
    knee : int, default=None
        The selected rank, drawn as a vertical line.
    estimator_name : str, default=None
        Name of the swept estimator, used in the legend.

    Attributes
    ----------
    line_ : matplotlib Line2D
        The risk curve.
    fill_between_ : matplotlib PolyCollection or None
        The band of one standard deviation.
    noise_floor_line_ : matplotlib Line2D or None
        The noise floor.
    bound_line_ : matplotlib Line2D or None
        The bound ``noise_floor + T(r)``.
    knee_line_ : matplotlib Line2D or None
        The vertical line at the knee.
    ax_ : matplotlib Axes
        Axes with the curve.
    figure_ : matplotlib Figure
        Figure containing the curve.
    result_ : RankSweepResult
        The sweep, only when created by :meth:`from_estimator` or :meth:`from_result`.

    See Also
    --------
    sklearn_ebound.experiments.rank_sweep : Run the sweep this display draws.
    SpectrumDisplay : The spectrum the bound ``T(r)`` comes from.

    Examples
    --------
    >>> import matplotlib.pyplot as plt
    >>> from sklearn_ebound import ReducedRankRegressor
    >>> from sklearn_ebound.datasets import make_static_task
    >>> from sklearn_ebound.display import RankSweepDisplay
    >>> X, Y, params = make_static_task(600, 8, rank=3, noise=0.3, random_state=0,
    ...                                 return_params=True)
    >>> display = RankSweepDisplay.from_estimator(
    ...     ReducedRankRegressor(), X, Y, ranks=range(0, 9), cv=3,
    ...     noise_floor=params.noise_floor, singular_values=params.singular_values)
    >>> display.knee
    3
    >>> plt.close("all")
    """

    def __init__(self, *, ranks, risk, risk_std=None, noise_floor=None, bound=None, knee=None,
                 estimator_name=None):
        self.ranks = ranks
        self.risk = risk
        self.risk_std = risk_std
        self.noise_floor = noise_floor
        self.bound = bound
        self.knee = knee
        self.estimator_name = estimator_name

    def plot(self, ax=None, *, name=None, show_std=True, line_kw=None, fill_between_kw=None):
        """Draw the deficiency curve.

        Parameters
        ----------
        ax : matplotlib Axes, default=None
            Axes to draw on; ``None`` creates a new figure.
        name : str, default=None
            Legend label of the risk curve; ``None`` uses ``estimator_name``.
        show_std : bool, default=True
            Draw the band of one standard deviation over folds.
        line_kw : dict, default=None
            Keyword arguments of :meth:`matplotlib.axes.Axes.plot` for the risk curve.
        fill_between_kw : dict, default=None
            Keyword arguments of :meth:`matplotlib.axes.Axes.fill_between` for the band.

        Returns
        -------
        display : RankSweepDisplay
            Object that stores the computed values and the matplotlib handles.
        """
        self.figure_, self.ax_ = new_axes(ax, f"{type(self).__name__}.plot")
        ax = self.ax_
        ranks = np.asarray(self.ranks, dtype=float)
        risk = np.asarray(self.risk, dtype=float)
        name = self.estimator_name if name is None else name
        label = "held-out risk" if name is None else f"held-out risk ({name})"
        (self.line_,) = ax.plot(ranks, risk, **{"marker": "o", "label": label, **(line_kw or {})})
        self.fill_between_ = None
        if show_std and self.risk_std is not None:
            std = np.asarray(self.risk_std, dtype=float)
            self.fill_between_ = ax.fill_between(
                ranks, risk - std, risk + std,
                **{"alpha": 0.3, "color": self.line_.get_color(), **(fill_between_kw or {})},
            )
        self.noise_floor_line_ = self.bound_line_ = self.knee_line_ = None
        if self.noise_floor is not None and np.isfinite(self.noise_floor):
            self.noise_floor_line_ = ax.axhline(self.noise_floor, color="black", linestyle="--",
                                                linewidth=1, label="noise floor")
            if self.bound is not None:
                bound = np.asarray(self.bound, dtype=float)
                known = np.isfinite(bound)
                if known.any():
                    (self.bound_line_,) = ax.plot(
                        ranks[known], self.noise_floor + bound[known], color="tab:red",
                        linestyle="-.", marker="x", label="bound: noise floor + T(r)")
        if self.knee is not None:
            self.knee_line_ = ax.axvline(self.knee, color="tab:green", linestyle=":",
                                         label=f"knee r* = {self.knee}")
        ax.set_xlabel("rank r of the model")
        ax.set_ylabel("held-out risk")
        ax.legend(loc="upper right")
        return self

    @classmethod
    def from_result(cls, result, *, ax=None, name=None, **kwargs):
        """Draw the deficiency curve of a finished rank sweep.

        Parameters
        ----------
        result : RankSweepResult
            Output of :func:`~sklearn_ebound.experiments.rank_sweep`.
        ax : matplotlib Axes, default=None
            Axes to draw on; ``None`` creates a new figure.
        name : str, default=None
            Legend label of the risk curve.
        **kwargs : dict
            Passed to :meth:`plot`.

        Returns
        -------
        display : RankSweepDisplay
        """
        import_pyplot(f"{cls.__name__}.from_result")
        missing = {"rank", "risk"} - set(result.columns)
        if missing:
            raise ValueError(
                f"`result` must have the columns of a RankSweepResult; {sorted(missing)} are "
                "missing."
            )
        display = cls(
            ranks=result.column("rank"),
            risk=result.column("risk"),
            risk_std=result.column("risk_std") if "risk_std" in result.columns else None,
            noise_floor=getattr(result, "noise_floor", None),
            bound=(np.asarray(result.column("bound"), dtype=float)
                   if "bound" in result.columns else None),
            knee=getattr(result, "knee", None),
            estimator_name=name,
        )
        display.result_ = result
        return display.plot(ax=ax, **kwargs)

    @classmethod
    def from_estimator(cls, estimator, X, Y, ranks, *, cv=5, n_jobs=None, noise_floor=None,
                       singular_values=None, param_name="rank", ax=None, name=None, **kwargs):
        """Sweep the rank of an estimator and draw its deficiency curve.

        Parameters
        ----------
        estimator : estimator
            A regressor with a rank parameter, such as
            :class:`~sklearn_ebound.ReducedRankRegressor` or
            :class:`~sklearn_ebound.nn.LowRankAttentionRegressor`. It is cloned, not fitted.
        X, Y : array-like
            2-D data or sequences, as in :func:`~sklearn_ebound.experiments.rank_sweep`.
        ranks : iterable of int
            The ranks to try.
        cv : int, cross-validation generator or iterable, default=5
            Cross-validation splitting.
        n_jobs : int, default=None
            Parallel jobs over ranks and folds.
        noise_floor : float, default=None
            Risk of the true model; ``None`` estimates it for 2-D data.
        singular_values : array-like, default=None
            Spectrum of the true operator, for the bound ``T(r)``.
        param_name : str, default="rank"
            The estimator's rank parameter.
        ax : matplotlib Axes, default=None
            Axes to draw on; ``None`` creates a new figure.
        name : str, default=None
            Legend label; ``None`` uses the estimator's class name.
        **kwargs : dict
            Passed to :meth:`plot`.

        Returns
        -------
        display : RankSweepDisplay
        """
        from ..experiments import rank_sweep

        import_pyplot(f"{cls.__name__}.from_estimator")  # fail before the sweep, not after
        result = rank_sweep(estimator, X, Y, ranks, cv=cv, n_jobs=n_jobs,
                            noise_floor=noise_floor, singular_values=singular_values,
                            param_name=param_name)
        name = type(estimator).__name__ if name is None else name
        return cls.from_result(result, ax=ax, name=name, **kwargs)
