"""Exponentially decayed averages: the two forms every layer uses, so old evidence fades one way.

* ``decayed(old, new, weight)``: the running average of a value (a cost, a rate of seconds, a
  share), each new observation given ``weight``; the controller's costs and the thread governor.
* ``Rate``: a decayed success rate with a prior, (successes + prior x weight) / (trials + weight),
  every observation first multiplying the sums so far by ``decay``; the drafters' agreement and
  calibration counts.
"""

from __future__ import annotations


def decayed(old: float | None, new: float, weight: float) -> float:
    """The decayed average after observing ``new`` with ``weight`` (the first observation: itself)."""
    return new if old is None else (1 - weight) * old + weight * new


class Rate:
    """A decayed success rate with a prior: (successes + prior x weight) / (trials + weight).

    Every ``add`` first multiplies the sums so far by ``decay``, so old evidence fades; with no
    evidence the value is the prior."""

    def __init__(self, prior: float, weight: float = 4.0, decay: float = 0.995):
        self.prior, self.weight, self.decay = prior, weight, decay
        self.hits = self.trials = 0.0

    def add(self, hits: float, trials: float) -> None:
        self.hits = self.decay * self.hits + hits
        self.trials = self.decay * self.trials + trials

    @property
    def value(self) -> float:
        return (self.hits + self.prior * self.weight) / (self.trials + self.weight)
