"""Native CPU kernels (``simd.h``, ``blocks.h``, ``linear.cpp``, ``layer_ops.cpp``, ``forward.cpp``,
``logit_ops.cpp`` (row argmax, grammar masks), and the
int8-activation linears ``q8.h`` / ``q8*.cpp``): built on first use with the system C++ compiler, loaded
with ctypes, cached under ``$SPECSERVE_CACHE/kernels`` by a hash of the source and flags.

No torch headers and no ninja are needed: the library exports plain C functions over raw pointers.
It links ``libgomp.so.1``, which resolves to the OpenMP runtime torch has already loaded, so both
share one thread pool.  The flags target AVX2 + FMA + F16C (never ``-march=native``), so a library
built on one x86-64 machine runs on any other with those extensions; the VNNI variants of the int8
products sit in files of their own, compiled with their extra flags and called only where the CPU
reports them (``packed.set_path``).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

import torch

from specserve.host import cache_root, cpu_info

HERE = Path(__file__).parent
# Each source with the instruction sets it is compiled for: the base set everywhere, and the int8
# kernels' VNNI paths (q8.h) in files of their own, called only where the CPU has them.
BASE_ISA = ["-mavx2", "-mfma", "-mf16c"]
SOURCES = {HERE / "linear.cpp": BASE_ISA, HERE / "layer_ops.cpp": BASE_ISA, HERE / "forward.cpp": BASE_ISA,
           HERE / "q8.cpp": BASE_ISA, HERE / "logit_ops.cpp": BASE_ISA,
           HERE / "q8_vnni512.cpp": BASE_ISA + ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni"],
           HERE / "q8_avxvnni.cpp": BASE_ISA + ["-mavxvnni"]}
OPTIONAL = {HERE / "q8_vnni512.cpp", HERE / "q8_avxvnni.cpp"}   # built as stubs (path never chosen) if the compiler lacks the flags
HEADERS = [HERE / "simd.h", HERE / "blocks.h", HERE / "q8.h", HERE / "q8_entry.h"]
FLAGS = ["-O3", "-std=c++17", "-ffp-contract=off", "-fopenmp", "-fPIC"]
REQUIRED_CPU_FLAGS = ("avx2", "fma", "f16c")
ABI_VERSION = 10
MAX_TREE_TOKENS = 256   # longest tree pass per row (MAX_TREE_TOKENS in layer_ops.cpp)

# Weight formats (the ``Fmt`` enum of simd.h).
F32, F16, Q8_0, Q4_1, Q4_0, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K = range(10)
FORMAT_NAMES = {F32: "f32", F16: "f16", Q8_0: "q8_0", Q4_1: "q4_1", Q4_0: "q4_0", Q5_0: "q5_0", Q5_1: "q5_1",
                Q4_K: "q4_k", Q5_K: "q5_k", Q6_K: "q6_k"}
# elements per block (in_features must be a multiple of it) and bytes per block
BLOCK = {F32: 8, F16: 8, Q8_0: 32, Q4_1: 32, Q4_0: 32, Q5_0: 32, Q5_1: 32, Q4_K: 256, Q5_K: 256, Q6_K: 256}
BLOCK_BYTES = {F32: 32, F16: 16, Q8_0: 34, Q4_1: 20, Q4_0: 18, Q5_0: 22, Q5_1: 24, Q4_K: 144, Q5_K: 176, Q6_K: 210}


def cache_dir() -> Path:
    return cache_root() / "kernels"


def _cpu_flags() -> frozenset[str]:
    return frozenset(cpu_info().flags)


def unavailable_reason() -> str | None:
    """Why the native kernels cannot run here, or None when they can."""
    missing = [f for f in REQUIRED_CPU_FLAGS if f not in _cpu_flags()]
    if missing:
        return f"this CPU lacks {', '.join(missing)} (native kernels need AVX2, FMA and F16C on x86-64 Linux)"
    try:
        library()
    except RuntimeError as e:
        return str(e)
    return None


def _compiler() -> str:
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if not cxx:
        raise RuntimeError("no C++ compiler found (install g++ or set CXX) to build the native kernels")
    return cxx


_I64, _P, _F32, _I32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float, ctypes.c_int
# Every exported function: (argument types, result type).
SIGNATURES = {
    "ss_row_bytes": ([_I32, _I64], _I64),
    "ss_linear": ([_P, _I64, _I64, _P, _I32, _I64, _P, _P, _I32], None),
    "ss_embed": ([_P, _I64, _P, _I32, _I64, _P], None),
    "ss_rmsnorm": ([_P, _P, _I64, _I64, _F32, _P], None),
    "ss_silu_mul": ([_P, _I64, _I64, _P], None),
    "ss_rope_cache": ([_P, _P, _P, _P, _P, _P, _P, _P, _I64, _I64, _I64, _I64, _I64, _P, _P, _F32, _P, _P, _P], None),
    "ss_attention": ([_P, _P, _P, _P, _P, _P, _P, _P, _I64, _I64, _I64, _I64, _I64, _F32, _I64, _P], None),
    "ss_gelu_tanh_mul": ([_P, _I64, _I64, _P], None),
    "ss_add": ([_P, _P, _I64], None),
    "ss_argmax_rows": ([_P, _I64, _I64, _I64, _P], None),
    "ss_mask_rows": ([_P, _I64, _I64, _P, _I64, _I64], None),
    "ss_scale": ([_P, _F32, _I64], None),
    "ss_set_threads": ([_I32], _I32),
    "ss_default_threads": ([], _I32),
    "ss_release_threads": ([], _I32),
    "ss_fma_peak": ([_I64, _P], ctypes.c_double),
    "ss_int8_peak": ([_I64, _P], ctypes.c_double),
    "ss_q8_path_runs": ([_I32], _I32),
    "ss_q8_set_path": ([_I32], _I32),
    "ss_q8_path": ([], _I32),
    "ss_packed_bytes": ([_I32, _I64, _I64], _I64),
    "ss_pack": ([_P, _I32, _I64, _I64, _P], None),
    "ss_quantize_rows": ([_P, _I64, _I64, _P, _P, _P, _P], None),
    "ss_layer_fields": ([], _I32),
    "ss_forward": ([_P, _P, _P, _P, _P, _P, _P, _P, _I64, _I64, _I64, _I64, _I64, _I64, _I64, _I64, _I64, _F32, _F32,
                    _F32, _P, _P, _P, _P, _P, _P, _I64, _P, _P, _P, _P, _I32, _P, _P, _I32, _I64, _P, _I64, _P, _P],
                   None),
}


@lru_cache(maxsize=1)
def library() -> ctypes.CDLL:
    """Build (once per source/flags/compiler) and load the kernel library."""
    cxx = _compiler()
    target = cache_dir() / f"specserve_kernels_{_build_key(cxx)}.so"
    if not target.is_file():
        _build(cxx, target)
    lib = ctypes.CDLL(str(target))
    if lib.ss_abi_version() != ABI_VERSION:
        raise RuntimeError(f"stale native kernel library {target}")
    for name, (args, res) in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, res
    return lib


def _build_key(cxx: str) -> str:
    """The library's name in the cache: a hash of the sources with their flags, the headers, the
    common flags and the compiler's version."""
    try:
        version = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise RuntimeError(f"C++ compiler {cxx!r} does not run: {e}") from None
    text = b"".join(p.read_bytes() + " ".join(isa).encode() for p, isa in SOURCES.items())
    text += b"".join(p.read_bytes() for p in HEADERS)
    return hashlib.sha256(text + " ".join(FLAGS).encode() + version.encode()).hexdigest()[:16]


