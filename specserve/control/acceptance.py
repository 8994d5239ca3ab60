"""What a draft is worth: acceptance per sequence and per drafter, learnt from verified steps.

Terms: the **gain** of a draft node is the expected number of tokens it adds to its sequence, the
probability that it is accepted: for a chain's d-th token the product of the per-depth acceptance
rates up to d; for a node with a drafter-supplied confidence, that confidence times a calibration
factor learnt from what was accepted.  ``AcceptanceModel`` keeps, per sequence and per drafter,
exponentially decayed counts of acceptance at each depth and of predicted against accepted tokens
for confidence-carrying drafts; a new sequence starts from its drafter's recent history (the
prior), whose weight is bounded and whose calibration is floored (``ControllerConfig.prior_floor``),
so one kind of prompt cannot decide the next kind's draft alone.

Its decayed counts fade as ``specserve.averages`` does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specserve.control.config import DEFAULTS, ControllerConfig


@dataclass
class _Counts:
    """Decayed counts: per depth, trials and acceptances; for confidences, predicted and accepted."""
    trials: list[float] = field(default_factory=list)
    accepted: list[float] = field(default_factory=list)
    predicted_sum: float = 0.0
    accepted_sum: float = 0.0

    def add_depths(self, reached: int, accepted: int, decay: float) -> None:
        """A chain of ``reached`` tokens of which ``accepted`` were accepted: depth d was a trial
        if d <= reached and the d-1 before it were accepted."""
        while len(self.trials) < reached:
            self.trials.append(0.0)
            self.accepted.append(0.0)
        for d in range(min(reached, accepted + 1)):
            self.trials[d] = decay * self.trials[d] + 1.0
            self.accepted[d] = decay * self.accepted[d] + (1.0 if d < accepted else 0.0)

    def add_confidence(self, predicted: float, accepted: int, decay: float) -> None:
        self.predicted_sum = decay * self.predicted_sum + predicted
        self.accepted_sum = decay * self.accepted_sum + accepted


class AcceptanceModel:
    """Acceptance per sequence, with its drafter's recent history as the prior."""

    def __init__(self, config: ControllerConfig = DEFAULTS):
        self.prior_weight, self.decay, self.drafter_decay = config.prior_weight, config.seq_decay, config.drafter_decay
        self.prior_floor = config.prior_floor
        self.initial_rate = config.initial_rate
        self.by_seq: dict[tuple[str, int], _Counts] = {}     # (drafter, seq_id): a merging drafter's parts apart
        self.by_drafter: dict[str, _Counts] = {}

    def forget(self, seq_id: int) -> None:
        for key in [k for k in self.by_seq if k[1] == seq_id]:
            del self.by_seq[key]

    def _rate(self, drafter: str, seq_id: int, d: int) -> float:
        """P(accept depth d+1 | depths 1..d accepted): the sequence's counts, shrunk to the drafter's."""
        prior = self.by_drafter.get(drafter, _Counts())
        p_trials = prior.trials[d] if d < len(prior.trials) else 0.0
        p_acc = prior.accepted[d] if d < len(prior.accepted) else 0.0
        if d and p_trials < 1.0:                       # no history this deep: carry the rate above
            prior_rate = self._rate(drafter, seq_id, d - 1) if p_trials <= 0 else (p_acc + 1.0 * self._rate(
                drafter, seq_id, d - 1)) / (p_trials + 1.0)
        else:
            prior_rate = (p_acc + self.initial_rate) / (p_trials + 1.0)
        own = self.by_seq.get((drafter, seq_id), _Counts())
        o_trials = own.trials[d] if d < len(own.trials) else 0.0
        o_acc = own.accepted[d] if d < len(own.accepted) else 0.0
        return (o_acc + self.prior_weight * prior_rate) / (o_trials + self.prior_weight)

    def chain_gains(self, drafter: str, seq_id: int, k: int) -> list[float]:
        """Gain of each of a chain's first k tokens: products of the per-depth rates."""
        out, p = [], 1.0
        for d in range(k):
            p *= self._rate(drafter, seq_id, d)
            out.append(p)
        return out

    def calibration(self, drafter: str, seq_id: int) -> float:
        """Accepted tokens per unit of drafter confidence (1.0 until something was measured)."""
        prior = self.by_drafter.get(drafter, _Counts())
        # the prior is floored: a drafter that failed on one kind of prompt starts the next request
        # near enough to being kept that its own evidence can decide
        prior_cal = max((prior.accepted_sum + 1.0) / (prior.predicted_sum + 1.0), self.prior_floor)
        own = self.by_seq.get((drafter, seq_id), _Counts())
        return (own.accepted_sum + self.prior_weight * prior_cal) / (own.predicted_sum + self.prior_weight)

    def node_gains(self, drafter: str, seq_id: int, depths: list[int], confidence: list[float] | None) -> list[float]:
        """Gain of every node of a proposal: calibrated confidences, or the chain gains by depth."""
        if confidence is not None:
            c = self.calibration(drafter, seq_id)
            return [min(max(x * c, 0.0), 1.0) for x in confidence]
        by_depth = self.chain_gains(drafter, seq_id, max(depths, default=0))
        return [by_depth[d - 1] for d in depths]

    def observe(self, drafter: str, seq_id: int, reached: int, accepted: int, predicted: float | None) -> None:
        """A verified draft: ``reached`` = its depth, ``accepted`` tokens, ``predicted`` = the sum of
        its calibrated-before-use confidences (None for drafts without confidences)."""
        for counts, decay in ((self.by_seq.setdefault((drafter, seq_id), _Counts()), self.decay),
                              (self.by_drafter.setdefault(drafter, _Counts()), self.drafter_decay)):
            if predicted is None:
                counts.add_depths(reached, accepted, decay)
            else:
                counts.add_confidence(predicted, accepted, decay)
