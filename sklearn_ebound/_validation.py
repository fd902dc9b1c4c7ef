"""Input checks shared by the estimators of sequence data."""

import numpy as np
from sklearn.utils import check_array

__all__ = ["check_sequences", "check_sequence_pair"]


def check_sequences(array, name, dtype=np.float64):
    """A finite float 3-D array ``(n_samples, n_tokens, n_channels)``, or a ValueError."""
    array = check_array(
        array, dtype=dtype, allow_nd=True, ensure_2d=False, input_name=name, ensure_min_samples=1
    )
    if array.ndim != 3:
        raise ValueError(
            f"`{name}` must be a 3-D array of shape (n_samples, n_tokens, n_channels). Got an "
            f"array of shape {array.shape} instead; a single sequence needs a leading axis of "
            "length 1, scalar tokens a trailing one."
        )
    if min(array.shape) == 0:
        raise ValueError(f"`{name}` must not have an empty axis. Got shape {array.shape}.")
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
