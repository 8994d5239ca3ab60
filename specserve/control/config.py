"""Every tuning number of the controller, once: ``ControllerConfig``.

The controller (``specserve.control.controller``) and its helpers (part pricing, probes, the
acceptance model, the thread governor, the cost model's online correction) read their numbers from
one instance, given to ``Controller`` (``DEFAULTS`` where none is given).  The docs link here
instead of restating the numbers.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ControllerConfig:
    """The controller's tuning numbers, each with what it decides."""

    # ------------------------------------------------------------------ budgets: when drafting is spared
    costly: float = 0.05
    """A drafter (or a part) is **costly** when its seconds per proposal exceed this share of a
    sequence's share of the step's pass (alone: a one-token pass); a costly drafter drafts only near
    what was kept of its last draft, and to probe."""

    crowded: float = 0.75
    """A step is **crowded** when one more drafted token would add more than this share of a
    sequence's share of the pass; there every drafter drafts as a costly one does."""

    first_look: int = 2
    """Nodes a sparing (costly, or crowded) drafter is asked for at a new sequence's first step, and
    when it probes after its drafts were not kept."""

    regrow_factor: int = 2
    """A sparing drafter whose last draft had n nodes kept is asked next for at most
    ``regrow_factor * n + regrow_margin`` nodes."""

    regrow_margin: int = 2
    """See ``regrow_factor``."""

    # ------------------------------------------------------------------ probes
    probe_gap: int = 8
    """Steps a sequence whose drafts are not kept waits before it is probed (its best node kept
    anyway); the gap after a probe whose node was accepted."""

    max_probe_gap: int = 128
    """The longest wait between probes: the gap doubles after each failed probe up to this."""

    inherited_gap: int = 16
    """The longest probe gap a new sequence starts with (it inherits its drafter's latest gap), so one
    kind of prompt never switches a drafter off for the next kind."""

    probe_share: float = 0.02
    """A probe waits until its drafting costs at most this share of the steps since the last one (a
    learned head's probe costs a good part of a pass)."""

    # ------------------------------------------------------------------ learning: decayed averages
    draft_weight: float = 0.2
    """Weight of a new measurement in a drafter's decayed seconds per proposal."""

    forced_prior: float = 0.9
    """A drafter label's acceptance of a grammar's forced nodes (where their parent was accepted)
    before any is verified."""

    forced_weight: float = 0.05
    """Weight of one verified forced node in that decayed rate."""

    cost_weight: float = 0.2
    """Weight of one measured pass in the cost model's online correction (measured / predicted)."""

    cost_ratio: tuple[float, float] = (0.1, 20.0)
    """One pass's measured / predicted ratio is clamped to this range before it enters the correction."""

    # ------------------------------------------------------------------ acceptance (``AcceptanceModel``)
    prior_weight: float = 3.0
    """Weight, in verified drafts, of a drafter's recent history in a sequence's acceptance."""

    seq_decay: float = 0.9
    """Decay per verified draft of a sequence's own acceptance counts."""

    drafter_decay: float = 0.98
    """Decay per verified draft of a drafter's counts (the prior of its new sequences)."""

    initial_rate: float = 0.5
    """Acceptance at a depth a drafter has no history of."""

    prior_floor: float = 0.2
    """The least calibration (accepted tokens per unit of confidence) a new sequence inherits, so
    its own evidence can decide."""

    # ------------------------------------------------------------------ threads (``ThreadGovernor``)
    thread_look_every: int = 24
    """Steps between looks at the other thread count."""

    thread_rare: int = 4
    """A look at a count measured over ``thread_rare_gap`` times slower, from the default count,
    waits this many times longer."""

    thread_rare_gap: float = 1.4
    """See ``thread_rare``."""

    thread_burst: int = 2
    """Passes a look runs; only the last counts (the first pays for waking or parking threads)."""

    thread_weight: float = 0.3
    """Weight of a pass in the current count's decayed measured / calibrated ratio."""

    thread_switch: float = 0.9
    """The governor moves to another count when its ratio is below this times the current one's."""


DEFAULTS = ControllerConfig()
