"""``suffix``: suffix decoding over earlier requests' text, shared by the whole server.

Prompt lookup (``ngram``, ``ngram-tree``) only sees the current request.  Suffix decoding
(Oliaro et al. 2024, arXiv 2411.04975; ArcticInference) also matches the current sequence's suffix
against the prompts and outputs of *earlier* requests, which pays off on repetitive workloads: an
agent loop that emits the same tool-call formats, many edits of one document.

Terms.  The **corpus** is every finished request's text (prompt + generated tokens), plus what
``warm`` loaded, oldest first, at most ``max_tokens`` tokens: when a new text would pass that, the
oldest texts are dropped (first in, first out).  A **match** is an earlier position whose preceding
tokens equal the current sequence's last m tokens (``min_n <= m <= max_n``), in the corpus or in the
current sequence itself.  A corpus match must span at least ``ANCHOR`` (3) tokens: shorter ones
hit unrelated texts everywhere and would drown the current text's own matches (measured on
Spec-Bench: with 1-token corpus matches the drafter was shut off by the controller 97% of the
time).  The index keys each corpus position by the three tokens before it, keeping the
``per_key`` most recent positions per key, and a match's length is then counted back from
there, so a lookup costs O(candidates x max_n), not O(corpus).

Two tries are built, as ``ngram-tree`` builds one: from the current text's own matches, and from
the corpus's.  In each, the ``max_matches`` longest (then most recent) matches add what followed
them; a node's estimate is its parent's, times its share of the continuations leaving the parent
(frequency), times the reliability of a copy after a match of its length (``ngram.reliability``).
The corpus trie holds at most ``size_factor`` x its longest match length nodes (a long, frequent
match earns a big tree).  Each source's estimates are then **calibrated**: multiplied by the
tokens its proposals had accepted per unit of estimate (measured per sequence, decayed, starting
from the drafter's recent history), and the trie whose calibrated estimates sum higher wins (the
current text's on a tie), as ArcticInference picks between its per-request and global trees by
score (the calibration only chooses; the estimates proposed are the trie's own, which the controller
calibrates).  So where the corpus holds other tasks' text (retrieval prompts: short matches
everywhere, rarely right) its proposals lose out to the current text's, instead of the controller
switching the whole drafter off.  At most k nodes, none below ``min_score``.
Deterministic proposals (one-hot q): exact under sampling.

Thread safety: the corpus and index are guarded by one lock; the engine calls the drafter from one
thread, ``warm`` and the server's start-up from another.
"""

from __future__ import annotations

import collections
import json
import math
import threading
from pathlib import Path
from typing import Any

import numpy as np

from specserve.drafters.base import DraftProposal, DraftRequest, Drafter, Feedback, Option
from specserve.drafters.ngram_tree import Rate, Trie, best_first, check_trie_options, find_matches, trie_options
from specserve.drafters.registry import register
from specserve.errors import SpecserveError

ANCHOR = 3                  # the key: the three tokens before a position; the shortest corpus match


class SuffixIndex:
    """The corpus and its index (see the module docstring); all methods take the lock."""

    def __init__(self, max_tokens: int, per_key: int):
        self.max_tokens, self.per_key = max_tokens, per_key
        self.docs: dict[int, np.ndarray] = {}                    # oldest first (insertion order)
        self.tokens = 0
        self.next_id = 0
        self.long: dict[tuple, list[tuple[int, int]]] = {}      # 3 tokens before -> [(doc, position)]
        self.lock = threading.Lock()

    def add(self, tokens: list[int] | np.ndarray) -> None:
        arr = np.asarray(tokens, dtype=np.int64)
        if len(arr) < 2 or len(arr) > self.max_tokens:
            return
        with self.lock:
            while self.tokens + len(arr) > self.max_tokens and self.docs:
                self.tokens -= len(self.docs.pop(next(iter(self.docs))))
            doc = self.next_id
            self.next_id += 1
            self.docs[doc] = arr
            self.tokens += len(arr)
            seq = arr.tolist()
            for p in range(ANCHOR, len(seq)):
                positions = self.long.setdefault(tuple(seq[p - ANCHOR:p]), [])
                positions.append((doc, p))
                if len(positions) > 2 * self.per_key:              # trimmed in batches: amortised O(1)
                    del positions[:len(positions) - self.per_key]

    def matches(self, suffix: np.ndarray, min_n: int, max_n: int, depth: int) -> list[tuple[np.ndarray, int, int]]:
        """(continuation of at most ``depth`` tokens, match length, doc) for every live candidate
        whose match is at least ``min_n`` (and ANCHOR) long; ``suffix``: the sequence's last tokens."""
        q = suffix[-max(max_n, ANCHOR):].tolist()
        out: list[tuple[np.ndarray, int, int]] = []
        if len(q) < ANCHOR:
            return out
        with self.lock:
            for doc, p in reversed(self.long.get(tuple(q[-ANCHOR:]), [])[-self.per_key:]):   # newest first
                arr = self.docs.get(doc)
                if arr is None or p >= len(arr):
                    continue
                m = 0
                while m < min(len(q), max_n) and p - 1 - m >= 0 and arr[p - 1 - m] == q[-1 - m]:
                    m += 1
                if m >= max(min_n, ANCHOR):
                    out.append((arr[p:p + depth], m, doc))
        return out


