"""The engine's prefix pool (``specserve.prefix_cache``): finding a new prompt's cached blocks, and
storing the blocks a prompt chunk, or a finished sequence's text, completed.

It reads the cache's keys and values and writes the pool; row lengths are the row table's, and
the sequence's fields are written by the engine from what these methods return.
"""

from __future__ import annotations

import torch

from specserve.errors import SpecserveError
from specserve.limits import PREFIX_BLOCK
from specserve.models.kv_cache import KVCache
from specserve.prefix_cache import Match, PrefixCache


class Prefixes:
    def __init__(self, megabytes: float, cache: KVCache, feature_layers: tuple[int, ...], hidden: int):
        self.pool: PrefixCache | None = None
        if megabytes > 0:
            layers, _, kv_heads, _, head_dim = cache.k_all.shape
            try:
                self.pool = PrefixCache(layers, kv_heads, head_dim, cache.k_all.dtype, cache.k_all.device,
                                        int(megabytes * 2**20), feature_layers, hidden)
            except ValueError as e:
                raise SpecserveError(str(e)) from None
        self.feature_layers = feature_layers if self.pool is not None else ()   # layers a prompt chunk must return

    def match(self, prompt: list[int], features: bool) -> Match | None:
        """The prompt's longest cached prefix of whole blocks, never its last token (the pass that
        ends a prompt gives its first token); None when nothing is cached."""
        if self.pool is None:
            return None
        m = self.pool.match(prompt, features, limit=len(prompt) - 1)
        return m if m.blocks else None

    def store(self, chain: list | None, tokens: list[int], views: tuple[torch.Tensor, torch.Tensor], start: int,
              end: int, features: dict[int, torch.Tensor] | None) -> list | None:
        """Store the whole blocks of ``tokens[:end]`` after ``chain`` (a sequence's blocks so far; None:
        broken) that positions ``start .. end - 1`` completed; ``features``: those positions' [n, hidden]
        per layer (None: none stored).  Returns the chain, or None once the pool evicted a block of it."""
        if self.pool is None:
            return chain
        while chain is not None and len(chain) * PREFIX_BLOCK + PREFIX_BLOCK <= end:
            at = len(chain) * PREFIX_BLOCK
            if at < start:             # a block begun before this chunk: chunks end at whole blocks
                raise AssertionError("a prompt chunk began inside a block")
            feats = None if features is None else {
                layer: features[layer][at - start: at - start + PREFIX_BLOCK] for layer in self.feature_layers
                if layer in features} or None
            b = self.pool.store(chain[-1] if chain else None, tokens[at:at + PREFIX_BLOCK], *views, at, feats)
            if b is None:
                return None
            chain = chain + [b]
        return chain
