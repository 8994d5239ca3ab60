"""The engine's side of adaptive speculation: it turns running sequences and their proposals into
the controller's inputs (``specserve.control``), trims the proposals to what the controller keeps,
folds every verified step back into the models, and sets the runtime's compute threads.

It owns no cache and drafts nothing: the engine calls it between its phases with plain numbers
(``Slot``: a sequence's id, drafter, requested draft size and cached context).
"""

from __future__ import annotations

from dataclasses import dataclass

from specserve.control import AcceptanceModel, Candidate, CostModel, ProbeState, ThreadGovernor, calibrate, choose
from specserve.drafters.base import DraftProposal, Drafter
from specserve.drafters.registry import AUTO


@dataclass(frozen=True)
class Slot:
    """A running sequence as the sizer sees it."""
    seq_id: int
    drafter: str
    num_draft: int | str          # a number, or AUTO
    context: int                  # positions cached before this step


class Sizer:
    def __init__(self, model, drafters: dict[str, Drafter], max_batch: int, max_draft: int):
        self.model, self.drafters, self.max_batch, self.max_draft = model, drafters, max_batch, max_draft
        self.cost: CostModel | None = None            # calibrated when first needed
        self.acceptance = AcceptanceModel()
        self.probes: dict[int, ProbeState] = {}
        self.drafter_gap: dict[str, int] = {}       # a new sequence's first probe gap: its drafter's latest
        self.draft_s: dict[str, float] = {}         # decayed mean seconds per proposal, per drafter
        self.kept: dict[int, int] = {}              # nodes the controller kept of each sequence's last draft
        choices = model.thread_choices()
        self.threads = ThreadGovernor(choices) if len(choices) > 1 else None
        self._threads_set = 0

    def calibrate(self) -> CostModel:
        """The cost model, measured on first use (a few seconds; cached per model)."""
        if self.cost is None:
            top = max((d.max_auto_draft for d in self.drafters.values()), default=0)
            self.cost = calibrate(self.model, max_tokens=min(self.max_batch * (top + 1), 128))
        return self.cost

    def probe(self, s: Slot) -> ProbeState:
        """The sequence's probe state; a new one waits as long as its drafter's last probe did, so a
        drafter that keeps failing is not probed afresh by every new request."""
        state = self.probes.get(s.seq_id)
        if state is None:
            state = self.probes[s.seq_id] = ProbeState(gap=self.drafter_gap.get(s.drafter, ProbeState.gap))
        return state

    def forget(self, seq_id: int) -> None:
        self.acceptance.forget(seq_id)
        self.probes.pop(seq_id, None)
        self.kept.pop(seq_id, None)

    def observe_draft(self, drafter: str, seconds: float, proposals: int) -> None:
        """A drafter's ``propose`` call took ``seconds`` for ``proposals`` non-empty requests."""
        if proposals:
            per = seconds / proposals
            old = self.draft_s.get(drafter)
            self.draft_s[drafter] = per if old is None else 0.8 * old + 0.2 * per

    def _costly(self, s: Slot) -> bool:
        """Drafting costs this drafter over 5% of a one-token pass: not worth doing when unkept."""
        return self.draft_s.get(s.drafter, 0.0) > 0.05 * self.calibrate().predict([1], [s.context])

    def budget(self, s: Slot, batch: list[Slot], depth: int) -> int:
        """The node budget to ask the drafter for: a fixed request's own; for auto, the drafter's
        largest if its nodes carry confidences (trimmed after it proposes; a costly drafter is asked for
        about twice what was kept last, and for nothing while its drafts are not kept), else the chain length that
        maximises this sequence's predicted rate beside the pending tokens of the rest of ``batch``
        (every running sequence, ``s`` among them)."""
        drafter = self.drafters[s.drafter]
        if s.num_draft != AUTO:
            return s.num_draft
        top = min(drafter.max_auto_draft, self.max_draft)
        if drafter.confidence or not top:
            # a costly drafter whose last draft was not kept drafts again only to probe
            kept = self.kept.get(s.seq_id)
            if top and kept == 0 and self._costly(s):
                # not kept last time: draft again only to probe, and then small (the probe keeps one node)
                return min(top, 2) if self.probe(s).due() else 0
            if kept and self._costly(s):         # a costly drafter drafts near what was kept last
                return min(top, 2 * kept + 2)
            return top
        gains = self.acceptance.chain_gains(s.drafter, s.seq_id, min(top, depth))
        contexts = [o.context for o in batch]
        mine = next(i for i, o in enumerate(batch) if o.seq_id == s.seq_id)

        def lengths(n: int) -> list[int]:
            return [1 + (n if i == mine else 0) for i in range(len(batch))]
        rates = [(len(batch) + sum(gains[:n])) / self.calibrate().predict(lengths(n), contexts)
                 for n in range(len(gains) + 1)]
        best = max(range(len(rates)), key=lambda n: (rates[n], -n))
        return max(best, 1 if self.probe(s).due() else 0)

    def size(self, slots: list[Slot], proposals: dict[int, DraftProposal], probed: set[int]) -> float:
        """Trim the auto proposals to the nodes the controller keeps; returns the predicted pass time."""
        cands = []
        for s in slots:
            prop = proposals[s.seq_id]
            gains = self.acceptance.node_gains(s.drafter, s.seq_id, prop.depths(), prop.confidence)
            if prop.future_gain is not None:                  # worth in later steps (never calibrated)
                gains = [g + f for g, f in zip(gains, prop.future_gain)]
            cands.append(Candidate(s.seq_id, s.context, gains, prop.parent_list(), fixed=s.num_draft != AUTO,
                                   probe=s.seq_id in probed, draft_s=self.draft_s.get(s.drafter, 0.0)))
        keep, predicted = choose(cands, self.calibrate())
        for s in slots:
            if s.num_draft == AUTO:
                if len(proposals[s.seq_id]):
                    self.kept[s.seq_id] = len(keep[s.seq_id])
                proposals[s.seq_id] = proposals[s.seq_id].subset(keep[s.seq_id])
        return predicted

    def learn(self, s: Slot, prop: DraftProposal, depth: int, accepted: int, probed: bool) -> None:
        """Fold a verified draft into the acceptance model and the sequence's probe state."""
        if len(prop):
            conf = sum(prop.confidence) if prop.confidence is not None else None
            self.acceptance.observe(s.drafter, s.seq_id, depth, accepted, conf)
        if s.num_draft == AUTO:
            state = self.probe(s)
            state.update(len(prop), accepted, probed)
            if probed:
                self.drafter_gap[s.drafter] = state.gap

    def pick_threads(self) -> int:
        """The governor's thread count for this step, set on the runtime (0: it cannot switch)."""
        if self.threads is None:
            return 0
        self.calibrate()
        n = self.threads.next()
        if n != self._threads_set:
            self._threads_set = self.model.set_threads(n)
        return n

    def observe_pass(self, threads: int, lengths: list[int], contexts: list[int], seconds: float) -> None:
        """A measured pass: into the cost model's correction and the thread governor."""
        if self.cost is None:
            return
        if threads:
            self.threads.observe(threads, seconds / self.cost.raw(lengths, contexts))
        self.cost.observe(lengths, contexts, seconds)
