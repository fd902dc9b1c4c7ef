"""Display of the predictability frontier as a heat map."""

import numpy as np

from ._matplotlib import import_pyplot, new_axes

__all__ = ["FrontierDisplay"]

_METRICS = ("recovery_rate", "mean_abs_error")


def _sort_key(value):
    # None (a setting that does not apply, e.g. the logit scale of linear attention) goes last.
    if value is None:
        return (2, 0.0, "")
    if isinstance(value, (bool, np.bool_)):
        return (0, float(value), "")
    if isinstance(value, (int, float, np.integer, np.floating)):
        return (0, float(value), "")
    return (1, 0.0, str(value))


def _tick_label(value):
    if value is None:
        return "n/a"
    if isinstance(value, (float, np.floating)):
        return "inf" if np.isinf(value) else format(float(value), "g")
    return str(value)


def _same(a, b):
    if a is None or b is None:
        return a is b
    if isinstance(a, (float, np.floating)) and isinstance(b, (float, np.floating)):
        return a == b or (np.isnan(a) and np.isnan(b))
    return a == b


class FrontierDisplay:
    """Heat map of the data-only recovery rate over two axes of the predictability frontier.

    One cell per pair of settings ``(x, y)``, coloured and annotated with the fraction of
    planted tasks whose intrinsic rank :class:`~sklearn_ebound.IntrinsicRankEstimator` read
    exactly (or another column of the frontier, such as ``mean_abs_error``). The other
    settings are held fixed: the slice.

    Create it with :meth:`from_result`; all parameters are stored as attributes.

    Parameters
    ----------
    values : ndarray of shape (n_y, n_x)
        The cell values; NaN where the grid has no cell.
    x_values, y_values : list
        The settings along the x and y axes, in drawing order.
    x_name, y_name : str
        The columns of the frontier along the axes.
    value_name : str, default="recovery_rate"
        The column shown in the cells.
    slice : dict, default=None
        The fixed values of the other settings, shown in the title.

    Attributes
    ----------
    im_ : matplotlib AxesImage
        The heat map.
    text_ : ndarray of shape (n_y, n_x), dtype=object, or None
        The cell annotations (matplotlib Text), None when not drawn.
    colorbar_ : matplotlib Colorbar or None
        The colour bar.
    ax_ : matplotlib Axes
        Axes with the heat map.
    figure_ : matplotlib Figure
        Figure containing the heat map.

    See Also
    --------
    sklearn_ebound.experiments.predictability_frontier : Compute the frontier this draws.

    Examples
    --------
    >>> import matplotlib.pyplot as plt
    >>> from sklearn_ebound.experiments import predictability_frontier
    >>> from sklearn_ebound.display import FrontierDisplay
    >>> result = predictability_frontier(
    ...     attention=["softmax"], value_known=[True], logit_scales=[0.5, 4.0],
    ...     n_tokens=[8, 16], value_conditions=[1.0], vocabulary_sizes=[None],
    ...     n_samples=100, n_repeats=2,
    ...     random_state=0)
    >>> display = FrontierDisplay.from_result(result, x="logit_scale", y="n_tokens")
    >>> display.values.shape
    (2, 2)
    >>> plt.close("all")
    """

    def __init__(self, *, values, x_values, y_values, x_name, y_name,
                 value_name="recovery_rate", slice=None):
        self.values = values
        self.x_values = x_values
        self.y_values = y_values
        self.x_name = x_name
        self.y_name = y_name
        self.value_name = value_name
        self.slice = slice

    def plot(self, ax=None, *, cmap="viridis", colorbar=True, include_values=True,
             values_format=".2f", vmin=None, vmax=None):
        """Draw the heat map.

        Parameters
        ----------
        ax : matplotlib Axes, default=None
            Axes to draw on; ``None`` creates a new figure.
        cmap : str or matplotlib Colormap, default="viridis"
            Colour map.
        colorbar : bool, default=True
            Draw a colour bar.
        include_values : bool, default=True
            Write the value in every cell.
        values_format : str, default=".2f"
            Format of the cell values.
        vmin, vmax : float, default=None
            Colour limits; ``None`` uses 0 and 1 for ``recovery_rate`` and the data range
            otherwise.

        Returns
        -------
        display : FrontierDisplay
            Object that stores the computed values and the matplotlib handles.
        """
        self.figure_, self.ax_ = new_axes(ax, f"{type(self).__name__}.plot")
        ax = self.ax_
        values = np.asarray(self.values, dtype=float)
        if self.value_name == "recovery_rate":
            vmin = 0.0 if vmin is None else vmin
            vmax = 1.0 if vmax is None else vmax
        self.im_ = ax.imshow(values, origin="lower", aspect="auto", cmap=cmap, vmin=vmin,
                             vmax=vmax, interpolation="nearest")
        self.text_ = None
        if include_values:
            self.text_ = np.empty(values.shape, dtype=object)
            low, high = self.im_.norm.vmin, self.im_.norm.vmax
            middle = (low + high) / 2
            for i, j in np.ndindex(values.shape):
                value = values[i, j]
                text = "-" if np.isnan(value) else format(value, values_format)
                color = "black" if np.isnan(value) or value > middle else "white"
                self.text_[i, j] = ax.text(j, i, text, ha="center", va="center", color=color)
        ax.set_xticks(np.arange(len(self.x_values)),
                      [_tick_label(v) for v in self.x_values])
        ax.set_yticks(np.arange(len(self.y_values)),
                      [_tick_label(v) for v in self.y_values])
        ax.set_xlabel(self.x_name)
        ax.set_ylabel(self.y_name)
        if self.slice:
            ax.set_title(", ".join(f"{k}={_tick_label(v)}" for k, v in self.slice.items()),
                         fontsize="small")
        self.colorbar_ = (self.figure_.colorbar(self.im_, ax=ax, label=self.value_name)
                          if colorbar else None)
        return self

    @classmethod
    def from_result(cls, result, *, x="logit_scale", y="n_tokens", value="recovery_rate",
                    where=None, ax=None, **kwargs):
        """Draw one slice of a predictability frontier.

        Parameters
        ----------
        result : FrontierResult
            Output of :func:`~sklearn_ebound.experiments.predictability_frontier`.
        x, y : str, default="logit_scale", "n_tokens"
            The grid columns along the axes (``attention``, ``value_known``, ``logit_scale``,
            ``n_tokens``, ``value_condition`` or ``noise``).
        value : str, default="recovery_rate"
            The column shown in the cells.
        where : dict, default=None
            Fixed values of the other grid columns, e.g. ``{"attention": "softmax",
            "value_known": True}``. Every other column that still takes several values
            after this selection is an error: say which slice to draw.
        ax : matplotlib Axes, default=None
            Axes to draw on; ``None`` creates a new figure.
        **kwargs : dict
            Passed to :meth:`plot`.

        Returns
        -------
        display : FrontierDisplay
        """
        import_pyplot(f"{cls.__name__}.from_result")
        columns = result.columns
        where = dict(where or {})
        for name in [x, y, value, *where]:
            if name not in columns:
                raise ValueError(f"{name!r} is not a column of the result; columns: {columns}.")
        if x == y:
            raise ValueError(f"`x` and `y` must be different columns. Got {x!r} twice.")
        rows = [row for row in result.rows
                if all(_same(row[k], v) for k, v in where.items())]
        if not rows:
            raise ValueError(f"No row of the result matches where={where!r}.")
        grid = [c for c in columns if c not in (x, y, value, *_METRICS, *where)]
        ambiguous = {}
        for name in grid:
            seen = []
            for row in rows:
                if not any(_same(row[name], v) for v in seen):
                    seen.append(row[name])
            if len(seen) > 1:
                ambiguous[name] = seen
            else:
                where[name] = seen[0]
        if ambiguous:
            raise ValueError(
                "Choose one slice: these columns take several values "
                f"{ambiguous!r}; fix them with `where`, e.g. where={{{next(iter(ambiguous))!r}:"
                f" {next(iter(ambiguous.values()))[0]!r}}}."
            )
        x_values = sorted({_sort_key(r[x]): r[x] for r in rows}.values(), key=_sort_key)
        y_values = sorted({_sort_key(r[y]): r[y] for r in rows}.values(), key=_sort_key)
        values = np.full((len(y_values), len(x_values)), np.nan)
        for row in rows:
            i = [_sort_key(v) for v in y_values].index(_sort_key(row[y]))
            j = [_sort_key(v) for v in x_values].index(_sort_key(row[x]))
            values[i, j] = np.nan if row[value] is None else float(row[value])
        display = cls(values=values, x_values=x_values, y_values=y_values, x_name=x, y_name=y,
                      value_name=value, slice=where)
        return display.plot(ax=ax, **kwargs)
