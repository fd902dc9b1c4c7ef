"""Displays of the ranks and spectra of every head of a pretrained transformer."""

import numpy as np

from .._spectrum import energy_rank
from ._matplotlib import import_pyplot, new_axes

__all__ = ["HeadRankDisplay", "HeadSpectrumDisplay", "HeadDeficiencyDisplay",
           "CompressionFrontierDisplay"]


def _percent(tau):
    # The label of an energy level in the result's column names: 0.9 -> "90".
    return format(100 * tau, "g")


class HeadRankDisplay:
    """Heat map of one rank column of every head: layers down, heads across.

    One cell per (layer, head), coloured by a column of a
    :class:`~sklearn_ebound.heads.HeadRankResult` such as ``kernel_energy_rank_90`` (the
    energy rank at 90% of the query-key kernel ``W_Q W_K^T``) or ``field_energy_rank_90``
    (the same for the logit field the head produces on text). Every rank is at most the head
    dimension ``d_h``, quoted in the title.

    Create it with :meth:`from_result`; all parameters are stored as attributes.

    Parameters
    ----------
    ranks : ndarray of shape (n_layers, n_heads)
        The cell values; NaN where a head has no value.
    column : str
        The column of the result the cells show, the label of the colour bar.
    head_dim : int, default=None
        Dimension ``d_h`` of each head, quoted in the title.

    Attributes
    ----------
    im_ : matplotlib AxesImage
        The heat map.
    colorbar_ : matplotlib Colorbar or None
        The colour bar.
    ax_ : matplotlib Axes
        Axes with the heat map.
    figure_ : matplotlib Figure
        Figure containing the heat map.

    See Also
    --------
    sklearn_ebound.heads.head_ranks : Compute the ranks this display draws.
    HeadSpectrumDisplay : The spectra one head's ranks are read from.

    Examples
    --------
    >>> import matplotlib.pyplot as plt
    >>> import numpy as np
    >>> from sklearn_ebound.display import HeadRankDisplay
    >>> from sklearn_ebound.heads import head_ranks
    >>> rng = np.random.default_rng(0)
    >>> state = {f"encoder.layer.{i}.attention.self.{m}.weight": rng.normal(size=(8, 8))
    ...          for i in range(3) for m in ("query", "key")}
    >>> result = head_ranks(state, n_heads=2)
    >>> display = HeadRankDisplay.from_result(result, "kernel_energy_rank_90")
    >>> display.ranks.shape
    (3, 2)
    >>> plt.close("all")
    """

    def __init__(self, *, ranks, column, head_dim=None):
        self.ranks = ranks
        self.column = column
        self.head_dim = head_dim

    def plot(self, ax=None, *, cmap="viridis", colorbar=True):
        """Draw the heat map.

        Parameters
        ----------
        ax : matplotlib Axes, default=None
            Axes to draw on; ``None`` creates a new figure.
        cmap : str or matplotlib Colormap, default="viridis"
            Colour map.
        colorbar : bool, default=True
            Draw a colour bar.

        Returns
        -------
        display : HeadRankDisplay
            Object that stores the computed values and the matplotlib handles.
        """
        self.figure_, self.ax_ = new_axes(ax, f"{type(self).__name__}.plot")
        ax = self.ax_
        ranks = np.asarray(self.ranks, dtype=float)
        self.im_ = ax.imshow(ranks, aspect="auto", cmap=cmap, interpolation="nearest")
        self.colorbar_ = (self.figure_.colorbar(self.im_, ax=ax, label=self.column)
                          if colorbar else None)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_xticks(range(ranks.shape[1]))
        ax.set_yticks(range(ranks.shape[0]))
        ax.set_title(self.column if self.head_dim is None
                     else f"{self.column} (d_h = {self.head_dim})")
        return self

    @classmethod
    def from_result(cls, result, column=None, *, ax=None, **kwargs):
        """Draw one rank column of a :class:`~sklearn_ebound.heads.HeadRankResult`.

        Parameters
        ----------
        result : HeadRankResult
            Output of :func:`~sklearn_ebound.heads.head_ranks`.
        column : str, default=None
            The column to draw, e.g. ``"kernel_energy_rank_90"``,
            ``"field_energy_rank_99"`` or ``"rank_ratio_90"``; ``None`` draws the kernel
            energy rank at the first of the result's ``taus``.
        ax : matplotlib Axes, default=None
            Axes to draw on; ``None`` creates a new figure.
        **kwargs : dict
            Passed to :meth:`plot`.

        Returns
        -------
        display : HeadRankDisplay
        """
        import_pyplot(f"{cls.__name__}.from_result")
        if column is None:
            column = f"kernel_energy_rank_{_percent(result.taus[0])}"
        display = cls(ranks=result.grid(column), column=column, head_dim=result.head_dim)
        return display.plot(ax=ax, **kwargs)


