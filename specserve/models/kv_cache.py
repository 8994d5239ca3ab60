"""A preallocated key/value cache indexed by absolute position.

Layout per layer: ``k[layer]`` and ``v[layer]`` are ``[rows, kv_heads, capacity, head_dim]`` (views
of one ``[layers, rows, kv_heads, capacity, head_dim]`` tensor per kind).  Each
row holds one sequence.  The model writes the keys and values of the tokens it is fed at the
positions it is told; it never decides what is valid.  Validity is ``lengths[row]``, owned by the
engine: rolling a row back to any length is a single integer assignment, because entries past a
row's length are masked out by position and overwritten by the next write (gpt-fast's trick).

The capacity is rounded up to a multiple of ``block`` so the batch-invariant attention can view the
used part as whole blocks, and it keeps ``slack`` positions beyond the longest sequence so that a
verification pass padded to the longest draft in the batch never writes out of range.
"""

from __future__ import annotations

from typing import Callable

import torch

# Moves entries within one row of a [layers, rows, kv_heads, capacity, head_dim] tensor:
# (cache, row, dst slots, src slots), dst[i] taking src[i] in order; a runtime's own kernel.
SlotMover = Callable[[torch.Tensor, int, list, list], None]


class KVCache:
    def __init__(self, num_layers: int, rows: int, kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str, block: int = 64, slack: int = 64,
                 zeroed: bool = True, move_slots: SlotMover | None = None):
        self.max_len = max_len                      # longest sequence a row may hold
        self.capacity = -(-(max_len + slack) // block) * block
        shape = (rows, kv_heads, self.capacity, head_dim)
        # zeroed: the torch runtimes multiply masked entries by an exact 0, so they must never be
        # NaN.  The native runtime never lets an unwritten entry reach a result, so it takes
        # untouched memory: pages become resident only as positions are written.
        alloc = torch.zeros if zeroed else torch.empty
        # one tensor per kind for all layers (so that compaction moves every layer at once); the
        # model sees per-layer views, each contiguous
        self.k_all = alloc((num_layers, *shape), dtype=dtype, device=device)
        self.v_all = alloc((num_layers, *shape), dtype=dtype, device=device)
        self.k, self.v = list(self.k_all.unbind(0)), list(self.v_all.unbind(0))
        self.lengths = [0] * rows                   # valid positions per row; set by the engine
        self.move_slots = move_slots                # the runtime's kernel for compact (None: tensor indexing)

    @property
    def rows(self) -> int:
        """Number of sequence slots."""
        return len(self.lengths)

    def set_length(self, row: int, length: int) -> None:
        """Set ``row``'s valid positions to ``length``: O(1).  Shorter rolls the row back (the entries
        past it are dropped); longer keeps entries a pass has just written."""
        if not 0 <= length <= self.max_len:
            raise ValueError(f"length {length} outside [0, {self.max_len}]")
        self.lengths[row] = length

    def compact(self, row: int, start: int, path: list[int]) -> None:
        """Move an accepted tree path together: the entries at slots ``start + path[i]`` go to
        ``start + i``, for every layer.  ``path`` is strictly increasing with ``path[0] == 0`` (the
        pending token), so no entry is overwritten before it is read; a chain (``path[i] == i``)
        moves nothing.  Example: start 10, path [0, 1, 3] moves slot 13 to slot 12."""
        moves = [(start + i, start + p) for i, p in enumerate(path) if p != i]
        if not moves:
            return
        if self.move_slots is not None:                # the runtime's kernel: no tensor built
            for cache in (self.k_all, self.v_all):
                self.move_slots(cache, row, [d for d, _ in moves], [s for _, s in moves])
            return
        dst = torch.tensor([d for d, _ in moves], device=self.k_all.device)
        src = torch.tensor([s for _, s in moves], device=self.k_all.device)
        for cache in (self.k_all, self.v_all):
            layers = cache[:, row]                                  # [L, kv_heads, capacity, head_dim]
            layers[:, :, dst] = layers[:, :, src]

    def nbytes(self) -> int:
        """Bytes held by the cache tensors."""
        return sum(t.numel() * t.element_size() for t in (self.k_all, self.v_all))
