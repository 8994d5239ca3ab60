"""Weights packed for int8 activations (``q8.h``), and the choice of instruction-set path.

``activations=int8`` (the default for GGUF blocks): each linear layer quantizes its input rows once,
in blocks of 32 int8 values with an fp32 scale, and takes integer dot products against its weight
repacked at load into groups of 8 output rows.  The integer block sums are exact, and the floats
that combine them run in one order per output element, so the bits do not depend on the batch,
the thread count or the instruction set (AVX2 always; AVX512-VNNI or AVX-VNNI where the CPU has
them).  ``activations=f32`` keeps fp32 activations against exactly dequantized weights.
"""

from __future__ import annotations

import itertools
from typing import Callable

import torch

from specserve.models.native import FORMAT_NAMES, Q8_0, BlockWeight, NativeWeight, library
from specserve.models.native.paths import INT8

PACKED = 16                       # a packed weight's format: PACKED + the GGUF format it came from
MIXED = 64                        # a fused weight whose parts are packed in different formats (simd.h)
MIXED_HEADER = 128
PATHS = INT8.codes
ACTIVATIONS = ("auto", "int8", "f32")


class PackedWeight(BlockWeight):
    """A GGUF block weight [out, in] repacked for the int8 kernels (uint8 data, ``fmt`` = PACKED + source);
    ``dequantize`` gives the exact values of the blocks it was packed from."""

    def __init__(self, data: torch.Tensor, fmt: int, shape: tuple[int, int]):
        self.data, self.fmt, self.shape = data, fmt, shape

    @classmethod
    def pack(cls, w: "NativeWeight | FusedParts") -> "PackedWeight":
        """``w`` in the packed layout, each part packed once into one allocation.  Fused parts of one
        format whose row counts (but the last's) fill whole groups of 8 lie side by side as one weight
        of that format (the layout's groups never straddle two parts); parts of different formats
        make a ``MixedPacked``: its header, then the parts."""
        parts = w.parts if isinstance(w, FusedParts) else [w]
        k = parts[0].shape[1]
        sizes = [int(library().ss_packed_bytes(p.fmt, p.shape[0], k)) for p in parts]
        if min(sizes) < 0:
            bad = next(p for p, size in zip(parts, sizes) if size < 0)
            raise ValueError(f"{FORMAT_NAMES[bad.fmt]} weights have no int8 kernels (float weights keep float math)")
        mixed = len({p.fmt for p in parts}) > 1 or any(p.shape[0] % 8 for p in parts[:-1])
        head = MIXED_HEADER if mixed else 0
        out = torch.empty(head + sum(sizes), dtype=torch.uint8)
        views, at = [], head
        for p, size in zip(parts, sizes):
            library().ss_pack(p.data.data_ptr(), p.fmt, p.shape[0], k, out[at:].data_ptr())
            views.append(cls(out[at:at + size], PACKED + p.fmt, p.shape))
            at += size
        if not mixed:
            return cls(out, PACKED + parts[0].fmt, w.shape)
        header = [len(parts)]
        for v, offset in zip(views, itertools.accumulate([head, *sizes[:-1]])):
            header += [v.fmt, v.shape[0], offset]
        out[:head].view(torch.int64)[:] = 0
        out[:8 * len(header)].view(torch.int64)[:] = torch.tensor(header)
        return MixedPacked(out, views, w.shape)


class FusedParts:
    """A fused weight (QKV, gate/up) kept as its parts until the activations are known: packed from
    the parts for int8 activations (``PackedWeight.pack``: no stacked copy of the blocks, and parts of
    different formats, such as a K-quant mix's Q6_K v beside Q4_K q and k, each in the file's own
    bits); one block weight, or fp32 rows, for float activations (``as_float``)."""

    def __init__(self, parts: list[NativeWeight]):
        if len({p.shape[1] for p in parts}) > 1:
            raise ValueError("fused parts need one in_features")
        self.parts = parts
        self.shape = (sum(p.shape[0] for p in parts), parts[0].shape[1])

    def as_float(self, part: "Callable[[NativeWeight], NativeWeight]" = lambda p: p) -> NativeWeight:
        """The parts (each through ``part`` first) stacked: ``NativeWeight.cat``."""
        return NativeWeight.cat([part(p) for p in self.parts])


