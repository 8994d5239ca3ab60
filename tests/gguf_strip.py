"""A copy of a GGUF file without some metadata fields, for tests that hand a real file to a slower
reader: gguf-py's ``GGUFReader`` (which transformers uses) decodes every element of the tokenizer's
arrays, about 25 s for Gemma 3's 262,144 tokens, twice per ``from_pretrained``.  The copy keeps every
other field and every tensor byte for byte, so the model read from it is the same model.

The layout is ``GGUFFile``'s (``specserve/models/gguf_file.py``): the header, the fields, the tensor
infos (offsets relative to the data section), padding to ``general.alignment``, the data section;
the copy takes each kept part's bytes from the spans the reader recorded.
"""

from __future__ import annotations

import struct

from specserve.models.gguf_file import DEFAULT_ALIGNMENT, GGUFFile
from specserve.models.loader import _TOKENIZER_ARRAYS

_U32 = 4


def u32_field(key: str, value: int) -> bytes:
    raw = key.encode()
    return struct.pack("<Q", len(raw)) + raw + struct.pack("<II", _U32, value)


def strip_fields(src: str, dst: str, drop: set[str], add: list[bytes] = ()) -> None:
    """Write ``src`` to ``dst`` without the fields named in ``drop`` and with the encoded fields ``add``."""
    meta = GGUFFile(src, skip=drop)
    buf = meta._buf
    kept = [bytes(buf[a:b]) for key, (a, b) in meta.field_spans.items() if key not in drop] + list(add)
    infos = bytes(buf[meta.infos_span[0]:meta.infos_span[1]])
    align = int(meta.fields.get("general.alignment", DEFAULT_ALIGNMENT))
    head = bytes(buf[:8]) + struct.pack("<QQ", len(meta.tensors), len(kept)) + b"".join(kept) + infos
    with open(dst, "wb") as f:
        f.write(head + b"\0" * (-len(head) % align))
        f.write(buf[meta.data_start:])


def transformers_model(path: str, directory) -> "torch.nn.Module":
    """transformers' own GGUF loading (fp32, eval mode) of the model in ``path``, read from a copy in
    ``directory`` without the tokenizer's fields (the vocabulary's size given as ``<arch>.vocab_size``)."""
    import torch
    from transformers import AutoModelForCausalLM

    meta = GGUFFile(path, skip=_TOKENIZER_ARRAYS)
    drop = {k for k in meta.fields if k.startswith("tokenizer.")}
    arch = meta.fields["general.architecture"]
    add = [] if f"{arch}.vocab_size" in meta.fields else [
        u32_field(f"{arch}.vocab_size", len(meta.fields["tokenizer.ggml.tokens"]))]
    strip_fields(path, str(directory / "model.gguf"), drop, add)
    return AutoModelForCausalLM.from_pretrained(str(directory), gguf_file="model.gguf", dtype=torch.float32).eval()
