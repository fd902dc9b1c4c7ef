"""Warnings and errors raised by sklearn-ebound."""

__all__ = ["RankEstimationWarning"]


class RankEstimationWarning(UserWarning):
    """A rank was estimated under assumptions the data strain; the answer is uncertain."""
