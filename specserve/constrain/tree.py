"""A grammar over a drafted tree: which nodes it forbids, which tokens it forces, a mask per node.

Terms.  A draft is a tree of N nodes in topological order (``tokens[i]``, ``parents[i]``, -1: a child
of the pending token, the root).  The matcher is at the root's state: every committed token,
pending one included, accepted.  A node's *state* is the matcher after accepting the tokens of its
path from the root.  A node is *forbidden* when the grammar rejects its token in its parent's state.

``shape`` walks the tree depth first, advancing the matcher along each path and rolling it back:

- a forbidden **deterministic** node goes, with its subtree.  Exact: its target probability under
  the mask is 0, so verification would reject it, and rejecting a one-hot draft whose token has
  probability 0 leaves the residual distribution as it was;
- a forbidden **drawn** node (sampled from q) stays, and only its subtree goes: removing it would
  change the residual that recursive rejection samples from (max(0, p - q) renormalised, not p), and
  with it the output distribution.  It is rejected with certainty, since p is 0 at its token;
- at every kept node none of whose children the grammar allows (the root included), the tokens the
  grammar forces next are proposed as a chain below it (jump-forward), spelt as the target spelt that
  text before where it did (``spelling``), else with xgrammar's tokens; where nothing (more) is
  forced but a mask allows exactly one token (an end tag xgrammar does not jump to), or only
  end-of-text tokens, that token (``only_tokens``), and so on while that holds.  At a node whose allowed children are
  all deterministic, a forced chain is added beside them when its first token is none of theirs (the
  drafter spelt the forced text otherwise: both spellings are verified).

``masks`` fills one bitmask row per logits row of the pass (row 0: the root's state; row i + 1: node
i's), so verification sees, at every position, the target's distribution masked by the grammar state
along that position's own path.  Rows of forbidden nodes allow everything: they are never read.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from specserve.constrain.grammar import Matcher, new_bitmask
from specserve.constrain.spelling import Spelling, chain as spelled
from specserve.trees import children_of


@dataclass
class Shaped:
    keep: list[int]                                     # kept drafted nodes, ascending
    chains: list[tuple[int, list[int]]] = field(default_factory=list)
    # ^ forced chains: (the kept node they hang below, -1: the root; their tokens, first to last)

    @property
    def forced(self) -> int:
        return sum(len(c) for _, c in self.chains)


def single_token(row: Tensor) -> int | None:
    """The token a bitmask row ([W] int32) allows when it allows exactly one, else None."""
    nz = torch.nonzero(row).flatten()
    if len(nz) != 1:
        return None
    w = int(row[nz[0]]) & 0xFFFFFFFF
    return int(nz[0]) * 32 + w.bit_length() - 1 if w & (w - 1) == 0 else None


def only_tokens(matcher: Matcher, head: list[int], budget: int, scratch: Tensor,
                spelling: Spelling | None) -> list[int]:
    """After ``head`` (tokens the grammar accepts from the matcher's state), the tokens that follow
    because the grammar allows nothing else: one token alone (an end tag xgrammar does not jump to),
    or the end of text where only end-of-text tokens are allowed (the one the target wrote last,
    ``Spelling.end``, else the lowest); at most ``budget``.  The matcher is left as it was."""
    if budget <= 0:
        return []
    for t in head:
        matcher.accept(t)
    out: list[int] = []
    while len(out) < budget and not matcher.terminated:
        matcher.fill(scratch, 0)
        t = single_token(scratch[0])
        if t is None:
            t = only_end(scratch[0], matcher.stop_ids, spelling)
        if t is None or not matcher.accept(t):
            break
        out.append(t)
    matcher.rollback(len(head) + len(out))
    return out


def only_end(row: Tensor, stops: frozenset[int], spelling: Spelling | None) -> int | None:
    """The end-of-text token to draft where a bitmask row ([W] int32) allows end-of-text tokens only
    (None where it allows anything else, or nothing)."""
    words = torch.nonzero(row).flatten().tolist()
    if not words or len(words) > len(stops):
        return None
    ids = {32 * w + b for w in words for b in range(32) if (int(row[w]) & 0xFFFFFFFF) >> b & 1}
    if not ids <= stops:
        return None
    last = spelling.end if spelling is not None else None
    return last if last in ids else min(ids)


def shape(matcher: Matcher, tokens: list[int], parents: list[int], drawn: list[bool], room: int,
          max_depth: int, jump: bool, prev: int = -1, spelling: Spelling | None = None) -> Shaped:
    """Prune a draft to what the grammar allows and add the forced chains (see the module docstring).

    ``drawn[i]``: node i was sampled from a q (not one-hot); ``room``: forced nodes that may be added
    in all; ``max_depth``: no forced node deeper; ``jump``: add forced chains at all; ``prev``: the
    root's token (the last committed); ``spelling``: how the target spelt forced text before.  The
    matcher is left at the root's state."""
    kids = children_of(parents)
    keep: list[int] = []
    out = Shaped(keep)
    scratch = new_bitmask(1, matcher.vocab_size)

    def forced_chain(at: int, depth: int, beside: set[int]) -> None:
        budget = min(room - out.forced, max_depth - depth)
        if budget <= 0:
            return
        chain = spelled(matcher, tokens[at] if at >= 0 else prev, budget, spelling)
        if chain or not beside:
            chain += only_tokens(matcher, chain, budget - len(chain), scratch, spelling)
        if chain and chain[0] not in beside:
            out.chains.append((at, chain))

    def visit(node: int, depth: int) -> None:            # the matcher is at ``node``'s state
        if matcher.terminated:                           # an end of text: nothing follows
            return
        allowed: set[int] = set()
        for c in kids[node + 1]:
            if matcher.accept(tokens[c]):
                keep.append(c)
                allowed.add(-1 if drawn[c] else tokens[c])
                visit(c, depth + 1)
                matcher.rollback(1)
            elif drawn[c]:
                keep.append(c)
        if jump and -1 not in allowed:
            forced_chain(node, depth, allowed)

    visit(-1, 0)
    keep.sort()
    return out


def masks(matcher: Matcher, tokens: list[int], parents: list[int], into: Tensor | None = None) -> Tensor:
    """int32 [N + 1, W]: row 0 the tokens allowed after the root, row i + 1 after node i's path (all
    allowed for a forbidden node, one below it or one after an end of text), written into the first
    N + 1 rows of ``into`` (int32 [R, W], contiguous, on the CPU) when given, else a new tensor.  The
    matcher is left at the root's state."""
    kids = children_of(parents)
    n = len(tokens) + 1
    if into is None:
        bitmask = new_bitmask(n, matcher.vocab_size)
    else:
        bitmask = into[:n]
    bitmask.numpy()[:] = -1                                                         # all allowed

    def visit(node: int) -> None:
        if matcher.terminated:                           # after an end of text: never read
            return
        matcher.fill(bitmask, node + 1)
        for c in kids[node + 1]:
            if matcher.accept(tokens[c]):
                visit(c)
                matcher.rollback(1)

    visit(-1)
    return bitmask
