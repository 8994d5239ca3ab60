"""The trie of candidate continuations shared by ``ngram-tree``, ``suffix`` and ``lookahead``.

Terms.  A **match** is an earlier position whose preceding m tokens equal the sequence's last m
tokens (its **length** m, ``min_n <= m <= max_n``); its **continuation** is what followed it.  The
``max_matches`` best matches (longest first, then most recent) are merged into a **trie** whose
root is the pending token.  A match of length m weighs ``length_weight ** m``, the j-th most
recent of a length also ``recency ** j``; a node's **mass** is the weight of the matches through
it.  Each node gets an estimate (its **score**) of the probability that its whole path is right:
its parent's score, times its share of the mass leaving the parent, times the reliability of a
copy whose match now spans m + (depth - 1) tokens (``reliability``).  The ``k`` best-scoring nodes
are kept best-first (a node's score never exceeds its parent's, so they form a tree), none below
``min_score``, and emitted depth-first with the best child first, so that the most probable path
is nodes 0, 1, 2, ...; the scores are the proposal's ``confidence``.

Example: tokens ``a b x . a b y . a b``: the suffix ``a b`` matches before ``x`` (2 tokens) and
``. a b`` before ``y`` (3 tokens), so the root has children ``y`` (the longer match, scored higher,
its path ``y . a b`` kept first) and ``x`` (a sibling, kept if the budget allows).

The options of these drafters (``TrieOptions``) are written here once; ``base`` and ``growth``
were fitted with ``experiments/tune_ngram_tree.py`` on training prompts, never the evaluation set.
"""

from __future__ import annotations

import collections
import heapq
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Iterable

import numpy as np

from specserve.drafters.base import DraftProposal, option
from specserve.errors import SpecserveError


def reliability(m: np.ndarray | int, base: float, growth: float) -> np.ndarray | float:
    """Probability that a copied token is right when the text before it matches over m tokens:
    ``1 - (1 - base) * growth ** (m - 1)``, rising from ``base`` at m = 1 towards 1."""
    return 1.0 - (1.0 - base) * growth ** (np.asarray(m) - 1)


@dataclass(frozen=True)
class TrieOptions:
    """How matches are found and their trie scored: ``ngram-tree``'s options, the defaults of the
    other trie drafters (``suffix`` overrides some), and ``lookahead``'s own-text trie."""
    drafter: ClassVar[str] = "ngram-tree"         # named in refusals
    min_n: int = option(1, "shortest suffix to look up")
    max_n: int = option(8, "longest suffix to look up (longer matches are trusted more)")
    max_matches: int = option(16, "earlier matches merged into the trie")
    max_depth: int = option(8, "longest path proposed")
    length_weight: float = option(4.0, "a match of length m weighs length_weight ** m")
    recency: float = option(0.7, "the j-th most recent match of a length weighs recency ** j")
    base: float = option(0.3, "probability that a token copied after a 1-token match is right")
    growth: float = option(0.8, "each further matched token multiplies the miss probability by this")
    min_score: float = option(0.05, "skip nodes whose estimated probability is lower")

    def __post_init__(self) -> None:
        name = self.drafter
        if self.min_n < 1 or self.max_n < self.min_n:
            raise SpecserveError(f"{name} needs 1 <= min_n <= max_n, got min_n={self.min_n}, max_n={self.max_n}")
        if self.max_matches < 1 or self.max_depth < 1:
            raise SpecserveError(f"{name} needs max_matches >= 1 and max_depth >= 1")
        if self.length_weight < 1 or not 0 < self.recency <= 1 or not 0 <= self.min_score <= 1:
            raise SpecserveError(f"{name} needs length_weight >= 1, 0 < recency <= 1 and 0 <= min_score <= 1")
        if not 0 < self.base <= 1 or not 0 < self.growth <= 1:
            raise SpecserveError(f"{name} needs 0 < base <= 1 and 0 < growth <= 1")


DEFAULT = TrieOptions()


def retuned(name: str, default: Any, help: str | None = None) -> Any:
    """A field of a subclass of ``TrieOptions`` (``suffix``'s): option ``name`` as declared here, its
    help (unless ``help`` words it for the subclass) and check, with another default."""
    declared = next(f for f in fields(TrieOptions) if f.name == name)
    return field(default=default, metadata={**declared.metadata, "help": help or declared.metadata["help"]})


def find_matches(tokens: np.ndarray, min_n: int, max_n: int) -> tuple[np.ndarray, np.ndarray]:
    """Earlier positions whose preceding tokens match the sequence's suffix.

    tokens: [L] int array.  Returns (ends, lengths), both [M], ends ascending:
    ``tokens[end - m: end] == tokens[L - m:]`` with m = lengths (capped at max_n, at least min_n)
    and ``end < L``, so a continuation starts at ``end``.  Example: [a b c a b] -> ends [2], lengths [2].
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


def own_matches(tokens: np.ndarray, min_n: int, max_n: int, depth: int) -> list[tuple[np.ndarray, int]]:
    """The sequence's own matches as (continuation of at most ``depth`` tokens, length), most recent first."""
    ends, lengths = find_matches(tokens, min_n, max_n)
    return [(tokens[e:e + depth], m) for e, m in zip(ends[::-1].tolist(), lengths[::-1].tolist())]


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
        """Every node's score (module docstring), node 0's being 1."""
        score = [1.0] + [0.0] * (len(self.mass) - 1)
        mass, miss = self.mass, 1.0 - base
        leaving = [sum(mass[c] for c in kids.values()) for kids in self.children]
        for node in range(1, len(mass)):                           # parents are created first
            p = self.parent[node]
            m = self.longest[node] + self.depth[node] - 1
            score[node] = score[p] * (mass[node] / leaving[p]) * (1.0 - miss * growth ** (m - 1))   # reliability(m)
        return score


def merge(found: Iterable[tuple[np.ndarray, int]], opts: TrieOptions) -> Trie:
    """Matches (continuation, length), most recent first, merged into a trie: the ``max_matches``
    longest (recency kept within a length), weighed as the module docstring says."""
    best = sorted(found, key=lambda x: -x[1])[:opts.max_matches]     # stable: recency kept within a length
    rank: dict[int, int] = collections.Counter()
    trie = Trie()
    for cont, m in best:
        if len(cont):
            trie.add(cont.tolist(), opts.length_weight ** m * opts.recency ** rank[m], m)
        rank[m] += 1
    return trie


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


def trie_proposal(found: Iterable[tuple[np.ndarray, int]], k: int, opts: TrieOptions) -> DraftProposal:
    """The best k nodes of the trie of ``found`` (matches as ``merge`` takes them); no matches: empty."""
    found = list(found)
    if not found:
        return DraftProposal([])
    trie = merge(found, opts)
    return best_first(trie, trie.scores(opts.base, opts.growth), k, opts.min_score)
