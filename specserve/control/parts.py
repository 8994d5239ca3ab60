"""A merging drafter's parts as the controller prices them (``auto``: ``Traits.parts``).

Each part is known under its own key ``drafter/part`` (``part_key``): its own node budget (the
controller's budget rule, per part), confidences calibrated per part and per sequence, drafting
seconds and probes.  A merged node is worth its best part's gain.  A costly part keeps running for a
sequence only while the tokens it adds to the kept nodes (their gain over what the other parts give
them) are worth more than its drafting seconds at the step's rate; otherwise it drafts only to probe.

``PartPricing`` holds no state of its own: it reads and writes the controller's tables (seconds,
kept nodes, probes, calibration) under the part keys, so a part is priced by the same rules as a
whole drafter, and every part rule is here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from specserve.control.choice import Candidate

if TYPE_CHECKING:
    from specserve.control.controller import Controller, Slot, StepPlan


def part_key(drafter: str, part: str) -> str:
    """The key a merging drafter's part is known by (traits, seconds, acceptance, probes)."""
    return f"{drafter}/{part}"


class PartPricing:
    def __init__(self, ctl: "Controller"):
        self.ctl = ctl

    def parts(self, s: "Slot") -> tuple[str, ...]:
        """The parts of ``s``'s drafter priced one by one (none unless ``s`` is auto)."""
        return self.ctl.traits[s.drafter].parts if s.auto else ()

    def merged(self, s: "Slot", prop) -> bool:
        """A merging drafter's proposal whose nodes may be priced part by part (drawn nodes: by depth)."""
        if not self.parts(s):
            return False
        return not len(prop) or (prop.origins is not None and prop.trim_confidence() is not None)

    # ------------------------------------------------------------------ 1. plan
    def budgets(self, s: "Slot", batch: list["Slot"], plan: "StepPlan") -> int:
        """Each part's node budget into ``plan.parts`` (and its probe into ``plan.part_probes``);
        the sequence's whole budget."""
        ctl, per = self.ctl, {}
        for part in self.parts(s):
            key = part_key(s.drafter, part)
            due = ctl.sparing(key, s) and ctl._kept(s, key) == 0 and ctl._due(s, key)
            per[part] = ctl._budget(s, key, batch, due)
            if due and per[part]:
                plan.part_probes.add((s.seq_id, part))
        plan.parts[s.seq_id] = per
        return min(ctl.max_draft, sum(per.values()))

    # ------------------------------------------------------------------ 3. keep
    def gains(self, s: "Slot", prop) -> dict[str, list[float]]:
        """Per part, each node's gain from that part's calibrated confidence (0 where it did not propose it)."""
        out = {}
        for part in self.parts(s):
            cal = self.ctl.acceptance.calibration(part_key(s.drafter, part), s.seq_id)
            out[part] = [min(max(o[part] * cal, 0.0), 1.0) if part in o else 0.0 for o in prop.origins or []]
        return out

    def candidate(self, s: "Slot", prop, by_part: dict[str, list[float]], plan: "StepPlan") -> Candidate:
        """The merged proposal as one candidate: a node worth its best part, probed where a part's
        probe is due (its first root), charged the drafting of its cheap parts (a costly part pays
        for itself through ``kept``)."""
        ctl = self.ctl
        gains = [max((g[n] for g in by_part.values()), default=0.0) for n in range(len(prop))]
        probed = [p for p in by_part if (s.seq_id, p) in plan.part_probes]
        probe_node = next((n for n, (o, q) in enumerate(zip(prop.origins or [], prop.parent_list()))
                           if q < 0 and any(p in o for p in probed)), None)
        cheap = sum(ctl.draft_s.get(part_key(s.drafter, p), 0.0) for p, k in plan.parts.get(s.seq_id, {}).items()
                    if k and not ctl._costly(part_key(s.drafter, p), s))
        return Candidate(s.seq_id, s.context, ctl.gains_with_forced(s, prop, gains), prop.parent_list(),
                         probe=s.seq_id in plan.probed or probe_node is not None, probe_node=probe_node or 0,
                         draft_s=cheap, own=prop.own)

    def kept(self, s: "Slot", gains: dict[str, list[float]], kept: list[int], plan: "StepPlan",
             step_rate: float) -> None:
        """What each part keeps of this draft, for its next budget: its kept nodes, or for a costly part
        0 when the tokens it adds over the other parts are worth less than its drafting seconds."""
        ctl = self.ctl
        for part, mine in gains.items():
            key = part_key(s.drafter, part)
            if not plan.parts.get(s.seq_id, {}).get(part):
                continue
            nodes = sum(1 for n in kept if mine[n] > 0)
            if ctl._costly(key, s):
                others = [max((g[n] for p, g in gains.items() if p != part), default=0.0) for n in range(len(mine))]
                added = sum(max(0.0, mine[n] - others[n]) for n in kept)
                nodes = nodes if added > ctl.draft_s.get(key, 0.0) * step_rate else 0
            ctl.kept[(s.seq_id, key)] = nodes

    # ------------------------------------------------------------------ 5. learning
    def learn(self, s: "Slot", prop, path: list[int], plan: "StepPlan") -> None:
        """Each part's calibration: its confidences over the verified nodes it proposed, against its
        nodes on the accepted path; and its probe state."""
        ctl = self.ctl
        for part in self.parts(s):
            key = part_key(s.drafter, part)
            nodes = [n for n, o in enumerate(prop.origins or []) if part in o]
            won = sum(1 for n in path if part in prop.origins[n])
            if nodes:
                ctl.acceptance.observe(key, s.seq_id, 0, won, sum(prop.origins[n][part] for n in nodes))
            paid = ctl.kept.get((s.seq_id, key), 0) if nodes else 0
            probed = (s.seq_id, part) in plan.part_probes
            state = ctl.probe(s, key)
            if probed:                          # a probe was made (idle ends); it succeeded if the target
                state.update(max(len(nodes), 1), won, True)     # took its nodes (its node was kept by force)
            else:
                state.update(paid, paid, False)
            if probed:
                ctl.drafter_gap[key] = state.gap
