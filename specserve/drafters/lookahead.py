"""``lookahead``: lookahead decoding (Fu et al. 2024, arXiv 2402.02057), in the engine's tree pass.

Terms.  The **window** holds ``levels`` (at most N - 1) of W guessed tokens each, per sequence: level
l's column j is a guess for the token at depth j + 1 + l below the pending token.  The **lookahead
branch** runs the window through the target: column j of level 0 is a chain (level 0, columns
0..j), and level l's token in column j hangs below level l-1's token in the same column.  So a
node sees the pending token, level 0 up to its column, and its own column's earlier levels: the
lookahead mask of the paper, which here is simply a tree, and rides in the engine's ragged tree
pass next to the candidates.  The target's most likely token after the top level's node of column
j (``Feedback.predicted``) is one Jacobi step: with the column it forms an **n-gram** of N tokens
(level 0 .. level N-2, prediction), which goes into the sequence's **pool** (keyed by its first
token, the ``guesses`` most recent per key).  The predictions then become a new top level, the
oldest level is dropped, and the window slides one position (as in the paper, whatever was
accepted).  Until the window has N - 1 levels it only grows.

The **verification branch**: the pool's n-grams that start with the pending token (the ``guesses``
most recent), plus, as the paper's "pool from the prompt" does and better, ``ngram-tree``'s trie of
the sequence's own earlier text (longer matches, calibrated).  All three are merged into one trie
of at most ``max_auto_draft`` nodes (a path appears once), so a lookahead node that happens to be
right is accepted too.  Everything is deterministic (one-hot q): exact under greedy decoding and
under sampling, whatever the window holds.

Confidences: own-text nodes carry ``ngram-tree``'s estimates; a pool node carries its parent's times
the measured rate at which pool nodes at its depth agree with the target's prediction after their
parent (every verified node is measured, accepted or not); a window node likewise with the window's
rate.  The window's value lies in later steps, so its nodes also carry a ``future_gain``: tokens
accepted through pool nodes (which only the window fills) per window node run, measured (decayed),
starting from ``window_prior``.  Under ``auto`` the controller then runs the window only where
those tokens pay for its nodes' share of the pass; a fixed node budget runs own-text nodes first,
then the pool's, then the window's.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specserve.averages import Rate
from specserve.drafters.base import (at_least, CheckedOptions, DraftProposal, DraftRequest, Drafter, Feedback,
                                     non_negative, option, positive)
from specserve.drafters.ngram_tree import ngram_tree_propose
from specserve.drafters.registry import register

OWN, POOL, WINDOW = 1, 2, 4            # where a node came from (bits: a path can come from several)
POOL_PRIOR, WINDOW_PRIOR = 0.3, 0.05   # agreement rates of pool and window nodes before any was measured


@dataclass
class _Tree:
    """A proposal being built: a path appears once (nodes keyed by parent and token)."""
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    conf: list[float] = field(default_factory=list)
    future: list[float] = field(default_factory=list)
    source: list[int] = field(default_factory=list)
    index: dict[tuple[int, int], int] = field(default_factory=dict)

    def add(self, parent: int, token: int, conf: float, source: int, future: float = 0.0) -> int:
        node = self.index.get((parent, token))
        if node is None:
            node = len(self.tokens)
            self.index[(parent, token)] = node
            self.tokens.append(token)
            self.parents.append(parent)
            self.conf.append(conf)
            self.future.append(future)
            self.source.append(source)
        else:
            self.conf[node] = max(self.conf[node], conf)
            self.future[node] = max(self.future[node], future)
            self.source[node] |= source
        return node


@dataclass
class _State:
    levels: list[list[int]]                                   # the window, oldest level first
    pool: dict[int, collections.OrderedDict] = field(default_factory=dict)   # first token -> n-gram tails
    sources: dict[tuple[int, ...], int] = field(default_factory=dict)       # last proposal: path -> source
    window: dict[tuple[int, int], tuple[int, ...]] = field(default_factory=dict)   # (level, column) -> path


@dataclass(frozen=True)
class LookaheadOptions(CheckedOptions):
    window: int = option(4, "W: window columns (guessed future positions) run per step",
                         check=positive("lookahead", "window"))
    ngram: int = option(3, "N: n-gram size (the window keeps N - 1 levels)", check=at_least(2, "lookahead", "ngram"))
    guesses: int = option(4, "G: pool n-grams per first token, and verified per step",
                          check=positive("lookahead", "guesses"))
    own_nodes: int = option(8, "nodes from the sequence's own earlier text (ngram-tree); 0: none",
                            check=non_negative("lookahead", "own_nodes"))
    window_prior: float = option(0.05, "tokens a window node is worth in later steps, before any was measured",
                                 check=non_negative("lookahead", "window_prior"))

    @property
    def node_budget(self) -> int:
        """The most nodes a proposal holds: own text, then (pool guesses + window) x (N - 1) levels."""
        return self.own_nodes + (self.guesses + self.window) * (self.ngram - 1)


@register("lookahead")
class LookaheadDrafter(Drafter):
    tree = True
    confidence = True
    wants_predictions = True
    preload = True
    Options = LookaheadOptions
    max_auto_draft = LookaheadOptions().node_budget

    def __init__(self, target: Any = None, **options: Any):
        o = self.opts = self.Options(**options)
        self.W, self.N, self.G, self.own_nodes = o.window, o.ngram, o.guesses, o.own_nodes
        # an instance attribute: the node budget the controller may give grows with the window
        self.max_auto_draft = o.node_budget
        self.pool_rate = [Rate(POOL_PRIOR) for _ in range(o.ngram - 1)]   # P(pool node agrees | parent), by depth
        self.window_rate = Rate(WINDOW_PRIOR)                              # the same for window nodes
        self.window_value = Rate(o.window_prior)                           # later tokens per window node run
        self.states: dict[int, _State] = {}

    def begin(self, seq_id: int, prompt: list[int], sampling, max_new_tokens: int, generator=None) -> None:
        # level 0 starts as prompt tokens spread over the prompt (the paper: random tokens; a spread
        # keeps a request's proposals independent of its id and batch)
        first = [prompt[(j * len(prompt)) // self.W] for j in range(self.W)] if prompt else [0] * self.W
        self.states[seq_id] = _State([first])

    def end(self, seq_id: int) -> None:
        self.states.pop(seq_id, None)

    def describe(self) -> dict:
        return {"pool_agreement": [round(r.value, 3) for r in self.pool_rate],
                "window_agreement": round(self.window_rate.value, 3),
                "window_value": round(self.window_value.value, 3)}

    # ------------------------------------------------------------------ proposals
    def propose(self, requests: list[DraftRequest]) -> list[DraftProposal]:
        return [self.propose_one(r) for r in requests]

    def propose_one(self, r: DraftRequest) -> DraftProposal:
        st = self.states.get(r.seq_id)
        if st is None:                                        # propose without begin: start from the text
            self.begin(r.seq_id, list(r.tokens), r.sampling, 0)
            st = self.states[r.seq_id]
        st.sources, st.window = {}, {}
        if r.k <= 0 or r.max_depth <= 0 or not r.tokens:
            return DraftProposal([])
        tree = _Tree()
        # 1. the sequence's own earlier text: ngram-tree's trie (its estimates as confidences)
        if self.own_nodes:
            own = ngram_tree_propose(np.asarray(r.tokens, dtype=np.int64), self.own_nodes, r.max_depth)
            for t, p, c in zip(own.tokens, own.parent_list(), own.confidence or []):
                tree.add(p, t, c, OWN)
        # 2. the pool's n-grams after the pending token, most recent first
        for tail in reversed(list(st.pool.get(r.tokens[-1], {}))):
            node, conf = -1, 1.0
            for d, t in enumerate(tail[:r.max_depth]):
                conf *= self.pool_rate[d].value
                node = tree.add(node, t, conf, POOL)
        # 3. the lookahead branch: level 0 a chain over the columns, level l of column j below level
        #    l-1 of column j (node (l, j) lies at depth j + 1 + l)
        value, rate = self.window_value.value, self.window_rate.value
        at: dict[tuple[int, int], int] = {}
        for level, row in enumerate(st.levels):
            for j, t in enumerate(row):
                parent = at.get((0, j - 1), -1) if level == 0 else at.get((level - 1, j), -1)
                placed = parent >= 0 or (level == 0 and j == 0)
                if placed and j + 1 + level <= r.max_depth:
                    conf = (tree.conf[parent] if parent >= 0 else 1.0) * rate
                    at[(level, j)] = tree.add(parent, t, conf, WINDOW, value)
        n = min(r.k, len(tree.tokens))                        # own, then pool, then window (topological)
        prop = DraftProposal(tree.tokens, None, tree.parents, tree.conf, tree.future).subset(list(range(n)))
        paths = prop.paths()
        st.sources = {path: tree.source[i] for i, path in enumerate(paths)}
        st.window = {key: paths[node] for key, node in at.items() if node < n}
        return prop

    # ------------------------------------------------------------------ feedback
    def feedback(self, fb: Feedback) -> None:
        st = self.states.get(fb.seq_id)
        prop = fb.proposal
        if st is None or not len(prop) or fb.predicted is None:
            return
        paths = prop.paths()
        row = {path: i + 1 for i, path in enumerate(paths)}  # the node's row in ``predicted``
        self._measure(st, prop, paths, fb)
        self._jacobi_step(st, row, fb.predicted)

    def _measure(self, st: _State, prop: DraftProposal, paths: list[tuple[int, ...]], fb: Feedback) -> None:
        """Agreement rates of pool and window nodes, and the tokens the pool's n-grams won."""
        window_nodes = 0
        sources = [st.sources.get(path, 0) for path in paths]
        for t, p, path, src in zip(prop.tokens, prop.parent_list(), paths, sources):
            agree = float(t == fb.predicted[p + 1])
            if src & POOL and not src & OWN:
                self.pool_rate[min(len(path), len(self.pool_rate)) - 1].add(agree, 1.0)
            if src & WINDOW:
                window_nodes += 1
                if not src & (OWN | POOL):
                    self.window_rate.add(agree, 1.0)
        won = sum(1 for i in fb.accepted if sources[i] & POOL and not sources[i] & OWN)
        if window_nodes or won:
            self.window_value.add(won, window_nodes)

    def _jacobi_step(self, st: _State, row: dict[tuple[int, ...], int], predicted: list[int]) -> None:
        """The top level's predictions: n-grams into the pool, a new top level, the window slides."""
        last = len(st.levels) - 1
        ran = {j: row[st.window[(last, j)]] for j in range(self.W)
               if (last, j) in st.window and st.window[(last, j)] in row}
        if not ran:
            return                                            # the window was not run: nothing learnt
        new = [predicted[ran[j]] if j in ran else st.levels[last][j] for j in range(self.W)]
        if len(st.levels) == self.N - 1:
            for j in ran:
                gram = [lv[j] for lv in st.levels] + [predicted[ran[j]]]
                tails = st.pool.setdefault(gram[0], collections.OrderedDict())
                tails[tuple(gram[1:])] = None
                tails.move_to_end(tuple(gram[1:]))
                while len(tails) > self.G:
                    tails.popitem(last=False)
            st.levels.pop(0)
        st.levels.append(new)
