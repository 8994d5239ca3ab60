"""``medusa``: Medusa-1 heads over the target's last hidden state propose a tree of candidates.

Terms as in ``specserve.drafters.heads.modules``: block j (0-based) reads f^L_t, the target's final normed
feature at the newest position whose features are known (t = n - 1 for pending token x_n), and
predicts x_{t+2+j}, i.e. the token at depth j + 1 of the draft.  The heads share the target's
LM-head rows over the reduced vocabulary.

Greedy: each depth's ``topk`` likeliest tokens; a node's confidence is the product of its path's head
probabilities (the heads are independent), and the k most confident nodes are grown best-first
(a node's product never exceeds its parent's) and emitted depth-first, likeliest child first.
Sampling: a tree of drawn nodes, depth j's nodes drawn from block j's q (processed like the
target's, zero outside the reduced vocabulary; q does not depend on the earlier drafted tokens,
which is what the heads compute): the ``sample_width`` likeliest drawn nodes of a depth are expanded,
each into ``sample_width`` children drawn without replacement (each with the q it was drawn from
given its earlier siblings, for exact recursive rejection), up to the budget, in draw order.  No
node is kept or dropped by its own draw; ``sample_width=1`` is a chain.

The sequences drafting in one step share the heads' calls: the blocks are one matrix product (their
weights stacked), then one reduced LM head product, one log-softmax and one top-k for all of them.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from specserve.drafters.base import DraftProposal, DraftRequest, Feedback, draw_generator, option, positive
from specserve.drafters.heads.runtime import (HeadDrafter, HeadOptions, depth_first, draw_distinct, head_option,
                                              sample_width_option)
from specserve.drafters.registry import register
from specserve.sampling import SamplingParams, processed_probs


@dataclass(frozen=True)
class MedusaOptions(HeadOptions):
    head: str = head_option("medusa")
    topk: int = option(4, "candidate tokens per depth", check=positive("medusa", "topk"))
    sample_width: int = sample_width_option("medusa")


@register("medusa")
class MedusaDrafter(HeadDrafter):
    max_auto_draft = 16
    Options = MedusaOptions

    def __init__(self, target: Any, **options: Any):
        module = self._open(target, options)
        m = target.model
        self.n_blocks = len(module.blocks)
        self.stacked = m.matmul(torch.cat([b.weight for b in module.blocks]),       # on the target's kernels,
                                torch.cat([b.bias for b in module.blocks]))         # all blocks in one product
        self.last: dict[int, Tensor] = {}
        self.gen: dict[int, torch.Generator] = {}

    def begin(self, seq_id: int, prompt: list[int], sampling: SamplingParams, max_new_tokens: int,
              generator: torch.Generator | None = None) -> None:
        gen = draw_generator(sampling, generator)
        if gen is not None:
            self.gen[seq_id] = gen

    def end(self, seq_id: int) -> None:
        self.last.pop(seq_id, None)
        self.gen.pop(seq_id, None)

    def feedback(self, fb: Feedback) -> None:
        f = fb.features.get(self.feature_layers[0])
        if f is not None and len(f):
            self.last[fb.seq_id] = f[-1].float().cpu()

    def _logits(self, f: Tensor, depth: int) -> Tensor:
        """f [S, hidden] -> the first ``depth`` blocks' reduced-vocabulary logits [S, depth, Vr]."""
        h = self.stacked(f).view(len(f), -1, f.shape[1])[:, :depth]            # [S, depth, hidden]
        h = f[:, None] + torch.nn.functional.silu(h)
        return self.lm(h.reshape(-1, f.shape[1])).view(len(f), depth, -1)

    @torch.inference_mode()
    def propose(self, requests: list[DraftRequest]) -> list[DraftProposal]:
        out = [DraftProposal([]) for _ in requests]
        asked = [(i, r, min(self.n_blocks, r.max_depth, r.k), self.last.get(r.seq_id)) for i, r in enumerate(requests)]
        asked = [a for a in asked if a[2] > 0 and a[3] is not None]
        if not asked:
            return out
        f = asked[0][3][None] if len(asked) == 1 else torch.stack([f for *_, f in asked])
        logits = self._logits(f, max(d for _, _, d, _ in asked))
        greedy = [j for j, (_, r, _, _) in enumerate(asked) if r.sampling.greedy]
        if greedy:
            rows = logits if len(greedy) == len(asked) else logits[greedy]
            top = rows.log_softmax(-1).topk(min(self.topk, logits.shape[2]))
            vals, idx = top.values.tolist(), top.indices.tolist()
            for j, v, ix in zip(greedy, vals, idx):
                i, r, depth, _ = asked[j]
                out[i] = self._tree(v[:depth], ix[:depth], r.k)
        for j, (i, r, depth, _) in enumerate(asked):
            if not r.sampling.greedy:                               # [depth, Vr]: the heads see no drafted token
                out[i] = self._sampled_tree(processed_probs(logits[j, :depth], r.sampling), r.k, self.gen[r.seq_id])
        return out

    def _sampled_tree(self, q: Tensor, budget: int, gen: torch.Generator) -> DraftProposal:
        """The sampled tree (module docstring) from each depth's q [depth, Vr] (processed probabilities)."""
        w = min(self.opts.sample_width, q.shape[1])
        tokens: list[int] = []
        parents: list[int] = []
        logq: list[float] = []
        rows: list[Tensor] = []
        frontier = [-1]
        for d in range(len(q)):
            room = budget - len(tokens)
            expand = sorted(frontier, key=lambda i: -logq[i] if i >= 0 else 0.0)[:min(w, -(-room // w))]
            frontier = []
            for p in expand:
                for i, row in zip(*draw_distinct(q[d], w, gen)):
                    if len(tokens) < budget:
                        frontier.append(len(tokens))
                        tokens.append(self.vocab_list[i])
                        parents.append(p)
                        logq.append((logq[p] if p >= 0 else 0.0) + math.log(float(row[i])))
                        rows.append(row)
        probs = torch.zeros(len(tokens), self.vocab_size)
        if tokens:
            probs[:, self.vocab_ids] = torch.stack(rows)
        return DraftProposal(tokens, probs, parents, [math.exp(x) for x in logq])

    def _tree(self, vals: list[list[float]], idx: list[list[int]], budget: int) -> DraftProposal:
        """Best-first over the Cartesian product of each depth's top tokens (module docstring): vals,
        idx [depth][topk], each depth's top log-probabilities (likeliest first) and their indices."""
        depth = len(vals)
        tokens, parents, score = [], [], []
        heap = [(-vals[0][c], -1, 0, c) for c in range(len(vals[0]))]      # (-score, parent, depth index, choice)
        heapq.heapify(heap)
        while heap and len(tokens) < budget:
            neg, parent, d, c = heapq.heappop(heap)
            tokens.append(self.vocab_list[idx[d][c]])
            parents.append(parent)
            score.append(-neg)
            me = len(tokens) - 1
            if d + 1 < depth:
                for c2 in range(len(vals[d + 1])):
                    heapq.heappush(heap, (neg - vals[d + 1][c2], me, d + 1, c2))
        return depth_first(tokens, parents, score, set(range(len(tokens))))
