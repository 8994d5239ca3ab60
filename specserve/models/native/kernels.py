"""Row kernels called one at a time from Python: a linear layer over any weight the kernels read,
each row's argmax, greedy verification and a grammar's bitmask over logits rows (``logit_ops.cpp``),
and the machine's fp32 multiply-add ceiling.
"""

from __future__ import annotations

import itertools
from array import array

import torch

from specserve.models.native.build import library
from specserve.models.native.formats import BlockWeight


def linear(x: torch.Tensor, w: BlockWeight, bias: torch.Tensor | None = None,
           out: torch.Tensor | None = None, accumulate: bool = False) -> torch.Tensor:
    """x: [M, in] fp32 contiguous -> [M, out]; with ``accumulate``, ``out`` += x W^T (+ bias)."""
    m, k = x.shape
    n = w.shape[0]
    if out is None:
        out = torch.empty(m, n)
    library().ss_linear(x.data_ptr(), m, k, w.data.data_ptr(), w.fmt, n,
                        bias.data_ptr() if bias is not None else None, out.data_ptr(), int(accumulate))
    return out


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """x: float32 [R, V] on the CPU, rows contiguous -> int64 [R]: each row's first maximum (the first
    NaN where a row has one), as ``torch.argmax`` gives it."""
    if x.dtype != torch.float32 or x.device.type != "cpu" or x.dim() != 2 or x.stride(1) != 1:
        raise ValueError("argmax_rows takes float32 [R, V] CPU rows with contiguous entries")
    out = torch.empty(x.shape[0], dtype=torch.int64)
    library().ss_argmax_rows(x.data_ptr(), x.shape[0], x.stride(0), x.shape[1], out.data_ptr())
    return out


def greedy_walk_rows(x: torch.Tensor, offsets: list[int], tokens: list[list[int]],
                  parents: list[list[int]] | None) -> list[tuple[list[int], int]]:
    """x: float32 [R, V] CPU logits rows with contiguous entries; per decoding row b: its pending
    token's row ``offsets[b]``, its node tokens, and their parents (-1: child of the pending token;
    ``parents`` None: every row a chain).  Per row: (accepted node indices, root first; the emitted
    token after them), as ``verify.tree.greedy_tree_verify_argmax`` gives them (``logit_ops.cpp``)."""
    if x.dtype != torch.float32 or x.device.type != "cpu" or x.dim() != 2 or x.stride(1) != 1:
        raise ValueError("greedy_walk_rows takes float32 [R, V] CPU rows with contiguous entries")
    b = len(offsets)
    first = list(itertools.accumulate([len(t) for t in tokens], initial=0))
    if b and (min(offsets) < 0 or max(o + len(t) for o, t in zip(offsets, tokens)) >= x.shape[0]):
        raise ValueError("a row's logits lie outside the pass's")
    flat = array("q", [t for ts in tokens for t in ts] or [0])
    par = None if parents is None else array("q", [p for ps in parents for p in ps] or [0])
    path, accepted, final = array("q", bytes(8 * max(first[-1], 1))), array("q", bytes(8 * b)), array("q", bytes(8 * b))
    off, fst = array("q", offsets), array("q", first)
    library().ss_greedy_verify(x.data_ptr(), x.stride(0), x.shape[1], b, _addr(off), _addr(fst), _addr(flat),
                               _addr(par) if par is not None else None, _addr(path), _addr(accepted), _addr(final))
    return [(path[first[i]:first[i] + accepted[i]].tolist(), final[i]) for i in range(b)]


def move_slots(cache: torch.Tensor, row: int, dst: list[int], src: list[int]) -> None:
    """cache: a contiguous CPU [L, R, Hkv, C, D] KV tensor: in row ``row``, every layer's and head's
    slot dst[i] takes slot src[i]'s entry, in order (``KVCache.compact``)."""
    if cache.device.type != "cpu" or cache.dim() != 5 or not cache.is_contiguous():
        raise ValueError("move_slots takes a contiguous CPU cache [L, R, Hkv, C, D]")
    n_layers, rows, hkv, cap, d = cache.shape
    if not 0 <= row < rows or any(not 0 <= x < cap for x in dst + src) or len(dst) != len(src):
        raise ValueError("move_slots: a row or slot outside the cache")
    to, frm = array("q", dst or [0]), array("q", src or [0])          # kept referenced through the call
    library().ss_move_slots(cache.data_ptr(), n_layers, rows, hkv, cap, d, cache.element_size(), row,
                            _addr(to), _addr(frm), len(dst))


def _addr(a: array) -> int:
    """An array's buffer address (the caller keeps the array referenced while the kernel runs)."""
    return a.buffer_info()[0]


def mask_rows(x: torch.Tensor, bitmask: torch.Tensor) -> None:
    """x: float32 [R, V] CPU rows with contiguous entries; bitmask: int32 [R, W] contiguous (bit j of
    word w: token 32w + j allowed).  Every forbidden token of each row set to -inf, in place."""
    if x.dtype != torch.float32 or x.device.type != "cpu" or x.dim() != 2 or x.stride(1) != 1:
        raise ValueError("mask_rows takes float32 [R, V] CPU rows with contiguous entries")
    if bitmask.dtype != torch.int32 or bitmask.shape[0] != x.shape[0] or not bitmask.is_contiguous():
        raise ValueError("mask_rows takes an int32 [R, W] contiguous bitmask, one row per logits row")
    library().ss_mask_rows(x.data_ptr(), x.shape[0], x.stride(0), bitmask.data_ptr(), bitmask.shape[1], x.shape[1])


def fma_peak(seconds: float = 0.3) -> float:
    """The machine's fp32 multiply-add ceiling with AVX2 + FMA on every core, in multiply-adds/s."""
    lib = library()
    threads = lib.ss_set_threads(0)
    sink = torch.zeros(max(threads, 1) * 4)
    iters = 1 << 16
    while True:
        t = lib.ss_fma_peak(iters, sink.data_ptr())
        if t >= seconds or iters > 1 << 34:
            return threads * iters * 96 / t
        iters *= 2
