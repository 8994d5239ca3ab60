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
hit unrelated texts everywhere and would drown the current text's own matches (and get the whole
drafter switched off by the controller).  The index keys each corpus position by the three tokens before it, keeping the
``per_key`` most recent positions per key, and a match's length is then counted back from
there, so a lookup costs O(candidates x max_n), not O(corpus).

Two tries are built, as ``ngram-tree`` builds one (``specserve.drafters.trie``: the terms, the
weights and the scores): from the current text's own matches, and from the corpus's.
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

import json
import math
import threading
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from specserve.averages import Rate
from specserve.drafters.base import DraftProposal, DraftRequest, Drafter, Feedback, option
from specserve.drafters.registry import register
from specserve.drafters.trie import TrieOptions, own_matches, retuned, trie_proposal
from specserve.errors import SpecserveError

ANCHOR = 3                  # the key: the three tokens before a position; the shortest corpus match
TOKEN_BITS = 21             # a key packs its three tokens into one int (vocabularies below 2**21)
POS_BITS = 32               # an entry packs (text, position) into one int64: text << 32 | position


def key_of(tokens) -> int:
    """The index key of three tokens."""
    a, b, c = tokens
    return (a << (2 * TOKEN_BITS)) | (b << TOKEN_BITS) | c


class SuffixIndex:
    """The corpus and its index (see the module docstring); all methods take the lock.  Compact: a
    key is one int (``key_of``) and its positions one ``array('q')`` of packed (text, position), about
    8 bytes an entry, so a full corpus of 500k tokens costs tens of MiB, not hundreds."""

    def __init__(self, max_tokens: int, per_key: int):
        self.max_tokens, self.per_key = max_tokens, per_key
        self.docs: dict[int, np.ndarray] = {}                    # oldest first (insertion order)
        self.tokens = 0
        self.next_id = 0
        self.long: dict[int, array] = {}                         # key_of(3 tokens before) -> packed entries
        self.lock = threading.Lock()

    def positions(self, tokens) -> list[tuple[int, int]]:
        """(text, position) of every entry under the key of three tokens, oldest first."""
        mask = (1 << POS_BITS) - 1
        return [(v >> POS_BITS, v & mask) for v in self.long.get(key_of(tokens), ())]

    def add(self, tokens: list[int] | np.ndarray) -> None:
        arr = np.asarray(tokens, dtype=np.int64)
        if len(arr) < 2 or len(arr) > self.max_tokens or len(arr) >= 1 << POS_BITS:
            return
        if arr.min() < 0 or arr.max() >= 1 << TOKEN_BITS:
            raise ValueError(f"suffix: token ids must lie in [0, {1 << TOKEN_BITS})")
        with self.lock:
            while self.tokens + len(arr) > self.max_tokens and self.docs:
                self._evict(next(iter(self.docs)))
            doc = self.next_id
            self.next_id += 1
            self.docs[doc] = arr
            self.tokens += len(arr)
            seq, base = arr.tolist(), doc << POS_BITS
            for p in range(ANCHOR, len(seq)):
                key = key_of(seq[p - ANCHOR:p])
                positions = self.long.get(key)
                if positions is None:
                    positions = self.long[key] = array("q")
                positions.append(base | p)
                if len(positions) > 2 * self.per_key:              # trimmed in batches: amortised O(1)
                    del positions[:len(positions) - self.per_key]

    def _evict(self, doc: int) -> None:
        """Drop the oldest text and its index entries, so the index is bounded by ``max_tokens`` too.
        Each key's positions are in the order their texts were added, so the oldest text's entries
        are at the front of every list it appears in."""
        seq = self.docs.pop(doc).tolist()
        self.tokens -= len(seq)
        last = ((doc + 1) << POS_BITS) - 1                     # the largest entry of this text
        for p in range(ANCHOR, len(seq)):
            key = key_of(seq[p - ANCHOR:p])
            positions = self.long.get(key)
            if positions is None:
                continue
            i = 0
            while i < len(positions) and positions[i] <= last:
                i += 1
            if i == len(positions):
                del self.long[key]
            elif i:
                del positions[:i]

    def matches(self, suffix: np.ndarray, min_n: int, max_n: int, depth: int) -> list[tuple[np.ndarray, int, int]]:
        """(continuation of at most ``depth`` tokens, match length, doc) for every live candidate
        whose match is at least ``min_n`` (and ANCHOR) long; ``suffix``: the sequence's last tokens."""
        q = suffix[-max(max_n, ANCHOR):].tolist()
        out: list[tuple[np.ndarray, int, int]] = []
        if len(q) < ANCHOR:
            return out
        mask = (1 << POS_BITS) - 1
        with self.lock:
            for v in reversed(self.long.get(key_of(q[-ANCHOR:]), array("q"))[-self.per_key:]):   # newest first
                doc, p = v >> POS_BITS, v & mask
                arr = self.docs.get(doc)
                if arr is None or p >= len(arr):
                    continue
                m = 0
                while m < min(len(q), max_n) and p - 1 - m >= 0 and arr[p - 1 - m] == q[-1 - m]:
                    m += 1
                if m >= max(min_n, ANCHOR):
                    out.append((arr[p:p + depth], m, doc))
        return out


