"""The statistics a rank is read from, chosen by the data and the estimator's settings.

One table, :data:`STATISTICS`, holds each kind of statistics as a strategy object
(:class:`Statistics`): which data and settings lead to it, what it is, which criteria can read
a rank from it, and how its rows, groups and empty statistics are made; the estimator asks it
instead of testing the kind's name, and its errors and docstring are written from it.
"""

import textwrap
from dataclasses import dataclass

import numpy as np
from sklearn.utils import check_array

from ._attention_operators import (
    check_attention_pattern,
    per_token_data,
    token_mixing_data,
)
from ._kernel_moments import KernelMoments
from ._moments import Moments, power_of_two_scale

__all__ = [
    "STATISTICS",
    "CV_NEEDS_ALL_DATA",
    "choose_statistics",
    "check_criterion",
    "criteria_list",
    "Statistics",
    "value_map",
]


@dataclass(frozen=True)
class Statistics:
    """One kind of statistics, a strategy: the data that feed it, what is solved, the criteria
    it allows, and how its rows and groups are formed.

    ``sequences``: fed by 3-D sequence data; ``targets``: with targets ``y``; ``attention``:
    the rank of attention (the kernel or the per-token operator); ``kernel``: the query–key
    kernel's own least squares (sequences kept whole, no 2-D rows); ``expected_failures``:
    the assumptions of :data:`._diagnostics.ASSUMPTIONS` its rows fail by construction, so
    that the calibration that drops them is taken without a warning.
    """

    name: str
    data: str
    operator: str
    criteria: tuple
    why: str = ""
    sequences: bool = False
    targets: bool = True
    attention: bool = False
    kernel: bool = False
    expected_failures: tuple = ()

    @property
    def diagnosed(self):
        """Whether the rows of the statistics are kept for the residual diagnostics."""
        return self.targets and not self.kernel

    def n_seen(self, statistics):
        """The samples the statistics hold: sequences for the kernel, rows otherwise."""
        return statistics.n_sequences if self.kernel else statistics.n

    def rows(self, X, Y, attention, mask=None, lengths=None, mask_normalization=None,
             logit_bias=None):
        """The rows the 2-D statistics are made of, for one validated chunk (per-token: of
        sequences with the attention ``mask`` (its ``mask_normalization``, a ``logit_bias``)
        and padding ``lengths``)."""
        if self.name == "token_mixing":
            return token_mixing_data(X, Y)
        if self.name == "per_token":
            pattern = check_attention_pattern(mask, X.shape[1], attention, mask_normalization,
                                              logit_bias)
            return per_token_data(X, Y, center_sequences=attention == "softmax", mask=pattern,
                                  lengths=lengths)
        return X, Y

    def row_groups(self, X, groups, offset=0, lengths=None):
        """Group labels of the :meth:`rows` of a chunk ``X`` with ``groups`` labels per sample
        (or ``None``).

        Rows of sequence data are grouped by sequence: by the sequences' own ``groups`` where
        given, else each sequence is its own group (labelled from ``offset``, the sequences
        of earlier chunks). 2-D data have ``groups`` as they are. Padded sequences
        (``lengths``, validated) give the per-token statistics ``lengths[s]`` rows each.
        """
        if not self.sequences:
            return groups
        labels = np.arange(offset, offset + X.shape[0]) if groups is None else groups
        if self.name == "per_token" and lengths is not None:
            return np.repeat(labels, lengths)
        # per_token: the rows are the tokens of each sequence; token_mixing: its channels.
        return np.repeat(labels, X.shape[1] if self.name == "per_token" else X.shape[2])

    def new(self, X, Y, attention, value, center, mask=None, mask_normalization=None,
            logit_bias=None):
        """Empty statistics for data shaped like the first chunk, and their scales (``mask``,
        ``mask_normalization``, ``logit_bias``: the attention pattern of the kernel).

        The data enter divided by the powers of two of the first chunk (exact), so that the
        products of extreme data stay finite; the scales ``(s_x, s_y)`` are returned with them.
        """
        scales = (power_of_two_scale(X), power_of_two_scale(Y))
        if self.kernel:
            # The value map V takes X's units to Y's: one common scale keeps it valid.
            scales = (max(scales),) * 2
            V = value_map(value, X.shape[2], Y.shape[2])
            return KernelMoments(V, attention, scale=scales[0], mask=mask,
                                 mask_normalization=mask_normalization,
                                 logit_bias=logit_bias), scales
        X2, Y2 = self.rows(X[:1], Y[:1], attention)
        return Moments.empty(X2.shape[1], Y2.shape[1], center=center, scale_x=scales[0],
                             scale_y=scales[1]), scales


_SPLIT_SEQUENCES = ("K-fold over its rows would put the tokens of one sequence on both sides "
                    "of a split")

