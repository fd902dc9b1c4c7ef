"""Rank rules: read a rank from solved statistics, as pure functions, one module a criterion.

- :mod:`.dispatch`: :func:`read_rank`, which solves the statistics and calls the rule;
- :mod:`.static_rank_test`: ``"threshold"`` on a static operator, the sequential test of the
  fitted values against the null laws, calibrated by the residual diagnostics;
- :mod:`.threshold`: ``"threshold"`` on ``X`` alone and on the query–key kernel;
- :mod:`.rsc`, :mod:`.cv`, :mod:`.energy`: the other criteria;
- :mod:`.reading`: what every rule returns, :class:`RankReading`;
- :mod:`.caveats`: the attention readings' caveats.

No rule sets state or warns: what the estimator should warn about travels in
``RankReading.caveats``.
"""

from .dispatch import read_rank
from .reading import NotEnoughData, RankReading

__all__ = ["read_rank", "NotEnoughData", "RankReading"]