class HeadSpectrumDisplay:
    """The spectra of one head: its query-key kernel and, with inputs, its logit field.

    Each spectrum is drawn divided by its largest singular value, on a log scale, with the
    ``k``-th value at ``x = k``; a dotted vertical line of the same colour marks its energy
    rank at each level ``tau``. A slowly decaying kernel spectrum above a fast decaying field
    spectrum is a head whose logits on real text use few of the directions its weights allow.

    Create it with :meth:`from_result`; all parameters are stored as attributes.

    Parameters
    ----------
    kernel_spectrum : array-like of shape (head_dim,)
        Singular values of the head's kernel ``W_Q W_K^T``, largest first.
    field_spectrum : array-like of shape (head_dim,), default=None
        Singular values of the head's logit field on the inputs, largest first.
    taus : sequence of float, default=(0.9, 0.99)
        Energy levels of the marked energy ranks.
    layer, head : int, default=None
        The head drawn, quoted in the title.

    Attributes
    ----------
    kernel_line_ : matplotlib Line2D
        The kernel spectrum.
    field_line_ : matplotlib Line2D or None
        The logit field spectrum.
    energy_rank_lines_ : list of matplotlib Line2D
        The vertical lines at the energy ranks, kernel first, one per ``tau``.
    ax_ : matplotlib Axes
        Axes with the spectra.
    figure_ : matplotlib Figure
        Figure containing the spectra.

    See Also
    --------
    sklearn_ebound.heads.head_ranks : Compute the spectra this display draws.
    HeadRankDisplay : One rank of every head as a heat map.
    SpectrumDisplay : A spectrum with its energy, entropy and threshold ranks.

    Examples
    --------
    >>> import matplotlib.pyplot as plt
    >>> import numpy as np
    >>> from sklearn_ebound.display import HeadSpectrumDisplay
    >>> from sklearn_ebound.heads import head_ranks
    >>> rng = np.random.default_rng(0)
    >>> state = {f"encoder.layer.0.attention.self.{m}.weight": rng.normal(size=(8, 8))
    ...          for m in ("query", "key")}
    >>> result = head_ranks(state, n_heads=2)
    >>> display = HeadSpectrumDisplay.from_result(result, 0, 1)
    >>> display.field_line_ is None  # no inputs, so no logit field
    True
    >>> plt.close("all")
    """

    def __init__(self, *, kernel_spectrum, field_spectrum=None, taus=(0.9, 0.99), layer=None,
                 head=None):
        self.kernel_spectrum = kernel_spectrum
        self.field_spectrum = field_spectrum
        self.taus = taus
        self.layer = layer
        self.head = head

    def plot(self, ax=None):
        """Draw the normalised spectra and their energy ranks.

        Parameters
        ----------
        ax : matplotlib Axes, default=None
            Axes to draw on; ``None`` creates a new figure.

        Returns
        -------
        display : HeadSpectrumDisplay
            Object that stores the computed values and the matplotlib handles.
        """
        self.figure_, self.ax_ = new_axes(ax, f"{type(self).__name__}.plot")
        ax = self.ax_
        spectra = [("QK kernel W_Q W_K^T", self.kernel_spectrum)]
        if self.field_spectrum is not None:
            spectra.append(("logit field on the inputs", self.field_spectrum))
        lines = []
        self.energy_rank_lines_ = []
        for name, values in spectra:
            s = np.asarray(values, dtype=float)
            # s_k / s_1; a zero spectrum is drawn as it is.
            (line,) = ax.semilogy(np.arange(1, s.size + 1), s / s[0] if s[0] > 0 else s, "o-",
                                  markersize=3, label=name)
            lines.append(line)
            for tau in self.taus:
                self.energy_rank_lines_.append(ax.axvline(
                    energy_rank(s, tau), linestyle=":", color=line.get_color(), linewidth=1))
        self.kernel_line_ = lines[0]
        self.field_line_ = lines[1] if len(lines) > 1 else None
        ax.set_xlabel("component")
        ax.set_ylabel("singular value / largest")
        ranks = f"dotted: energy ranks at {', '.join(_percent(t) + '%' for t in self.taus)}"
        ax.set_title(ranks if self.layer is None
                     else f"layer {self.layer}, head {self.head} ({ranks})")
        ax.legend()
        return self

    @classmethod
    def from_result(cls, result, layer, head, *, ax=None, **kwargs):
        """Draw the spectra of one head of a :class:`~sklearn_ebound.heads.HeadRankResult`.

        Parameters
        ----------
        result : HeadRankResult
            Output of :func:`~sklearn_ebound.heads.head_ranks`.
        layer : int
            Position of the layer among the result's layers (0 for the first).
        head : int
            Query head within the layer.
        ax : matplotlib Axes, default=None
            Axes to draw on; ``None`` creates a new figure.
        **kwargs : dict
            Passed to :meth:`plot`.

        Returns
        -------
        display : HeadSpectrumDisplay
        """
        import_pyplot(f"{cls.__name__}.from_result")
        field = getattr(result, "field_spectra", None)
        display = cls(kernel_spectrum=np.asarray(result.kernel_spectra)[layer, head],
                      field_spectrum=None if field is None else np.asarray(field)[layer, head],
                      taus=tuple(result.taus), layer=layer, head=head)
        return display.plot(ax=ax, **kwargs)


