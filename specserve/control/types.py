"""What the engine and the controller hand each other: a drafter's ``Traits``, a decoding sequence
as the controller sees it (``SeqView``), and a step's decisions (``StepPlan``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from specserve.control.guard import PLAIN
from specserve.limits import AUTO_SIZE


@dataclass(frozen=True)
class Traits:
    """What a drafter declares about itself (``specserve.drafters.base.Drafter``)."""
    max_auto_draft: int           # the largest draft (node budget) the controller may choose
    confidence: bool              # proposals carry per-node confidences (then trimmed by ``keep``)
    parts: tuple[str, ...] = ()   # a merging drafter's parts (each one's Traits under ``part_key``)


@dataclass(frozen=True)
class SeqView:
    """A decoding sequence as the controller sees it."""
    seq_id: int
    drafter: str
    num_draft: int | str          # a number, or AUTO_SIZE
    context: int                  # positions cached before this step
    depth: int                    # deepest node it may draft (tokens still to generate - 1)

    @property
    def auto_size(self) -> bool:
        """The controller chooses this sequence's draft size each step."""
        return self.num_draft == AUTO_SIZE


@dataclass
class StepPlan:
    """What ``Controller.plan`` decided for one step."""
    budgets: dict[int, int]                        # seq_id -> node budget to ask its drafter for
    probed: set[int] = field(default_factory=set)  # auto-sized sequences whose best node is kept anyway
    parts: dict[int, dict[str, int]] = field(default_factory=dict)     # a merging drafter's budget per part
    part_probes: set[tuple[int, str]] = field(default_factory=set)     # (seq_id, part): that part's best
                                                                         # node is kept anyway
    arm: str | None = None         # the guard's arm (``guard.DRAFT`` or ``PLAIN``); None: no auto-sized sequence

    def resting(self, view: "SeqView") -> bool:
        """The guard took plain decoding for this step and ``view``'s draft size is the controller's: its
        drafter is not asked, and nothing is kept or learnt for it (the step is plain decoding's)."""
        return self.arm == PLAIN and view.auto_size
