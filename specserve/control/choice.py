"""Which drafted nodes a step keeps: the rate rule, and when an idle sequence is probed.

The **rate** of a step is the expected tokens committed by the whole batch (one per sequence,
plus the gains of every kept node) divided by the predicted seconds of the step: its target pass,
plus the drafting of every sequence that keeps nodes (a drafter's cost is paid again next step only
if its nodes are kept now).  ``rate`` is that rule, written once; ``choose`` applies it to keep,
over the whole batch, the nodes with the highest gains, as many as maximise the rate.  A node is
never kept without its parent (gains never grow along a path), and 0 nodes, plain decoding, is
always a candidate, so speculation is only kept where it is predicted to pay.  A sequence whose
drafts have not been kept for a while is probed (its best node kept anyway), so that a drafter
that became useful again is noticed (``ProbeState``; ``DraftHistory`` keeps, per drafter or part,
what was kept of each sequence's last draft and its probes).  The waits are ``ControllerConfig``'s.
"""

from __future__ import annotations

from dataclasses import dataclass

from specserve.control.config import DEFAULTS, ControllerConfig
from specserve.control.cost import CostModel


def rate(tokens: float, pass_s: float, drafting_s: float) -> float:
    """Expected tokens per second of a step: ``tokens`` committed over the pass and the drafting."""
    return tokens / (pass_s + drafting_s) if pass_s > 0 else 0.0


@dataclass
class Candidate:
    """One sequence in a step, as the controller sees it."""
    seq_id: int
    context: int                  # positions cached before the step
    gains: list[float]            # per drafted node (in proposal order); fixed drafts: their gains
    parents: list[int]            # per node (-1: child of the pending token)
    fixed: bool = False           # a request that asked for an exact draft length: keep every node
    probe: bool = False           # keep the best node even if it does not pay
    probe_node: int = 0           # the node a probe keeps (a root: a child of the pending token); not a
                                  # grammar's forced node (past ``drafter_nodes``)
    draft_s: float = 0.0          # what drafting costs this sequence per step (seconds), paid again
                                  # next step only if some of its drafter's nodes are kept now
    drafter_nodes: int | None = None  # nodes that are its drafter's (the first ones; the rest a grammar
                                      # forced, which no drafting pays for); None: all of them


def choose(cands: list[Candidate], cost: CostModel) -> tuple[dict[int, list[int]], float]:
    """Nodes to keep per sequence (indices into its proposal, in order), maximising the rate.

    Nodes enter best-first; a node's gain is first capped at its parent's, so that with ties broken
    by index a parent always enters before its children and every prefix of the order is a set of
    trees.  Fixed drafts are kept whole; a probed sequence's first node (or ``probe_node``) is kept whatever it pays.
    A sequence that keeps nodes of its drafter's own is charged its drafter's cost (``draft_s``) on
    top of the pass, so a drafter whose drafting costs more than its tokens save is not kept (forced
    nodes alone charge nothing: the engine drafts them without the drafter).
    Returns ({seq_id: kept node indices}, predicted seconds of the chosen pass).
    """
    order: list[tuple[float, int, int]] = []           # (-gain, candidate, node)
    probed: list[tuple[int, int]] = []
    for i, c in enumerate(cands):
        if c.fixed:
            continue
        capped: list[float] = []
        for n, (g, p) in enumerate(zip(c.gains, c.parents)):
            capped.append(min(g, capped[p]) if p >= 0 else g)
            if c.probe and n == c.probe_node:
                probed.append((i, n))
            else:
                order.append((-capped[n], i, n))
    order.sort()
    steps = probed + [(i, n) for _, i, n in order]
    lengths = [1 + (len(c.gains) if c.fixed else 0) for c in cands]
    contexts = [c.context for c in cands]
    gain = sum(sum(c.gains) for c in cands if c.fixed) + len(cands)     # expected tokens committed
    best_n, best_rate, best_cost = 0, -1.0, 0.0
    drafting = 0.0
    charged = [False] * len(cands)
    for n in range(len(steps) + 1):
        if n:
            i, node = steps[n - 1]
            lengths[i] += 1
            gain += cands[i].gains[node]
            if not charged[i] and (cands[i].drafter_nodes is None or node < cands[i].drafter_nodes):
                charged[i] = True
                drafting += cands[i].draft_s
        if n < len(probed):
            continue
        seconds = cost.predict(lengths, contexts)
        r = rate(gain, seconds, drafting)
        if r > best_rate * (1 + 1e-9):
            best_n, best_rate, best_cost = n, r, seconds
    keep = {c.seq_id: (list(range(len(c.gains))) if c.fixed else []) for c in cands}
    for i, node in steps[:best_n]:
        keep[cands[i].seq_id].append(node)
    return {k: sorted(v) for k, v in keep.items()}, best_cost


