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
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from specserve.drafters.base import DraftProposal
from specserve.drafters.heads.runtime import depth_first


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
        e, k = self.expand, self.kk
        m = len(e)
        self.out[self.used - m:self.used] = out
        a, b = self.n, self.n + m * k
        self.tok[a:b] = indices.numpy().reshape(-1)
        self.par[a:b] = np.repeat(e, k)
        np.add(self.cum[e][:, None], values.numpy(), out=self.cum[a:b].reshape(m, k))
        self.lo, self.n = a, b

    def proposal(self, vocab_ids: np.ndarray) -> DraftProposal:
        """The ``budget`` best nodes (vocab_ids: the reduced vocabulary), emitted depth-first."""
        n = self.n
        cum = self.cum[:n]
        keep = np.argsort(-cum, kind="stable")[:self.budget]
        return depth_first(vocab_ids[self.tok[:n]].tolist(), self.par[:n].tolist(), cum.tolist(), set(keep.tolist()))
