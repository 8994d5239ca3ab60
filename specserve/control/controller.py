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
rule ``keep`` applies).  A drafter whose drafting costs over ``COSTLY`` of a sequence's share of the
step's pass (alone: a one-token pass; under load: the batch's pass over its sequences) is asked
for about twice what was kept of its last draft (two nodes for a new sequence's first, unless its
drafter's recent probes failed), and for nothing while its drafts are not kept, except to probe.
Every drafter is asked that way in a **crowded** step, one where a drafted node would cost more than
``CROWDED`` of a sequence's share of the pass: there only near-certain nodes pay, so a sequence
whose drafts are not kept stops drafting (and the step stops paying for drafting, merging, pricing
and feedback that buy nothing) until its drafts are kept again or a probe finds they would be.

A **merging** drafter (``auto``: its ``Traits.parts``) is seen part by part, each part priced and
probed as a drafter of its own, never probed as a whole (``specserve.control.parts``, where every
part rule is).

What a new sequence inherits is bounded: its probe gap starts at its drafter's latest, at most
``INHERITED_GAP``, and its calibration prior is floored (``AcceptanceModel``), so one kind of
prompt never switches a drafter off for the next kind.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specserve.averages import decayed
from specserve.control.acceptance import AcceptanceModel
from specserve.control.choice import Candidate, ProbeState, choose, rate
from specserve.control.cost import CostModel
from specserve.control.guard import DRAFT, PLAIN, Guard
from specserve.control.parts import PartPricing
from specserve.control.threads import ThreadGovernor

AUTO = "auto"           # a request's draft size when the controller chooses it each step
COSTLY = 0.05           # drafting this share of a one-token pass is worth doing only when kept
CROWDED = 0.75          # a drafted node costing this share of a sequence's share of the pass: drafts only when kept
DRAFT_WEIGHT = 0.2      # of a new measurement in a drafter's decayed seconds per proposal
FORCED_PRIOR = 0.9      # a drafter label's forced-node acceptance (parent accepted) before any is verified
FORCED_WEIGHT = 0.05    # of one verified forced node in that decayed rate
INHERITED_GAP = 16      # the longest probe gap a new sequence starts with
PROBE_SHARE = 0.02      # a probe waits until its drafting costs at most this share of the steps since the last


@dataclass(frozen=True)
class Traits:
    """What a drafter declares about itself (``specserve.drafters.base.Drafter``)."""
    max_auto_draft: int           # the largest draft (node budget) ``auto`` may choose
    confidence: bool              # proposals carry per-node confidences (then trimmed by ``keep``)
    parts: tuple[str, ...] = ()   # a merging drafter's parts (each one's Traits under ``part_key``)


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
    parts: dict[int, dict[str, int]] = field(default_factory=dict)     # a merging drafter's budget per part
    part_probes: set[tuple[int, str]] = field(default_factory=set)     # (seq_id, part): that part's best
                                                                         # node is kept anyway
    arm: str | None = None         # the guard's arm (``guard.DRAFT`` or ``PLAIN``); None: no auto sequence


def forced_gains(prop, gains: list[float], rate: float = 1.0) -> list[float]:
    """Gains with the forced nodes' (``DraftProposal.forced``) set: the grammar fixes the text there, so a
    forced node is accepted when its parent is unless the target spells that text with other tokens:
    it is priced at its parent's gain (1 below the pending token) times ``rate``, the share of forced
    nodes accepted where their parent was (``Controller.forced_rate``)."""
    if not prop.forced:
        return gains
    out, parents = list(gains), prop.parent_list()
    for n in range(prop.own, len(prop)):
        out[n] = (out[parents[n]] if parents[n] >= 0 else 1.0) * rate
    return out


class Controller:
    def __init__(self, traits: dict[str, Traits], cost: CostModel, max_draft: int, thread_choices: tuple[int, ...],
                 guard: bool = True):
        self.traits, self.cost, self.max_draft = traits, cost, max_draft
        self.guard = Guard(guard)                  # whether drafting pays at all, measured per batch level
        self.acceptance = AcceptanceModel()
        self.probes: dict[tuple[int, str], ProbeState] = {}   # (seq_id, drafter or part key)
        self.drafter_gap: dict[str, int] = {}      # a new sequence's first probe gap: its drafter's latest
        self.draft_s: dict[str, float] = {}        # decayed seconds per proposal, per drafter (and part)
        self.forced: dict[str, float] = {}         # decayed forced-node acceptance, per drafter (``forced_rate``)
        self.kept: dict[tuple[int, str], int] = {} # nodes kept of each auto sequence's last draft (per part:
                                                   # its nodes, or 0 when what it added did not pay)
        self.governor = ThreadGovernor(thread_choices) if len(thread_choices) > 1 else None
        self._share: float | None = None           # this step's pass seconds per sequence (``_unit``)
        self.crowded = False                       # this step is crowded (``crowding``)
        self.parts = PartPricing(self)             # a merging drafter's parts, each priced as a drafter

    # ------------------------------------------------------------------ 1. plan
    def plan(self, slots: list[Slot]) -> StepPlan:
        """The step's probes and node budgets."""
        self._share = (self.cost.predict([1] * len(slots), [s.context for s in slots]) / len(slots)) if slots else None
        self.crowded = bool(slots) and self.crowding(slots, self._share) > CROWDED
        arm = self.guard.arm(len(slots)) if any(s.auto for s in slots) else None
        plan = StepPlan({}, {s.seq_id for s in slots             # a merging drafter's parts probe one by one
                             if s.auto and arm == DRAFT and not self.parts.parts(s) and self._due(s, s.drafter)},
                        arm=arm)
        for s in slots:
            if not s.depth or (s.auto and arm == PLAIN):
                plan.budgets[s.seq_id] = 0
            elif self.parts.parts(s):
                plan.budgets[s.seq_id] = self.parts.budgets(s, slots, plan)
            else:
                plan.budgets[s.seq_id] = self._budget(s, s.drafter, slots, s.seq_id in plan.probed)
        return plan

    def _budget(self, s: Slot, key: str, batch: list[Slot], probe: bool) -> int:
        if not s.auto:
            return int(s.num_draft)
        traits = self.traits[key]
        top = min(traits.max_auto_draft, self.max_draft)
        if traits.confidence or not top:
            kept = self._kept(s, key)
            sparing = top and self.sparing(key, s)
            if sparing and kept is None:
                return min(top, 2)                        # a new sequence: a small first look
            if sparing and kept == 0:
                return min(top, 2) if probe else 0        # not kept last time: small, and only to probe
            if sparing:
                return min(top, 2 * kept + 2)             # near what was kept last
            return top
        return max(self._best_chain(s, key, batch, min(top, s.depth)), 1 if probe else 0)

    def _kept(self, s: Slot, key: str) -> int | None:
        """Nodes kept of the sequence's last draft by ``key`` (None: it has not drafted yet).  A new
        sequence of a drafter whose recent probes failed (its probe gap grew) starts as unkept: it
        drafts only when its first probe is due, instead of paying for a first look every request."""
        kept = self.kept.get((s.seq_id, key))
        if kept is None and self.drafter_gap.get(key, ProbeState.gap) > ProbeState.gap:
            return 0
        return kept

    def _best_chain(self, s: Slot, key: str, batch: list[Slot], top: int) -> int:
        """The chain length that maximises the step's predicted rate, the rest of ``batch`` (every
        decoding sequence, ``s`` among them) feeding its pending token only."""
        gains = self.acceptance.chain_gains(key, s.seq_id, top)
        contexts = [o.context for o in batch]
        mine = next(i for i, o in enumerate(batch) if o.seq_id == s.seq_id)
        drafting = self.draft_s.get(key, 0.0)

        def step_rate(n: int) -> float:
            lengths = [1 + (n if i == mine else 0) for i in range(len(batch))]
            return rate(len(batch) + sum(gains[:n]), self.cost.predict(lengths, contexts), drafting if n else 0.0)
        rates = [step_rate(n) for n in range(len(gains) + 1)]
        return max(range(len(rates)), key=lambda n: (rates[n], -n))

    def probe(self, s: Slot, key: str | None = None) -> ProbeState:
        """A sequence's probe state for its drafter (or one of its parts, ``key``).  A new sequence
        waits as long as its drafter's last probe did, up to ``INHERITED_GAP``, so a drafter that
        keeps failing is not probed afresh by every new request, nor switched off for the next kind."""
        key = key or s.drafter
        state = self.probes.get((s.seq_id, key))
        if state is None:
            gap = min(self.drafter_gap.get(key, ProbeState.gap), INHERITED_GAP)
            state = self.probes[(s.seq_id, key)] = ProbeState(gap=gap)
        return state

    def _due(self, s: Slot, key: str) -> bool:
        """A probe is due: its gap has passed, and enough steps for its drafting to cost at most
        ``PROBE_SHARE`` of them (a learned head's probe costs a good part of a pass)."""
        state = self.probe(s, key)
        floor = self.draft_s.get(key, 0.0) / (PROBE_SHARE * self._unit(s))
        return state.due() and state.idle >= floor

    def _unit(self, s: Slot) -> float:
        """What one sequence's row of this step's pass costs: the predicted seconds of a pass of the
        batch's pending tokens, shared out per sequence (alone: a one-token pass).  Drafting is
        costly, and probes are spaced, against that: under load a row's share shrinks."""
        if self._share is None:
            self._share = self.cost.predict([1], [s.context])
        return self._share

    def _costly(self, key: str, s: Slot) -> bool:
        return self.draft_s.get(key, 0.0) > COSTLY * self._unit(s)

    def sparing(self, key: str, s: Slot) -> bool:
        """``key`` drafts for ``s`` only near what was kept of its last draft (and to probe): its
        drafting is costly, or the step is crowded."""
        return self.crowded or self._costly(key, s)

    def crowding(self, slots: list[Slot], share: float | None = None) -> float:
        """What one more drafted token would add to the batch's pass (every sequence feeding its
        pending token), over the pass's seconds per sequence (``share``, when already predicted); a
        node at the batch's mean context, priced as a sequence of its own (the same weights' share, and
        attention over that context)."""
        contexts = [s.context for s in slots]
        alone = share * len(slots) if share is not None else self.cost.predict([1] * len(slots), contexts)
        more = self.cost.predict([1] * (len(slots) + 1), contexts + [sum(contexts) // len(contexts)])
        return (more - alone) / (alone / len(slots)) if alone > 0 else 0.0

    # ------------------------------------------------------------------ 2. drafting's cost
    def observe_draft(self, drafter: str, seconds: float, proposals: int) -> None:
        """A drafter's (or part's) ``propose`` call took ``seconds`` for ``proposals`` non-empty requests."""
        if proposals:
            self.draft_s[drafter] = decayed(self.draft_s.get(drafter), seconds / proposals, DRAFT_WEIGHT)

    # ------------------------------------------------------------------ 3. keep
    def keep(self, slots: list[Slot], proposals: dict, plan: StepPlan) -> float | None:
        """Trim the auto proposals (``seq_id -> DraftProposal``, replaced in place) to the nodes the
        rate rule keeps; the predicted pass seconds (None when no sequence is auto)."""
        if not any(s.auto for s in slots):
            return None
        cands, merged = [], {}
        for s in slots:
            prop = proposals[s.seq_id]
            if self.parts.merged(s, prop):
                merged[s.seq_id] = by_part = self.parts.gains(s, prop)
                cands.append(self.parts.candidate(s, prop, by_part, plan))
                continue
            gains = self.acceptance.node_gains(s.drafter, s.seq_id, prop.depths(), prop.trim_confidence())
            if prop.future_gain is not None:                  # worth in later steps (never calibrated)
                gains = [g + f for g, f in zip(gains, prop.future_gain)]
            cands.append(Candidate(s.seq_id, s.context, self.gains_with_forced(s, prop, gains),
                                   prop.parent_list(), fixed=not s.auto, probe=s.seq_id in plan.probed,
                                   draft_s=self.draft_s.get(s.drafter, 0.0), own=prop.own))
        keep, predicted = choose(cands, self.cost)
        step_rate = rate(len(cands) + sum(sum(c.gains[n] for n in keep[c.seq_id]) for c in cands), predicted,
                         sum(c.draft_s for c in cands if any(n < c.own for n in keep[c.seq_id])))
        for s in slots:
            if not s.auto:
                continue
            own = proposals[s.seq_id].own
            if own:
                self.kept[(s.seq_id, s.drafter)] = sum(1 for n in keep[s.seq_id] if n < own)
            if s.seq_id in merged:
                self.parts.kept(s, merged[s.seq_id], keep[s.seq_id], plan, step_rate)
            proposals[s.seq_id] = proposals[s.seq_id].subset(keep[s.seq_id])
        return predicted

    def gains_with_forced(self, s: Slot, prop, gains: list[float]) -> list[float]:
        """``gains`` with the grammar's forced nodes priced (``forced_gains``) at ``s``'s drafter's rate."""
        return forced_gains(prop, gains, self.forced_rate(s.drafter))

    # ------------------------------------------------------------------ 4. the pass
    def threads(self) -> int:
        """The thread count for this step's pass (0: the runtime cannot switch)."""
        return self.governor.next() if self.governor is not None else 0

    def observe_pass(self, threads: int, lengths: list[int], contexts: list[int], seconds: float) -> None:
        """A measured decoding pass (no prompt chunks): into the cost model's correction and the governor."""
        if threads and self.governor is not None:
            self.governor.observe(threads, seconds / self.cost.raw(lengths, contexts))
        self.cost.observe(lengths, contexts, seconds)

    def observe_step(self, plan: StepPlan, sequences: int, tokens: int, seconds: float) -> None:
        """A step without prompt chunks committed ``tokens`` to its ``sequences`` decoding sequences in
        ``seconds`` (its whole wall time): into the guard, under the arm ``plan`` took."""
        if plan.arm is not None:
            self.guard.observe(sequences, plan.arm, tokens, seconds)

    # ------------------------------------------------------------------ 5. learning
    def learn(self, s: Slot, prop, path: list[int], plan: StepPlan) -> None:
        """A verified draft ``prop`` (what the pass ran) of which the nodes ``path`` were accepted;
        what the drafter is judged by is its own nodes (not the forced ones a grammar added, which
        teach ``forced_rate``)."""
        self._learn_forced(s.drafter, prop, path)
        prop, path = prop.drafted(path)
        conf = prop.trim_confidence()
        if self.parts.merged(s, prop):
            self.parts.learn(s, prop, path, plan)
        elif len(prop):
            self.acceptance.observe(s.drafter, s.seq_id, prop.depth, len(path), None if conf is None else sum(conf))
        if s.auto and not self.parts.parts(s):          # a merging drafter's probes are its parts' (``plan``)
            state = self.probe(s)
            probed = s.seq_id in plan.probed
            state.update(len(prop), len(path), probed)
            if probed:
                self.drafter_gap[s.drafter] = state.gap

    def forced_rate(self, drafter: str) -> float:
        """The share of forced nodes the target accepted where it accepted their parent (decayed), for
        ``drafter``'s sequences: how often it spells forced text as the engine drafted it."""
        return self.forced.get(drafter, FORCED_PRIOR)

    def _learn_forced(self, drafter: str, prop, path: list[int]) -> None:
        on, parents = set(path), prop.parent_list()
        for n in range(prop.own, len(prop)):
            if parents[n] < 0 or parents[n] in on:
                self.forced[drafter] = decayed(self.forced_rate(drafter), float(n in on), FORCED_WEIGHT)

    def forget(self, seq_id: int) -> None:
        self.acceptance.forget(seq_id)
        for table in (self.probes, self.kept):
            for k in [k for k in table if k[0] == seq_id]:
                del table[k]
