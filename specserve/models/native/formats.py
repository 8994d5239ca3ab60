"""The weight formats the native kernels read (the ``Fmt`` enum of simd.h): fp32 and fp16 rows, and
GGUF's blocks (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, and the K-quants Q4_K, Q5_K, Q6_K), each with its block
of elements and bytes; ``NativeWeight``, a weight matrix stored as rows of such blocks, and
``BlockWeight``, what every weight the kernels read has (``packed.PackedWeight`` is the other kind).
"""

from __future__ import annotations

import torch

from specserve.models.native.build import library

# Weight formats (the ``Fmt`` enum of simd.h).
F32, F16, Q8_0, Q4_1, Q4_0, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K = range(10)
FORMAT_NAMES = {F32: "f32", F16: "f16", Q8_0: "q8_0", Q4_1: "q4_1", Q4_0: "q4_0", Q5_0: "q5_0", Q5_1: "q5_1",
                Q4_K: "q4_k", Q5_K: "q5_k", Q6_K: "q6_k"}
# elements per block (in_features must be a multiple of it) and bytes per block
BLOCK = {F32: 8, F16: 8, Q8_0: 32, Q4_1: 32, Q4_0: 32, Q5_0: 32, Q5_1: 32, Q4_K: 256, Q5_K: 256, Q6_K: 256}
BLOCK_BYTES = {F32: 32, F16: 16, Q8_0: 34, Q4_1: 20, Q4_0: 18, Q5_0: 22, Q5_1: 24, Q4_K: 144, Q5_K: 176, Q6_K: 210}


class BlockWeight:
    """What every weight the kernels read has: uint8 ``data``, a format ``fmt`` and ``shape`` [out, in]."""

    data: torch.Tensor
    fmt: int
    shape: tuple[int, int]

    @property
    def nbytes(self) -> int:
        return self.data.numel()

    def dequantize(self) -> torch.Tensor:
        """The exact fp32 values the kernels use: [out, in]."""
        n, k = self.shape
        out, idx = torch.empty(n, k), torch.arange(n)
        library().ss_embed(idx.data_ptr(), n, self.data.data_ptr(), self.fmt, k, out.data_ptr())
        return out


class NativeWeight(BlockWeight):
    """A weight matrix [out, in] as the native kernels read it: rows of ``fmt`` blocks (uint8)."""

    def __init__(self, data: torch.Tensor, fmt: int, shape: tuple[int, int]):
        n, k = shape
        if k % BLOCK[fmt]:
            raise ValueError(f"in_features {k} is not a multiple of {BLOCK[fmt]} ({FORMAT_NAMES[fmt]})")
        rb = row_bytes(fmt, k)
        if data.dtype != torch.uint8 or tuple(data.shape) != (n, rb):
            raise ValueError(f"{FORMAT_NAMES[fmt]} weight of shape {shape} needs uint8 data [{n}, {rb}], "
                             f"got {data.dtype} {tuple(data.shape)}")
        self.data, self.fmt, self.shape = data.contiguous(), fmt, (n, k)

    @classmethod
    def from_float(cls, w: torch.Tensor, fmt: int = F32) -> "NativeWeight":
        if fmt == F32:
            data = w.detach().to(torch.float32).contiguous()
        elif fmt == F16:
            data = w.detach().to(torch.float16).contiguous()
        else:
            raise ValueError(f"cannot store a float tensor as {FORMAT_NAMES[fmt]}")
        return cls(data.view(torch.uint8).reshape(w.shape[0], -1), fmt, tuple(w.shape))

    @staticmethod
    def cat(parts: list["NativeWeight"]) -> "NativeWeight":
        """Stack along out_features (fused QKV / gate-up).  Parts of different formats are brought to
        one without changing a value: Q4_0 / Q5_0 blocks are Q8_0 blocks with small q (GGUF K-quant
        mixes store q and k as Q5_0 beside a Q8_0 v); anything else falls back to fp32 rows."""
        k = parts[0].shape[1]
        if len({p.fmt for p in parts}) > 1 and all(p.fmt in (Q4_0, Q5_0, Q8_0) for p in parts):
            parts = [p.as_q8_0() for p in parts]
        fmt = parts[0].fmt
        if any(p.fmt != fmt or p.shape[1] != k for p in parts):
            return NativeWeight.from_float(torch.cat([p.dequantize() for p in parts]))
        return NativeWeight(torch.cat([p.data for p in parts]), fmt, (sum(p.shape[0] for p in parts), k))

    def as_q8_0(self) -> "NativeWeight":
        """The same values as Q8_0 blocks: a Q4_0 / Q5_0 block is {d, q} with q in [-16, 15], which a
        Q8_0 block {d, int8 q[32]} holds exactly (both dequantize as d * q)."""
        if self.fmt == Q8_0:
            return self
        n, k = self.shape
        blocks = self.data.view(n, k // 32, BLOCK_BYTES[self.fmt])
        d = blocks[..., :2]
        if self.fmt == Q4_0:
            qs = blocks[..., 2:18].to(torch.int16)
            q = torch.cat([qs & 0x0F, qs >> 4], -1) - 8                              # [n, b, 32]
        elif self.fmt == Q5_0:
            qh = blocks[..., 2:6].to(torch.int64)
            bits = (qh[..., 0] | qh[..., 1] << 8 | qh[..., 2] << 16 | qh[..., 3] << 24)[..., None]
            high = ((bits >> torch.arange(32)) & 1).to(torch.int16) << 4           # element j: bit j
            qs = blocks[..., 6:22].to(torch.int16)
            q = (torch.cat([qs & 0x0F, qs >> 4], -1) | high) - 16
        else:
            raise ValueError(f"cannot store {FORMAT_NAMES[self.fmt]} blocks as q8_0 exactly")
        out = torch.cat([d, q.to(torch.int8).view(torch.uint8)], -1)              # [n, b, 34]
        return NativeWeight(out.reshape(n, -1).contiguous(), Q8_0, self.shape)


def row_bytes(fmt: int, k: int) -> int:
    return k // BLOCK[fmt] * BLOCK_BYTES[fmt]
