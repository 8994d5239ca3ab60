"""``auto``: every loaded drafter at once, their proposals merged into one tree that the controller prices.

Which drafter wins depends on the work: prompt lookup where the output copies the prompt, a corpus
of earlier requests where the work repeats, a learned head where there is nothing to copy.  ``auto``
holds several drafters, its **parts** (by default ``ngram-tree`` and ``suffix`` over its corpus of
earlier requests alone; a learned head such as ``eagle`` when named: ``parts=ngram-tree+suffix/own=0+eagle``;
its features cost every target pass whether it drafts or not: BENCHMARKS.md, section 17),
asks each for a proposal within the node budget the controller gives
that part (``DraftRequest.parts``), and merges them:

- **Deterministic parts** (one-hot q: lookup, a corpus, a head's top-k tree under greedy decoding)
  are merged into one trie: a path drafted by several parts appears once, and its node records, in
  ``MergedProposal.origins``, every part that proposed it with that part's own confidence.
- **Sampled parts** (a head's draws under sampling, ``probs`` set) are kept whole, each as its own
  subtree below the pending token, after the trie's nodes: a drawn node is never merged into
  another node (that would change the law it was drawn under), and the trie's nodes are fixed
  before any draw is made (they depend on the text alone).  The merged ``probs`` row of a trie
  node is one-hot on its token, of a drawn node the q it was drawn from.  So the **sibling law**
  verification needs holds: every child's q is the distribution it was drawn from given its
  ancestors and its earlier siblings (a trie node: one-hot; a drawn node: its part's q, drawn
  independently of the trie siblings before it), and recursive rejection over the siblings in
  order is exact (``specserve.verify.tree``).

Nodes are emitted depth-first, best child first (by the best confidence of their parts), so the
most probable path is a chain at the front; with a budget smaller than the merged tree the best
nodes are kept (a node's score is capped at its parent's, so the kept nodes form a tree).

The controller (``specserve.control.controller``) sees the parts: it calibrates each part's
confidences per request, prices a node by its best part, charges each part its own drafting cost,
and runs a costly part (a learned head) only for requests where the tokens it adds pay for it.
Each part gets its own feedback: its own proposal as far as it was verified, its nodes on the
accepted path, the step's tokens and features.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, replace
from typing import Any

import torch

from specserve.drafters.base import (DraftProposal, DraftRequest, Drafter, Feedback, MergedProposal, MergingDrafter,
                                     option)
from specserve.drafters.registry import create, drafter_class, register, resolve_options
from specserve.errors import SpecserveError
from specserve.limits import MAX_DRAFT, NO_LIMIT
from specserve.trees import is_chain, one_hot_rows

DEFAULT_PARTS = "ngram-tree+suffix/own=0"   # "default": suffix matches the corpus alone (ngram-tree has the
                                            # text); a learned head joins when named (why not by default:
                                            # BENCHMARKS.md, section 17)


def parse_parts(text: str) -> list[tuple[str, dict[str, Any]]]:
    """``default``, or parts joined by ``+``, each ``name[/option=value]...``: a registered drafter whose
    nodes carry confidences, and its options (checked here, before anything is loaded)."""
    items = [p.strip() for p in (DEFAULT_PARTS if text == "default" else text).split("+") if p.strip()]
    if not items:
        raise SpecserveError("auto needs at least one part (parts=default, or drafters joined by '+')")
    out = []
    for item in items:
        name, *pairs = item.split("/")
        cls = drafter_class(name)
        if issubclass(cls, MergingDrafter) or cls.synthetic or not cls.confidence or not cls.max_auto_draft:
            raise SpecserveError(f"auto cannot merge {name!r}: a part must be a real drafter whose nodes carry "
                                 "confidences (ngram, ngram-tree, suffix, lookahead, eagle, medusa)")
        opts = {}
        for pair in pairs:
            key, sep, value = pair.partition("=")
            if not sep or not key:
                raise SpecserveError(f"auto part {item!r}: expected option=value after '/', got {pair!r}")
            opts[key] = value
        resolve_options(name, opts)
        out.append((name, opts))
    if len({n for n, _ in out}) != len(out):
        raise SpecserveError(f"auto parts {text!r} name a drafter twice")
    return out


@dataclass(frozen=True)
class AutoOptions:
    parts: str = option("default", "drafters merged, joined by '+', each name[/option=value]... (default: "
                        f"{DEFAULT_PARTS}; a learned head joins when named, e.g. +eagle); from Python also a "
                        "dict name -> built drafter",
                        check=parse_parts)

    def __post_init__(self) -> None:
        if isinstance(self.parts, str):
            parse_parts(self.parts)
        elif not self.parts or not all(isinstance(d, Drafter) and d.confidence for d in self.parts.values()):
            raise SpecserveError("auto parts given as a dict need one or more drafters whose nodes carry confidences")


@register("auto")
class AutoDrafter(MergingDrafter):
    tree = True
    confidence = True
    preload = False
    Options = AutoOptions
    max_auto_draft = MAX_DRAFT

    def __init__(self, target: Any = None, **options: Any):
        self.opts = self.Options(**options)
        self._parts: dict[str, Drafter] = {}
        if isinstance(self.opts.parts, dict):
            self._parts = dict(self.opts.parts)                # built by the caller (the Python API, tests)
        for name, opts in parse_parts(self.opts.parts) if isinstance(self.opts.parts, str) else ():
            try:
                self._parts[name] = create(name, target, **opts)
            except SpecserveError as e:
                raise SpecserveError(f"auto part {name!r}: {e}") from None
        self.max_auto_draft = min(MAX_DRAFT, sum(p.max_auto_draft for p in self._parts.values()))
        self.feature_layers = tuple(sorted({x for p in self._parts.values() for x in p.feature_layers}))
        self.wants_predictions = any(p.wants_predictions for p in self._parts.values())
        self.last: dict[int, dict[str, tuple[DraftProposal, list[tuple[int, ...]]]]] = {}

    # ------------------------------------------------------------------ lifecycle, forwarded
    def parts(self) -> dict[str, Drafter]:
        return dict(self._parts)

    def bind(self, max_batch: int, max_len: int) -> None:
        for p in self._parts.values():
            p.bind(max_batch, max_len)

    def validate(self, sampling) -> None:
        for p in self._parts.values():
            p.validate(sampling)

    def begin(self, seq_id, prompt, sampling, max_new_tokens, generator=None) -> None:
        for p in self._parts.values():
            p.begin(seq_id, prompt, sampling, max_new_tokens, generator)

    def end(self, seq_id: int) -> None:
        self.last.pop(seq_id, None)
        for p in self._parts.values():
            p.end(seq_id)

    def reset_memory(self) -> bool:
        return any([p.reset_memory() for p in self._parts.values()])

    def describe(self) -> dict:
        return {"parts": {name: p.describe() for name, p in self._parts.items()}}

    # ------------------------------------------------------------------ proposals
    def propose(self, requests: list[DraftRequest]) -> list[MergedProposal]:
        by_part: dict[str, list[DraftProposal | None]] = {}
        shares: list[dict[str, float]] = [{} for _ in requests]   # each part's seconds, per request asked
        for name, part in self._parts.items():
            asks = [(i, DraftRequest(r.seq_id, r.tokens, k, r.sampling, r.max_depth))
                    for i, r in enumerate(requests) if (k := _budget(r, name)) > 0 and r.max_depth > 0]
            got: list[DraftProposal | None] = [None] * len(requests)
            if asks:
                t0 = time.perf_counter()
                props = part.propose([a for _, a in asks])
                share = (time.perf_counter() - t0) / len(asks)
                for (i, a), prop in zip(asks, props):
                    got[i] = prop.truncated(a.k, a.max_depth)
                    shares[i][name] = share
            by_part[name] = got
        out = []
        for i, r in enumerate(requests):
            mine = {name: got[i] for name, got in by_part.items() if got[i] is not None and len(got[i])}
            self.last[r.seq_id] = {name: (p, p.paths()) for name, p in mine.items()}
            out.append(replace(merge(mine, r.k), part_draft_s=shares[i]))
        return out

    # ------------------------------------------------------------------ feedback, per part
    def feedback(self, fb: Feedback) -> None:
        drafted = self.last.pop(fb.seq_id, {})
        paths = fb.proposal.paths() if drafted else []
        row = {path: i for i, path in enumerate(paths)}               # a verified path -> its node
        won = {paths[i] for i in fb.accepted}
        for name, part in self._parts.items():
            if name not in drafted:
                part.feedback(Feedback(fb.seq_id, DraftProposal([]), [], fb.emitted, fb.features,
                                       None if fb.predicted is None else fb.predicted[:1]))
                continue
            prop, own = drafted[name]
            keep = [j for j, path in enumerate(own) if path in row]   # what of its draft was verified
            sub, kept = prop.subset(keep), [own[j] for j in keep]
            accepted = sorted((j for j, path in enumerate(kept) if path in won), key=lambda j: len(kept[j]))
            predicted = None if fb.predicted is None else [fb.predicted[0]] + [fb.predicted[row[p] + 1] for p in kept]
            part.feedback(Feedback(fb.seq_id, sub, accepted, fb.emitted, fb.features, predicted))


def _budget(r: DraftRequest, part: str) -> int:
    return r.k if r.parts is None else r.parts.get(part, 0)


def merge(props: dict[str, DraftProposal], k: int) -> MergedProposal:
    """The parts' proposals as one tree of at most ``k`` nodes (the module docstring's law): the
    deterministic ones merged into a trie, emitted depth-first, best child first; then each sampled
    one whole, as its own subtree.  ``origins``: per node, each proposing part's confidence."""
    fixed = {n: p for n, p in props.items() if p.probs is None}
    drawn = {n: p for n, p in props.items() if p.probs is not None}
    if len(fixed) == 1 and not drawn:                 # one part proposed: its tree as it is (a trie already)
        (name, p), = fixed.items()
        p = p.truncated(k, NO_LIMIT)
        conf = p.confidence or [1.0] * len(p)
        return MergedProposal(p.tokens, p.probs, p.parents, conf, forced=p.forced, origins=[{name: c} for c in conf])
    tokens, parents, origins = _trie(fixed, k)
    probs_rows: list[torch.Tensor] = []
    for name, p in drawn.items():
        room = k - len(tokens)
        if room <= 0:
            break
        p = p.truncated(room, NO_LIMIT)
        base = len(tokens)
        tokens += p.tokens
        parents += [q if q < 0 else q + base for q in p.parent_list()]
        conf = p.confidence or [1.0] * len(p)
        origins += [{name: c} for c in conf]
        probs_rows.append(p.probs)
    if not tokens:
        return MergedProposal([])
    probs = None
    if probs_rows:
        vocab = probs_rows[0].shape[1]
        n_fixed = len(tokens) - sum(r.shape[0] for r in probs_rows)
        head = one_hot_rows(tokens[:n_fixed], vocab, probs_rows[0].dtype, probs_rows[0].device)
        probs = torch.cat([head] + probs_rows)
    conf = [max(o.values()) for o in origins]
    return MergedProposal(tokens, probs, None if is_chain(parents) else parents, conf, origins=origins)


