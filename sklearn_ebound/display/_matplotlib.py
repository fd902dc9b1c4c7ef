"""Lazy access to matplotlib, with an error that names the ``plot`` extra."""

__all__ = ["import_pyplot"]


def import_pyplot(caller_name):
    """Import and return ``matplotlib.pyplot``, or explain how to install it.

    Parameters
    ----------
    caller_name : str
        The method that needs matplotlib, quoted in the error.

    Returns
    -------
    plt : module
        ``matplotlib.pyplot``.

    Raises
    ------
    ImportError
        When matplotlib is not installed.
    """
    try:
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ImportError(
            f"{caller_name} requires matplotlib. Install it with "
            '`pip install "sklearn-ebound[plot]"` (or `pip install matplotlib`).'
        ) from exc
    return plt


def new_axes(ax, caller_name):
    """Return ``(figure, ax)``: ``ax`` and its figure, or a new figure with one axes."""
    plt = import_pyplot(caller_name)
    if ax is None:
        _, ax = plt.subplots()
    return ax.figure, ax
