"""The row table: the one owner of the target KV cache's rows and their lengths.

Every change of a row's valid length goes through here: a row taken (length 0) and freed, a cached
prefix copied in, a prompt chunk kept, an accepted path compacted and the rest rolled back.
Nothing else in specserve calls ``KVCache.set_length`` or ``KVCache.compact`` on the target's cache.

Cache invariant: for a decoding sequence, ``length(row) == len(tokens) - 1``; the last token (the
*pending* token) has been generated but not yet fed to the target.  A step feeds the pending token
and every drafted node at slots ``L .. L + N`` (L = the row's length), verifies, moves the accepted
path's entries to slots ``L + 1 .. L + a`` (``KVCache.compact``; nothing moves for a chain) and
sets the row's length to ``L + 1 + a``: entries past it are dead and overwritten later.  While its
prompt is prefilled a sequence's row holds exactly its ``prefilled`` positions.
"""

from __future__ import annotations

import bisect

from torch import Tensor

from specserve.models.kv_cache import KVCache
from specserve.prefix_cache import Match, PrefixCache


class RowTable:
    def __init__(self, cache: KVCache):
        self.cache = cache
        self._free = list(range(cache.rows))

    @property
    def rows(self) -> int:
        return self.cache.rows

    @property
    def free(self) -> int:
        return len(self._free)

    def length(self, row: int) -> int:
        return self.cache.lengths[row]

    def take(self) -> int:
        """The lowest free row, emptied (so the cache pages touched follow the concurrency, not the history)."""
        if not self._free:
            raise RuntimeError("no free KV row; check the engine's capacity first")
        row = self._free.pop(0)
        self.cache.set_length(row, 0)
        return row

    def release(self, row: int) -> None:
        bisect.insort(self._free, row)

    def release_all(self) -> None:
        self._free = list(range(self.cache.rows))

    def views(self, row: int) -> tuple[Tensor, Tensor]:
        """The row's keys and values, every layer: [L, kv_heads, capacity, head_dim] each."""
        return self.cache.k_all[:, row], self.cache.v_all[:, row]

    def copy_prefix(self, row: int, pool: PrefixCache, match: Match) -> dict[int, Tensor]:
        """Copy a cached prefix's blocks into an empty row, which then holds ``match.tokens``
        positions; returns the blocks' features (layer -> [n, hidden])."""
        got = pool.load(match, *self.views(row))
        self.cache.set_length(row, match.tokens)
        return got

    def extend(self, row: int, n: int) -> None:
        """A pass wrote ``n`` more positions of a prompt after the row's length: keep them."""
        self.cache.set_length(row, self.cache.lengths[row] + n)

    def keep_path(self, row: int, kept: list[int]) -> None:
        """After a verification pass fed slots ``L .. L + N``: keep the pass indices ``kept``
        (``[0]`` (the pending token) + accepted nodes + 1, increasing) at ``L .. L + len(kept) - 1``."""
        start = self.cache.lengths[row]
        self.cache.compact(row, start, kept)
        self.cache.set_length(row, start + len(kept))
