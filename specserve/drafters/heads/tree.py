"""EAGLE-2's dynamic tree as tensors: one sequence's nodes while its draft is grown, a depth at a time.

Nodes are numbered in creation order: depth 1's ``kk`` roots, then each expanded node's ``kk``
children (the nodes in the order they were expanded, each one's children likeliest first), which is
also the order ties are broken in.  A node holds its token (an index into the head's reduced
vocabulary), its parent (-1: a child of the pending token) and its cumulative log-probability in
float64 (the head's float32 log-probabilities along its path, added as Python floats add them).

An expanded node gets a head entry, its *slot* (from 0, in expansion order; the entries' keys and
values sit after the sequence's real entries).  ``anc[e]`` marks the slots of entry e's ancestors
and e itself, so an entry attends to the real entries and to ``anc`` of its row; a depth's rows are
its parents' rows plus the diagonal, gathered once per depth.

The rules (``EagleDrafter._tree``'s docstring): at each depth the ``kk`` frontier nodes of highest
cumulative probability are expanded, those whose probability is above the budget-th best so far
(the others cannot reach the final top ``budget``); the ``budget`` best nodes are kept, ties to the
lower number (a node's number orders it after its ancestors, so the kept nodes form a tree).

A ``SampledTree`` is grown the same way under sampling, with each expanded node's ``kk`` children
*drawn* without replacement from the head's processed q (``draw_distinct``) instead of its top
``kk``; its cumulative score is the log of the draws' probabilities.  Which nodes are expanded may
depend on the drawn nodes' scores (a node's children are drawn after it), but which nodes are
*kept* never depends on a node's own draw: the proposal is the first ``budget`` nodes in creation
order (siblings in draw order), which is what keeps recursive rejection exact.  A node that could
not be drawn (q has fewer than ``kk`` tokens) is void: score -inf, never expanded, never kept.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from specserve.drafters.base import DraftProposal
from specserve.drafters.heads.runtime import depth_first, draw_distinct
from specserve.sampling import SamplingParams, processed_probs


class Tree:
    """One sequence's tree (module docstring).  The nodes' fields are numpy arrays (a tree has a few
    hundred nodes, and numpy's operations on them cost a fraction of torch's); ``anc`` and ``out``
    are torch tensors, as the head reads them."""

    def __init__(self, budget: int, depth: int, kk: int, hidden: int):
        self.budget, self.depth, self.kk = budget, depth, kk
        nodes, entries = kk + (depth - 1) * kk * kk, max((depth - 1) * kk, 1)
        self.tok = np.empty(nodes, np.int64)                  # reduced-vocabulary index
        self.par = np.empty(nodes, np.int64)
        self.cum = np.empty(nodes, np.float64)
        self.slot = np.empty(nodes, np.int64)                 # an expanded node's entry
        self._anc = np.zeros((entries, entries), np.bool_)
        self.anc = torch.from_numpy(self._anc)                # the same memory
        self.out = torch.empty(entries, hidden)               # the entries' outputs
        self.n = self.lo = self.used = 0                      # nodes, the frontier's first, entries
        self.expand = self.par[:0]
        self.done = False

    def roots(self, values: Tensor, indices: Tensor) -> None:
        """Depth 1: the pending token's top ``kk`` (values [kk] float32 log-probabilities, indices [kk])."""
        k = self.kk
        self.tok[:k], self.par[:k], self.cum[:k] = indices.numpy(), -1, values.numpy()
        self.lo, self.n = 0, k

    def select(self) -> int:
        """The frontier nodes to expand next (``expand``, best first); how many (0: the tree is done)."""
        n, b = self.n, self.budget
        bar = np.partition(self.cum[:n], n - b)[n - b] if n >= b else -np.inf   # the budget-th best
        front = self.cum[self.lo:n]
        order = np.argsort(-front, kind="stable")[:self.kk]
        m = int(np.count_nonzero(front[order] > bar))           # sorted: the passing ones lead
        self.expand = order[:m] + self.lo
        self.done = m == 0
        return m

    def entries(self, last: Tensor, g: Tensor) -> tuple[np.ndarray, Tensor]:
        """Slots for ``expand``; writes their state inputs (the parents' outputs, ``last`` for depth 1)
        into g [m, hidden].  Returns (their tokens as reduced-vocabulary indices, the mask [m, slots])."""
        e, u = self.expand, self.used
        m = len(e)
        new = np.arange(u, u + m)
        self.slot[e] = new
        if self.lo == 0:                                       # depth 1: children of the pending token
            g.copy_(last.expand(m, -1))
        else:
            ps = self.slot[self.par[e]]
            torch.index_select(self.out, 0, torch.from_numpy(ps), out=g)
            self._anc[u:u + m] = self._anc[ps]
        self._anc[new, new] = True
        self.used = u + m
        return self.tok[e], self.anc[u:u + m, :u + m]

    def grow(self, out: Tensor, values: Tensor, indices: Tensor) -> None:
        """The expanded entries' outputs [m, hidden] and their top ``kk`` (values float32, indices) [m, kk]."""
        m = len(self.expand)
        self.out[self.used - m:self.used] = out
        self.add_children(values, indices)

    def add_children(self, values: Tensor, indices: Tensor) -> None:
        """The ``expand`` nodes' children: values [m, kk] float32 log-probabilities, indices [m, kk]
        (a parallel head's: the same row for every parent of a depth)."""
        e, k = self.expand, self.kk
        m = len(e)
        a, b = self.n, self.n + m * k
        self.tok[a:b] = indices.numpy().reshape(-1)
        self.par[a:b] = np.repeat(e, k)
        np.add(self.cum[e][:, None], values.numpy(), out=self.cum[a:b].reshape(m, k))
        self.lo, self.n = a, b

    def proposal(self, vocab_ids: np.ndarray, vocab_size: int) -> DraftProposal:
        """The ``budget`` best nodes (vocab_ids: the reduced vocabulary), emitted depth-first."""
        n = self.n
        cum = self.cum[:n]
        keep = np.argsort(-cum, kind="stable")[:self.budget]
        return depth_first(vocab_ids[self.tok[:n]].tolist(), self.par[:n].tolist(), cum.tolist(), set(keep.tolist()))


