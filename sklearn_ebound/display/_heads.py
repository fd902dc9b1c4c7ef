"""Displays of the ranks and spectra of every head of a pretrained transformer."""

import numpy as np

from .._spectrum import energy_rank
from ._matplotlib import import_pyplot, new_axes

__all__ = ["HeadRankDisplay", "HeadSpectrumDisplay"]


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
