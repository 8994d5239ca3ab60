"""``Rate``: the one exponentially decayed average the drafters keep (agreement, calibration)."""

from __future__ import annotations


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
