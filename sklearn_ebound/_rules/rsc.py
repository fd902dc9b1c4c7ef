"""``criterion="rsc"``: Bunea, She & Wegkamp's (2011) rank selection criterion."""

import numpy as np

from .reading import NotEnoughData, RankReading, fitted_spectrum

__all__ = ["rsc_rule", "check_residual_noise"]


def check_residual_noise(operator, criterion):
    """Raise :class:`.reading.NotEnoughData` where no residual degrees of freedom are left to
    estimate the noise from."""
    if operator.residual_dof < 1:
        raise NotEnoughData(
            f"criterion={criterion!r} estimates the noise from the residuals and needs "
            "n_samples > rank(X) + 1 (with fit_intercept). Got no residual degrees of freedom."
        )


def rsc_rule(moments, operator):
    """Singular values of the fitted values above ``sigma * sqrt(2 (q + rank(X)))`` (their
    ``mu = 2 S^2 (q + rank(X))``)."""
    check_residual_noise(operator, "rsc")
    s = fitted_spectrum(operator)
    noise_variance = operator.noise_variance()
    n_targets = operator.output_directions.shape[0]
    cut = np.sqrt(noise_variance) * np.sqrt(2 * (n_targets + operator.input_rank))
    return RankReading(int(np.sum(s > cut)), s / np.sqrt(moments.n), cut / np.sqrt(moments.n),
                       "y", noise_variance)
