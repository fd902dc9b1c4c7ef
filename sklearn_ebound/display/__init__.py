"""Display objects for the Entropic Bound, in the manner of scikit-learn's displays.

Each display has a ``from_...`` class method that computes (or takes) the numbers and a
``plot(ax=None, ...)`` method that draws them and stores ``ax_`` and ``figure_``. matplotlib
is imported only when drawing; install it with ``pip install "sklearn-ebound[plot]"``.
"""

from ._frontier import FrontierDisplay
from ._heads import (
    CompressionFrontierDisplay,
    HeadDeficiencyDisplay,
    HeadRankDisplay,
    HeadSpectrumDisplay,
)
from ._spectrum import SpectrumDisplay
from ._sweep import RankSweepDisplay

__all__ = [
    "RankSweepDisplay",
    "SpectrumDisplay",
    "FrontierDisplay",
    "HeadRankDisplay",
    "HeadSpectrumDisplay",
    "HeadDeficiencyDisplay",
    "CompressionFrontierDisplay",
]
