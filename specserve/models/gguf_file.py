"""A GGUF file's metadata and tensors, read straight from a memory map.

gguf-py's ``GGUFReader`` builds a numpy view for every element of every metadata array, so a file
whose tokenizer holds tens of thousands of tokens and as many merges takes seconds to open, and
Gemma 3's vocabulary of 262,144 tokens longer still.  The loader needs none of those elements: it needs the scalar fields, the
vocabulary's size and the tensors.  This reader walks the same layout (GGUF v2/v3, little-endian)
with ``struct``, counts the long arrays it is told to skip instead of decoding them, and hands out
each tensor as a zero-copy view of the map shaped the way gguf-py shapes it, so everything
downstream (``gguf.quants.dequantize``, the native kernels' blocks) reads the same bytes.

Layout: magic ``GGUF``, u32 version, u64 tensor count, u64 field count; each field a string key
(u64 length + UTF-8), a u32 value type and the value (an array is a u32 element type, a u64 count
and the elements); each tensor's info a name, u32 dimension count, u64 dimensions (innermost
first), u32 GGML type and u64 offset into the data section, which starts at the next multiple of
``general.alignment`` (default 32) after the infos.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

_STRING, _ARRAY = 8, 9
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


@dataclass(frozen=True)
class Skipped:
    """An array field left undecoded: its element type and how many elements it holds."""
    element_type: int
    count: int

    def __len__(self) -> int:
        return self.count


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    tensor_type: Any                # gguf.GGMLQuantizationType
    shape: tuple[int, ...]          # GGUF order, innermost dimension first
    data: np.ndarray                # read-only view of the map: typed for F32/F16/I*, else uint8 blocks


def release_mapped(w) -> None:
    """Let go of the resident pages under a block weight read in place from a file's map (marked
    ``mapped`` by the loader) once nothing reads it any more: the whole pages inside its bytes leave
    this process's resident memory (a later read would fault them back from the page cache).  Any
    other weight is left alone."""
    if not getattr(w, "mapped", False):
        return
    import ctypes
    import mmap

    start, n = w.data.data_ptr(), w.data.numel()
    lo, hi = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE, (start + n) // mmap.PAGESIZE * mmap.PAGESIZE
    if hi > lo and hasattr(mmap, "MADV_DONTNEED"):
        ctypes.CDLL(None).madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), mmap.MADV_DONTNEED)


class GGUFFile:
    """``fields``: key -> Python value (str, int, float, bool, list), or ``Skipped`` for an array
    whose key is in ``skip``; ``tensors``: in file order.  Where each part lies in the file (byte
    offsets, end exclusive): ``field_spans`` (key -> (start, end) of its key, type and value),
    ``infos_span`` (the tensor infos) and ``data_start`` (the aligned data section)."""

    def __init__(self, path: str, skip: Iterable[str] = ()):
        self.path = path
        self._skip = set(skip)
        self._map = np.memmap(path, dtype=np.uint8, mode="r")
        self._buf = memoryview(self._map)
        self._pos = 0
        if bytes(self._buf[:4]) != MAGIC:
            raise ValueError("not a GGUF file (bad magic)")
        self._pos = 4
        version = self._scalar("<I")
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version} is not supported (2 and 3 are)")
        n_tensors, n_fields = self._scalar("<Q"), self._scalar("<Q")
        self.fields: dict[str, Any] = {}
        self.field_spans: dict[str, tuple[int, int]] = {}
        for _ in range(n_fields):
            begin = self._pos
            key = self._string()
            self.fields[key] = self._value(self._scalar("<I"), skip=key in self._skip)
            self.field_spans[key] = (begin, self._pos)
        begin = self._pos
        infos = [self._tensor_info() for _ in range(n_tensors)]
        self.infos_span = (begin, self._pos)
        align = int(self.fields.get("general.alignment", DEFAULT_ALIGNMENT))
        self.data_start = start = -(-self._pos // align) * align
        self.tensors = [self._tensor(name, dims, ttype, start + offset) for name, dims, ttype, offset in infos]

    def raw_field(self, key: str) -> bytes:
        """A field's bytes as the file holds them (key, type and value): to copy it into another file."""
        begin, end = self.field_spans[key]
        return bytes(self._buf[begin:end])

    # ---- the layout ---------------------------------------------------------------------------

    def _scalar(self, fmt: str):
        size = struct.calcsize(fmt)
        if self._pos + size > len(self._buf):
            raise ValueError("truncated GGUF file")
        (v,) = struct.unpack_from(fmt, self._buf, self._pos)
        self._pos += size
        return v

    def _string(self) -> str:
        n = self._scalar("<Q")
        if self._pos + n > len(self._buf):
            raise ValueError("truncated GGUF file")
        s = bytes(self._buf[self._pos:self._pos + n]).decode("utf-8", errors="replace")
        self._pos += n
        return s

    def _value(self, vtype: int, skip: bool = False):
        if vtype in _SCALARS:
            return self._scalar(_SCALARS[vtype])
        if vtype == _STRING:
            return self._string()
        if vtype != _ARRAY:
            raise ValueError(f"unknown GGUF value type {vtype}")
        etype, count = self._scalar("<I"), self._scalar("<Q")
        if etype in _SCALARS:
            fmt = _SCALARS[etype]
            size = struct.calcsize(fmt) * count
            if self._pos + size > len(self._buf):
                raise ValueError("truncated GGUF file")
            if skip:
                self._pos += size
                return Skipped(etype, count)
            out = list(struct.unpack_from(f"<{count}{fmt[1]}", self._buf, self._pos))
            self._pos += size
            return out
        if etype == _STRING and skip:
            for _ in range(count):                  # each string carries its own length: walk them
                n = self._scalar("<Q")
                self._pos += n
            if self._pos > len(self._buf):
                raise ValueError("truncated GGUF file")
            return Skipped(etype, count)
        items = [self._value(etype) for _ in range(count)]
        return Skipped(etype, count) if skip else items

    def _tensor_info(self) -> tuple[str, tuple[int, ...], int, int]:
        name = self._string()
        dims = tuple(self._scalar("<Q") for _ in range(self._scalar("<I")))
        return name, dims, self._scalar("<I"), self._scalar("<Q")

    def _tensor(self, name: str, dims: tuple[int, ...], ttype: int, offset: int) -> GGUFTensor:
        import gguf

        qtype = gguf.GGMLQuantizationType(ttype)
        np_dims = tuple(reversed(dims))
        typed = {gguf.GGMLQuantizationType.F32: np.float32, gguf.GGMLQuantizationType.F16: np.float16,
                 gguf.GGMLQuantizationType.F64: np.float64, gguf.GGMLQuantizationType.I8: np.int8,
                 gguf.GGMLQuantizationType.I16: np.int16, gguf.GGMLQuantizationType.I32: np.int32,
                 gguf.GGMLQuantizationType.I64: np.int64}.get(qtype)
        if typed is None:
            np_dims = gguf.quants.quant_shape_to_byte_shape(np_dims, qtype)
            typed = np.uint8
        nbytes = int(np.prod(np_dims, dtype=np.int64)) * np.dtype(typed).itemsize
        if offset + nbytes > len(self._map):
            raise ValueError(f"tensor {name} runs past the end of the file")
        data = self._map[offset:offset + nbytes].view(typed).reshape(np_dims)
        return GGUFTensor(name, qtype, dims, data)
