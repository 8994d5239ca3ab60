"""A merging drafter's parts as the controller prices them (``auto``: ``Traits.parts``).

Each part is known under its own key ``drafter/part`` (``part_key``): its own node budget (the
controller's budget rule, per part), confidences calibrated per part and per sequence, drafting
seconds and probes.  A merged node is worth its best part's gain.  A costly part keeps running for a
sequence only while the tokens it adds to the kept nodes (their gain over what the other parts give
them) are worth more than its drafting seconds at the step's rate; otherwise it drafts only to probe.

``PartPricing`` keeps its parts' history (nodes kept, probes: a ``DraftHistory`` of its own) and asks
the controller only through its public methods (``Pricer``: the budget rule, when drafting is spared
or costly, when a probe is due, drafting seconds, the acceptance model), so a part is priced by the
same rules as a whole drafter, and every part rule is here.  Its sections follow the engine's
phases (``Engine.step``).
"""

from __future__ import annotations

from typing import Protocol

from specserve.control.acceptance import AcceptanceModel
from specserve.control.choice import Candidate, DraftHistory, ProbeState
from specserve.control.config import DEFAULTS, ControllerConfig
from specserve.control.types import SeqView, StepPlan, Traits


def part_key(drafter: str, part: str) -> str:
    """The key a merging drafter's part is known by (traits, seconds, acceptance, probes)."""
    return f"{drafter}/{part}"


class Pricer(Protocol):
    """What part pricing asks of the controller (``Controller``'s public methods)."""
    traits: dict[str, Traits]
    max_draft: int
    acceptance: AcceptanceModel

    def budget(self, s: SeqView, key: str, batch: list[SeqView], probe: bool, kept: int | None) -> int: ...
    def sparing(self, key: str, s: SeqView) -> bool: ...
    def costly(self, key: str, s: SeqView) -> bool: ...
    def due(self, s: SeqView, key: str, state: ProbeState) -> bool: ...
    def draft_seconds(self, key: str) -> float: ...
    def gains_with_forced(self, s: SeqView, prop, gains: list[float]) -> list[float]: ...


class PartPricing:
    def __init__(self, ctl: Pricer, config: ControllerConfig = DEFAULTS):
        self.ctl = ctl
        self.history = DraftHistory(config)       # per part key: nodes kept of each sequence's last draft, probes

    def parts(self, s: SeqView) -> tuple[str, ...]:
        """The parts of ``s``'s drafter priced one by one (none unless ``s`` is auto-sized)."""
        return self.ctl.traits[s.drafter].parts if s.auto_size else ()

    def merged(self, s: SeqView, prop) -> bool:
        """A merging drafter's proposal whose nodes may be priced part by part (drawn nodes: by depth)."""
        if not self.parts(s):
            return False
        return not len(prop) or (getattr(prop, "origins", None) is not None and prop.trim_confidence() is not None)

    def forget(self, seq_id: int) -> None:
        self.history.forget(seq_id)

    # ------------------------------------------------------------------ 2. budgets
    def budgets(self, s: SeqView, batch: list[SeqView], plan: StepPlan) -> int:
        """Each part's node budget into ``plan.parts`` (and its probe into ``plan.part_probes``);
        the sequence's whole budget."""
        ctl, per = self.ctl, {}
        for part in self.parts(s):
            key = part_key(s.drafter, part)
            kept = self.history.last_kept(s.seq_id, key)
            due = ctl.sparing(key, s) and kept == 0 and ctl.due(s, key, self.history.probe(s.seq_id, key))
            per[part] = ctl.budget(s, key, batch, due, kept)
            if due and per[part]:
                plan.part_probes.add((s.seq_id, part))
        plan.parts[s.seq_id] = per
        return min(ctl.max_draft, sum(per.values()))

    # ------------------------------------------------------------------ 4. keep
    def gains(self, s: SeqView, prop) -> dict[str, list[float]]:
        """Per part, each node's gain from that part's calibrated confidence (0 where it did not propose it)."""
        out = {}
        for part in self.parts(s):
            cal = self.ctl.acceptance.calibration(part_key(s.drafter, part), s.seq_id)
            out[part] = [min(max(o[part] * cal, 0.0), 1.0) if part in o else 0.0 for o in _origins(prop)]
        return out

    def candidate(self, s: SeqView, prop, by_part: dict[str, list[float]], plan: StepPlan) -> Candidate:
        """The merged proposal as one candidate: a node worth its best part, probed where a part's
        probe is due (its first root), charged the drafting of its cheap parts (a costly part pays
        for itself through ``kept``)."""
        ctl = self.ctl
        gains = [max((g[n] for g in by_part.values()), default=0.0) for n in range(len(prop))]
        probed = [p for p in by_part if (s.seq_id, p) in plan.part_probes]
        probe_node = next((n for n, (o, q) in enumerate(zip(_origins(prop), prop.parent_list()))
                           if q < 0 and any(p in o for p in probed)), None)
        cheap = sum(ctl.draft_seconds(part_key(s.drafter, p)) for p, k in plan.parts.get(s.seq_id, {}).items()
                    if k and not ctl.costly(part_key(s.drafter, p), s))
        return Candidate(s.seq_id, s.context, ctl.gains_with_forced(s, prop, gains), prop.parent_list(),
                         probe=s.seq_id in plan.probed or probe_node is not None, probe_node=probe_node or 0,
                         draft_s=cheap, drafter_nodes=prop.drafter_nodes)

    def kept(self, s: SeqView, gains: dict[str, list[float]], kept: list[int], plan: StepPlan,
             step_rate: float) -> None:
        """What each part keeps of this draft, for its next budget: its kept nodes, or for a costly part
        0 when the tokens it adds over the other parts are worth less than its drafting seconds."""
        ctl = self.ctl
        for part, mine in gains.items():
            key = part_key(s.drafter, part)
            if not plan.parts.get(s.seq_id, {}).get(part):
                continue
            nodes = sum(1 for n in kept if mine[n] > 0)
            if ctl.costly(key, s):
                others = [max((g[n] for p, g in gains.items() if p != part), default=0.0) for n in range(len(mine))]
                added = sum(max(0.0, mine[n] - others[n]) for n in kept)
                nodes = nodes if added > ctl.draft_seconds(key) * step_rate else 0
            self.history.kept[(s.seq_id, key)] = nodes

    # ------------------------------------------------------------------ 10. feed back: learning
    def learn(self, s: SeqView, prop, path: list[int], plan: StepPlan) -> None:
        """Each part's calibration: its confidences over the verified nodes it proposed, against its
        nodes on the accepted path; and its probe state."""
        origins = _origins(prop)
        for part in self.parts(s):
            key = part_key(s.drafter, part)
            nodes = [n for n, o in enumerate(origins) if part in o]
            won = sum(1 for n in path if part in origins[n])
            if nodes:
                self.ctl.acceptance.observe(key, s.seq_id, 0, won, sum(origins[n][part] for n in nodes))
            paid = self.history.kept.get((s.seq_id, key), 0) if nodes else 0
            # a probe was made (idle ends); it succeeded if the target took its nodes (its node was kept by force)
            if (s.seq_id, part) in plan.part_probes:
                self.history.record(s.seq_id, key, max(len(nodes), 1), won, True)
            else:
                self.history.record(s.seq_id, key, paid, paid, False)


def _origins(prop) -> list[dict[str, float]]:
    """A merged proposal's origins (``MergedProposal``: per node, each proposing part's confidence); none
    for any other proposal."""
    return getattr(prop, "origins", None) or []
