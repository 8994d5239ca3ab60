"""What a target pass costs: a pure model of pass seconds, fitted once and corrected online.

``CostModel``: seconds of one ragged pass as a function of its total tokens (interpolated from a
table measured at start-up by ``specserve.control.measure``) plus attention work (tokens times
cached keys), times an online correction (the decayed ratio of measured to predicted pass times,
which also shows contention with other programs).  It runs nothing.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, replace

from specserve.averages import decayed
from specserve.control.config import DEFAULTS

LONG_RUN = 16      # a sequence's run of this many tokens in a pass (a prompt chunk) has its own measured attention term


def interp(x: float, xs: list[int], ys: list[float]) -> float:
    """``numpy.interp(x, xs, ys)`` in plain Python, the same arithmetic (a controller asks it several
    times a step, right after a pass, where numpy's call costs more than the arithmetic)."""
    if x <= xs[0]:
        return float(ys[0])
    if x >= xs[-1]:
        return float(ys[-1])
    j = bisect.bisect_right(xs, x) - 1
    slope = (ys[j + 1] - ys[j]) / (xs[j + 1] - xs[j])
    return float(slope * (x - xs[j]) + ys[j])


@dataclass
class CostModel:
    tokens: list[int]             # calibrated pass sizes (total tokens)
    seconds: list[float]          # their measured seconds, at a short context
    per_key: float                # seconds per (token x cached key) of attention
    context: int = 64             # the context the table was measured at
    scale: float = 1.0            # online correction: measured / predicted, decayed average
    observed: int = 0
    per_key_run: float | None = None   # the same for a sequence's run of >= LONG_RUN tokens (a prompt
                                       # chunk: its queries share each key read); None: per_key

    def base(self, m: int) -> float:
        """Seconds of a pass of m tokens at the calibration context (linear beyond the table)."""
        if m <= self.tokens[-1]:
            return interp(m, self.tokens, self.seconds)
        slope = (self.seconds[-1] - self.seconds[-2]) / max(self.tokens[-1] - self.tokens[-2], 1)
        return self.seconds[-1] + slope * (m - self.tokens[-1])

    def raw(self, lengths: list[int], contexts: list[int]) -> float:
        """Seconds of a ragged pass on the machine as calibrated: lengths[b] tokens of a sequence
        holding contexts[b] positions."""
        run = self.per_key if self.per_key_run is None else self.per_key_run
        attention = sum(n * max(c + n - self.context, 0) * (run if n >= LONG_RUN else self.per_key)
                        for n, c in zip(lengths, contexts))
        return self.base(sum(lengths)) + attention

    def predict(self, lengths: list[int], contexts: list[int]) -> float:
        """``raw`` times the online correction: the machine as it has been lately."""
        return self.scale * self.raw(lengths, contexts)

    def observe(self, lengths: list[int], contexts: list[int], seconds: float, weight: float = DEFAULTS.cost_weight,
                clamp: tuple[float, float] = DEFAULTS.cost_ratio) -> None:
        """Fold a measured pass time into the correction factor (``weight`` and ``clamp``:
        ``ControllerConfig.cost_weight`` and ``cost_ratio``)."""
        raw = self.raw(lengths, contexts)
        if raw > 0 and seconds > 0:
            ratio = min(max(seconds / raw, clamp[0]), clamp[1])
            self.scale = decayed(self.scale if self.observed else None, ratio, weight)
            self.observed += 1

    def fresh(self) -> "CostModel":
        """A copy with no online correction yet (each engine corrects its own)."""
        return replace(self, tokens=list(self.tokens), seconds=list(self.seconds), scale=1.0, observed=0)

    def to_json(self) -> dict:
        return {"tokens": list(self.tokens), "seconds": list(self.seconds), "per_key": self.per_key,
                "context": self.context, "per_key_run": self.per_key_run}

    @classmethod
    def from_json(cls, d: dict) -> "CostModel":
        return cls([int(x) for x in d["tokens"]], [float(x) for x in d["seconds"]], float(d["per_key"]),
                   int(d["context"]), per_key_run=None if d.get("per_key_run") is None else float(d["per_key_run"]))

    def describe(self) -> list[str]:
        """Rows for ``specserve profile``: the table and the attention term."""
        out = [f"| {m} | {s * 1e3:.2f} |" for m, s in zip(self.tokens, self.seconds)]
        return ["| tokens in the pass | ms (context %d) |" % self.context, "|---|---|", *out,
                f"attention: {self.per_key * 1e9:.2f} ns per token per cached key beyond {self.context}"
                + (f" ({self.per_key_run * 1e9:.2f} in runs of {LONG_RUN}+ tokens)" if self.per_key_run is not None else "")]
