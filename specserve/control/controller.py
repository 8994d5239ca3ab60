"""The controller: each step's node budgets, the nodes kept, probes, and the compute threads.

It decides from numbers the engine gives it and runs nothing: each decoding sequence as a ``SeqView``
(its drafter's name, the draft size it asked for, its cached context, the tokens it may still
draft), each drafter's declared ``Traits``, the proposals' node gains, and measured seconds.  It
holds no drafter objects and no model.  Its tuning numbers are one ``ControllerConfig``
(``specserve.control.config``).  One step, numbered as the engine's phases (``Engine.step``):

2. ``plan(views)``: the probes due and every sequence's node budget, decided once for the step
   (phase 1 builds the views);
3. (the drafters propose within the budgets; ``observe_draft`` gets the seconds they took);
4. ``keep(views, proposals, plan)``: trims the auto-sized proposals to the nodes that pay (over the
   whole batch, ``choice.choose``) and returns the predicted pass seconds;
7. ``threads()`` before the pass, ``observe_pass`` after it;
10. ``observe_step`` (the step's yield, into the ``guard``) and ``learn`` per verified sequence;
    ``forget`` when a sequence ends (11).

A request with a fixed draft size gets exactly that; auto-sized requests (``AUTO_SIZE``) get, for
drafters whose nodes carry confidences, the drafter's largest draft (trimmed by ``keep``), and for
the others the chain length that maximises the predicted rate beside the rest of the batch
(``choice.rate``, the same rule ``keep`` applies).  A **costly** drafter (``ControllerConfig.costly``:
its drafting costs a large share of a sequence's share of the step's pass; alone: a one-token pass;
under load: the batch's pass over its sequences) is asked for a little more than what was kept of
its last draft (a small first look for a new sequence's first, unless its drafter's recent probes
failed), and for nothing while its drafts are not kept, except to probe.  Every drafter is asked
that way in a **crowded** step (``ControllerConfig.crowded``), one where a drafted node would cost a
large share of a sequence's share of the pass: there only near-certain nodes pay, so a sequence
whose drafts are not kept stops drafting (and the step stops paying for drafting, merging, pricing
and feedback that buy nothing) until its drafts are kept again or a probe finds they would be.

A **merging** drafter (``auto``: its ``Traits.parts``) is seen part by part, each part priced and
probed as a drafter of its own, never probed as a whole (``specserve.control.parts``, where every
part rule is).

What a new sequence inherits is bounded: its probe gap starts at its drafter's latest, at most
``ControllerConfig.inherited_gap`` (``choice.DraftHistory``), and its calibration prior is floored
(``AcceptanceModel``), so one kind of prompt never switches a drafter off for the next kind.
"""

from __future__ import annotations

from specserve.averages import decayed
from specserve.control.acceptance import AcceptanceModel
from specserve.control.choice import Candidate, DraftHistory, ProbeState, choose, rate
from specserve.control.config import DEFAULTS, ControllerConfig
from specserve.control.cost import CostModel
from specserve.control.guard import DRAFT, PLAIN, Guard
from specserve.control.parts import PartPricing
from specserve.control.threads import ThreadGovernor
from specserve.control.types import SeqView, StepPlan, Traits


def forced_gains(prop, gains: list[float], rate: float = 1.0) -> list[float]:
    """Gains with the forced nodes' (``DraftProposal.forced``) set: the grammar fixes the text there, so a
    forced node is accepted when its parent is unless the target spells that text with other tokens:
    it is priced at its parent's gain (1 below the pending token) times ``rate``, the share of forced
    nodes accepted where their parent was (``Controller.forced_rate``)."""
    if not prop.forced:
        return gains
    out, parents = list(gains), prop.parent_list()
    for n in range(prop.drafter_nodes, len(prop)):
        out[n] = (out[parents[n]] if parents[n] >= 0 else 1.0) * rate
    return out


