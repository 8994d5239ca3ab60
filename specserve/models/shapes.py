"""The shapes of models people serve, and how llama.cpp's quantizer types each of their tensors.

A ``Shape`` holds what a GGUF file of that model says about its size (the published configuration's
numbers: layers, widths, heads, vocabulary, RoPE), enough to write a file of random weights that
llama.cpp and this project load like the real one (``specserve.models.make``).  ``tensor_plan``
lists the file's tensors in llama.cpp's names, each with the block type llama.cpp's
``llama_tensor_get_type`` gives it under a file type:

- ``q8_0``: every matrix Q8_0.
- ``q4_0``: every matrix Q4_0, except the output matrix (or, when the output is tied to the token
  embedding, the embedding): Q6_K.
- ``q4_k_m``: Q4_K, except the output matrix (tied: the embedding) Q6_K, and ``attn_v`` and
  ``ffn_down`` Q6_K in the layers ``use_more_bits`` picks (the first and last eighth, and every
  third between).

A K-quant block spans 256 values of a row: a matrix whose rows are not a multiple of 256 falls back
as llama.cpp does (Q4_K -> Q5_0, Q6_K -> Q8_0).  Norms, biases and Llama 3's ``rope_freqs`` are F32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from specserve.errors import SpecserveError

QK_K = 256                                   # values per K-quant super-block
FILE_TYPES = {"q4_0": 2, "q8_0": 7, "q4_k_m": 15}      # GGUF's general.file_type (llama_ftype)
_FALLBACK = {"Q4_K": "Q5_0", "Q6_K": "Q8_0"}


@dataclass(frozen=True)
class Shape:
    name: str
    arch: str                    # GGUF general.architecture: llama, qwen2, gemma3
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    rope_base: float
    norm_eps: float
    tied: bool                   # the output matrix is the token embedding (no output.weight)
    context: int                 # the model's trained context length
    tokenizer: str               # the installed model whose tokenizer it carries, padded to ``vocab``
    llama3_rope: tuple[float, float, float, int] | None = None   # factor, low, high, original context
    qkv_bias: bool = False
    sliding_window: int = 0

    def rope_factors(self) -> list[float]:
        """Llama 3's per-frequency RoPE divisors (the ``rope_freqs`` tensor), as its converter writes them."""
        factor, low, high, original = self.llama3_rope
        out = []
        for i in range(0, self.head_dim, 2):
            wavelen = 2 * math.pi * self.rope_base ** (i / self.head_dim)
            if wavelen < original / high:
                out.append(1.0)
            elif wavelen > original / low:
                out.append(factor)
            else:
                smooth = (original / wavelen - low) / (high - low)
                out.append(1.0 / ((1 - smooth) / factor + smooth))
        return out


SHAPES = {s.name: s for s in (
    Shape("llama3.2-1b", "llama", 128256, 2048, 16, 32, 8, 64, 8192, 500000.0, 1e-5, True, 131072, "default",
          llama3_rope=(32.0, 1.0, 4.0, 8192)),
    Shape("qwen2.5-3b", "qwen2", 151936, 2048, 36, 16, 2, 128, 11008, 1000000.0, 1e-6, True, 32768, "default",
          qkv_bias=True),
    Shape("llama3.1-8b", "llama", 128256, 4096, 32, 32, 8, 128, 14336, 500000.0, 1e-5, False, 131072, "default",
          llama3_rope=(8.0, 1.0, 4.0, 8192)),
    # a draft model's shape (SmolLM2-135M): give it the target's vocabulary (``shape_named(vocab=...)``)
    Shape("smollm2-135m", "llama", 49152, 576, 30, 9, 3, 64, 1536, 100000.0, 1e-5, True, 8192, "default"),
    Shape("gemma3-1b", "gemma3", 262144, 1152, 26, 4, 1, 256, 6912, 1000000.0, 1e-6, True, 32768, "gemma3-270m",
          sliding_window=512),
)}


