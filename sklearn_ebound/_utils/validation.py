"""Input checks shared by the package: sequence data, and spectra or stacks of matrices."""

import numpy as np
from sklearn.utils import check_array

__all__ = [
    "refuse_strings",
    "check_sequences",
    "check_sequence_pair",
    "check_same_sequence_shape",
    "check_spectra",
    "spectrum_output",
    "check_groups",
]


def refuse_strings(array, name="X"):
    """``array`` unchanged, or scikit-learn's own ValueError where it holds strings or bytes.

    A float ``dtype`` in :func:`~sklearn.utils.check_array` parses numeric strings silently;
    scikit-learn's estimators validate with ``dtype="numeric"``, which refuses them. Object
    arrays are left to the caller's conversion, as scikit-learn leaves them.
    """
    kind = getattr(getattr(array, "dtype", None), "kind", None)
    if kind is None and isinstance(array, (list, tuple)):
        try:
            kind = np.asarray(array).dtype.kind
        except (ValueError, TypeError):
            return array  # ragged: the caller's validation says what is wrong
    if kind is not None and kind in "USV":
        check_array(array, dtype="numeric", allow_nd=True, ensure_2d=False, input_name=name)
    return array


def check_sequences(array, name, dtype=np.float64, expected_channels=None, estimator=None):
    """A finite float 3-D array ``(n_samples, n_tokens, n_channels)``, or a ValueError; with
    ``expected_channels``, also the channel count that ``estimator`` was fitted with."""
    array = check_array(refuse_strings(array, name), dtype=dtype, allow_nd=True,
                        ensure_2d=False, input_name=name, ensure_min_samples=1)
    if array.ndim != 3:
        raise ValueError(
            f"`{name}` must be a 3-D array of shape (n_samples, n_tokens, n_channels). Got an "
            f"array of shape {array.shape} instead; a single sequence needs a leading axis of "
            "length 1, scalar tokens a trailing one."
        )
    if min(array.shape) == 0:
        raise ValueError(f"`{name}` must not have an empty axis. Got shape {array.shape}.")
    if expected_channels is not None and array.shape[2] != expected_channels:
        raise ValueError(f"{name} has {array.shape[2]} features per token, but "
                         f"{type(estimator).__name__} is expecting {expected_channels}.")
    return array


def check_sequence_pair(X, Y, dtype=np.float64):
    """Check input and target sequences together: same number of sequences and of tokens."""
    X = check_sequences(X, "X", dtype)
    Y = check_sequences(Y, "Y", dtype)
    if X.shape[0] != Y.shape[0]:
        raise ValueError(
            f"`X` and `Y` must hold the same number of sequences. Got {X.shape[0]} and "
            f"{Y.shape[0]}.")
    if X.shape[1] != Y.shape[1]:
        raise ValueError(
            f"`X` and `Y` must have the same number of tokens per sequence. Got {X.shape[1]} "
            f"and {Y.shape[1]}.")
    return X, Y


def check_same_sequence_shape(X, Y, n_features, n_tokens, n_targets):
    """Check that a later chunk of sequences has the shape of the first one."""
    if (X.shape[2], X.shape[1], Y.shape[2]) != (n_features, n_tokens, n_targets):
        raise ValueError(
            f"Every chunk must have {n_tokens} tokens, {n_features} features and {n_targets} "
            f"targets. Got X {X.shape} and y {Y.shape}.")


def check_spectra(A, is_spectrum=None, name="A"):
    """Return (s, shape, scalar) with ``s`` sorted descending along its last axis.

    ``shape`` is the matrix shape ``(m, n)`` the spectrum came from (``None`` for a spectrum),
    ``scalar`` tells whether one spectrum (rather than a stack) was given.
    """
    A = np.asarray(A)
    if A.dtype.kind not in "biuf":
        raise TypeError(f"`{name}` must be a real numeric array. Got dtype {A.dtype} instead.")
    if A.ndim == 0:
        raise ValueError(f"`{name}` must be a 1-D spectrum or an array of matrices. Got a scalar.")
    if not np.all(np.isfinite(A)):
        raise ValueError(f"`{name}` contains NaN or infinity.")
    if is_spectrum is None:
        is_spectrum = A.ndim == 1
    if is_spectrum:
        if np.any(A < 0):
            raise ValueError(f"Singular values in `{name}` must be non-negative.")
        s = -np.sort(-A.astype(np.float64, copy=False), axis=-1)
        return s, None, A.ndim == 1
    if A.ndim < 2:
        raise ValueError(f"`{name}` must have at least 2 axes to be read as matrices.")
    shape = A.shape[-2:]
    if min(shape) == 0:
        s = np.zeros(A.shape[:-2] + (0,))
    else:
        s = np.linalg.svd(A.astype(np.float64, copy=False), compute_uv=False)
    return s, shape, A.ndim == 2


def spectrum_output(values, scalar, dtype):
    """One value as a Python scalar, a stack as an array of ``dtype``."""
    values = np.asarray(values, dtype=dtype)
    return values.item() if scalar else values


def check_groups(groups, n_samples):
    """Validated group labels, one per sample (as scikit-learn's group splitters take them),
    or ``None``.

    Any labels that sort (integers, strings) work; floats must be finite. A ValueError names
    the expected form.
    """
    if groups is None:
        return None
    if hasattr(groups, "compute") and hasattr(groups, "to_delayed"):  # a dask array
        groups = groups.compute()
    groups = np.asarray(groups)
    if groups.ndim != 1:
        raise ValueError("`groups` must be a 1-D array-like of one group label per sample "
                         f"(n_samples={n_samples}). Got an array of shape {groups.shape}.")
    if groups.shape[0] != n_samples:
        raise ValueError(f"`groups` must have one label per sample: got {groups.shape[0]} "
                         f"labels for {n_samples} samples.")
    if groups.dtype.kind == "f" and not np.all(np.isfinite(groups)):
        raise ValueError("`groups` must not contain NaN or infinite labels.")
    if groups.dtype.kind not in "biufUS":
        if any(label is None for label in groups):
            raise ValueError("`groups` must not contain None labels.")
        try:
            np.unique(groups)
        except TypeError as exc:
            raise ValueError("`groups` must hold labels that can be sorted (integers or "
                             f"strings); got labels of dtype {groups.dtype}.") from exc
    return groups
