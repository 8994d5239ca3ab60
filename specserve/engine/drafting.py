"""Every call the engine makes to a drafter, each one guarded (``specserve.engine.faults``).

``Drafting`` begins and ends a sequence's drafter, asks the drafters for a step's proposals (one
batched ``propose`` per drafter, over its sequences) and hands them the step's feedback; it also
keeps, per drafter label, how the target spelt the text grammars forced (``spelling``), from which
the engine drafts forced tokens itself.  A call
that raises for a sequence, or a malformed proposal, is that sequence's fault: its drafter state is
ended and it continues with ``PLAIN`` (see ``faults``); the other sequences are untouched.
"""

from __future__ import annotations

import time

from specserve.constrain.spelling import Spelling
from specserve.control import Controller, SeqView, StepPlan, Traits
from specserve.control.parts import part_key
from specserve.drafters.base import DraftProposal, DraftRequest, Drafter, Feedback, draft_s_by_part, parts_of
from specserve.engine.faults import PLAIN, Faults, quietly_end
from specserve.engine.types import Request, Sequence, StepTimes


class Drafting:
    def __init__(self, controller: Controller, vocab_size: int):
        self.controller, self.vocab = controller, vocab_size
        self.faults = Faults()
        self.spellings: dict[str, Spelling] = {}     # per drafter label: how the target spells forced text

    def spelling(self, label: str) -> Spelling:
        """What the sequences of drafter ``label`` saw of the target's spelling of forced text (the
        engine's own drafts under a grammar, ``specserve.constrain.spelling``), kept across requests."""
        return self.spellings.setdefault(label, Spelling())

    def forget_spellings(self) -> bool:
        """Forget every label's spelling memory (as on a fresh server); True if any was kept."""
        kept = any(sp.after for sp in self.spellings.values())
        self.spellings.clear()
        return kept

    def begin(self, seq_id: int, req: Request, drafter: Drafter, generator) -> Drafter:
        """``drafter.begin`` for a new sequence; the drafter that will serve it (``PLAIN`` if begin failed)."""
        if self.faults.call(req.drafter, seq_id, "begin", drafter.begin, seq_id, req.prompt, req.sampling,
                            req.max_tokens, generator):
            return drafter
        quietly_end(drafter, seq_id)
        return PLAIN

    def end(self, s: Sequence) -> None:
        """``end`` for a sequence leaving the engine (its exception is counted, and changes nothing)."""
        self.faults.call(s.request.drafter, s.seq_id, "end", s.drafter.end, s.seq_id)

    def propose(self, decoding: list[Sequence], views: list[SeqView], plan: StepPlan,
                times: StepTimes) -> dict[int, DraftProposal]:
        """Proposals per sequence, cut to the node budget and to the tokens still to generate; a
        sequence whose drafter fails gets none and continues by plain decoding."""
        out = {s.seq_id: DraftProposal([]) for s in decoding}
        groups: dict[int, list[tuple[Sequence, DraftRequest]]] = {}
        for s, v in zip(decoding, views):
            if s.drafter is not PLAIN and not plan.resting(v):
                r = DraftRequest(s.seq_id, s.tokens, plan.budgets[s.seq_id], s.request.sampling, v.depth,
                                 plan.parts.get(s.seq_id))
                groups.setdefault(id(s.drafter), []).append((s, r))
        for pairs in groups.values():
            t0 = time.perf_counter()
            props = draft(pairs[0][0].drafter, [r for _, r in pairs])
            took = time.perf_counter() - t0
            times.draft_s += took
            label = pairs[0][0].request.drafter
            self.controller.observe_draft(label, took, sum(1 for _, r in pairs if r.k > 0))
            for part, (seconds, n) in draft_s_by_part(props).items():       # a merging drafter's parts
                self.controller.observe_draft(part_key(label, part), seconds, n)
            for (s, r), prop in zip(pairs, props):
                try:
                    if isinstance(prop, Exception):
                        raise prop
                    prop = prop.truncated(r.k, r.max_depth)
                    prop.check(self.vocab)
                    out[s.seq_id] = prop
                except Exception as e:  # noqa: BLE001 - a drafter's bug: this sequence decodes plainly
                    self.fault(s, "propose", e)
        return out

    def feed_back(self, feedback: list[tuple[Sequence, Feedback]]) -> None:
        for s, fb in feedback:
            try:
                s.drafter.feedback(fb)
            except Exception as e:  # noqa: BLE001 - a drafter's bug: this sequence decodes plainly
                self.fault(s, "feedback", e)

    def fault(self, s: Sequence, phase: str, error: Exception) -> None:
        """A drafter failed for ``s``: count and log it, end the drafter's state for ``s``; from now
        on ``s`` decodes plainly."""
        self.faults.record(s.request.drafter, s.seq_id, phase, error)
        quietly_end(s.drafter, s.seq_id)
        s.drafter, s.prompt_feats = PLAIN, {}
        s.stats.drafter_faults += 1
        self.controller.forget(s.seq_id)


def draft(drafter: Drafter, reqs: list[DraftRequest]) -> list[DraftProposal | Exception]:
    """``drafter.propose(reqs)``; if it raises, each request again alone, so that a fault costs only
    the sequences it happens for (an exception in place of their proposal)."""
    try:
        props = drafter.propose(reqs)
        if len(props) != len(reqs):
            raise ValueError(f"{len(props)} proposals for {len(reqs)} requests")
        return list(props)
    except Exception as e:  # noqa: BLE001 - attributed below, one sequence at a time
        return [e] if len(reqs) == 1 else [draft(drafter, [r])[0] for r in reqs]


def traits_of(drafters: dict[str, Drafter]) -> dict[str, Traits]:
    """What the controller knows of each drafter (and of a merging drafter's parts, under ``part_key``)."""
    traits = {}
    for name, d in drafters.items():
        parts = parts_of(d)
        traits[name] = Traits(d.max_auto_draft, d.confidence, tuple(parts))
        traits |= {part_key(name, p): Traits(x.max_auto_draft, x.confidence) for p, x in parts.items()}
    return traits