class SampledTree(Tree):
    """A tree of drawn nodes with their q rows (module docstring)."""

    def __init__(self, budget: int, depth: int, kk: int, hidden: int, sampling: SamplingParams,
                 gen: torch.Generator):
        super().__init__(budget, depth, kk, hidden)
        self.sampling, self.gen = sampling, gen
        self.rows: list[Tensor | None] = []                   # per node: the q [Vr] it was drawn from

    def draw(self, logits: Tensor) -> tuple[Tensor, Tensor]:
        """Children of m nodes from the head's logits [m, Vr]: (log-probabilities of the draws [m, kk]
        float32, -inf for void children; reduced-vocabulary indices [m, kk]); their q rows are kept."""
        q = processed_probs(logits, self.sampling)                                       # [m, Vr]
        values = torch.full((len(q), self.kk), float("-inf"))
        indices = torch.zeros((len(q), self.kk), dtype=torch.int64)
        for r in range(len(q)):
            drawn, rows = draw_distinct(q[r], self.kk, self.gen)
            for j, (i, row) in enumerate(zip(drawn, rows)):
                values[r, j], indices[r, j] = float(row[i]), i
            self.rows += rows + [None] * (self.kk - len(drawn))
        return values.log(), indices

    def select(self) -> int:
        """As ``Tree.select``, expanding no more nodes than the budget has room for children of."""
        room = self.budget - int(np.count_nonzero(self.cum[:self.n] > -np.inf))
        if room <= 0:
            self.expand, self.done = self.par[:0], True
            return 0
        m = super().select()
        need = -(-room // self.kk)
        if m > need:
            self.expand = self.expand[:need]
            m = need
        return m

    def proposal(self, vocab_ids: np.ndarray, vocab_size: int) -> DraftProposal:
        """The first ``budget`` drawn nodes in creation order, with their q rows [N, vocab_size]."""
        n = self.n
        keep = np.flatnonzero(self.cum[:n] > -np.inf)[:self.budget]
        index = {int(old): new for new, old in enumerate(keep)}
        probs = torch.zeros(len(keep), vocab_size)
        if len(keep):
            probs[:, torch.from_numpy(vocab_ids)] = torch.stack([self.rows[i] for i in keep])
        parents = [index[int(p)] if p >= 0 else -1 for p in self.par[keep]]
        return DraftProposal(vocab_ids[self.tok[keep]].tolist(), probs, parents,
                             np.exp(self.cum[keep]).tolist())
