"""Dask arrays as input: moments reduced block by block on any dask scheduler.

Only imported names from dask are used inside the functions, so dask stays an optional extra
(``pip install "sklearn-ebound[dask]"``).
"""

import copy

__all__ = ["is_dask_array", "dask_sample_blocks", "tree_merge", "dask_statistics"]


def is_dask_array(array):
    """Whether ``array`` is a dask array (without importing dask when it is not)."""
    module = type(array).__module__
    return module.startswith("dask.") and hasattr(array, "to_delayed")


def dask_sample_blocks(X, Y):
    """Delayed blocks of ``X`` and ``Y`` that split the samples (first axis) identically.

    Every block holds whole samples: the other axes are one chunk each.
    """
    try:
        import dask.array as da
    except ImportError as exc:  # pragma: no cover - a dask array implies dask
        raise ImportError("Dask input needs dask: pip install 'sklearn-ebound[dask]'") from exc
    X = X.rechunk({axis: -1 for axis in range(1, X.ndim)})
    blocks_x = list(X.to_delayed().ravel())
    if Y is None:
        return blocks_x, [None] * len(blocks_x)
    Y = da.asarray(Y)
    if Y.shape[0] != X.shape[0]:
        raise ValueError(f"Found input variables with inconsistent numbers of samples: "
                         f"[{X.shape[0]}, {Y.shape[0]}]")
    Y = Y.rechunk((X.chunks[0],) + tuple((size,) for size in Y.shape[1:]))
    return blocks_x, list(Y.to_delayed().ravel())


def tree_merge(parts):
    """Pairwise (log-depth) merge of delayed statistics with a ``merge`` method."""
    import dask

    @dask.delayed
    def merge(a, b):
        return a.merge(b)

    while len(parts) > 1:
        merged = [merge(a, b) for a, b in zip(parts[::2], parts[1::2], strict=False)]
        parts = merged + ([parts[-1]] if len(parts) % 2 else [])
    return parts[0]


def dask_statistics(X, Y, start, add):
    """Statistics of dask arrays ``X`` and ``Y``, reduced on the current dask scheduler.

    ``start(x, y)`` makes the empty statistics from the first block of samples (validating and
    sizing them there); ``add(statistics, x, y)`` adds a block to a copy of them. Every block is
    one task and the results are merged as a tree, so nothing but the statistics leaves a worker.
    """
    import dask

    blocks_x, blocks_y = dask_sample_blocks(X, Y)
    first_x = blocks_x[0].compute() if hasattr(blocks_x[0], "compute") else blocks_x[0]
    first_y = None if Y is None else blocks_y[0].compute()
    template = start(first_x, first_y)

    def block_statistics(x, y):  # on the worker: a fresh copy of the empty statistics
        return add(copy.deepcopy(template), x, y)

    parts = [dask.delayed(block_statistics)(bx, by)
             for bx, by in zip(blocks_x, blocks_y, strict=True)]
    return dask.compute(tree_merge(parts))[0]
