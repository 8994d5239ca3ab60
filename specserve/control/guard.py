"""The guard: what drafting delivered, measured, against plain steps of the same batch level.

The cost model prices every draft before its pass (``choice``); the guard checks afterwards, from
the step's own clock, whether drafting paid at all, and turns it off where it did not.  Terms:

- a step's **level**: how many sequences it decodes, in powers of two (1, 2-3, 4-7, 8-15, ...),
  since what a plain step costs per token depends on how many rows share its pass;
- its **arm**: ``DRAFT`` (the controller's budgets as planned) or ``PLAIN`` (every ``auto``
  sequence's budget 0; a request that asked for a fixed draft size keeps it);
- its **yield**: tokens committed to its decoding sequences over the step's seconds, drafting,
  sizing, the pass, verification and commit included.  Steps that carry prompt chunks are not
  counted (the chunks' tokens are not decoding's); only steps with an ``auto`` sequence are.

Per level, each arm keeps decayed sums of tokens and seconds (``WEIGHT`` per step); the arm with
the higher yield leads and is taken, and the other is tried once every ``gap`` steps of that level:
the gap starts at ``MIN_GAP``, doubles up to ``MAX_GAP`` each time a trial yields less than the
leader, and falls back to ``MIN_GAP`` when a trial yields more (its arm may be catching up: it is
tried often until its average settles) or changes the leader.  So where drafting is behind, at most
one step in ``MIN_GAP`` (soon one in ``MAX_GAP``) still drafts, and where it is ahead as few are
plain: that is what measuring costs.  A new request's text may draft well where the others did
not, so where plain steps lead, a step with a request new to the guard drafts (a trial) whatever the
gap: one step per request at most.  A level starts with ``WARMUP`` steps of each arm, drafting
first.  Which arm a step takes never changes what it outputs, only how fast.
"""

from __future__ import annotations

from dataclasses import dataclass

DRAFT, PLAIN = "draft", "plain"
WARMUP = 2          # steps of each arm before a level compares them
WEIGHT = 0.1        # of a new step in an arm's decayed tokens and seconds
MIN_GAP = 8         # steps between trials of the trailing arm, at first and after a change of leader
MAX_GAP = 64        # ... at most, while trials confirm the leader


def level(sequences: int) -> int:
    """The batch level of a step decoding ``sequences`` sequences: 1 for 1, 2 for 2-3, 3 for 4-7, ..."""
    return max(sequences, 1).bit_length()


@dataclass
class Arm:
    """Decayed tokens and seconds of one arm's steps at one level."""
    tokens: float = 0.0
    seconds: float = 0.0
    steps: int = 0

    def add(self, tokens: int, seconds: float) -> None:
        keep = 1.0 - WEIGHT if self.steps else 0.0
        self.tokens = keep * self.tokens + tokens
        self.seconds = keep * self.seconds + seconds
        self.steps += 1

    @property
    def rate(self) -> float:
        """Tokens per second."""
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Level:
    """One batch level's arms, its leader, and when the trailing arm is tried next."""
    draft: Arm
    plain: Arm
    leader: str = DRAFT
    gap: int = MIN_GAP
    since: int = 0           # steps since the trailing arm was last tried

    def arm(self, name: str) -> Arm:
        return self.draft if name == DRAFT else self.plain

    def choose(self, fresh: bool = False) -> str:
        """The arm for this level's next step (``fresh``: it holds a request new to the guard)."""
        for name in (DRAFT, PLAIN):
            if self.arm(name).steps < WARMUP:
                return name
        if fresh and self.leader == PLAIN:
            return DRAFT
        return self.trailing() if self.since >= self.gap else self.leader

    def trailing(self) -> str:
        return PLAIN if self.leader == DRAFT else DRAFT

    def observe(self, name: str, tokens: int, seconds: float) -> None:
        self.arm(name).add(tokens, seconds)
        warm = min(self.draft.steps, self.plain.steps)
        if warm < WARMUP:
            return
        if warm == WARMUP and self.arm(name).steps == WARMUP:       # the warm-up's last step: a first leader
            self.leader, self.gap, self.since = self.faster(), MIN_GAP, 0
        elif name == self.leader:
            self.since += 1
        else:                                                       # a trial of the trailing arm
            won = tokens / seconds > self.arm(self.leader).rate
            leader = self.faster()
            self.gap = MIN_GAP if won or leader != self.leader else min(2 * self.gap, MAX_GAP)
            self.leader, self.since = leader, 0

    def faster(self) -> str:
        return DRAFT if self.draft.rate >= self.plain.rate else PLAIN


class Guard:
    """Per batch level, whether the next step drafts (``arm``), learnt from what steps yielded
    (``observe``)."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.levels: dict[int, Level] = {}

    def _level(self, sequences: int) -> Level:
        key = level(sequences)
        if key not in self.levels:
            self.levels[key] = Level(Arm(), Arm())
        return self.levels[key]

    def arm(self, sequences: int, fresh: bool = False) -> str:
        """``DRAFT`` or ``PLAIN`` for a step decoding ``sequences`` sequences, ``fresh`` when one of them
        is new to the guard (always ``DRAFT`` when the guard is off)."""
        return self._level(sequences).choose(fresh) if self.enabled else DRAFT

    def observe(self, sequences: int, arm: str, tokens: int, seconds: float) -> None:
        """A step of ``sequences`` decoding sequences took ``arm`` and committed ``tokens`` in ``seconds``."""
        if self.enabled and seconds > 0:
            self._level(sequences).observe(arm, tokens, seconds)

    def leaders(self) -> dict[int, str]:
        """Each level's (lowest sequence count's) leading arm, for reports."""
        return {1 << (k - 1): lv.leader for k, lv in sorted(self.levels.items())}
