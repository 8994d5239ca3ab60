"""``ngram-tree``: prompt lookup that merges many earlier matches into a trie of candidates.

Chain n-gram lookup (``ngram``) proposes what followed the single most recent occurrence of the
sequence's longest matching suffix.  Here every earlier position whose preceding tokens match the
sequence's last ``min_n``..``max_n`` tokens is a *match*; the ``max_matches`` best of them (longest
match first, then most recent) each contribute the tokens that followed them, and these
continuations are merged into a trie.  Each trie node gets an estimate of the probability that its
whole path is right: its parent's estimate, times its share of the continuations leaving the parent
(a match of length m weighing ``length_weight ** m``, the j-th most recent of a length
``recency ** j``), times the reliability of a copy whose match now spans m + (depth - 1) tokens,
``1 - (1 - base) * growth ** (m + depth - 2)``.  The defaults of ``base`` and ``growth`` were fitted
on greedy outputs of the default model for training prompts (not the evaluation set), where the
estimates are calibrated to within a few points (``scripts/tune_ngram_tree.py``).  The ``k``
most probable nodes are kept best-first (a node's estimate never exceeds its parent's, so the kept
nodes form a tree), none below ``min_score``, and emitted depth-first with the best child first, so
that the most probable path is nodes 0, 1, 2, ...; the estimates are the proposal's ``confidence``.

Example: tokens ``a b x . a b y . a b``: the suffix ``a b`` matches before ``x`` (2 tokens) and
``. a b`` before ``y`` (3 tokens), so the trie's root has children ``y`` (longer match, scored
higher, its path ``y . a b`` kept first) and ``x`` (a sibling, kept if the budget allows).  The proposal is deterministic (one-hot q), so it is exact under sampling as well.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specserve.drafters.base import DraftProposal, DraftRequest, Drafter, Option
from specserve.drafters.ngram import reliability
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


@dataclass
class Trie:
    """Node 0 is the pending token; every other node a drafted token with its parent."""
    children: list[dict[int, int]] = field(default_factory=lambda: [{}])
    mass: list[float] = field(default_factory=lambda: [0.0])     # weight of the matches through the node
    longest: list[int] = field(default_factory=lambda: [0])      # longest match length through the node
    parent: list[int] = field(default_factory=lambda: [-1])
    token: list[int] = field(default_factory=lambda: [-1])
    depth: list[int] = field(default_factory=lambda: [0])

    def add(self, continuation: list[int], weight: float, match_len: int) -> None:
        node = 0
        for t in continuation:
            nxt = self.children[node].get(t)
            if nxt is None:
                nxt = len(self.mass)
                self.children[node][t] = nxt
                self.children.append({})
                self.mass.append(0.0)
                self.longest.append(0)
                self.parent.append(node)
                self.token.append(t)
                self.depth.append(self.depth[node] + 1)
            self.mass[nxt] += weight
            self.longest[nxt] = max(self.longest[nxt], match_len)
            node = nxt

    def scores(self, base: float, growth: float) -> list[float]:
        """Estimated probability that each node's path is right: the parent's estimate, times the
        node's share of the continuations leaving its parent, times the reliability of a copy whose
        match spans the match length plus the path below the pending token."""
        score = [1.0] + [0.0] * (len(self.mass) - 1)
        for node in range(1, len(self.mass)):                      # parents are created first
            p = self.parent[node]
            share = self.mass[node] / sum(self.mass[c] for c in self.children[p].values())
            m = self.longest[node] + self.depth[node] - 1
            score[node] = score[p] * share * float(reliability(m, base, growth))
        return score


def ngram_tree_propose(tokens: np.ndarray, k: int, max_depth: int, min_n: int = 1, max_n: int = 8,
                       max_matches: int = 16, length_weight: float = 4.0, recency: float = 0.7,
                       base: float = 0.3, growth: float = 0.8, min_score: float = 0.05) -> DraftProposal:
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
    trie = Trie()
    for end, w, m in zip(ends.tolist(), weight.tolist(), lengths.tolist()):
        trie.add(tokens[end: end + max_depth].tolist(), w, m)
    return best_first(trie, trie.scores(base, growth), k, min_score)


def best_first(trie: Trie, score: list[float], k: int, min_score: float) -> DraftProposal:
    """The k best-scoring nodes of ``trie`` (none below ``min_score``), emitted depth-first with the
    best child first, ``score`` as their confidence."""
    # best-first selection: a child's score <= its parent's, so popping by score keeps a tree
    heap = [(-score[c], c) for c in trie.children[0].values()]
    heapq.heapify(heap)
    kept: dict[int, list[int]] = {0: []}                 # selected node -> selected children, best first
    while heap and len(kept) - 1 < k:
        neg, node = heapq.heappop(heap)
        if -neg < min_score:
            break
        kept[trie.parent[node]].append(node)
        kept[node] = []
        for c in trie.children[node].values():
            heapq.heappush(heap, (-score[c], c))
    # emit depth-first, best child first: the most probable path comes first, as a chain, so when
    # it is the one accepted the engine has no cache entries to move
    out_tokens, out_parents, conf = [], [], []
    stack = [(c, -1) for c in reversed(kept[0])]
    while stack:
        node, parent_index = stack.pop()
        out_tokens.append(trie.token[node])
        out_parents.append(parent_index)
        conf.append(score[node])
        stack += [(c, len(out_tokens) - 1) for c in reversed(kept[node])]
    return DraftProposal(out_tokens, None, out_parents, conf)


def trie_options(recency: float) -> tuple[Option, ...]:
    """The options of a drafter that scores a trie of matches' continuations (``Trie.scores``)."""
    return (Option("length_weight", float, 4.0, "a match of length m weighs length_weight ** m"),
            Option("recency", float, recency, "the j-th most recent match of a length weighs recency ** j"),
            Option("base", float, 0.3, "probability that a token copied after a 1-token match is right"),
            Option("growth", float, 0.8, "each further matched token multiplies the miss probability by this"),
            Option("min_score", float, 0.05, "skip nodes whose estimated probability is lower"))