_METHOD_LABELS = {"weight": "weight-space truncation", "data": "data-aware truncation",
                  "trained": "achievable (trained)"}


class HeadDeficiencyDisplay:
    """Deficiency curves: a head's relative output error against its query-key rank.

    One line per method (weight-space truncation of the form on ``[x, 1]``, data-aware
    truncation, the achievable trained pairs), on a log scale, with the tolerances ``eps`` as
    dotted horizontal lines: the eps-rank of a method is where its line first falls below
    one. For all heads at once (``layer=None``) each line is the median over heads, with the
    band between the 10th and 90th percentiles.

    Create it with :meth:`from_result`; all parameters are stored as attributes.

    Parameters
    ----------
    curves : dict of str to ndarray
        Method to errors, each ``(d_h + 1,)`` (one head) or ``(n_heads, d_h + 1)`` (a median
        and a band are drawn); NaN where not measured.
    epsilons : sequence of float, default=()
        Tolerances drawn as horizontal lines.
    title : str, default=None
        The axes title.

    Attributes
    ----------
    lines_ : dict of str to matplotlib Line2D
        One line per method.
    ax_ : matplotlib Axes
    figure_ : matplotlib Figure

    See Also
    --------
    sklearn_ebound.heads.head_deficiency : Compute the curves.
    CompressionFrontierDisplay : What the curves give end to end.

    Examples
    --------
    >>> import matplotlib.pyplot as plt
    >>> import numpy as np
    >>> from sklearn_ebound.display import HeadDeficiencyDisplay
    >>> curves = {"weight": np.linspace(1, 0, 9) ** 2, "data": np.linspace(1, 0, 9) ** 4}
    >>> display = HeadDeficiencyDisplay(curves=curves, epsilons=(0.1,)).plot()
    >>> sorted(display.lines_)
    ['data', 'weight']
    >>> plt.close("all")
    """

    def __init__(self, *, curves, epsilons=(), title=None):
        self.curves = curves
        self.epsilons = epsilons
        self.title = title

    def plot(self, ax=None):
        """Draw the curves.

        Parameters
        ----------
        ax : matplotlib Axes, default=None
            Axes to draw on; ``None`` creates a new figure.

        Returns
        -------
        display : HeadDeficiencyDisplay
        """
        self.figure_, self.ax_ = new_axes(ax, f"{type(self).__name__}.plot")
        ax = self.ax_
        self.lines_ = {}
        floor = 1e-6
        for method, values in self.curves.items():
            values = np.asarray(values, dtype=float)
            ranks = np.arange(values.shape[-1])
            label = _METHOD_LABELS.get(method, method)
            if values.ndim == 1:
                keep = ~np.isnan(values)
                style = "o" if method == "trained" else "o-"
                (line,) = ax.semilogy(ranks[keep], np.maximum(values[keep], floor), style,
                                      markersize=3, label=label)
            else:
                if np.isnan(values).all():
                    continue
                keep = ~np.isnan(values).all(axis=0)
                median = np.nanmedian(values[:, keep], axis=0)
                (line,) = ax.semilogy(ranks[keep], np.maximum(median, floor), "o-",
                                      markersize=3, label=f"{label} (median)")
                low, high = np.nanpercentile(values[:, keep], [10, 90], axis=0)
                ax.fill_between(ranks[keep], np.maximum(low, floor), np.maximum(high, floor),
                                color=line.get_color(), alpha=0.15)
            self.lines_[method] = line
        for eps in self.epsilons:
            ax.axhline(eps, linestyle=":", color="grey", linewidth=1)
        ax.set_xlabel("query-key rank r")
        ax.set_ylabel("relative output error err(r)")
        if self.title:
            ax.set_title(self.title)
        ax.legend()
        return self

    @classmethod
    def from_result(cls, result, layer=None, head=None, *, methods=None, ax=None):
        """Draw the curves of one head, or of all heads (``layer=None``).

        Parameters
        ----------
        result : HeadDeficiencyResult
            Output of :func:`~sklearn_ebound.heads.head_deficiency`.
        layer : int, default=None
            Position of the layer among the result's layers; ``None`` draws every head.
        head : int, default=None
            Query head (its position among the result's heads); needed with ``layer``.
        methods : sequence of str, default=None
            Methods to draw; ``None`` draws those measured.
        ax : matplotlib Axes, default=None

        Returns
        -------
        display : HeadDeficiencyDisplay
        """
        import_pyplot(f"{cls.__name__}.from_result")
        methods = ("weight", "data", "trained") if methods is None else methods
        curves = {}
        for method in methods:
            values = result.curves(method)
            if np.isnan(values).all():
                continue
            curves[method] = (values.reshape(-1, values.shape[-1]) if layer is None
                              else values[layer, head])
        title = (f"{result.n_layers * result.n_heads} heads" if layer is None
                 else f"layer {result.layer_indices[layer]}, head {result.heads[head]}")
        return cls(curves=curves, epsilons=result.epsilons, title=title).plot(ax=ax)


