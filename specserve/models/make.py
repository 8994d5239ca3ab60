"""``specserve make-model``: a GGUF file of random weights in a real model's shape.

What a pass costs does not depend on the weights' values, so a file with the tensors, block types
and metadata of a model people serve (``specserve.models.shapes``) measures a runtime at that size
without the weights.  The file:

- carries the installed default model's BPE vocabulary padded with ``[PADn]`` tokens (type UNUSED,
  as llama.cpp's converter pads vocabularies) to the shape's vocabulary size, or, for Gemma shapes,
  Gemma 3 270M's own 262,144-token vocabulary; so both llama.cpp and this project tokenize with it,
  and the LM head has the real size;
- has random quantised blocks whose scales make every weight's standard deviation about ``SIGMA``
  (Hugging Face's usual initialiser range) with every scale a normal fp16 number, so activations stay
  in a realistic range and nothing is denormal; norms are 1, biases small;
- is written tensor by tensor in chunks of at most ``CHUNK_BYTES``, so an 8B file needs no more
  memory than a chunk, and is deterministic in its seed.

The layout written (GGUF v3, little-endian) is the one ``specserve.models.gguf_file`` reads.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np

from specserve.errors import SpecserveError
from specserve.models.shapes import FILE_TYPES, Shape, TensorSpec, tensor_plan

SIGMA = 0.02                    # each weight's standard deviation
BIAS_SIGMA = 0.02
CHUNK_BYTES = 64 << 20
ALIGNMENT = 32
VERSION = 3
UNUSED_TOKEN = 5                # llama.cpp's token type for padding
_U32, _F32, _BOOL, _STRING, _ARRAY, _I32 = 4, 6, 7, 8, 9, 5

# block types: (values per block, bytes per block)
BLOCKS = {"Q4_0": (32, 18), "Q5_0": (32, 22), "Q8_0": (32, 34), "Q4_K": (256, 144), "Q6_K": (256, 210)}


# ---------------------------------------------------------------- random blocks

def _f16(values: np.ndarray) -> np.ndarray:
    """fp16 scales as two bytes each, checked normal (no denormal, no zero)."""
    h = values.astype(np.float16)
    if not np.all(np.abs(h) >= np.finfo(np.float16).tiny):
        raise AssertionError("a block scale would be denormal")
    return h.view(np.uint8).reshape(-1, 2)


def random_blocks(qtype: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` random blocks of ``qtype`` [n, bytes per block] whose values have standard deviation
    about ``SIGMA`` and mean about 0: random quants, and per block a random scale (and for Q4_K
    random sub-block scales with the minimum that centres them)."""
    _, size = BLOCKS[qtype]
    b = np.frombuffer(rng.bytes(n * size), dtype=np.uint8).reshape(n, size).copy()
    jitter = rng.uniform(0.8, 1.25, n)                       # per block, so blocks differ in scale
    if qtype == "Q8_0":                                      # d, then 32 int8: value d * q
        b[:, 0:2] = _f16(SIGMA / 73.9 * jitter)
    elif qtype == "Q4_0":                                    # d, 16 bytes of nibbles: d * (q - 8)
        b[:, 0:2] = _f16(SIGMA / 4.61 * jitter)
    elif qtype == "Q5_0":                                    # d, 4 bytes of fifth bits, 16 of nibbles: d * (q - 16)
        b[:, 0:2] = _f16(SIGMA / 9.23 * jitter)
    elif qtype == "Q4_K":                                    # d, dmin, 12 bytes of 6-bit scales and mins, nibbles
        sc = rng.integers(16, 32, (n, 8))                    # value d * sc * q - dmin * m, dmin = 8 d
        m = np.rint(sc * 7.5 / 8).astype(np.int64)           # centres q's mean 7.5
        d = SIGMA / (23.5 * 4.61) * jitter
        b[:, 0:2], b[:, 2:4] = _f16(d), _f16(8 * d)
        b[:, 4:16] = _pack_k4_scales(sc, m)
    elif qtype == "Q6_K":                                    # ql, qh, 16 int8 scales, d: d * scale * (q - 32)
        b[:, 192:208] = rng.integers(4, 8, (n, 16)).astype(np.uint8)
        b[:, 208:210] = _f16(SIGMA / (5.5 * 18.5) * jitter)
    else:
        raise SpecserveError(f"no random blocks for {qtype}")
    return b


