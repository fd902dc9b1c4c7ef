"""``criterion="energy"``: the energy rank, and the energy cap of approximate models."""

from dataclasses import replace

from .._spectrum import energy_rank
from .reading import RankReading

__all__ = ["energy_rule", "cap_by_energy"]


def energy_rule(s, tau, unit="y", spectrum=None, noise_variance=None):
    """Energy rank of ``s`` at level ``tau``: a descriptor, not noise-adaptive. ``spectrum``
    (default ``s``) is the spectrum reported beside it."""
    rank = energy_rank(s, tau) if s.size else 0
    return RankReading(int(rank), s if spectrum is None else spectrum, None, unit,
                       noise_variance)


def cap_by_energy(reading, s, tau):
    """Cap the rank by the energy rank, at ``tau``, of the directions that passed.

    Where the model is only approximate (softmax, or an unknown value map at finite ``n``)
    its error is a systematic, signal-proportional term rather than noise. The energy of the
    directions that passed the noise test is used: the noise's own energy in the other
    directions would otherwise loosen the cap as the noise grows.
    """
    signal = s[: reading.rank]
    if not (signal.size and signal[0] > 0):
        return reading
    return replace(reading, rank=int(min(reading.rank, energy_rank(signal, tau))))