def _trie(props: dict[str, DraftProposal], k: int) -> tuple[list[int], list[int], list[dict[str, float]]]:
    """Deterministic proposals merged by path; the best ``k`` nodes (score: the best part's confidence,
    capped at the parent's), emitted depth-first, best child first."""
    children: list[dict[int, int]] = [{}]                 # node 0: the pending token
    token, parent, origin, score = [-1], [-1], [{}], [1.0]
    for name, p in props.items():
        conf = p.confidence or [1.0] * len(p)
        at: list[int] = []
        for t, q, c in zip(p.tokens, p.parent_list(), conf):
            up = at[q] if q >= 0 else 0
            node = children[up].get(t)
            if node is None:
                node = len(token)
                children[up][t] = node
                children.append({})
                token.append(t)
                parent.append(up)
                origin.append({})
                score.append(0.0)
            origin[node][name] = max(origin[node].get(name, 0.0), c)
            at.append(node)
    for node in range(1, len(token)):                    # parents were created first
        score[node] = min(max(origin[node].values()), score[parent[node]])
    heap = [(-score[c], c) for c in children[0].values()]
    heapq.heapify(heap)
    kept: dict[int, list[int]] = {0: []}
    while heap and len(kept) - 1 < k:
        _, node = heapq.heappop(heap)
        kept[parent[node]].append(node)
        kept[node] = []
        for c in children[node].values():
            heapq.heappush(heap, (-score[c], c))
    tokens, parents, origins = [], [], []
    stack = [(c, -1) for c in sorted(kept[0], key=lambda c: score[c])]
    while stack:                                          # depth-first, best child first
        node, up = stack.pop()
        tokens.append(token[node])
        parents.append(up)
        origins.append(origin[node])
        stack += [(c, len(tokens) - 1) for c in sorted(kept[node], key=lambda c: score[c])]
    return tokens, parents, origins
