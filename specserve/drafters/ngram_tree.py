"""``ngram-tree``: prompt lookup that merges many earlier matches into a trie of candidates.

Chain n-gram lookup (``ngram``) proposes what followed the single most recent occurrence of the
sequence's longest matching suffix.  Here every earlier position whose preceding tokens match the
sequence's last ``min_n``..``max_n`` tokens is a *match*; the ``max_matches`` best of them (longest
match first, then most recent) each contribute the tokens that followed them as a continuation.
The continuations are merged into a trie, and each trie node is scored by the weighted share of
continuations that pass through it, a match of length m weighing ``length_weight ** m`` and the
j-th most recent match of that length ``recency ** j``: an estimate of the probability that the
node's whole path is right.  The ``k`` best nodes are kept best-first (a node's score never exceeds
its parent's, so the kept nodes always form a tree), skipping nodes scored below ``min_score``.

Example: tokens ``a b x . a b y . a b`` with suffix ``a b``: matches at 2 and 6 continue with
``x . a b`` and ``y . a b``; the trie's root has children ``y`` (more recent, scored higher) and
``x``.  The proposal is deterministic (one-hot q), so it is exact under sampling as well.
"""

from __future__ import annotations

import heapq
from typing import Any

import numpy as np

from specserve.drafters.base import DraftProposal, DraftRequest, Drafter, Option
from specserve.drafters.registry import register
from specserve.errors import SpecserveError


def find_matches(tokens: np.ndarray, min_n: int, max_n: int) -> tuple[np.ndarray, np.ndarray]:
    """Earlier positions whose preceding tokens match the sequence's suffix.

    tokens: [L] int array.  Returns (ends, lengths): ``tokens[end - m: end] == tokens[L - m:]`` with
    m = lengths (capped at max_n, at least min_n) and ``end < L``, so a continuation starts at
    ``end``.  Example: [a b c a b] -> ends [2], lengths [2].
    """
    length = len(tokens)
    ends = np.arange(1, length)                                    # a match must leave a continuation
    alive = np.ones(len(ends), dtype=bool)
    lengths = np.zeros(len(ends), dtype=np.int64)
    for j in range(1, min(max_n, length - 1) + 1):
        ok = ends - j >= 0
        alive &= ok & (tokens[np.maximum(ends - j, 0)] == tokens[length - j])
        lengths += alive
        if not alive.any():
            break
    keep = lengths >= min_n
    return ends[keep], lengths[keep]


def ngram_tree_propose(tokens: np.ndarray, k: int, max_depth: int, min_n: int = 1, max_n: int = 4,
                       max_matches: int = 16, length_weight: float = 4.0, recency: float = 0.7,
                       min_score: float = 0.0) -> DraftProposal:
    """A trie of at most k nodes, no deeper than max_depth (see the module docstring)."""
    if k <= 0 or max_depth <= 0:
        return DraftProposal([])
    ends, lengths = find_matches(tokens, min_n, max_n)
    if not len(ends):
        return DraftProposal([])
    order = np.lexsort((-ends, -lengths))[:max_matches]            # longest first, then most recent
    ends, lengths = ends[order], lengths[order]
    rank = np.zeros(len(ends))                                     # recency rank within each length
    for m in np.unique(lengths):
        sel = lengths == m
        rank[sel] = np.arange(sel.sum())
    weight = length_weight ** lengths.astype(float) * recency ** rank
    weight /= weight.sum()
    # trie: node -> children {token: node}; node 0 is the pending token
    children: list[dict[int, int]] = [{}]
    score, parent, tok, depth = [1.0], [-1], [-1], [0]
    for end, w in zip(ends, weight):
        node = 0
        for t in tokens[end: end + max_depth].tolist():
            nxt = children[node].get(t)
            if nxt is None:
                nxt = len(score)
                children[node][t] = nxt
                children.append({})
                score.append(0.0)
                parent.append(node)
                tok.append(t)
                depth.append(depth[node] + 1)
            score[nxt] += w
            node = nxt
    # best-first selection: a child's score <= its parent's, so popping by score keeps a tree
    heap = [(-score[c], c) for c in children[0].values()]
    heapq.heapify(heap)
    out_tokens, out_parents, conf = [], [], []
    index: dict[int, int] = {0: -1}
    while heap and len(out_tokens) < k:
        neg, node = heapq.heappop(heap)
        if -neg < min_score:
            break
        index[node] = len(out_tokens)
        out_tokens.append(tok[node])
        out_parents.append(index[parent[node]])
        conf.append(score[node])
        for c in children[node].values():
            heapq.heappush(heap, (-score[c], c))
    return DraftProposal(out_tokens, None, out_parents, conf)


@register("ngram-tree")
class NgramTreeDrafter(Drafter):
    tree = True
    default_num_draft = 8
    preload = True
    options = (Option("min_n", int, 1, "shortest suffix to look up"),
               Option("max_n", int, 4, "longest suffix to look up"),
               Option("max_matches", int, 16, "earlier matches merged into the trie"),
               Option("max_depth", int, 8, "longest path proposed"),
               Option("length_weight", float, 4.0, "a match of length m weighs length_weight ** m"),
               Option("recency", float, 0.7, "the j-th most recent match of a length weighs recency ** j"),
               Option("min_score", float, 0.0, "skip nodes whose estimated probability is lower"))

    def __init__(self, target: Any = None, min_n: int = 1, max_n: int = 4, max_matches: int = 16, max_depth: int = 8,
                 length_weight: float = 4.0, recency: float = 0.7, min_score: float = 0.0):
        if min_n < 1 or max_n < min_n:
            raise SpecserveError(f"ngram-tree needs 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        if max_matches < 1 or max_depth < 1:
            raise SpecserveError("ngram-tree needs max_matches >= 1 and max_depth >= 1")
        if length_weight < 1 or not 0 < recency <= 1 or not 0 <= min_score <= 1:
            raise SpecserveError("ngram-tree needs length_weight >= 1, 0 < recency <= 1 and 0 <= min_score <= 1")
        self.params = dict(min_n=min_n, max_n=max_n, max_matches=max_matches, length_weight=length_weight,
                           recency=recency, min_score=min_score)
        self.max_depth = max_depth

    def propose(self, requests: list[DraftRequest]) -> list[DraftProposal]:
        return [ngram_tree_propose(np.asarray(r.tokens, dtype=np.int64), r.k, min(self.max_depth, r.max_depth),
                                   **self.params) for r in requests]
