"""Row kernels called one at a time from Python: a linear layer over any weight the kernels read,
each row's argmax and a grammar's bitmask over logits rows (``logit_ops.cpp``), and the machine's fp32
multiply-add ceiling.
"""

from __future__ import annotations

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
