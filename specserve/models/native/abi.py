"""The native library's interface as ctypes sees it: every exported function's signature, the two
structures ``ss_forward`` reads (``SsPass`` and its table of ``SsLayer``, mirrored field for field from
forward.cpp), the two ``ss_draft_layer`` reads (``SsDraftLayer`` and its ``SsDraftPart``s, from
draft_layer.cpp), and the check, when the library is loaded, that both sides agree.

The library states its version (``ABI_VERSION`` in simd.h), the sizes of its structures, every
field's name and offset, and the names of the parts it times a pass by; a library that differs in
any of them is refused before a pass runs, and ``ss_forward`` itself refuses a structure of another
version or size.
"""

from __future__ import annotations

import ctypes

from specserve.models.decoder import PARTS

ABI_VERSION = 13          # ABI_VERSION in simd.h
MAX_TREE_TOKENS = 256     # longest tree pass per row (MAX_TREE_TOKENS in attention.h)

_I64, _P, _F32, _I32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float, ctypes.c_int


class SsLayer(ctypes.Structure):
    """One decoder layer's weights and settings (``SsLayer`` in forward.cpp): pointers to rows of
    blocks (weights, with their formats) and to fp32 norms, biases and rotary tables (None: the
    layer has none); ``window`` its sliding window (0: none), ``act`` 0 silu, 1 gelu_tanh."""

    _fields_ = [("attn_norm", _P), ("qkv", _P), ("qkv_fmt", _I64), ("qkv_bias", _P), ("q_norm", _P),
                ("k_norm", _P), ("o", _P), ("o_fmt", _I64), ("ffn_norm", _P), ("gate_up", _P),
                ("gate_up_fmt", _I64), ("down", _P), ("down_fmt", _I64), ("post_attn_norm", _P),
                ("post_ffn_norm", _P), ("cos", _P), ("sin", _P), ("window", _I64), ("act", _I64)]


class SsPass(ctypes.Structure):
    """One whole pass (``SsPass`` in forward.cpp): its version and sizes, the model's sizes, the pass's
    index arrays and buffers, the cache, the embedding / final norm / LM head, the layer table, and
    where to add each part's seconds (None: no timing).  ``new`` fills in the version and sizes."""

    _fields_ = [("version", _I64), ("pass_size", _I64), ("layer_size", _I64),
                ("L", _I64), ("M", _I64), ("hid", _I64), ("inter", _I64), ("H", _I64), ("Hkv", _I64),
                ("D", _I64), ("R", _I64), ("C", _I64), ("B", _I64), ("V", _I64), ("n_logits", _I64),
                ("eps", _F32), ("scale", _F32), ("embed_scale", _F32),
                ("tokens", _P), ("rows", _P), ("start", _P), ("offsets", _P), ("seq_of", _P), ("pos", _P),
                ("parent", _P), ("logit_rows", _P),
                ("x", _P), ("hbuf", _P), ("qkv", _P), ("q", _P), ("att", _P), ("gu", _P), ("act", _P),
                ("kc", _P), ("vc", _P), ("kv", _I64),
                ("embed", _P), ("embed_fmt", _I64), ("norm", _P), ("head", _P), ("head_fmt", _I64),
                ("logits", _P), ("feats", _P), ("layers", ctypes.POINTER(SsLayer)),
                ("part_seconds", ctypes.POINTER(ctypes.c_double))]

    @classmethod
    def new(cls, **fields) -> "SsPass":
        return cls(version=ABI_VERSION, pass_size=ctypes.sizeof(cls), layer_size=ctypes.sizeof(SsLayer), **fields)


class SsDraftPart(ctypes.Structure):
    """One sequence's rows of a draft-layer call (``SsDraftPart`` in draft_layer.cpp): its key and value
    buffers [capacity, Hkv, D], its rows of the call, the slots they are written at, the slots of its
    real entries, and its mask [m, mask_stride] (bool; None: causal)."""

    _fields_ = [("k", _P), ("v", _P), ("capacity", _I64), ("row0", _I64), ("m", _I64), ("at", _I64),
                ("n_real", _I64), ("mask", _P), ("mask_stride", _I64)]