@dataclass
class ProbeState:
    """When a sequence's drafts were last kept, and how long to wait before probing again."""
    idle: int = 0
    gap: int = DEFAULTS.probe_gap

    def due(self) -> bool:
        return self.idle >= self.gap

    def update(self, kept: int, accepted: int, probed: bool, config: ControllerConfig = DEFAULTS) -> None:
        """A step's outcome: ``kept`` nodes kept, ``accepted`` of them accepted, ``probed``: kept by a
        probe (accepted: the gap starts again at ``config.probe_gap``; not: it doubles, up to
        ``config.max_probe_gap``)."""
        if kept:
            self.idle = 0
            if probed:
                self.gap = config.probe_gap if accepted else min(self.gap * 2, config.max_probe_gap)
        else:
            self.idle += 1


class DraftHistory:
    """What the controller remembers of a drafter's (or a part's) drafts, under its key: per sequence,
    the nodes kept of its last draft and its probe state; per key, its latest probe gap, which a new
    sequence starts from (at most ``config.inherited_gap``)."""

    def __init__(self, config: ControllerConfig = DEFAULTS):
        self.config = config
        self.kept: dict[tuple[int, str], int] = {}           # (seq_id, key) -> nodes kept of its last draft
        self.probes: dict[tuple[int, str], ProbeState] = {}  # (seq_id, key)
        self.gaps: dict[str, int] = {}                       # key -> its latest probe's gap

    def last_kept(self, seq_id: int, key: str) -> int | None:
        """Nodes kept of the sequence's last draft by ``key`` (None: it has not drafted yet).  A new
        sequence of a key whose recent probes failed (its probe gap grew) starts as unkept: it drafts
        only when its first probe is due, instead of paying for a first look every request."""
        kept = self.kept.get((seq_id, key))
        if kept is None and self.gaps.get(key, self.config.probe_gap) > self.config.probe_gap:
            return 0
        return kept

    def probe(self, seq_id: int, key: str) -> ProbeState:
        """The sequence's probe state for ``key``.  A new sequence waits as long as the key's last probe
        did, up to ``config.inherited_gap``, so a drafter that keeps failing is not probed afresh by
        every new request, nor switched off for the next kind."""
        state = self.probes.get((seq_id, key))
        if state is None:
            gap = min(self.gaps.get(key, self.config.probe_gap), self.config.inherited_gap)
            state = self.probes[(seq_id, key)] = ProbeState(gap=gap)
        return state

    def record(self, seq_id: int, key: str, kept: int, accepted: int, probed: bool) -> None:
        """A verified step of the sequence under ``key`` (``ProbeState.update``); a probe's new gap
        becomes the key's latest."""
        state = self.probe(seq_id, key)
        state.update(kept, accepted, probed, self.config)
        if probed:
            self.gaps[key] = state.gap

    def forget(self, seq_id: int) -> None:
        for table in (self.probes, self.kept):
            for k in [k for k in table if k[0] == seq_id]:
                del table[k]