class Controller:
    def __init__(self, traits: dict[str, Traits], cost: CostModel, max_draft: int, thread_choices: tuple[int, ...],
                 config: ControllerConfig = DEFAULTS, guard: bool = True):
        self.traits, self.cost, self.max_draft, self.config = traits, cost, max_draft, config
        self.guard = Guard(guard)                  # whether drafting pays at all, measured per batch level
        self._guarded: set[int] = set()            # auto-sized sequences the guard has seen (``plan``)
        self.acceptance = AcceptanceModel(config)
        self.history = DraftHistory(config)        # whole drafters' kept nodes and probes (parts: ``parts``)
        self.draft_s: dict[str, float] = {}        # decayed seconds per proposal, per drafter (and part)
        self.forced: dict[str, float] = {}         # decayed forced-node acceptance, per drafter (``forced_rate``)
        self.governor = ThreadGovernor(thread_choices, config) if len(thread_choices) > 1 else None
        self._share: float | None = None           # this step's pass seconds per sequence (``unit``)
        self.crowded = False                       # this step is crowded (``crowding``)
        self.parts = PartPricing(self, config)     # a merging drafter's parts, each priced as a drafter

    # ------------------------------------------------------------------ 2. budgets
    def plan(self, views: list[SeqView]) -> StepPlan:
        """The step's probes and node budgets."""
        self._share = (self.cost.predict([1] * len(views), [s.context for s in views]) / len(views)) if views else None
        self.crowded = bool(views) and self.crowding(views, self._share) > self.config.crowded
        fresh = {s.seq_id for s in views if s.auto_size} - self._guarded
        self._guarded |= fresh
        arm = self.guard.arm(len(views), bool(fresh)) if any(s.auto_size for s in views) else None
        plan = StepPlan({}, {s.seq_id for s in views             # a merging drafter's parts probe one by one
                             if s.auto_size and arm == DRAFT and not self.parts.parts(s)
                             and self.due(s, s.drafter, self.probe(s))}, arm=arm)
        for s in views:
            if not s.depth or (s.auto_size and arm == PLAIN):
                plan.budgets[s.seq_id] = 0
            elif self.parts.parts(s):
                plan.budgets[s.seq_id] = self.parts.budgets(s, views, plan)
            else:
                plan.budgets[s.seq_id] = self.budget(s, s.drafter, views, s.seq_id in plan.probed,
                                                     self.history.last_kept(s.seq_id, s.drafter))
        return plan

    def budget(self, s: SeqView, key: str, batch: list[SeqView], probe: bool, kept: int | None) -> int:
        """The node budget of drafter (or part) ``key`` for ``s``: a fixed size as asked; else, for
        drafters whose nodes carry confidences, the largest draft, or when drafting is spared
        (``sparing``) a small look, nothing but a probe, or a little more than ``kept`` (the nodes kept
        of its last draft, None: none yet); for the others the chain that maximises the step's rate."""
        if not s.auto_size:
            return int(s.num_draft)
        traits, c = self.traits[key], self.config
        top = min(traits.max_auto_draft, self.max_draft)
        if traits.confidence or not top:
            sparing = top and self.sparing(key, s)
            if sparing and kept is None:
                return min(top, c.first_look)             # a new sequence: a small first look
            if sparing and kept == 0:
                return min(top, c.first_look) if probe else 0     # not kept last time: small, and only to probe
            if sparing:
                return min(top, c.regrow_factor * kept + c.regrow_margin)     # near what was kept last
            return top
        return max(self._best_chain(s, key, batch, min(top, s.depth)), 1 if probe else 0)

    def _best_chain(self, s: SeqView, key: str, batch: list[SeqView], top: int) -> int:
        """The chain length that maximises the step's predicted rate, the rest of ``batch`` (every
        decoding sequence, ``s`` among them) feeding its pending token only."""
        gains = self.acceptance.chain_gains(key, s.seq_id, top)
        contexts = [o.context for o in batch]
        mine = next(i for i, o in enumerate(batch) if o.seq_id == s.seq_id)
        drafting = self.draft_seconds(key)

        def step_rate(n: int) -> float:
            lengths = [1 + (n if i == mine else 0) for i in range(len(batch))]
            return rate(len(batch) + sum(gains[:n]), self.cost.predict(lengths, contexts), drafting if n else 0.0)
        rates = [step_rate(n) for n in range(len(gains) + 1)]
        return max(range(len(rates)), key=lambda n: (rates[n], -n))

    def probe(self, s: SeqView) -> ProbeState:
        """A sequence's probe state for its drafter (``DraftHistory.probe``)."""
        return self.history.probe(s.seq_id, s.drafter)

    def due(self, s: SeqView, key: str, state: ProbeState) -> bool:
        """A probe of ``key`` for ``s`` is due: its gap has passed (``state``), and enough steps for its
        drafting to cost at most ``ControllerConfig.probe_share`` of them (a learned head's probe costs
        a good part of a pass)."""
        floor = self.draft_seconds(key) / (self.config.probe_share * self.unit(s))
        return state.due() and state.idle >= floor

    def unit(self, s: SeqView) -> float:
        """What one sequence's row of this step's pass costs: the predicted seconds of a pass of the
        batch's pending tokens, shared out per sequence (alone: a one-token pass).  Drafting is
        costly, and probes are spaced, against that: under load a row's share shrinks."""
        if self._share is None:
            self._share = self.cost.predict([1], [s.context])
        return self._share

    def costly(self, key: str, s: SeqView) -> bool:
        """Drafting by ``key`` costs more than ``ControllerConfig.costly`` of ``s``'s share of the pass."""
        return self.draft_seconds(key) > self.config.costly * self.unit(s)

    def sparing(self, key: str, s: SeqView) -> bool:
        """``key`` drafts for ``s`` only near what was kept of its last draft (and to probe): its
        drafting is costly, or the step is crowded."""
        return self.crowded or self.costly(key, s)

    def crowding(self, views: list[SeqView], share: float | None = None) -> float:
        """What one more drafted token would add to the batch's pass (every sequence feeding its
        pending token), over the pass's seconds per sequence (``share``, when already predicted); a
        node at the batch's mean context, priced as a sequence of its own (the same weights' share, and
        attention over that context)."""
        contexts = [s.context for s in views]
        alone = share * len(views) if share is not None else self.cost.predict([1] * len(views), contexts)
        more = self.cost.predict([1] * (len(views) + 1), contexts + [sum(contexts) // len(contexts)])
        return (more - alone) / (alone / len(views)) if alone > 0 else 0.0

    # ------------------------------------------------------------------ 3. propose: drafting's cost
    def observe_draft(self, drafter: str, seconds: float, proposals: int) -> None:
        """A drafter's (or part's) ``propose`` call took ``seconds`` for ``proposals`` non-empty requests."""
        if proposals:
            self.draft_s[drafter] = decayed(self.draft_s.get(drafter), seconds / proposals, self.config.draft_weight)

    def draft_seconds(self, key: str) -> float:
        """A drafter's (or part's) decayed seconds per proposal (0 before any was measured)."""
        return self.draft_s.get(key, 0.0)

    # ------------------------------------------------------------------ 4. keep
    def keep(self, views: list[SeqView], proposals: dict, plan: StepPlan) -> float | None:
        """Trim the auto-sized proposals (``seq_id -> DraftProposal``, replaced in place) to the nodes
        the rate rule keeps; the predicted pass seconds (None when no sequence is auto-sized)."""
        if all(not s.auto_size or (plan.resting(s) and not len(proposals[s.seq_id])) for s in views):
            return None                     # no auto-sized sequence, or all rest (the guard's plain step)
        cands, merged = [], {}
        for s in views:
            prop = proposals[s.seq_id]
            if self.parts.merged(s, prop):
                merged[s.seq_id] = by_part = self.parts.gains(s, prop)
                cands.append(self.parts.candidate(s, prop, by_part, plan))
                continue
            gains = self.acceptance.node_gains(s.drafter, s.seq_id, prop.depths(), prop.trim_confidence())
            if prop.future_gain is not None:                  # worth in later steps (never calibrated)
                gains = [g + f for g, f in zip(gains, prop.future_gain)]
            cands.append(Candidate(s.seq_id, s.context, self.gains_with_forced(s, prop, gains),
                                   prop.parent_list(), fixed=not s.auto_size, probe=s.seq_id in plan.probed,
                                   draft_s=self.draft_seconds(s.drafter), drafter_nodes=prop.drafter_nodes))
        keep, predicted = choose(cands, self.cost)
        step_rate = rate(len(cands) + sum(sum(c.gains[n] for n in keep[c.seq_id]) for c in cands), predicted,
                         sum(c.draft_s for c in cands if any(n < c.drafter_nodes for n in keep[c.seq_id])))
        for s in views:
            if not s.auto_size:
                continue
            drafted = proposals[s.seq_id].drafter_nodes
            if drafted:
                self.history.kept[(s.seq_id, s.drafter)] = sum(1 for n in keep[s.seq_id] if n < drafted)
            if s.seq_id in merged:
                self.parts.kept(s, merged[s.seq_id], keep[s.seq_id], plan, step_rate)
            proposals[s.seq_id] = proposals[s.seq_id].subset(keep[s.seq_id])
        return predicted

    def gains_with_forced(self, s: SeqView, prop, gains: list[float]) -> list[float]:
        """``gains`` with the grammar's forced nodes priced (``forced_gains``) at ``s``'s drafter's rate."""
        return forced_gains(prop, gains, self.forced_rate(s.drafter))

    # ------------------------------------------------------------------ 7. the pass
    def threads(self) -> int:
        """The thread count for this step's pass (0: the runtime cannot switch)."""
        return self.governor.next() if self.governor is not None else 0

    def observe_pass(self, threads: int, lengths: list[int], contexts: list[int], seconds: float) -> None:
        """A measured decoding pass (no prompt chunks): into the cost model's correction and the governor."""
        if threads and self.governor is not None:
            self.governor.observe(threads, seconds / self.cost.raw(lengths, contexts))
        self.cost.observe(lengths, contexts, seconds, self.config.cost_weight, self.config.cost_ratio)

    # ------------------------------------------------------------------ 10. feed back: the guard, learning
    def observe_step(self, plan: StepPlan, sequences: int, tokens: int, seconds: float, chunked: bool = False) -> None:
        """A step committed ``tokens`` to its ``sequences`` decoding sequences in ``seconds`` (its whole wall
        time): into the guard, under the arm ``plan`` took, unless it carried prompt chunks (``chunked``)."""
        if plan.arm is not None and not chunked:
            self.guard.observe(sequences, plan.arm, tokens, seconds)

    def learn(self, s: SeqView, prop, path: list[int], plan: StepPlan) -> None:
        """A verified draft ``prop`` (what the pass ran) of which the nodes ``path`` were accepted;
        what the drafter is judged by is its own nodes (not the forced ones a grammar added, which
        teach ``forced_rate``); nothing for a sequence that rested (``StepPlan.resting``) and drafted nothing."""
        if plan.resting(s) and not len(prop):
            return
        self._learn_forced(s.drafter, prop, path)
        prop, path = prop.drafted(path)
        conf = prop.trim_confidence()
        if self.parts.merged(s, prop):
            self.parts.learn(s, prop, path, plan)
        elif len(prop):
            self.acceptance.observe(s.drafter, s.seq_id, prop.depth, len(path), None if conf is None else sum(conf))
        if s.auto_size and not self.parts.parts(s):     # a merging drafter's probes are its parts' (``plan``)
            self.history.record(s.seq_id, s.drafter, len(prop), len(path), s.seq_id in plan.probed)

    def forced_rate(self, drafter: str) -> float:
        """The share of forced nodes the target accepted where it accepted their parent (decayed), for
        ``drafter``'s sequences: how often it spells forced text as the engine drafted it."""
        return self.forced.get(drafter, self.config.forced_prior)

    def _learn_forced(self, drafter: str, prop, path: list[int]) -> None:
        on, parents = set(path), prop.parent_list()
        for n in range(prop.drafter_nodes, len(prop)):
            if parents[n] < 0 or parents[n] in on:
                self.forced[drafter] = decayed(self.forced_rate(drafter), float(n in on), self.config.forced_weight)

    def forget(self, seq_id: int) -> None:
        self._guarded.discard(seq_id)
        self.acceptance.forget(seq_id)
        self.history.forget(seq_id)
        self.parts.forget(seq_id)