class SsDraftLayer(ctypes.Structure):
    """A learned drafter's EAGLE layer and one call's inputs (``SsDraftLayer`` in draft_layer.cpp):
    layout (0 eagle, 1 eagle3), sizes, weights (products with their formats, fp32 norms), inputs,
    rotary tables, parts and the output buffer.  ``new`` fills in the version and sizes."""

    _fields_ = [("version", _I64), ("layer_size", _I64), ("part_size", _I64), ("layout", _I64),
                ("M", _I64), ("hid", _I64), ("H", _I64), ("Hkv", _I64), ("D", _I64), ("inter", _I64), ("B", _I64),
                ("eps", _F32), ("scale", _F32),
                ("norm_e", _P), ("norm_g", _P), ("fc", _P), ("fc_fmt", _I64), ("attn_norm", _P),
                ("qkv", _P), ("qkv_fmt", _I64), ("o", _P), ("o_fmt", _I64), ("mlp_norm", _P),
                ("gate_up", _P), ("gate_up_fmt", _I64), ("down", _P), ("down_fmt", _I64),
                ("g", _P), ("emb", _P), ("pos", _P), ("cos", _P), ("sin", _P), ("positions", _I64),
                ("parts", ctypes.POINTER(SsDraftPart)), ("out", _P)]

    @classmethod
    def new(cls, **fields) -> "SsDraftLayer":
        return cls(version=ABI_VERSION, layer_size=ctypes.sizeof(cls), part_size=ctypes.sizeof(SsDraftPart), **fields)


# ss_draft_layer's status codes (0: the call ran).
DRAFT_LAYER_ERRORS = {1: "its version is not the library's", 2: "its structure sizes are not the library's",
                      3: "a position lies outside the rotary tables",
                      4: "a part's rows, slots or mask lie outside the call's or its buffers"}

# ss_forward's status codes (0: the pass ran).
FORWARD_ERRORS = {1: "its version is not the library's", 2: "its structure sizes are not the library's"}

# Every exported function Python calls: (argument types, result type).  (The library exports a few
# more that only its own sources call, declared in exports.h.)
SIGNATURES = {
    "ss_abi_version": ([], _I32),
    "ss_row_bytes": ([_I32, _I64], _I64),
    "ss_linear": ([_P, _I64, _I64, _P, _I32, _I64, _P, _P, _I32], None),
    "ss_embed": ([_P, _I64, _P, _I32, _I64, _P], None),
    "ss_rmsnorm": ([_P, _P, _I64, _I64, _F32, _P], None),
    "ss_rope_cache": ([_P, _P, _P, _P, _P, _P, _P, _P, _I64, _I64, _I64, _I64, _I64, _P, _P, _F32, _P, _P, _P, _I64],
                      None),
    "ss_attention": ([_P, _P, _P, _P, _P, _P, _P, _P, _I64, _I64, _I64, _I64, _I64, _F32, _I64, _P, _I64], None),
    "ss_attention_path_runs": ([_I32], _I32),
    "ss_attention_set_path": ([_I32], _I32),
    "ss_attention_path": ([], _I32),
    "ss_argmax_rows": ([_P, _I64, _I64, _I64, _P], None),
    "ss_mask_rows": ([_P, _I64, _I64, _P, _I64, _I64], None),
    "ss_move_slots": ([_P, _I64, _I64, _I64, _I64, _I64, _I64, _I64, _P, _P, _I64], None),
    "ss_greedy_verify": ([_P, _I64, _I64, _I64, _P, _P, _P, _P, _P, _P, _P], None),
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
    "ss_forward_abi": ([ctypes.POINTER(_I64)], None),
    "ss_forward_field": ([_I32, _I32, ctypes.POINTER(_I64)], ctypes.c_char_p),
    "ss_part_name": ([_I32], ctypes.c_char_p),
    "ss_forward": ([ctypes.POINTER(SsPass)], _I32),
    "ss_draft_layer_abi": ([ctypes.POINTER(_I64)], None),
    "ss_draft_layer_field": ([_I32, _I32, ctypes.POINTER(_I64)], ctypes.c_char_p),
    "ss_draft_layer": ([ctypes.POINTER(SsDraftLayer)], _I32),
}