def fuse(parts: list[NativeWeight]) -> "NativeWeight | FusedParts":
    """Parts stacked along out_features: ``FusedParts`` where every part has int8 kernels (packed into
    one weight, with no stacked copy of the blocks; see ``PackedWeight.pack``), else one weight
    (``NativeWeight.cat``)."""
    if len(parts) <= (MIXED_HEADER // 8 - 1) // 3 and all(map(packable, parts)):
        return FusedParts(parts)
    return NativeWeight.cat(parts)


class MixedPacked(PackedWeight):
    """``FusedParts`` of different formats packed (``PackedWeight.pack``): a header of int64 {parts,
    then per part: packed format, rows, byte offset} in MIXED_HEADER bytes, then each part's packed
    data (``parts``: views of it); one linear call quantizes the activations once and runs each part
    on its own format's kernel into its columns."""

    def __init__(self, data: torch.Tensor, parts: list[PackedWeight], shape: tuple[int, int]):
        super().__init__(data, MIXED, shape)
        self.parts = parts

    def dequantize(self) -> torch.Tensor:
        return torch.cat([p.dequantize() for p in self.parts])


def quantize_q8_0(w: torch.Tensor) -> NativeWeight:
    """Float weights [out, in] as Q8_0 blocks: per block of 32, q = round(w * 127 / max|w|) and
    d = max|w| / 127 stored as fp16 (for weights that have no GGUF blocks of their own, e.g. a learned
    drafter head's, to run on the int8 kernels)."""
    n, k = w.shape
    if k % 32:
        raise ValueError(f"in_features {k} is not a multiple of 32 (q8_0)")
    x = w.detach().to(torch.float32).reshape(n, k // 32, 32)
    d = x.abs().amax(-1, keepdim=True) / 127                                           # [n, b, 1]
    inv = torch.where(d > 0, 1 / d, torch.zeros_like(d))
    q = torch.round(x * inv).clamp(-127, 127).to(torch.int8)                           # [n, b, 32]
    d16 = d.to(torch.float16).view(torch.uint8).reshape(n, k // 32, 2)
    blocks = torch.cat([d16, q.view(torch.uint8)], -1)
    return NativeWeight(blocks.reshape(n, -1).contiguous(), Q8_0, (n, k))


def packable(w) -> bool:
    if isinstance(w, FusedParts):
        return True
    return isinstance(w, NativeWeight) and int(library().ss_packed_bytes(w.fmt, 8, 256)) > 0


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [M, K] -> (q [M, K] int8, d [M, K/32], sx [M, K/32], hs [M, K/32, 2] int32): the activations
    as the int8 kernels see them (q = round(x * 127 / amax) per block of 32, d = amax / 127,
    sx = d * sum q, hs = the sums of q over each block's two halves)."""
    m, k = x.shape
    x = x.contiguous()
    q = torch.empty(m, k, dtype=torch.int8)
    d, sx = torch.empty(m, k // 32), torch.empty(m, k // 32)
    hs = torch.empty(m, k // 32, 2, dtype=torch.int32)
    library().ss_quantize_rows(x.data_ptr(), m, k, q.data_ptr(), d.data_ptr(), sx.data_ptr(), hs.data_ptr())
    return q, d, sx, hs


def path_runs(name: str) -> bool:
    """Whether this CPU runs the int8 path ``name`` (one of PATHS)."""
    return INT8.runs(name)


def set_path(name: str | None) -> str:
    """Use the int8 path ``name`` for later passes (None: the best this CPU runs); returns the one in
    use.  Paths give the same bits; this only changes speed."""
    return INT8.set(name)


def current_path() -> str:
    return INT8.current()


def int8_peak(seconds: float = 0.3) -> float:
    """The int8 multiply-add ceiling of the path in use on every core, in multiply-adds/s."""
    lib = library()
    threads = lib.ss_set_threads(0)
    sink = torch.zeros(max(threads, 1) * 4, dtype=torch.int32)
    iters = 1 << 14
    while True:
        t = lib.ss_int8_peak(iters, sink.data_ptr())
        if t >= seconds or iters > 1 << 32:
            return threads * iters * 8 * 32 / t
        iters *= 2