def shape_named(name: str, layers: int | None = None, vocab: int | None = None) -> Shape:
    """A shape by name, optionally with fewer (or more) layers or another vocabulary size (a draft
    model's shape given its target's vocabulary); a clear error for an unknown name."""
    if name not in SHAPES:
        raise SpecserveError(f"unknown shape {name!r}; choose from {', '.join(SHAPES)}")
    if layers is not None and layers < 1:
        raise SpecserveError("--layers must be >= 1")
    if vocab is not None and vocab < 1:
        raise SpecserveError("--vocab must be >= 1")
    shape = SHAPES[name]
    shape = replace(shape, layers=layers) if layers is not None else shape
    return replace(shape, vocab=vocab) if vocab is not None else shape


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dims: tuple[int, ...]        # GGUF order: the row (innermost) first
    qtype: str                   # gguf.GGMLQuantizationType's name: F32, Q4_0, Q4_K, ...


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's choice of layers that get more bits under the _M mixes."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def matrix_type(role: str, layer: int, layers: int, row: int, quant: str, tied: bool) -> str:
    """The block type llama.cpp's quantizer gives one matrix (``role``: output, token_embd, attn_v,
    ffn_down, or any other matrix) of a file of type ``quant``; ``row``: values per row."""
    if quant not in FILE_TYPES:
        raise SpecserveError(f"unknown quantisation {quant!r}; choose from {', '.join(FILE_TYPES)}")
    base = {"q4_0": "Q4_0", "q8_0": "Q8_0", "q4_k_m": "Q4_K"}[quant]
    if role == "output" or (role == "token_embd" and tied):
        if row % QK_K:
            return "Q8_0"
        return base if base == "Q8_0" else "Q6_K"
    qtype = base
    if quant == "q4_k_m" and role in ("attn_v", "ffn_down") and use_more_bits(layer, layers):
        qtype = "Q6_K"
    if qtype in _FALLBACK and row % QK_K:
        qtype = _FALLBACK[qtype]
    return qtype


def tensor_plan(shape: Shape, quant: str) -> list[TensorSpec]:
    """Every tensor of a ``shape`` file of type ``quant``, in llama.cpp's names and order."""
    h, q_out, kv_out = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim

    def mat(name: str, role: str, layer: int, row: int, rows: int) -> TensorSpec:
        return TensorSpec(name, (row, rows), matrix_type(role, layer, shape.layers, row, quant, shape.tied))

    out = [mat("token_embd.weight", "token_embd", 0, h, shape.vocab)]
    if shape.llama3_rope:
        out.append(TensorSpec("rope_freqs.weight", (shape.head_dim // 2,), "F32"))
    for i in range(shape.layers):
        b = f"blk.{i}."
        out += [TensorSpec(b + "attn_norm.weight", (h,), "F32"),
                mat(b + "attn_q.weight", "attn_q", i, h, q_out),
                mat(b + "attn_k.weight", "attn_k", i, h, kv_out),
                mat(b + "attn_v.weight", "attn_v", i, h, kv_out)]
        if shape.qkv_bias:
            out += [TensorSpec(b + f"attn_{x}.bias", (n,), "F32") for x, n in (("q", q_out), ("k", kv_out), ("v", kv_out))]
        if shape.arch == "gemma3":
            out += [TensorSpec(b + "attn_q_norm.weight", (shape.head_dim,), "F32"),
                    TensorSpec(b + "attn_k_norm.weight", (shape.head_dim,), "F32")]
        out.append(mat(b + "attn_output.weight", "attn_output", i, q_out, h))
        if shape.arch == "gemma3":
            out.append(TensorSpec(b + "post_attention_norm.weight", (h,), "F32"))
        out += [TensorSpec(b + "ffn_norm.weight", (h,), "F32"),
                mat(b + "ffn_gate.weight", "ffn_gate", i, h, shape.ffn),
                mat(b + "ffn_up.weight", "ffn_up", i, h, shape.ffn),
                mat(b + "ffn_down.weight", "ffn_down", i, shape.ffn, h)]
        if shape.arch == "gemma3":
            out.append(TensorSpec(b + "post_ffw_norm.weight", (h,), "F32"))
    out.append(TensorSpec("output_norm.weight", (h,), "F32"))
    if not shape.tied:
        out.append(mat("output.weight", "output", shape.layers - 1, h, shape.vocab))
    return out
