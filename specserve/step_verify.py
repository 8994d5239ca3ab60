"""One step's verification: turn each sequence's proposal and the (ragged) target pass's logits
into the tensors the pure functions of ``specserve.verify`` take, and their results back into paths.

Rows are grouped: greedy rows go through ``greedy_verify`` when every proposal in the group is a
chain and ``greedy_tree_verify`` otherwise; sampled chain rows through the batched
``rejection_verify``, sampled tree rows one by one through ``tree_rejection_verify_row`` (which
computes the same bits as ``rejection_verify`` on a chain).  Each sampled row draws its own
randomness from its own generator, in a fixed order and amount that depend only on its own
proposal (N uniforms, then V exponentials), so a seeded request samples the same tokens alone and
in any batch on a batch-invariant runtime.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from specserve.drafters.base import DraftProposal
from specserve.sampling import exponential_noise, processed_probs
from specserve.verify import (greedy_tree_verify_argmax, greedy_verify_argmax, rejection_verify,
                              tree_rejection_verify_row)

if TYPE_CHECKING:
    from specserve.engine import Sequence


@dataclass
class StepOutcome:
    path: list[int]       # accepted node indices, root to leaf (a chain: 0 .. a-1)
    tokens: list[int]     # emitted: the accepted tokens, then the recovered or bonus token


def verify_rows(seqs: list["Sequence"], proposals: dict[int, DraftProposal], logits: Tensor,
                offsets: list[int]) -> dict[int, StepOutcome]:
    """logits: [N, V] of a ragged pass; sequence b's pending token is row offsets[b], its node i
    row offsets[b] + 1 + i."""
    out: dict[int, StepOutcome] = {}
    greedy = [i for i, s in enumerate(seqs) if s.request.sampling.greedy]
    sampled = [i for i, s in enumerate(seqs) if not s.request.sampling.greedy]
    if greedy:
        argmax = logits.argmax(-1)                                                     # [N], one op for all
        out.update(_greedy([seqs[i] for i in greedy], [proposals[seqs[i].seq_id] for i in greedy], argmax,
                           [offsets[i] for i in greedy]))
    chains = [i for i in sampled if proposals[seqs[i].seq_id].is_chain]
    if chains:
        out.update(_sampled_chains([seqs[i] for i in chains], [proposals[seqs[i].seq_id] for i in chains],
                                   [_rows(logits, offsets[i], proposals[seqs[i].seq_id]) for i in chains]))
    for i in sampled:
        if i not in chains:
            s = seqs[i]
            out[s.seq_id] = _sampled_tree(s, proposals[s.seq_id], _rows(logits, offsets[i], proposals[s.seq_id]))
    return out


def _rows(logits: Tensor, offset: int, prop: DraftProposal) -> Tensor:
    """A sequence's rows of a ragged pass: [len(prop) + 1, V]."""
    return logits[offset: offset + len(prop) + 1]


def _padded(rows: list[list[int]], width: int, fill: int) -> Tensor:
    return torch.tensor([r + [fill] * (width - len(r)) for r in rows], dtype=torch.long).view(len(rows), width)


def _greedy(seqs, props: list[DraftProposal], argmax: Tensor, offsets: list[int]) -> dict[int, StepOutcome]:
    n = max(len(p) for p in props)
    dev = argmax.device
    tokens = _padded([p.tokens for p in props], n, 0).to(dev)
    num = torch.tensor([len(p) for p in props], dtype=torch.long, device=dev)
    # [B, N+1] argmax per row; entries past a row's own nodes repeat its last one (never read)
    at = torch.tensor([[o + min(j, len(p)) for j in range(n + 1)] for o, p in zip(offsets, props)], device=dev)
    rows = argmax[at]
    if all(p.is_chain for p in props):
        res = greedy_verify_argmax(tokens, num, rows)
        return {s.seq_id: StepOutcome(list(range(int(res.num_accepted[b]))), res.row(b)) for b, s in enumerate(seqs)}
    parents = _padded([p.parent_list() for p in props], n, -1).to(dev)
    res = greedy_tree_verify_argmax(tokens, parents, num, rows)
    return {s.seq_id: StepOutcome(res.accepted_nodes(b), res.row(b)) for b, s in enumerate(seqs)}


def _draws(s: "Sequence", n: int, vocab: int) -> tuple[Tensor, Tensor]:
    """A sampled row's randomness: n acceptance uniforms [n], then the final token's noise [V]."""
    g = s.generator
    return torch.rand(n, generator=g, device=g.device), exponential_noise((vocab,), g)


def _sampled_chains(seqs, props: list[DraftProposal], logits: list[Tensor]) -> dict[int, StepOutcome]:
    """logits[b]: [len(props[b]) + 1, V]."""
    k = max(len(p) for p in props)
    bsz, vocab, dev = len(seqs), logits[0].shape[-1], logits[0].device
    draft = _padded([p.tokens for p in props], k, 0).to(dev)
    num = torch.tensor([len(p) for p in props], dtype=torch.long, device=dev)
    target = torch.zeros(bsz, k + 1, vocab, device=dev)
    uniform = torch.zeros(bsz, k, device=dev)
    noise = torch.empty(bsz, vocab, device=dev)
    for b, (s, p) in enumerate(zip(seqs, props)):
        target[b, : len(p) + 1] = processed_probs(logits[b], s.request.sampling)
        u, e = _draws(s, len(p), vocab)
        uniform[b, : len(p)], noise[b] = u.to(dev), e.to(dev)
    q = None
    if any(p.probs is not None for p in props):
        q = torch.zeros(bsz, k, vocab, device=dev)
        for b, p in enumerate(props):
            if p.probs is not None:
                q[b, : len(p)] = p.probs.to(dev)
            elif len(p):
                q[b, torch.arange(len(p)), draft[b, : len(p)]] = 1.0          # one-hot draft
    res = rejection_verify(draft, num, q, target, uniform, noise)
    return {s.seq_id: StepOutcome(list(range(int(res.num_accepted[b]))), res.row(b)) for b, s in enumerate(seqs)}


def _sampled_tree(s: "Sequence", p: DraftProposal, logits: Tensor) -> StepOutcome:
    """logits: [len(p) + 1, V]."""
    vocab = logits.shape[-1]
    target = processed_probs(logits, s.request.sampling)                          # [N+1, V]
    uniform, noise = _draws(s, len(p), vocab)
    probs = p.probs.to(logits.device) if p.probs is not None else None
    path, tokens = tree_rejection_verify_row(p.tokens, p.parent_list(), probs, target,
                                             uniform.to(logits.device), noise.to(logits.device))
    return StepOutcome(path, tokens)