def _build(cxx: str, target: Path) -> None:
    """Compile every source and link them into ``target``, which appears whole or not at all."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        objects = _compile_all(cxx, tmp)
        out = Path(tmp) / target.name
        proc = subprocess.run([cxx, "-fopenmp", "-shared", *objects, "-o", str(out)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"linking the native kernels failed: {proc.stderr.strip()[-2000:]}")
        os.replace(out, target)                       # atomic: concurrent builders are harmless


def _compile_all(cxx: str, tmp: str) -> list[str]:
    """Every source compiled (in parallel) to an object file in ``tmp``; an optional source the
    compiler cannot build with its extra flags is built as a stub whose path is never chosen."""
    jobs = [(subprocess.Popen([cxx, *FLAGS, *isa, f"-I{HERE}", "-c", str(src), "-o", f"{tmp}/{src.stem}.o"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), src)
            for src, isa in SOURCES.items()]
    for proc, src in jobs:
        _, err = proc.communicate()
        if proc.returncode != 0 and src in OPTIONAL:       # an older compiler: this path is left out
            proc = subprocess.run([cxx, *FLAGS, *BASE_ISA, "-DSS_Q8_STUB", "-c", str(src), "-o",
                                   f"{tmp}/{src.stem}.o"], capture_output=True, text=True)
            err = proc.stderr
        if proc.returncode != 0:
            raise RuntimeError(f"building the native kernels failed ({src.name}): {err.strip()[-2000:]}")
    return [f"{tmp}/{src.stem}.o" for src in SOURCES]


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


def linear(x: torch.Tensor, w: NativeWeight, bias: torch.Tensor | None = None,
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
