"""Reuse of shared prompt prefixes: a bounded pool of KV blocks keyed by the tokens before them.

Terms.  A **block** is the keys and values (and, when drafters need them, the target features) of
``PREFIX_BLOCK`` (``specserve.limits``: the prefill planner cuts prompt chunks at its multiples)
consecutive positions ``[i * PREFIX_BLOCK, (i + 1) * PREFIX_BLOCK)`` of one sequence.  Its **key** is
its parent block (the block before it, none for i = 0) and its own tokens, so a block is found only
through the exact token ids from position 0 to its end: a chain of blocks is a prefix.  The engine
(which owns the target's KV cache) asks for the longest cached chain of a new prompt and copies it
into the prompt's cache row instead of computing it; it stores each block a prefill completes, and
at a sequence's end the blocks its generated text completed (without features).

Exactness.  Every position's keys, values and features are a function of the tokens up to it,
computed by batch-invariant kernels whose bits do not depend on how a prompt is cut into chunks or
what else shares a pass.  A copied block therefore holds the bits a cold prefill would write, and
output is identical with and without reuse (on batch-invariant runtimes; see docs/exactness.md).

Memory and eviction.  The pool is allocated once (``max_bytes`` rounded down to whole blocks;
pages become resident as blocks are written).  When it is full, a new block replaces the least
recently used block that has no cached children (a leaf), so a cached chain is never cut in the
middle; a lookup marks every block of the chain it returns as used.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

import torch

from specserve.limits import PREFIX_BLOCK


@dataclass(eq=False)
class Block:
    key: tuple                    # (parent block id or -1, its PREFIX_BLOCK token ids)
    id: int
    slot: int                     # index into the pool tensors
    parent: "Block | None"
    has_features: bool
    children: int = 0


@dataclass
class PrefixStats:
    lookups: int = 0
    hit_tokens: int = 0           # prompt tokens copied from the pool instead of computed
    miss_tokens: int = 0          # prompt tokens looked up and not found (computed)
    stored_blocks: int = 0
    evicted_blocks: int = 0


@dataclass
class Match:
    """The cached chain for a prompt: its blocks, root first, and the tokens they cover."""
    blocks: list[Block] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return len(self.blocks) * PREFIX_BLOCK


class PrefixCache:
    """Blocks of ``layers x kv_heads x PREFIX_BLOCK x head_dim`` keys and values (the KV cache's dtype and
    device), plus features of ``feature_layers`` ([PREFIX_BLOCK, hidden] each) when there are any."""

    def __init__(self, num_layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device | str, max_bytes: int, feature_layers: tuple[int, ...] = (), hidden: int = 0):
        self.feature_layers = tuple(feature_layers)
        elem = torch.empty(0, dtype=dtype).element_size()
        kv_bytes = 2 * num_layers * kv_heads * PREFIX_BLOCK * head_dim * elem
        feat_bytes = len(self.feature_layers) * PREFIX_BLOCK * hidden * 4
        self.block_bytes = kv_bytes + feat_bytes
        self.capacity = max(int(max_bytes) // self.block_bytes, 0)
        if self.capacity < 1:
            raise ValueError(f"a prefix cache of {max_bytes} bytes holds no block ({self.block_bytes} bytes each)")
        shape = (self.capacity, num_layers, kv_heads, PREFIX_BLOCK, head_dim)
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)
        self.f = (torch.empty(self.capacity, len(self.feature_layers), PREFIX_BLOCK, hidden, device=device)
                  if self.feature_layers else None)
        self._blocks: dict[tuple, Block] = {}
        self._lru: collections.OrderedDict[int, Block] = collections.OrderedDict()   # by id, oldest first
        self._free = list(range(self.capacity - 1, -1, -1))
        self._next_id = 0
        self.stats = PrefixStats()

    # ------------------------------------------------------------------ what the engine calls
    @property
    def blocks(self) -> int:
        return len(self._blocks)

    @property
    def used_bytes(self) -> int:
        return len(self._blocks) * self.block_bytes

    def match(self, tokens: list[int], features: bool, limit: int | None = None) -> Match:
        """The longest chain of cached blocks that ``tokens`` starts with, of at most ``limit``
        tokens (whole blocks); with ``features`` only blocks that hold features.  Counts the
        lookup (hits and misses over ``limit`` tokens) and marks the chain as used."""
        limit = len(tokens) if limit is None else min(limit, len(tokens))
        out, parent = Match(), -1
        for i in range(limit // PREFIX_BLOCK):
            b = self._blocks.get((parent, tuple(tokens[i * PREFIX_BLOCK:(i + 1) * PREFIX_BLOCK])))
            if b is None or (features and not b.has_features):
                break
            out.blocks.append(b)
            parent = b.id
        for b in out.blocks:
            self._lru.move_to_end(b.id)
        self.stats.lookups += 1
        self.stats.hit_tokens += out.tokens
        self.stats.miss_tokens += limit - out.tokens
        return out

    def load(self, match: Match, k_row: torch.Tensor, v_row: torch.Tensor) -> dict[int, torch.Tensor]:
        """Copy the chain into a cache row's views ``k_row``/``v_row`` [L, kv_heads, capacity, D] at
        positions 0 .. match.tokens - 1.  Returns the features per layer [match.tokens, hidden]
        when the blocks hold them (else {})."""
        for i, b in enumerate(match.blocks):
            k_row[:, :, i * PREFIX_BLOCK:(i + 1) * PREFIX_BLOCK] = self.k[b.slot]
            v_row[:, :, i * PREFIX_BLOCK:(i + 1) * PREFIX_BLOCK] = self.v[b.slot]
        if self.f is None or not match.blocks or not all(b.has_features for b in match.blocks):
            return {}
        feats = torch.cat([self.f[b.slot] for b in match.blocks], 1)              # [F, tokens, hidden]
        return {layer: feats[j] for j, layer in enumerate(self.feature_layers)}

    def store(self, parent: Block | None, tokens: list[int], k_row: torch.Tensor, v_row: torch.Tensor,
              start: int, features: dict[int, torch.Tensor] | None = None) -> Block | None:
        """Add the block of positions ``start .. start + PREFIX_BLOCK - 1`` (``tokens``: its PREFIX_BLOCK ids)
        after ``parent`` (None when start is 0), copying from a cache row's views; ``features``:
        [PREFIX_BLOCK, hidden] per feature layer, or None.  An existing block is marked used and returned
        (gaining features if it had none).  Returns None, storing nothing, when the parent has been
        evicted meanwhile or no block can make room."""
        if len(tokens) != PREFIX_BLOCK or start % PREFIX_BLOCK or (parent is None) != (start == 0):
            raise ValueError("a block holds PREFIX_BLOCK tokens at a multiple of it; only the first has no parent")
        if parent is not None and self._blocks.get(parent.key) is not parent:
            return None
        key = (parent.id if parent is not None else -1, tuple(tokens))
        b = self._blocks.get(key)
        if b is None:
            slot = self._take_slot(keep=parent)
            if slot is None:
                return None
            b = Block(key, self._next_id, slot, parent, False)
            self._next_id += 1
            self._blocks[key] = b
            if parent is not None:
                parent.children += 1
            self.k[slot] = k_row[:, :, start:start + PREFIX_BLOCK]
            self.v[slot] = v_row[:, :, start:start + PREFIX_BLOCK]
            self.stats.stored_blocks += 1
        if (features is not None and self.f is not None and not b.has_features
                and all(layer in features for layer in self.feature_layers)):
            for j, layer in enumerate(self.feature_layers):
                self.f[b.slot, j] = features[layer]
            b.has_features = True
        self._lru[b.id] = b
        self._lru.move_to_end(b.id)
        return b

    # ------------------------------------------------------------------ eviction
    def _take_slot(self, keep: Block | None) -> int | None:
        if self._free:
            return self._free.pop()
        for b in self._lru.values():                     # least recently used leaf first
            if b.children == 0 and b is not keep:
                self._evict(b)
                return self._free.pop()
        return None                                      # only `keep` and its ancestors are cached

    def _evict(self, b: Block) -> None:
        del self._blocks[b.key]
        del self._lru[b.id]
        if b.parent is not None:
            b.parent.children -= 1
        self._free.append(b.slot)
        self.stats.evicted_blocks += 1
