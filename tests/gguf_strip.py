"""A copy of a GGUF file without some metadata fields, for tests that hand a real file to a slower
reader: gguf-py's ``GGUFReader`` (which transformers uses) decodes every element of the tokenizer's
arrays, about 25 s for Gemma 3's 262,144 tokens, twice per ``from_pretrained``.  The copy keeps every
other field and every tensor byte for byte, so the model read from it is the same model.

Layout (GGUF v2/v3): magic, u32 version, u64 tensor count, u64 field count, the fields, the tensor
infos (offsets relative to the data section), padding to ``general.alignment``, the data section.
"""

from __future__ import annotations

import struct

from specserve.models.gguf_file import DEFAULT_ALIGNMENT, GGUFFile

_U32 = 4


def _field_end(buf: memoryview, pos: int) -> int:
    """The offset just past the field (key, type, value) that starts at ``pos``."""
    (klen,) = struct.unpack_from("<Q", buf, pos)
    pos += 8 + klen
    (vtype,) = struct.unpack_from("<I", buf, pos)
    return _value_end(buf, pos + 4, vtype)


def _value_end(buf: memoryview, pos: int, vtype: int) -> int:
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    if vtype in sizes:
        return pos + sizes[vtype]
    if vtype == 8:                                              # string: u64 length + bytes
        (n,) = struct.unpack_from("<Q", buf, pos)
        return pos + 8 + n
    (etype,) = struct.unpack_from("<I", buf, pos)               # array: element type, count, elements
    (count,) = struct.unpack_from("<Q", buf, pos + 4)
    pos += 12
    if etype in sizes:
        return pos + count * sizes[etype]
    for _ in range(count):
        pos = _value_end(buf, pos, etype)
    return pos


def _key(buf: memoryview, pos: int) -> str:
    (klen,) = struct.unpack_from("<Q", buf, pos)
    return bytes(buf[pos + 8:pos + 8 + klen]).decode()


def u32_field(key: str, value: int) -> bytes:
    raw = key.encode()
    return struct.pack("<Q", len(raw)) + raw + struct.pack("<II", _U32, value)


def strip_fields(src: str, dst: str, drop: set[str], add: list[bytes] = ()) -> None:
    """Write ``src`` to ``dst`` without the fields named in ``drop`` and with the encoded fields ``add``."""
    meta = GGUFFile(src, skip=drop)
    buf = memoryview(meta._map)
    (n_tensors,) = struct.unpack_from("<Q", buf, 8)
    (n_fields,) = struct.unpack_from("<Q", buf, 16)
    pos, kept = 24, []
    for _ in range(n_fields):
        end = _field_end(buf, pos)
        if _key(buf, pos) not in drop:
            kept.append(bytes(buf[pos:end]))
        pos = end
    infos_start = pos
    for _ in range(n_tensors):                                   # name, n dims, dims, type, offset
        (nlen,) = struct.unpack_from("<Q", buf, pos)
        pos += 8 + nlen
        (ndim,) = struct.unpack_from("<I", buf, pos)
        pos += 4 + 8 * ndim + 4 + 8
    infos = bytes(buf[infos_start:pos])
    align = int(meta.fields.get("general.alignment", DEFAULT_ALIGNMENT))
    data_start = -(-pos // align) * align
    kept += list(add)
    head = bytes(buf[:8]) + struct.pack("<QQ", n_tensors, len(kept)) + b"".join(kept) + infos
    with open(dst, "wb") as f:
        f.write(head + b"\0" * (-len(head) % align))
        f.write(buf[data_start:])


def transformers_model(path: str, directory) -> "torch.nn.Module":
    """transformers' own GGUF loading (fp32, eval mode) of the model in ``path``, read from a copy in
    ``directory`` without the tokenizer's fields (the vocabulary's size given as ``<arch>.vocab_size``)."""
    import torch
    from transformers import AutoModelForCausalLM

    meta = GGUFFile(path, skip={"tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type",
                                "tokenizer.ggml.merges"})
    drop = {k for k in meta.fields if k.startswith("tokenizer.")}
    arch = meta.fields["general.architecture"]
    add = [] if f"{arch}.vocab_size" in meta.fields else [
        u32_field(f"{arch}.vocab_size", len(meta.fields["tokenizer.ggml.tokens"]))]
    strip_fields(path, str(directory / "model.gguf"), drop, add)
    return AutoModelForCausalLM.from_pretrained(str(directory), gguf_file="model.gguf", dtype=torch.float32).eval()