STATISTICS = {statistics.name: statistics for statistics in (
    Statistics(
        "inputs", "2-D ``X`` alone", "the spectrum of ``X``", ("threshold", "energy"),
        "'rsc' and 'cv' compare fitted values with residuals, so the criterion needs targets "
        "`y`", targets=False),
    Statistics(
        "static", "2-D ``X`` and ``y``", "the least-squares operator ``Y ~ X B``",
        ("threshold", "rsc", "cv", "energy")),
    # The tokens (or channels) of one sequence are dependent, and are grouped by sequence;
    # with an unknown value map the residuals also carry the per-token operator's systematic
    # error, which depends on the inputs and has heavy tails.
    Statistics(
        "token_mixing", "sequences, ``operator='static'``",
        "the naive static transfer, one token-mixing matrix ``Y_s ~ M X_s``",
        ("threshold", "rsc", "energy"), _SPLIT_SEQUENCES, sequences=True,
        expected_failures=("serial_dependence", "group_dependence")),
    Statistics(
        "per_token", "sequences, ``operator='auto'`` or ``'attention'``, ``value=None``",
        "the per-token channel operator ``y_i ~ V Sigma Wᵀ x_i``",
        ("threshold", "rsc", "energy"), _SPLIT_SEQUENCES, sequences=True, attention=True,
        expected_failures=("heteroscedasticity", "serial_dependence", "group_dependence",
                           "heavy_tails")),
    Statistics(
        "kernel", "sequences, ``operator='auto'`` or ``'attention'``, known ``value``",
        "the query–key kernel's least squares ``y_i = V S Wᵀ x_i``", ("threshold", "energy"),
        "the kernel's least squares has no reduced-rank path, so 'rsc' and 'cv' are not "
        "available with a known value map", sequences=True, attention=True, kernel=True),
)}

CV_NEEDS_ALL_DATA = ("criterion='cv' scores held-out folds of all the data in memory, so it "
                     "cannot be accumulated by partial_fit nor reduced over dask blocks")


def criteria_list():
    """The table of :data:`STATISTICS` as a reStructuredText list, pasted into the estimator's
    docstring (a test keeps the two equal)."""
    items = [f"- {s.data}: " + ", ".join(f'``"{c}"``' for c in s.criteria)
             for s in STATISTICS.values()]
    return "\n".join(textwrap.fill(item, 90, subsequent_indent="  ", break_long_words=False,
                                   break_on_hyphens=False) for item in items)


def check_criterion(name, criterion):
    """Raise a ValueError, from the table, when ``criterion`` cannot read statistics ``name``."""
    entry = STATISTICS[name]
    if criterion not in entry.criteria:
        allowed = ", ".join(repr(c) for c in entry.criteria)
        data, operator = (text.replace("``", "`") for text in (entry.data, entry.operator))
        raise ValueError(f"criterion={criterion!r} is not available for {data} ({operator}): "
                         f"{entry.why}. Use one of {allowed}.")


def _n_dims(X):
    shape = getattr(X, "shape", None)
    return len(shape) if shape is not None else np.asarray(X).ndim


def choose_statistics(X, Y, operator, value, criterion):
    """The name (a key of :data:`STATISTICS`) of the statistics that ``X``, ``Y`` and the
    settings feed; a ValueError where ``criterion`` cannot read them."""
    name = _statistics_name(X, Y, operator, value)
    check_criterion(name, criterion)
    return name


def _statistics_name(X, Y, operator, value):
    for name, array in (("X", X), ("Y", Y)):
        if array is not None and _n_dims(array) > 3:
            raise ValueError(
                f"`{name}` must be 2-D (n_samples, n_features) or 3-D sequences (n_samples, "
                f"n_tokens, n_channels). Got a {_n_dims(array)}-D array.")
    if operator == "auto":  # sequences have an attention-native rank; 2-D data a static one
        if Y is not None and (_n_dims(X) == 3) != (_n_dims(Y) == 3):
            operator = "static"  # mixed forms: the error below names both
        else:
            operator = "attention" if _n_dims(X) == 3 else "static"
    if Y is not None and operator == "static" and (_n_dims(X) == 3) != (_n_dims(Y) == 3):
        raise ValueError(
            "`X` and `Y` must both be 2-D (n_samples, n_features) or both be 3-D sequences "
            f"(n_samples, n_tokens, n_channels). Got {_n_dims(X)}-D X and {_n_dims(Y)}-D Y.")
    if operator == "attention" or _n_dims(X) == 3:
        if Y is None:
            raise ValueError("Sequence data (3-D `X`) needs the target sequences `Y`.")
        if operator == "static":
            return "token_mixing"
        return "per_token" if value is None else "kernel"
    return "inputs" if Y is None else "static"


def value_map(value, n_features, n_targets):
    """The value map ``V`` as an array of shape ``(n_targets, n_features)``."""
    if isinstance(value, str):  # "identity"
        if n_targets != n_features:
            raise ValueError(f"value='identity' needs n_targets == n_features. Got "
                             f"{n_targets} and {n_features}.")
        return np.eye(n_features)
    V = check_array(value, dtype=np.float64, input_name="value")
    if V.shape != (n_targets, n_features):
        raise ValueError(f"`value` must have shape (n_targets, n_features) = "
                         f"{(n_targets, n_features)}. Got {V.shape} instead.")
    return V
