"""One step's verification: each decoding row's proposal and the ragged pass's logits in, each
row's accepted path and emitted tokens out (the per-step routing over ``chain`` and ``tree``).

Rows are grouped: greedy rows go through a runtime's native walk when it gives one (``walk_of``:
the same outcomes, with no tensor built), else ``greedy_verify_argmax`` when every proposal in the
group is a chain and ``greedy_tree_verify_argmax`` otherwise; sampled chain rows through the batched
``rejection_verify``, sampled tree rows one by one through ``tree_rejection_verify_row`` (which
computes the same bits as ``rejection_verify`` on a chain).  Each sampled row draws its own
randomness from its own generator, in a fixed order and amount that depend only on its own
proposal (N uniforms, then V exponentials), so a seeded request samples the same tokens alone and
in any batch on a batch-invariant runtime.  Rows carry plain fields (tokens, parents, q, sampling
settings, generator): nothing here knows drafters or sequences.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from specserve import trees
from specserve.sampling import SamplingParams, exponential_noise, processed_probs
from specserve.verify.chain import greedy_verify_argmax, rejection_verify
from specserve.verify.tree import greedy_tree_verify_argmax, tree_rejection_verify_row


@dataclass
class Row(trees.Nodes):
    """One decoding sequence's part of a pass."""
    tokens: list[int]                 # N drafted node tokens, topological order
    parents: list[int] | None         # N parent indices (-1: child of the pending token); None: a chain
    probs: Tensor | None              # [N, V] q per node; None: one-hot (deterministic drafter)
    offset: int                       # logits row of the pending token; node i is row offset + 1 + i
    sampling: SamplingParams
    generator: torch.Generator | None  # the sequence's own (None: greedy)


@dataclass
class Outcome:
    path: list[int]       # accepted node indices, root to leaf (a chain: 0 .. a-1)
    tokens: list[int]     # emitted: the accepted tokens, then the recovered or bonus token


Walk = Callable[[Tensor, list[int], list[list[int]], "list[list[int]] | None"], "list[tuple[list[int], int]] | None"]


def verify_rows(rows: list[Row], logits: Tensor,
                argmax_of: Callable[[Tensor], Tensor] = lambda x: x.argmax(-1),
                walk_of: Walk | None = None) -> list[Outcome]:
    """logits: [M, V] of a ragged pass (M >= every row's offset + N + 1); ``argmax_of`` maps them to
    [M] int64, each row's first maximum (greedy rows read nothing else; a runtime's faster kernel may
    stand in for torch's when it gives the same indices).  ``walk_of(logits, offsets, tokens,
    parents)`` (parents None: chains), where given, verifies the greedy rows in one call and returns
    each one's (accepted path, emitted token after it), the outcomes ``_greedy`` computes, or None
    where it cannot run.  Outcomes in row order."""
    out: list[Outcome | None] = [None] * len(rows)
    greedy = [i for i, r in enumerate(rows) if r.sampling.greedy]
    sampled = [i for i, r in enumerate(rows) if not r.sampling.greedy]
    if greedy:
        for i, o in zip(greedy, _greedy_rows([rows[i] for i in greedy], logits, argmax_of, walk_of)):
            out[i] = o
    chains = [i for i in sampled if rows[i].is_chain]
    if chains:
        for i, o in zip(chains, _sampled_chains([rows[i] for i in chains], [_logits(logits, rows[i]) for i in chains])):
            out[i] = o
    for i in sampled:
        if out[i] is None:
            out[i] = _sampled_tree(rows[i], _logits(logits, rows[i]))
    return out                                                                         # type: ignore[return-value]


def _logits(logits: Tensor, r: Row) -> Tensor:
    """A row's logits: [N + 1, V]."""
    return logits[r.offset: r.offset + len(r.tokens) + 1]


def _padded(rows: list[list[int]], width: int, fill: int) -> Tensor:
    return torch.tensor([r + [fill] * (width - len(r)) for r in rows], dtype=torch.long).view(len(rows), width)