@register("suffix")
class SuffixDrafter(Drafter):
    tree = True
    confidence = True
    preload = True
    max_auto_draft = 16
    options = (Option("min_n", int, 1, "shortest match used"),
               Option("max_n", int, 16, "longest match counted (longer matches are trusted more)"),
               Option("max_matches", int, 32, "matches merged into the trie"),
               Option("max_depth", int, 16, "longest path proposed"),
               Option("size_factor", float, 2.0, "at most this many nodes per token of the longest match"),
               Option("max_tokens", int, 500_000, "corpus size bound in tokens (oldest texts dropped first)"),
               Option("per_key", int, 256, "most recent corpus positions kept per 3-token key"),
               Option("warm", str, "", "a JSONL file of earlier text to start from: lines with 'text', "
                      "'prompt' and 'output', or 'tokens' (token ids)"),
               *trie_options(recency=0.9))

    def __init__(self, target: Any = None, min_n: int = 1, max_n: int = 16, max_matches: int = 32,
                 max_depth: int = 16, size_factor: float = 2.0, max_tokens: int = 500_000, per_key: int = 256,
                 length_weight: float = 4.0, recency: float = 0.9, base: float = 0.3, growth: float = 0.8,
                 min_score: float = 0.05, warm: str = ""):
        if min_n < 1 or max_n < min_n or max_matches < 1 or max_depth < 1 or per_key < 1 or max_tokens < 2:
            raise SpecserveError("suffix needs 1 <= min_n <= max_n, and max_matches, max_depth, per_key >= 1, "
                                 "max_tokens >= 2")
        if size_factor <= 0:
            raise SpecserveError(f"suffix needs size_factor > 0, got {size_factor}")
        check_trie_options("suffix", length_weight, recency, base, growth, min_score)
        self.min_n, self.max_n, self.max_matches, self.max_depth = min_n, max_n, max_matches, max_depth
        self.size_factor, self.length_weight, self.recency = size_factor, length_weight, recency
        self.base, self.growth, self.min_score = base, growth, min_score
        self.index = SuffixIndex(max_tokens, per_key)
        self.live: dict[int, list[int]] = {}
        # accepted tokens per unit of trie estimate, per source: the drafter's recent history (the prior
        # of a new sequence) and each sequence's own; what the last proposal of a sequence came from
        self.history = {"own": Rate(1.0, weight=4.0, decay=0.99), "corpus": Rate(1.0, weight=4.0, decay=0.99)}
        self.calib: dict[int, dict[str, Rate]] = {}
        self.last: dict[int, str] = {}
        if warm:
            self.warm(warm, target)

    # ------------------------------------------------------------------ the corpus
    def warm(self, path: str, target: Any) -> int:
        """Add every text of a JSONL file to the corpus; returns the number of texts."""
        try:
            lines = Path(path).read_text().splitlines()
        except OSError as e:
            raise SpecserveError(f"suffix warm file {path}: {e.strerror}") from None
        tok = None
        n = 0
        for i, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                doc = json.loads(line)
            except json.JSONDecodeError:
                raise SpecserveError(f"suffix warm file {path}, line {i}: not JSON") from None
            if isinstance(doc, dict) and isinstance(doc.get("tokens"), list):
                self.index.add(doc["tokens"])
            elif isinstance(doc, dict) and isinstance(doc.get("text") or doc.get("prompt"), str):
                if tok is None:
                    if target is None:
                        raise SpecserveError("suffix warm file with text needs the target's tokenizer")
                    from specserve.tokenizer import load_tokenizer
                    tok = load_tokenizer(target)
                text = doc.get("text") or (doc["prompt"] + str(doc.get("output", "")))
                self.index.add(tok.encode(text))
            else:
                raise SpecserveError(f"suffix warm file {path}, line {i}: needs 'text', 'prompt' or 'tokens'")
            n += 1
        return n

    def begin(self, seq_id: int, prompt: list[int], sampling, max_new_tokens: int) -> None:
        self.live[seq_id] = prompt
        # each source's calibration starts from the drafter's recent history
        self.calib[seq_id] = {src: Rate(r.value, weight=4.0, decay=0.95) for src, r in self.history.items()}

    def end(self, seq_id: int) -> None:
        tokens = self.live.pop(seq_id, None)
        self.calib.pop(seq_id, None)
        self.last.pop(seq_id, None)
        if tokens is not None:
            self.index.add(tokens)

    def describe(self) -> dict:
        return {"corpus_tokens": self.index.tokens, "corpus_texts": len(self.index.docs),
                "calibration": {src: round(r.value, 3) for src, r in self.history.items()}}

    # ------------------------------------------------------------------ proposals
    def propose(self, requests: list[DraftRequest]) -> list[DraftProposal]:
        out = []
        for r in requests:
            self.live[r.seq_id] = r.tokens            # the engine's own list: the whole text at the end
            out.append(self.propose_one(np.asarray(r.tokens, dtype=np.int64), r.k, min(self.max_depth, r.max_depth),
                                        r.seq_id))
        return out

    def propose_one(self, tokens: np.ndarray, k: int, depth: int, seq_id: int | None = None) -> DraftProposal:
        """The better of two tries, the current text's own matches (``ngram-tree``'s proposal) and the
        corpus's: each trie's estimates times its source's calibration (accepted tokens per unit of
        estimate, measured per sequence), and the one whose calibrated estimates sum higher (more tokens
        expected) wins, the current text's on a tie.  Its estimates go out uncalibrated: the controller
        calibrates the drafter's confidences as a whole, and scaling them here too would count every
        miss twice."""
        self.last.pop(seq_id, None)
        if k <= 0 or depth <= 0 or len(tokens) == 0:
            return DraftProposal([])
        own = tokens[-4096:]
        ends, lengths = find_matches(own, self.min_n, self.max_n)
        mine = [(own[e:e + depth], int(m)) for e, m in zip(ends[::-1].tolist(), lengths[::-1].tolist())]
        corpus = [(c, m) for c, m, _ in self.index.matches(tokens, self.min_n, self.max_n, depth)]
        calib = self.calib.get(seq_id, self.history)
        best, best_src, best_sum = DraftProposal([]), "own", 0.0
        for src, found in (("own", mine), ("corpus", corpus)):
            prop = self._trie_proposal(found, k, src == "corpus")
            factor = calib[src].value
            total = factor * sum(prop.confidence or [])
            if len(prop) and (total > best_sum or not len(best)):
                best, best_src, best_sum = prop, src, total
        if len(best) and seq_id is not None:
            self.last[seq_id] = best_src
        return best

    def feedback(self, fb: Feedback) -> None:
        """Accepted tokens against the (uncalibrated) estimates of what was verified, per source."""
        src = self.last.pop(fb.seq_id, None)
        if src is None or not len(fb.proposal) or fb.proposal.confidence is None:
            return
        predicted = sum(fb.proposal.confidence)
        for rate in (self.calib[fb.seq_id][src], self.history[src]):
            rate.add(len(fb.accepted), predicted)

    def _trie_proposal(self, found: list[tuple[np.ndarray, int]], k: int, capped: bool) -> DraftProposal:
        """Matches (continuation, length), most recent first, merged into a trie (longest first)."""
        found = sorted(found, key=lambda x: -x[1])[:self.max_matches]    # stable: recency kept within a length
        if not found:
            return DraftProposal([])
        rank: dict[int, int] = collections.Counter()
        trie = Trie()
        for cont, m in found:
            if len(cont):
                trie.add(cont.tolist(), self.length_weight ** m * self.recency ** rank[m], m)
            rank[m] += 1
        budget = min(k, max(1, math.ceil(self.size_factor * found[0][1]))) if capped else k
        return best_first(trie, trie.scores(self.base, self.growth), budget, self.min_score)
