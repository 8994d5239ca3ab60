"""The controller: each step's node budgets, the nodes kept, probes, and the compute threads.

It decides from numbers the engine gives it and runs nothing: each running sequence as a ``Slot``
(its drafter's name, the draft size it asked for, its cached context, the tokens it may still
draft), each drafter's declared ``Traits``, the proposals' node gains, and measured seconds.  It
holds no drafter objects and no model.  One step, as the engine calls it:

1. ``plan(slots)``: the probes due and every sequence's node budget, decided once for the step;
2. (the drafters propose within the budgets; ``observe_draft`` gets the seconds they took);
3. ``keep(slots, proposals, plan)``: trims the ``auto`` proposals to the nodes that pay (over the
   whole batch, ``choice.choose``) and returns the predicted pass seconds;
4. ``threads()`` before the pass, ``observe_pass`` after it;
5. ``learn`` per verified sequence, ``forget`` when a sequence ends.

A request with a fixed draft size gets exactly that; ``auto`` requests get, for drafters whose nodes
carry confidences, the drafter's largest draft (trimmed by ``keep``), and for the others the chain
length that maximises the predicted rate beside the rest of the batch (``choice.rate``, the same
rule ``keep`` applies).  A drafter whose drafting costs over ``COSTLY`` of a one-token pass is asked
for about twice what was kept of its last draft (two nodes for a new sequence's first), and for
nothing while its drafts are not kept, except to probe.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specserve.control.acceptance import AcceptanceModel, decayed
from specserve.control.choice import Candidate, ProbeState, choose, rate
from specserve.control.cost import CostModel
from specserve.control.threads import ThreadGovernor

AUTO = "auto"           # a request's draft size when the controller chooses it each step
COSTLY = 0.05           # drafting this share of a one-token pass is worth doing only when kept
DRAFT_WEIGHT = 0.2      # of a new measurement in a drafter's decayed seconds per proposal


@dataclass(frozen=True)
class Traits:
    """What a drafter declares about itself (``specserve.drafters.base.Drafter``)."""
    max_auto_draft: int           # the largest draft (node budget) ``auto`` may choose
    confidence: bool              # proposals carry per-node confidences (then trimmed by ``keep``)


@dataclass(frozen=True)
class Slot:
    """A decoding sequence as the controller sees it."""
    seq_id: int
    drafter: str
    num_draft: int | str          # a number, or AUTO
    context: int                  # positions cached before this step
    depth: int                    # deepest node it may draft (tokens still to generate - 1)

    @property
    def auto(self) -> bool:
        return self.num_draft == AUTO


@dataclass
class StepPlan:
    """What ``plan`` decided for one step."""
    budgets: dict[int, int]                        # seq_id -> node budget to ask its drafter for
    probed: set[int] = field(default_factory=set)  # auto sequences whose best node is kept anyway


class Controller:
    def __init__(self, traits: dict[str, Traits], cost: CostModel, max_draft: int, thread_choices: tuple[int, ...]):
        self.traits, self.cost, self.max_draft = traits, cost, max_draft
        self.acceptance = AcceptanceModel()
        self.probes: dict[int, ProbeState] = {}
        self.drafter_gap: dict[str, int] = {}      # a new sequence's first probe gap: its drafter's latest
        self.draft_s: dict[str, float] = {}        # decayed seconds per proposal, per drafter
        self.kept: dict[int, int] = {}             # nodes kept of each auto sequence's last draft
        self.governor = ThreadGovernor(thread_choices) if len(thread_choices) > 1 else None

    # ------------------------------------------------------------------ 1. plan
    def plan(self, slots: list[Slot]) -> StepPlan:
        """The step's probes and node budgets."""
        probed = {s.seq_id for s in slots if s.auto and self.probe(s).due()}
        budgets = {s.seq_id: self._budget(s, slots, s.seq_id in probed) if s.depth else 0 for s in slots}
        return StepPlan(budgets, probed)

    def _budget(self, s: Slot, batch: list[Slot], probe: bool) -> int:
        if not s.auto:
            return int(s.num_draft)
        traits = self.traits[s.drafter]
        top = min(traits.max_auto_draft, self.max_draft)
        if traits.confidence or not top:
            kept = self.kept.get(s.seq_id)
            if top and kept is None and self._costly(s):
                return min(top, 2)                        # a new sequence: a small first look
            if top and kept == 0 and self._costly(s):
                return min(top, 2) if probe else 0        # not kept last time: small, and only to probe
            if kept and self._costly(s):
                return min(top, 2 * kept + 2)             # near what was kept last
            return top
        return max(self._best_chain(s, batch, min(top, s.depth)), 1 if probe else 0)

    def _best_chain(self, s: Slot, batch: list[Slot], top: int) -> int:
        """The chain length that maximises the step's predicted rate, the rest of ``batch`` (every
        decoding sequence, ``s`` among them) feeding its pending token only."""
        gains = self.acceptance.chain_gains(s.drafter, s.seq_id, top)
        contexts = [o.context for o in batch]
        mine = next(i for i, o in enumerate(batch) if o.seq_id == s.seq_id)
        drafting = self.draft_s.get(s.drafter, 0.0)

        def step_rate(n: int) -> float:
            lengths = [1 + (n if i == mine else 0) for i in range(len(batch))]
            return rate(len(batch) + sum(gains[:n]), self.cost.predict(lengths, contexts), drafting if n else 0.0)
        rates = [step_rate(n) for n in range(len(gains) + 1)]
        return max(range(len(rates)), key=lambda n: (rates[n], -n))

    def probe(self, s: Slot) -> ProbeState:
        """A new sequence waits as long as its drafter's last probe did, so a drafter that keeps
        failing is not probed afresh by every new request."""
        state = self.probes.get(s.seq_id)
        if state is None:
            state = self.probes[s.seq_id] = ProbeState(gap=self.drafter_gap.get(s.drafter, ProbeState.gap))
        return state

    def _costly(self, s: Slot) -> bool:
        return self.draft_s.get(s.drafter, 0.0) > COSTLY * self.cost.predict([1], [s.context])

    # ------------------------------------------------------------------ 2. drafting's cost
    def observe_draft(self, drafter: str, seconds: float, proposals: int) -> None:
        """A drafter's ``propose`` call took ``seconds`` for ``proposals`` non-empty requests."""
        if proposals:
            self.draft_s[drafter] = decayed(self.draft_s.get(drafter), seconds / proposals, DRAFT_WEIGHT)

    # ------------------------------------------------------------------ 3. keep
    def keep(self, slots: list[Slot], proposals: dict, plan: StepPlan) -> float | None:
        """Trim the auto proposals (``seq_id -> DraftProposal``, replaced in place) to the nodes the
        rate rule keeps; the predicted pass seconds (None when no sequence is auto)."""
        if not any(s.auto for s in slots):
            return None
        cands = []
        for s in slots:
            prop = proposals[s.seq_id]
            gains = self.acceptance.node_gains(s.drafter, s.seq_id, prop.depths(), prop.trim_confidence())
            if prop.future_gain is not None:                  # worth in later steps (never calibrated)
                gains = [g + f for g, f in zip(gains, prop.future_gain)]
            cands.append(Candidate(s.seq_id, s.context, gains, prop.parent_list(), fixed=not s.auto,
                                   probe=s.seq_id in plan.probed, draft_s=self.draft_s.get(s.drafter, 0.0)))
        keep, predicted = choose(cands, self.cost)
        for s in slots:
            if s.auto:
                if len(proposals[s.seq_id]):
                    self.kept[s.seq_id] = len(keep[s.seq_id])
                proposals[s.seq_id] = proposals[s.seq_id].subset(keep[s.seq_id])
        return predicted

    # ------------------------------------------------------------------ 4. the pass
    def threads(self) -> int:
        """The thread count for this step's pass (0: the runtime cannot switch)."""
        return self.governor.next() if self.governor is not None else 0

    def observe_pass(self, threads: int, lengths: list[int], contexts: list[int], seconds: float) -> None:
        """A measured decoding pass (no prompt chunks): into the cost model's correction and the governor."""
        if threads and self.governor is not None:
            self.governor.observe(threads, seconds / self.cost.raw(lengths, contexts))
        self.cost.observe(lengths, contexts, seconds)

    # ------------------------------------------------------------------ 5. learning
    def learn(self, s: Slot, tokens: int, depth: int, accepted: int, confidence: float | None, plan: StepPlan) -> None:
        """A verified draft of ``tokens`` nodes reaching ``depth``, of which ``accepted`` were
        accepted; ``confidence``: the sum of its nodes' confidences (None: it carried none)."""
        if tokens:
            self.acceptance.observe(s.drafter, s.seq_id, depth, accepted, confidence)
        if s.auto:
            state = self.probe(s)
            probed = s.seq_id in plan.probed
            state.update(tokens, accepted, probed)
            if probed:
                self.drafter_gap[s.drafter] = state.gap

    def forget(self, seq_id: int) -> None:
        self.acceptance.forget(seq_id)
        self.probes.pop(seq_id, None)
        self.kept.pop(seq_id, None)