def _greedy_rows(rows: list[Row], logits: Tensor, argmax_of: Callable[[Tensor], Tensor],
                 walk_of: Walk | None) -> list[Outcome]:
    """logits: [M, V]; the greedy rows' outcomes by the native walk where it runs, else on tensors."""
    chains = all(r.is_chain for r in rows)
    walked = walk_of(logits, [r.offset for r in rows], [r.tokens for r in rows],
                     None if chains else [r.parent_list() for r in rows]) if walk_of is not None else None
    if walked is None:
        return _greedy(rows, argmax_of(logits))                                        # [M], one op for all
    return [Outcome(path, [r.tokens[j] for j in path] + [final]) for r, (path, final) in zip(rows, walked)]


def _greedy(rows: list[Row], argmax: Tensor) -> list[Outcome]:
    """argmax: [M] the pass's argmax per logits row."""
    n = max(len(r.tokens) for r in rows)
    dev = argmax.device
    tokens = _padded([r.tokens for r in rows], n, 0).to(dev)
    num = torch.tensor([len(r.tokens) for r in rows], dtype=torch.long, device=dev)
    # [B, N+1] argmax per row; entries past a row's own nodes repeat its last one (never read)
    at = torch.tensor([[r.offset + min(j, len(r.tokens)) for j in range(n + 1)] for r in rows], device=dev)
    best = argmax[at]
    if all(r.is_chain for r in rows):
        res = greedy_verify_argmax(tokens, num, best)
        return [Outcome(list(range(int(res.num_accepted[b]))), res.row(b)) for b in range(len(rows))]
    parents = _padded([r.parent_list() for r in rows], n, -1).to(dev)
    res = greedy_tree_verify_argmax(tokens, parents, num, best)
    return [Outcome(res.accepted_nodes(b), res.row(b)) for b in range(len(rows))]


def _draws(g: torch.Generator, n: int, vocab: int) -> tuple[Tensor, Tensor]:
    """A sampled row's randomness: n acceptance uniforms [n], then the final token's noise [V]."""
    return torch.rand(n, generator=g, device=g.device), exponential_noise((vocab,), g)


def _sampled_chains(rows: list[Row], logits: list[Tensor]) -> list[Outcome]:
    """logits[b]: [len(rows[b].tokens) + 1, V]."""
    k = max(len(r.tokens) for r in rows)
    bsz, vocab, dev = len(rows), logits[0].shape[-1], logits[0].device
    draft = _padded([r.tokens for r in rows], k, 0).to(dev)
    num = torch.tensor([len(r.tokens) for r in rows], dtype=torch.long, device=dev)
    target = torch.zeros(bsz, k + 1, vocab, device=dev)
    uniform = torch.zeros(bsz, k, device=dev)
    noise = torch.empty(bsz, vocab, device=dev)
    for b, r in enumerate(rows):
        n = len(r.tokens)
        target[b, : n + 1] = processed_probs(logits[b], r.sampling)
        u, e = _draws(r.generator, n, vocab)
        uniform[b, :n], noise[b] = u.to(dev), e.to(dev)
    q = None
    if any(r.probs is not None for r in rows):
        q = torch.zeros(bsz, k, vocab, device=dev)
        for b, r in enumerate(rows):
            n = len(r.tokens)
            if r.probs is not None:
                q[b, :n] = r.probs.to(dev)
            elif n:
                q[b, :n] = trees.one_hot_rows(draft[b, :n], vocab, q.dtype, dev)               # one-hot draft
    res = rejection_verify(draft, num, q, target, uniform, noise)
    return [Outcome(list(range(int(res.num_accepted[b]))), res.row(b)) for b in range(bsz)]


def _sampled_tree(r: Row, logits: Tensor) -> Outcome:
    """logits: [N + 1, V]."""
    vocab = logits.shape[-1]
    target = processed_probs(logits, r.sampling)                                       # [N+1, V]
    uniform, noise = _draws(r.generator, len(r.tokens), vocab)
    probs = r.probs.to(logits.device) if r.probs is not None else None
    path, tokens = tree_rejection_verify_row(r.tokens, r.parent_list(), probs, target,
                                             uniform.to(logits.device), noise.to(logits.device))
    return Outcome(path, tokens)