def _pack_k4_scales(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Q4_K's 12 bytes holding eight 6-bit scales and eight 6-bit mins (ggml's get_scale_min_k4, inverted)."""
    q = np.zeros((sc.shape[0], 12), dtype=np.int64)
    q[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    q[:, 4:8] = m[:, 0:4] | ((m[:, 4:8] >> 4) << 6)
    q[:, 8:12] = (sc[:, 4:8] & 0xF) | ((m[:, 4:8] & 0xF) << 4)
    return q.astype(np.uint8)


def _tensor_chunks(spec: TensorSpec, shape: Shape, rng: np.random.Generator):
    """A tensor's bytes, in chunks of whole rows."""
    if spec.qtype == "F32":
        if spec.name == "rope_freqs.weight":
            yield np.asarray(shape.rope_factors(), dtype=np.float32).tobytes()
        elif spec.name.endswith(".bias"):
            yield (rng.standard_normal(spec.dims[0]) * BIAS_SIGMA).astype(np.float32).tobytes()
        else:
            yield np.ones(spec.dims[0], dtype=np.float32).tobytes()
        return
    row, rows = spec.dims
    per, size = BLOCKS[spec.qtype]
    row_blocks = row // per
    step = max(1, CHUNK_BYTES // (row_blocks * size))
    for start in range(0, rows, step):
        yield random_blocks(spec.qtype, row_blocks * min(step, rows - start), rng).tobytes()


def tensor_bytes(spec: TensorSpec) -> int:
    if spec.qtype == "F32":
        return 4 * int(np.prod(spec.dims))
    per, size = BLOCKS[spec.qtype]
    if spec.dims[0] % per:
        raise AssertionError(f"{spec.name}: rows of {spec.dims[0]} do not split into {spec.qtype} blocks")
    return spec.dims[0] // per * size * spec.dims[1]


# ---------------------------------------------------------------- metadata

def _string(s: str) -> bytes:
    raw = s.encode("utf-8")
    return struct.pack("<Q", len(raw)) + raw


def _field(key: str, vtype: int, value) -> bytes:
    out = _string(key) + struct.pack("<I", vtype)
    if vtype == _STRING:
        return out + _string(value)
    if vtype == _ARRAY:
        etype, items = value
        out += struct.pack("<IQ", etype, len(items))
        if etype == _STRING:
            return out + b"".join(_string(x) for x in items)
        return out + np.asarray(items, dtype={_I32: "<i4", _F32: "<f4"}[etype]).tobytes()
    return out + struct.pack({_U32: "<I", _F32: "<f", _BOOL: "<?"}[vtype], value)


def model_fields(shape: Shape, quant: str, seed: int) -> list[bytes]:
    """The architecture's fields as llama.cpp's converter writes them for the real model."""
    a = shape.arch + "."
    fields = [_field("general.architecture", _STRING, shape.arch),
              _field("general.name", _STRING, f"random-weight {shape.name} ({quant}, seed {seed})"),
              _field("general.file_type", _U32, FILE_TYPES[quant]),
              _field("general.quantization_version", _U32, 2),
              _field(a + "context_length", _U32, shape.context),
              _field(a + "embedding_length", _U32, shape.hidden),
              _field(a + "block_count", _U32, shape.layers),
              _field(a + "feed_forward_length", _U32, shape.ffn),
              _field(a + "attention.head_count", _U32, shape.heads),
              _field(a + "attention.head_count_kv", _U32, shape.kv_heads),
              _field(a + "rope.freq_base", _F32, shape.rope_base),
              _field(a + "attention.layer_norm_rms_epsilon", _F32, shape.norm_eps),
              _field(a + "attention.key_length", _U32, shape.head_dim),
              _field(a + "attention.value_length", _U32, shape.head_dim)]
    if shape.arch != "gemma3":
        fields += [_field(a + "vocab_size", _U32, shape.vocab), _field(a + "rope.dimension_count", _U32, shape.head_dim)]
    if shape.sliding_window:
        fields.append(_field(a + "attention.sliding_window", _U32, shape.sliding_window))
    return fields


def tokenizer_fields(shape: Shape) -> list[bytes]:
    """The ``tokenizer.*`` fields of the shape's tokenizer model, its vocabulary padded to the shape's."""
    from specserve.models.gguf_file import GGUFFile
    from specserve.models.loader import resolve_model_path

    src = GGUFFile(resolve_model_path(shape.tokenizer), skip=("tokenizer.ggml.merges", "tokenizer.ggml.scores"))
    tokens = src.fields["tokenizer.ggml.tokens"]
    pad = shape.vocab - len(tokens)
    if pad < 0:
        raise SpecserveError(f"{shape.tokenizer}'s vocabulary ({len(tokens)}) is larger than {shape.name}'s ({shape.vocab})")
    out = []
    for key in src.field_spans:
        if not key.startswith("tokenizer.") or (pad and key in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type")):
            continue
        if pad and key == "tokenizer.ggml.scores":
            raise SpecserveError(f"{shape.tokenizer}'s vocabulary has scores: padding it is not supported")
        out.append(src.raw_field(key))                                   # copied byte for byte
    if pad:
        out.append(_field("tokenizer.ggml.tokens", _ARRAY, (_STRING, list(tokens) + [f"[PAD{i}]" for i in range(pad)])))
        types = list(src.fields["tokenizer.ggml.token_type"]) + [UNUSED_TOKEN] * pad
        out.append(_field("tokenizer.ggml.token_type", _ARRAY, (_I32, types)))
    return out


# ---------------------------------------------------------------- the file

def _align(n: int) -> int:
    return -(-n // ALIGNMENT) * ALIGNMENT


def write_gguf(path: str, fields: list[bytes], shape: Shape, plan: list[TensorSpec], seed: int) -> int:
    """Header, fields, tensor infos, then each tensor's bytes chunk by chunk; returns the file's size.
    Written to ``path``.partial and renamed when complete, so a stopped run leaves no half file."""
    offsets, at = [], 0
    for spec in plan:
        offsets.append(at)
        at = _align(at + tensor_bytes(spec))
    head = bytearray(b"GGUF" + struct.pack("<IQQ", VERSION, len(plan), len(fields)))
    for f in fields:
        head += f
    for spec, off in zip(plan, offsets):
        head += _string(spec.name) + struct.pack("<I", len(spec.dims)) + struct.pack(f"<{len(spec.dims)}Q", *spec.dims)
        head += struct.pack("<IQ", _qtype_id(spec.qtype), off)
    head += bytes(_align(len(head)) - len(head))
    tmp = Path(str(path) + ".partial")
    with open(tmp, "wb") as fh:
        fh.write(head)
        for i, (spec, off) in enumerate(zip(plan, offsets)):
            rng = np.random.default_rng([seed, i])
            written = 0
            for chunk in _tensor_chunks(spec, shape, rng):
                fh.write(chunk)
                written += len(chunk)
            assert written == tensor_bytes(spec), spec.name
            fh.write(bytes(_align(off + written) - off - written))
    os.replace(tmp, path)
    return len(head) + at


def _qtype_id(name: str) -> int:
    import gguf
    return int(gguf.GGMLQuantizationType[name])


def make_model(shape: Shape, quant: str, out: str, seed: int = 0) -> int:
    """Write ``out``: a random-weight GGUF of ``shape`` quantised as ``quant``; returns its size in bytes."""
    if quant not in FILE_TYPES:
        raise SpecserveError(f"unknown quantisation {quant!r}; choose from {', '.join(FILE_TYPES)}")
    parent = Path(out).resolve().parent
    if not parent.is_dir():
        raise SpecserveError(f"cannot write {out}: directory {parent} does not exist")
    plan = tensor_plan(shape, quant)
    return write_gguf(out, model_fields(shape, quant, seed) + tokenizer_fields(shape), shape, plan, seed)
