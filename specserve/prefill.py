"""How prompts enter the running batch: chunked prefill and reuse of cached prefixes.

A prompt is prefilled in **chunks**, each one more ragged sequence in the same target pass as the
running sequences' decoding and verification tokens, so a long prompt never freezes the streams
already running.  How many prompt tokens a step takes is the controller's choice
(``control.prefill_shares``): everything up to ``chunk`` when nothing else runs, otherwise as much
as keeps the step within ``stall`` times a decoding step of the whole batch (every sequence one
token, the prompts' included), so the running streams' inter-token latency stays within about
``stall`` times its usual value while prompts enter.  Prompts that one chunk can finish go first.
Chunks end at multiples of ``prefix_cache.BLOCK`` (unless they end the prompt), so every block of a
prompt lies in one chunk.

The bits do not depend on the chunking: on a batch-invariant runtime each position's keys, values,
features and logits are computed by the same operations whether its prompt is prefilled whole, in
chunks of any size, or beside other sequences (``Decoder.invariant_tokens`` bounds the chunk where
that holds only for runs of limited length).  So greedy output alone and under load is identical.

``Prefill`` is the engine's helper for the prefix pool (``specserve.prefix_cache``): it finds and
copies a new prompt's cached blocks into its cache row, and stores the blocks that a chunk, or a
finished sequence's generated text, completed.  The engine owns the cache and calls it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from specserve.errors import SpecserveError
from specserve.models.kv_cache import KVCache
from specserve.prefix_cache import BLOCK, PrefixCache

if TYPE_CHECKING:
    from specserve.engine import Sequence


@dataclass(frozen=True)
class PrefillPolicy:
    chunk: int | None = 256         # most prompt tokens one pass takes; None: every prompt whole, in one pass
    stall: float = 5.0              # a step with prompt chunks may take this many times a decoding step
    prefix_cache_mb: float = 0.0    # the prefix pool's memory (0: no reuse)

    def check(self) -> None:
        """Refuse settings that cannot work (at construction: nothing is rewritten silently)."""
        if self.chunk is not None and (self.chunk < BLOCK or self.chunk % BLOCK):
            raise SpecserveError(f"prefill chunk must be a positive multiple of {BLOCK} tokens, got {self.chunk}")
        if not self.stall >= 1.0:
            raise SpecserveError(f"prefill stall must be >= 1 (times a decoding step of the batch), got {self.stall}")
        if not self.prefix_cache_mb >= 0:
            raise SpecserveError(f"prefix cache size must be >= 0 MB, got {self.prefix_cache_mb}")


class Prefill:
    """The engine's prefix pool, with the bookkeeping of each sequence's chain of blocks."""

    def __init__(self, policy: PrefillPolicy, cache: KVCache, feature_layers: tuple[int, ...], hidden: int):
        policy.check()
        self.policy = policy
        self.pool: PrefixCache | None = None
        if policy.prefix_cache_mb > 0:
            k = cache.k_all
            layers, _, kv_heads, _, head_dim = k.shape
            try:
                self.pool = PrefixCache(layers, kv_heads, head_dim, k.dtype, k.device,
                                        int(policy.prefix_cache_mb * 2**20), feature_layers, hidden)
            except ValueError as e:
                raise SpecserveError(str(e)) from None
        self.feature_layers = feature_layers if self.pool is not None else ()

    def reuse(self, s: "Sequence", cache: KVCache, features: tuple[int, ...]) -> dict[int, torch.Tensor]:
        """Copy the prompt's longest cached prefix (whole blocks, never its last token: the pass
        that ends a prompt gives its first token) into its row; set ``s.prefilled`` and
        ``s.blocks``.  Returns the copied features of ``features`` layers (each [n, hidden])."""
        if self.pool is None:
            return {}
        prompt = s.request.prompt
        match = self.pool.match(prompt, bool(features), limit=len(prompt) - 1)
        if not match.blocks:
            return {}
        got = self.pool.load(match, cache.k_all[:, s.row], cache.v_all[:, s.row])
        s.blocks = list(match.blocks)
        s.prefilled = s.stats.cached_tokens = match.tokens
        cache.truncate(s.row, match.tokens)
        return {layer: got[layer] for layer in features}

    def store_chunk(self, s: "Sequence", cache: KVCache, start: int, features: dict[int, torch.Tensor]) -> None:
        """After a pass wrote prompt positions ``start .. s.prefilled - 1``: store the blocks they
        completed; ``features``: this chunk's [n, hidden] per layer (those of the pool's layers)."""
        if self.pool is None:
            return
        while s.blocks is not None and len(s.blocks) * BLOCK + BLOCK <= s.prefilled:
            at = len(s.blocks) * BLOCK
            if at < start:             # a block begun before this chunk: chunks end at whole blocks
                raise AssertionError("a prompt chunk began inside a block")
            feats = {layer: features[layer][at - start: at - start + BLOCK] for layer in self.feature_layers
                     if layer in features}
            if not self._add(s, cache, at, feats or None):
                return

    def store_generated(self, s: "Sequence", cache: KVCache) -> None:
        """At a sequence's end: store the blocks its cached text completed (prompt and generated
        tokens; positions the cache holds for tokens that were committed)."""
        if self.pool is None:
            return
        valid = min(cache.lengths[s.row], len(s.tokens))
        while s.blocks is not None and len(s.blocks) * BLOCK + BLOCK <= valid:
            if not self._add(s, cache, len(s.blocks) * BLOCK, None):
                return

    def _add(self, s: "Sequence", cache: KVCache, at: int, feats: dict[int, torch.Tensor] | None) -> bool:
        parent = s.blocks[-1] if s.blocks else None
        b = self.pool.store(parent, s.tokens[at:at + BLOCK], cache.k_all[:, s.row], cache.v_all[:, s.row], at, feats)
        if b is None:
            s.blocks = None            # the chain is broken (evicted meanwhile): store no more of it
            return False
        s.blocks.append(b)
        return True
