"""``ngram``: prompt lookup decoding (Saxena 2023; transformers' ``prompt_lookup_num_tokens``).

Find the most recent earlier occurrence of the sequence's last n tokens (n from ``max_n`` down to
``min_n``) in the prompt and generated text, and propose the tokens that followed it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from specserve.drafters.base import DraftProposal, DraftRequest, Drafter, Option
from specserve.drafters.registry import register
from specserve.errors import SpecserveError

# the reliability curve fitted for ngram-tree (probability that a copied token is right after an
# m-token match: 1 - (1 - BASE) * GROWTH ** (m - 1))
BASE, GROWTH = 0.3, 0.8


def reliability(m: np.ndarray | int, base: float, growth: float) -> np.ndarray | float:
    """Probability that a copied token is right when the text before it matches over m tokens:
    ``1 - (1 - base) * growth ** (m - 1)``, rising from ``base`` at m = 1 towards 1."""
    return 1.0 - (1.0 - base) * growth ** (np.asarray(m) - 1)


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


def ngram_propose(tokens: np.ndarray, min_n: int, max_n: int, k: int) -> list[int]:
    """The tokens of ``ngram_match``."""
    return ngram_match(tokens, min_n, max_n, k)[0]


@register("ngram")
class NgramDrafter(Drafter):
    max_auto_draft = 8
    confidence = True
    preload = True
    options = (Option("min_n", int, 1, "shortest suffix to look up"),
               Option("max_n", int, 4, "longest suffix to look up (tried first)"))

    def __init__(self, target: Any = None, min_n: int = 1, max_n: int = 4):
        if not (isinstance(min_n, int) and isinstance(max_n, int)) or min_n < 1 or max_n < min_n:
            raise SpecserveError(f"ngram needs 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        self.min_n, self.max_n = min_n, max_n

    def propose(self, requests: list[DraftRequest]) -> list[DraftProposal]:
        out = []
        for r in requests:
            tokens, n = ngram_match(np.asarray(r.tokens, dtype=np.int64), self.min_n, self.max_n, min(r.k, r.max_depth)) \
                if r.k > 0 else ([], 0)
            # confidence of the d-th token: every copy up to it right, each copy as reliable as its
            # match is long (the match grows by one with every right copy; see ngram_tree)
            conf = np.cumprod(reliability(np.arange(n, n + len(tokens)), BASE, GROWTH)).tolist() if tokens else None
            out.append(DraftProposal(tokens, confidence=conf))
        return out