def bind(lib: ctypes.CDLL, name: str) -> None:
    """Set every exported function's signature on ``lib`` (loaded from ``name``), after checking that
    its version, its structures' sizes and its parts are this module's."""
    lib.ss_abi_version.argtypes, lib.ss_abi_version.restype = [], _I32
    if lib.ss_abi_version() != ABI_VERSION:
        raise RuntimeError(f"stale native kernel library {name}")
    for fn_name, (args, res) in SIGNATURES.items():
        fn = getattr(lib, fn_name)
        fn.argtypes, fn.restype = args, res
    got = (_I64 * 4)()
    lib.ss_forward_abi(got)
    want = (ABI_VERSION, ctypes.sizeof(SsPass), ctypes.sizeof(SsLayer), len(PARTS))
    if tuple(got) != want:
        raise RuntimeError(f"native kernel library {name} and abi.py disagree on ss_forward's structures: "
                           f"(version, pass, layer, parts) {tuple(got)} there, {want} here")
    lib.ss_draft_layer_abi(got)
    want = (ABI_VERSION, ctypes.sizeof(SsDraftLayer), ctypes.sizeof(SsDraftPart))
    if tuple(got[:3]) != want:
        raise RuntimeError(f"native kernel library {name} and abi.py disagree on ss_draft_layer's structures: "
                           f"(version, layer, part) {tuple(got[:3])} there, {want} here")
    for fn, structs in ((lib.ss_forward_field, (SsPass, SsLayer)), (lib.ss_draft_layer_field, (SsDraftLayer, SsDraftPart))):
        for which, struct in enumerate(structs):
            check_fields(fn, which, struct, name)
    if part_names(lib) != PARTS:
        raise RuntimeError(f"native kernel library {name} times the parts {part_names(lib)}, not {PARTS}")


def check_fields(field_of, which: int, struct: type[ctypes.Structure], name: str) -> None:
    """Raise unless structure ``which`` of the library (``field_of(which, i, &offset)``: the name of
    its field i, null past the last) has exactly ``struct``'s fields, each at ctypes' offset: a field
    renamed, added, moved or two swapped on either side is caught, not only a change of size."""
    got, offset = {}, _I64()
    while (field := field_of(which, len(got), ctypes.byref(offset))) is not None:
        got[field.decode()] = offset.value
    want = {f[0]: getattr(struct, f[0]).offset for f in struct._fields_}
    if got != want:
        diff = sorted(set(got.items()) ^ set(want.items()))
        raise RuntimeError(f"native kernel library {name} and abi.py disagree on {struct.__name__}'s fields "
                           f"(name, offset), here or there: {diff}")


def part_names(lib: ctypes.CDLL) -> tuple[str, ...]:
    """The parts ``ss_forward`` times, in the order it adds their seconds."""
    names, i = [], 0
    while (name := lib.ss_part_name(i)) is not None:
        names.append(name.decode())
        i += 1
    return tuple(names)


def run_pass(lib: ctypes.CDLL, p: SsPass) -> None:
    """Run one whole pass, raising if the library refuses its structure."""
    status = lib.ss_forward(ctypes.byref(p))
    if status:
        raise RuntimeError(f"ss_forward refused the pass: {FORWARD_ERRORS.get(status, f'status {status}')}")


def run_draft_layer(lib: ctypes.CDLL, p: SsDraftLayer) -> None:
    """Run one draft-layer call, raising if the library refuses it (running nothing)."""
    status = lib.ss_draft_layer(ctypes.byref(p))
    if status:
        raise RuntimeError(f"ss_draft_layer refused the call: {DRAFT_LAYER_ERRORS.get(status, f'status {status}')}")