def check_trie_options(name: str, length_weight: float, recency: float, base: float, growth: float,
                       min_score: float) -> None:
    """Refuse ``trie_options`` values that make no sense, naming the drafter."""
    if length_weight < 1 or not 0 < recency <= 1 or not 0 <= min_score <= 1:
        raise SpecserveError(f"{name} needs length_weight >= 1, 0 < recency <= 1 and 0 <= min_score <= 1")
    if not 0 < base <= 1 or not 0 < growth <= 1:
        raise SpecserveError(f"{name} needs 0 < base <= 1 and 0 < growth <= 1")


class Rate:
    """A decayed success rate with a prior: (successes + prior x weight) / (trials + weight)."""

    def __init__(self, prior: float, weight: float = 4.0, decay: float = 0.995):
        self.prior, self.weight, self.decay = prior, weight, decay
        self.hits = self.trials = 0.0

    def add(self, hits: float, trials: float) -> None:
        self.hits = self.decay * self.hits + hits
        self.trials = self.decay * self.trials + trials

    @property
    def value(self) -> float:
        return (self.hits + self.prior * self.weight) / (self.trials + self.weight)


@register("ngram-tree")
class NgramTreeDrafter(Drafter):
    tree = True
    max_auto_draft = 16
    confidence = True
    preload = True
    options = (Option("min_n", int, 1, "shortest suffix to look up"),
               Option("max_n", int, 8, "longest suffix to look up (longer matches are trusted more)"),
               Option("max_matches", int, 16, "earlier matches merged into the trie"),
               Option("max_depth", int, 8, "longest path proposed"),
               *trie_options(recency=0.7))

    def __init__(self, target: Any = None, min_n: int = 1, max_n: int = 8, max_matches: int = 16, max_depth: int = 8,
                 length_weight: float = 4.0, recency: float = 0.7, base: float = 0.3, growth: float = 0.8,
                 min_score: float = 0.05):
        if min_n < 1 or max_n < min_n:
            raise SpecserveError(f"ngram-tree needs 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        if max_matches < 1 or max_depth < 1:
            raise SpecserveError("ngram-tree needs max_matches >= 1 and max_depth >= 1")
        check_trie_options("ngram-tree", length_weight, recency, base, growth, min_score)
        self.params = dict(min_n=min_n, max_n=max_n, max_matches=max_matches, length_weight=length_weight,
                           recency=recency, base=base, growth=growth, min_score=min_score)
        self.max_depth = max_depth

    def propose(self, requests: list[DraftRequest]) -> list[DraftProposal]:
        return [ngram_tree_propose(np.asarray(r.tokens, dtype=np.int64), r.k, min(self.max_depth, r.max_depth),
                                   **self.params) for r in requests]
