"""``ngram``: prompt lookup decoding (Saxena 2023; transformers' ``prompt_lookup_num_tokens``).

Find the most recent earlier occurrence of the sequence's last n tokens (n from ``max_n`` down to
``min_n``) in the prompt and generated text, and propose the tokens that followed it.  The d-th
token's confidence: every copy up to it right, each copy as reliable as its match is long (the
match grows by one with every right copy), on the reliability curve fitted for the trie drafters
(``specserve.drafters.trie.reliability``).  ``LookupDrafter`` is the base of the drafters that look
their proposals up in the sequence's own text, this one and ``ngram-tree``.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
from typing import Any

import numpy as np

from specserve.drafters.base import DraftProposal, DraftRequest, Drafter, option
from specserve.drafters.registry import register
from specserve.drafters.trie import DEFAULT, reliability
from specserve.errors import SpecserveError


def ngram_match(tokens: np.ndarray, min_n: int, max_n: int, k: int) -> tuple[list[int], int]:
    """Up to k tokens that followed the most recent earlier match of the last n tokens, and n.

    tokens: [L] int array, the whole sequence.  Longer n-grams are tried first.
    Example: tokens [a b c d a b], n=2 -> suffix [a b] matched at 0 -> propose [c d a b][:k], n = 2.
    """
    length = len(tokens)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = tokens[length - n:]
        windows = np.lib.stride_tricks.sliding_window_view(tokens[: length - 1], n)   # [L-n, n]
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n                     # first token after the most recent match
            follow = tokens[start: start + k]
            if follow.size:
                return follow.tolist(), n
    return [], 0


@dataclass(frozen=True)
class NgramOptions:
    min_n: int = option(1, "shortest suffix to look up")
    max_n: int = option(4, "longest suffix to look up (tried first)")

    def __post_init__(self) -> None:
        if not (isinstance(self.min_n, int) and isinstance(self.max_n, int)) or self.min_n < 1 \
                or self.max_n < self.min_n:
            raise SpecserveError(f"ngram needs 1 <= min_n <= max_n, got min_n={self.min_n}, max_n={self.max_n}")


class LookupDrafter(Drafter):
    """A drafter that looks its proposals up in each sequence's own text (``ngram``, ``ngram-tree``):
    no model and no state but its options, one request at a time (``lookup``)."""
    confidence = True
    preload = True

    def __init__(self, target: Any = None, **options: Any):
        self.opts = self.Options(**options)

    def propose(self, requests: list[DraftRequest]) -> list[DraftProposal]:
        return [self.lookup(np.asarray(r.tokens, dtype=np.int64), r.k, r.max_depth) for r in requests]

    @abstractmethod
    def lookup(self, tokens: np.ndarray, k: int, max_depth: int) -> DraftProposal:
        """At most k nodes, none deeper than ``max_depth``, after ``tokens`` [L] (the whole sequence)."""


@register("ngram")
class NgramDrafter(LookupDrafter):
    max_auto_draft = 8
    Options = NgramOptions

    def lookup(self, tokens: np.ndarray, k: int, max_depth: int) -> DraftProposal:
        found, n = ngram_match(tokens, self.opts.min_n, self.opts.max_n, min(k, max_depth)) if k > 0 else ([], 0)
        conf = np.cumprod(reliability(np.arange(n, n + len(found)), DEFAULT.base, DEFAULT.growth)).tolist() \
            if found else None
        return DraftProposal(found, confidence=conf)
