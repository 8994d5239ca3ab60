"""The loader's own GGUF reader against gguf-py's ``GGUFReader``: the same fields (long arrays it is
told to skip only counted), the same tensors byte for byte, typed and shaped the same way."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf import quants

from specserve.errors import SpecserveError
from specserve.models.gguf_file import GGUFFile, Skipped
from specserve.models.loader import _TOKENIZER_ARRAYS, load_model


def assert_same_as_gguf_py(path, skip=()) -> None:
    ours, ref = GGUFFile(str(path), skip=skip), gguf.GGUFReader(str(path))
    ref_fields = {k: f for k, f in ref.fields.items() if not k.startswith("GGUF.")}   # gguf-py's header pseudo-fields
    assert list(ours.fields) == list(ref_fields)
    for key, fld in ref_fields.items():
        value = ours.fields[key]
        if key in skip:
            assert isinstance(value, Skipped) and len(value) == len(fld.data), key
        elif isinstance(value, float):
            assert np.float32(value) == np.float32(fld.contents()) or value == fld.contents(), key
        else:
            assert value == fld.contents(), key
    assert [t.name for t in ours.tensors] == [t.name for t in ref.tensors]
    for a, b in zip(ours.tensors, ref.tensors):
        assert a.tensor_type == b.tensor_type and a.shape == tuple(int(d) for d in b.shape), a.name
        assert a.data.dtype == b.data.dtype and a.data.shape == b.data.shape, a.name
        assert np.array_equal(a.data.view(np.uint8), b.data.view(np.uint8)), a.name


def write_sample(path, alignment: int | None = None) -> None:
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), "llama")
    if alignment:
        w.add_custom_alignment(alignment)
    w.add_uint32("s.u32", 7)
    w.add_int32("s.i32", -3)
    w.add_uint64("s.u64", 1 << 40)
    w.add_int64("s.i64", -(1 << 40))
    w.add_float32("s.f32", 0.1)
    w.add_float64("s.f64", 0.1)
    w.add_bool("s.bool", True)
    w.add_uint8("s.u8", 255)
    w.add_int16("s.i16", -300)
    w.add_string("s.str", "héllo ✓")
    w.add_array("s.ints", [1, 2, 3])
    w.add_array("s.floats", [0.5, -1.25])
    w.add_array("s.strs", ["a", "", "ccc"])
    w.add_token_list([f"tok{i}" for i in range(50)] + ["✓"])
    w.add_token_scores([float(i) for i in range(51)])
    w.add_token_types([1] * 51)
    w.add_token_merges(["a b", "c d"])
    w.add_tensor("f32.weight", rng.standard_normal((3, 5)).astype(np.float32))
    w.add_tensor("f16.weight", rng.standard_normal((2, 7)).astype(np.float16))
    w.add_tensor("vec.weight", rng.standard_normal(9).astype(np.float32))
    for qtype in (gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_1):
        x = rng.standard_normal((4, 64)).astype(np.float32)
        w.add_tensor(f"{qtype.name}.weight", quants.quantize(x, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("alignment", [None, 64])
def test_fields_and_tensors_match_gguf_py(tmp_path, alignment):
    write_sample(tmp_path / "s.gguf", alignment)
    assert_same_as_gguf_py(tmp_path / "s.gguf")                         # everything decoded
    assert_same_as_gguf_py(tmp_path / "s.gguf", skip=_TOKENIZER_ARRAYS)  # the long arrays only counted


def test_bad_files_are_one_line_errors(tmp_path):
    write_sample(tmp_path / "s.gguf")
    data = (tmp_path / "s.gguf").read_bytes()
    (tmp_path / "magic.gguf").write_bytes(b"GGUX" + data[4:])
    (tmp_path / "cut.gguf").write_bytes(data[:200])                     # inside the fields
    (tmp_path / "short.gguf").write_bytes(data[:-8])                    # the last tensor's bytes missing
    with pytest.raises(ValueError, match="magic"):
        GGUFFile(str(tmp_path / "magic.gguf"))
    with pytest.raises(ValueError, match="truncated"):
        GGUFFile(str(tmp_path / "cut.gguf"))
    with pytest.raises(ValueError, match="past the end"):
        GGUFFile(str(tmp_path / "short.gguf"))
    for name in ("magic", "cut", "short"):
        with pytest.raises(SpecserveError, match="cannot read GGUF file"):
            load_model(str(tmp_path / f"{name}.gguf"))


@pytest.mark.slow
def test_default_model_file_matches_gguf_py():
    """The real file: 49,152 tokens and 48,900 merges skipped, 272 tensors compared.  (Gemma 3's file
    reads the same way; gguf-py alone takes about 30 s over it, so it is not repeated here.)"""
    from specserve.models.loader import default_model_path

    assert_same_as_gguf_py(default_model_path(), skip=_TOKENIZER_ARRAYS)


@pytest.mark.parametrize("alignment", [None, 64])
def test_a_copy_without_some_fields_keeps_everything_else(tmp_path, alignment):
    """tests/gguf_strip.py (the copy transformers reads in the real-model parity tests): the dropped
    fields are gone, the added one is there, every other field and every tensor is as before (gguf-py
    reads the copy too)."""
    from gguf_strip import strip_fields, u32_field

    write_sample(tmp_path / "s.gguf", alignment)
    drop = {"tokenizer.ggml.tokens", "tokenizer.ggml.merges", "s.str"}
    strip_fields(str(tmp_path / "s.gguf"), str(tmp_path / "c.gguf"), drop, [u32_field("llama.vocab_size", 51)])
    src, dst = GGUFFile(str(tmp_path / "s.gguf")), GGUFFile(str(tmp_path / "c.gguf"))
    assert dst.fields == {**{k: v for k, v in src.fields.items() if k not in drop}, "llama.vocab_size": 51}
    assert [(t.name, t.tensor_type, t.shape) for t in dst.tensors] == [(t.name, t.tensor_type, t.shape) for t in src.tensors]
    assert all(np.array_equal(a.data.view(np.uint8), b.data.view(np.uint8)) for a, b in zip(src.tensors, dst.tensors))
    assert_same_as_gguf_py(tmp_path / "c.gguf")