def _check_own(value) -> None:
    if value not in (0, 1):
        raise SpecserveError(f"suffix option own takes 0 or 1, got {value}")


@dataclass(frozen=True)
class SuffixOptions(TrieOptions):
    """The trie drafters' options (some defaults of its own) and the corpus's."""
    drafter: ClassVar[str] = "suffix"
    max_n: int = retuned("max_n", 16, "longest match counted (longer matches are trusted more)")
    max_matches: int = retuned("max_matches", 32, "matches merged into the trie")
    max_depth: int = retuned("max_depth", 16)
    recency: float = retuned("recency", 0.9)
    size_factor: float = option(2.0, "at most this many nodes per token of the longest match")
    max_tokens: int = option(500_000, "corpus size bound in tokens (oldest texts dropped first)")
    per_key: int = option(256, "most recent corpus positions kept per 3-token key")
    warm: str = option("", "a JSONL file of earlier text to start from: lines with 'text', 'prompt' and "
                           "'output', or 'tokens' (token ids)")
    own: int = option(1, "also match the current text itself (0: the corpus alone, for use beside ngram-tree)",
                      check=_check_own)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.per_key < 1 or self.max_tokens < 2:
            raise SpecserveError("suffix needs per_key >= 1 and max_tokens >= 2")
        _check_own(self.own)
        if self.size_factor <= 0:
            raise SpecserveError(f"suffix needs size_factor > 0, got {self.size_factor}")


@register("suffix")
class SuffixDrafter(Drafter):
    tree = True
    confidence = True
    preload = True
    max_auto_draft = 16
    Options = SuffixOptions

    def __init__(self, target: Any = None, **options: Any):
        self.opts = self.Options(**options)
        self.target = target
        self.live: dict[int, list[int]] = {}
        self.calib: dict[int, dict[str, Rate]] = {}
        self.last: dict[int, str] = {}
        self.reset_memory()

    def reset_memory(self) -> bool:
        """An empty corpus (then the ``warm`` file, if one is named) and no history: a fresh server's."""
        o = self.opts
        self.index = SuffixIndex(o.max_tokens, o.per_key)
        # accepted tokens per unit of trie estimate, per source: the drafter's recent history (the prior
        # of a new sequence) and each sequence's own; what the last proposal of a sequence came from
        self.history = {"own": Rate(1.0, weight=4.0, decay=0.99), "corpus": Rate(1.0, weight=4.0, decay=0.99)}
        if o.warm:
            self.warm(o.warm, self.target)
        return True

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

    def begin(self, seq_id: int, prompt: list[int], sampling, max_new_tokens: int, generator=None) -> None:
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
            out.append(self.propose_one(np.asarray(r.tokens, dtype=np.int64), r.k,
                                        min(self.opts.max_depth, r.max_depth), r.seq_id))
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
        o = self.opts
        mine = own_matches(tokens[-4096:], o.min_n, o.max_n, depth) if o.own else []
        corpus = [(c, m) for c, m, _ in self.index.matches(tokens, o.min_n, o.max_n, depth)]
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
        """Matches (continuation, length), most recent first, merged into a trie (``trie.merge``); the
        corpus's trie (``capped``) holds at most ``size_factor`` nodes per token of its longest match."""
        if capped and found:
            k = min(k, max(1, math.ceil(self.opts.size_factor * max(m for _, m in found))))
        return trie_proposal(found, k, self.opts)
