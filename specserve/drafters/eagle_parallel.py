"""``eagle-parallel``: a parallel-drafting EAGLE head (P-EAGLE) drafts every depth in one head pass.

Terms as in ``specserve.drafters.eagle`` and ``specserve.drafters.heads.modules``.  When a draft is
asked for after the pending token x_n, one call to the head runs the real entries committed since
the last draft (the newest at n - 1, whose output gives the distribution of x_{n+1}) and, after
them, d - 1 *placeholder* entries at positions n .. n + d - 2 (the embedding of the head's
``mask_token_id`` and the learned state fuse(``mask_hidden``), attending causally to the real entries
and to the placeholders before them); placeholder i's output gives the distribution of x_{n+1+i}.
So a draft of depth d costs one head call and one reduced-LM-head product of d rows, whatever d
(``eagle`` makes one call per depth), for every sequence drafting in the step together.

The distribution at depth i does not depend on the tokens drafted above it, so the tree is built
from the d rows alone, with EAGLE-2's rules (``heads.tree.Tree``): depth 1 is the ``topk`` likeliest
tokens of row 1; at each further depth the ``topk`` nodes of highest cumulative probability that
can still reach the final top k are expanded, each into the ``topk`` likeliest tokens of that
depth's row; the k best nodes are kept and emitted depth-first.  Greedy drafts are one-hot, so
verification is exact whatever the head says.  Under sampling each expanded node's children are
drawn without replacement from the depth's processed q (``heads.tree.SampledTree``, the same law
``eagle`` keeps: the proposal is the first k drawn nodes; ``sample_width=1``: a chain).

The head must have been trained to draft in parallel (``specserve train eagle --parallel K``);
``depth`` is at most its K.  The real entries' bookkeeping (windowed catch-up, features kept per
sequence) is ``eagle``'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from specserve.drafters.base import DraftProposal, DraftRequest, non_negative, option, positive
from specserve.drafters.eagle import EagleDrafter, _Seq
from specserve.drafters.heads.runtime import HeadOptions, head_option, sample_width_option
from specserve.drafters.heads.tree import SampledTree, Tree
from specserve.drafters.registry import register
from specserve.errors import SpecserveError


@dataclass(frozen=True)
class EagleParallelOptions(HeadOptions):
    head: str = head_option("eagle-parallel")
    topk: int = option(4, "children per expanded node, and nodes expanded per depth",
                       check=positive("eagle-parallel", "topk"))
    depth: int = option(0, "deepest drafted token (0: as deep as the head was trained to draft)",
                        check=non_negative("eagle-parallel", "depth"))
    window: int = option(8, "real entries a draft catches up on after positions committed without one: "
                         "the newest this many (0: every position)", check=non_negative("eagle-parallel", "window"))
    sample_width: int = sample_width_option("eagle-parallel")


@register("eagle-parallel")
class EagleParallelDrafter(EagleDrafter):
    Options = EagleParallelOptions
    parallel_head = True
    train_command = "specserve train eagle --parallel 4 --out DIR"

    def __init__(self, target: Any, **options: Any):
        super().__init__(target, **options)
        k = self.cfg.parallel
        if self.opts.depth > k:
            raise SpecserveError(f"eagle-parallel: depth {self.opts.depth} is deeper than the head at "
                                 f"{self.head_dir} drafts (it was trained for {k})")
        self.max_tree_depth = self.opts.depth or k
        with torch.inference_mode():
            self.hold_g = self.head.placeholder_state(self.lin).clone()     # [hidden]
        self.hold_token = self.cfg.mask_token_id

    @torch.inference_mode()
    def propose(self, requests: list[DraftRequest]) -> list[DraftProposal]:
        out = [DraftProposal([]) for _ in requests]
        asked = [(i, r, self.seqs[r.seq_id], min(self.max_tree_depth, r.max_depth, r.k)) for i, r in enumerate(requests)]
        asked = [a for a in asked if a[3] > 0]                # a request for no draft costs nothing
        if not asked:
            return out
        held = self._catch_up([(s, r.tokens) for _, r, s, _ in asked], [d - 1 for *_, d in asked])
        ready = [(a, h) for a, h in zip(asked, held) if a[2].last is not None]
        if not ready:
            return out
        logits = self._logits(torch.cat([torch.cat([s.last[None], h]) for (_, _, s, _), h in ready]))
        lo = 0
        for (i, r, s, d), _ in ready:
            out[i] = self._tree(r, s, d, logits[lo:lo + d])
            lo += d
        return out

    def _tree(self, r: DraftRequest, s: _Seq, d: int, logits: torch.Tensor) -> DraftProposal:
        """One request's tree of depth <= d from its rows' logits [d, Vr] (module docstring)."""
        vr = len(self.vocab_ids)
        if r.sampling.greedy:
            kk = min(self.topk, vr, r.k)
            t = Tree(r.k, d, kk, 0)
            top = logits.log_softmax(-1).topk(kk)
            pick = lambda j, m: (top.values[j].expand(m, kk), top.indices[j].expand(m, kk))   # noqa: E731
        else:
            t = SampledTree(r.k, d, min(self.opts.sample_width, vr, r.k), 0, r.sampling, s.gen)
            pick = lambda j, m: t.draw(logits[j].expand(m, -1))                                 # noqa: E731
        v, i = pick(0, 1)
        t.roots(v[0], i[0])
        for j in range(1, d):
            m = t.select()
            if not m:
                break
            t.add_children(*pick(j, m))
        return t.proposal(self.vocab_np, self.vocab_size)