_STRATEGY_LABELS = {"uniform": "same rank for every head", "weight": "weight-space, one tolerance",
                    "data": "data-aware, one tolerance",
                    "plan": "plan: greedy by marginal error"}


class CompressionFrontierDisplay:
    """End-to-end fidelity of compressed models against the query-key rank kept.

    One line per strategy (uniform rank, weight-space, data-aware, the package's plan): the
    mean embedding cosine to the original model (a sentence-embedding model), or the
    perplexity (a causal language model, with the original's as a dotted line), against the
    fraction of the full query-key rank kept.

    Create it with :meth:`from_result`; all parameters are stored as attributes.

    Parameters
    ----------
    frontier : ResultTable
        Output of :func:`~sklearn_ebound.heads.compression_frontier`.
    column : str, default=None
        The measure drawn; ``None`` means ``"mean_cosine"`` or ``"perplexity"``.

    Attributes
    ----------
    lines_ : dict of str to matplotlib Line2D
    ax_ : matplotlib Axes
    figure_ : matplotlib Figure

    See Also
    --------
    sklearn_ebound.heads.compression_frontier : Compute the frontier.
    HeadDeficiencyDisplay : The per-head curves the plans are read from.

    Examples
    --------
    >>> import matplotlib.pyplot as plt
    >>> from sklearn_ebound._utils.results import ResultTable
    >>> from sklearn_ebound.display import CompressionFrontierDisplay
    >>> rows = [{"strategy": s, "budget": b, "budget_used": b, "mean_cosine": 1 - (1 - b) / k}
    ...         for s, k in (("uniform", 20), ("plan", 60)) for b in (0.2, 0.4)]
    >>> display = CompressionFrontierDisplay.from_result(ResultTable(rows, measure="cosine"))
    >>> sorted(display.lines_)
    ['plan', 'uniform']
    >>> plt.close("all")
    """

    def __init__(self, *, frontier, column=None):
        self.frontier = frontier
        self.column = column

    def plot(self, ax=None):
        """Draw the frontier; returns the display."""
        self.figure_, self.ax_ = new_axes(ax, f"{type(self).__name__}.plot")
        ax = self.ax_
        perplexity = getattr(self.frontier, "measure", "cosine") == "perplexity"
        column = self.column or ("perplexity" if perplexity else "mean_cosine")
        self.lines_ = {}
        for strategy in dict.fromkeys(row["strategy"] for row in self.frontier.rows):
            rows = [r for r in self.frontier.rows if r["strategy"] == strategy]
            x = [100 * r["budget_used"] for r in rows]
            y = [r[column] for r in rows]
            (line,) = ax.plot(x, y, "o-", markersize=4,
                              label=_STRATEGY_LABELS.get(strategy, strategy))
            self.lines_[strategy] = line
        if perplexity and "perplexity_original" in self.frontier.meta:
            ax.axhline(self.frontier.perplexity_original, linestyle=":", color="grey",
                       label="original")
        ax.set_xlabel("query-key rank kept (% of the full rank)")
        ax.set_ylabel(column.replace("_", " "))
        ax.legend()
        return self

    @classmethod
    def from_result(cls, frontier, column=None, *, ax=None):
        """Draw a :func:`~sklearn_ebound.heads.compression_frontier` table."""
        import_pyplot(f"{cls.__name__}.from_result")
        return cls(frontier=frontier, column=column).plot(ax=ax)
