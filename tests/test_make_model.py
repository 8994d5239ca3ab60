"""``specserve make-model``: random-weight GGUF files in real models' shapes.

The block-type mix is checked against a file llama.cpp's quantizer wrote (the installed Gemma 3 270M
Q4_K_M: every one of its 236 tensors' names, shapes and types), the random blocks by dequantising
them with gguf-py, and written files by reading them back with gguf-py's own reader, loading them
into this project's runtime (greedy identity of a drafter with plain decoding) and, where
llama-cpp-python is installed, into llama.cpp.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace

import numpy as np
import pytest

from specserve.models.shapes import SHAPES, Shape, matrix_type, shape_named, tensor_plan, use_more_bits

TINY_LLAMA = Shape("tiny-llama", "llama", 49152 + 100, 256, 2, 4, 2, 64, 512, 500000.0, 1e-5, True, 4096,
                   "default", llama3_rope=(32.0, 1.0, 4.0, 8192))
TINY_QWEN = Shape("tiny-qwen", "qwen2", 49152 + 36, 256, 2, 4, 1, 64, 512, 1000000.0, 1e-6, False, 4096,
                  "default", qkv_bias=True)


def test_use_more_bits_picks_llama_cpps_layers():
    # 16 layers: the first and last eighth (0, 1, 14, 15) and every third from 2 on (4, 7, 10, 13)
    assert [i for i in range(16) if use_more_bits(i, 16)] == [0, 1, 4, 7, 10, 13, 14, 15]
    assert [i for i in range(8) if use_more_bits(i, 8)] == [0, 3, 6, 7]


def test_matrix_types_by_hand():
    # q4_k_m: ffn_down of a middle layer Q4_K, of a first layer Q6_K; a row of 1152 falls back to Q5_0 / Q8_0
    assert matrix_type("ffn_down", 5, 16, 8192, "q4_k_m", True) == "Q4_K"
    assert matrix_type("ffn_down", 0, 16, 8192, "q4_k_m", True) == "Q6_K"
    assert matrix_type("attn_q", 0, 26, 1152, "q4_k_m", True) == "Q5_0"
    assert matrix_type("attn_v", 0, 26, 1152, "q4_k_m", True) == "Q8_0"
    # the output matrix, or the tied embedding: Q6_K unless the file is q8_0
    assert matrix_type("output", 31, 32, 4096, "q4_0", False) == "Q6_K"
    assert matrix_type("token_embd", 0, 32, 4096, "q4_0", False) == "Q4_0"
    assert matrix_type("token_embd", 0, 16, 2048, "q4_0", True) == "Q6_K"
    assert matrix_type("token_embd", 0, 16, 2048, "q8_0", True) == "Q8_0"
    assert matrix_type("attn_q", 3, 16, 2048, "q8_0", True) == "Q8_0"


def test_shapes_and_their_errors():
    from specserve.errors import SpecserveError
    one_b = shape_named("llama3.2-1b")
    plan = tensor_plan(one_b, "q4_k_m")
    params = sum(int(np.prod(t.dims)) for t in plan)
    assert 1.23e9 < params < 1.24e9                        # Llama 3.2 1B: 1.236 B parameters, tied
    assert not any(t.name == "output.weight" for t in plan) and plan[1].name == "rope_freqs.weight"
    eight_b = sum(int(np.prod(t.dims)) for t in tensor_plan(SHAPES["llama3.1-8b"], "q4_k_m"))
    assert 8.02e9 < eight_b < 8.04e9                       # Llama 3.1 8B: 8.030 B
    three_b = sum(int(np.prod(t.dims)) for t in tensor_plan(SHAPES["qwen2.5-3b"], "q8_0"))
    assert 3.08e9 < three_b < 3.10e9                       # Qwen2.5 3B: 3.086 B
    gemma = sum(int(np.prod(t.dims)) for t in tensor_plan(SHAPES["gemma3-1b"], "q8_0"))
    assert 0.99e9 < gemma < 1.01e9                         # Gemma 3 1B: 1.000 B
    assert shape_named("llama3.2-1b", layers=2).layers == 2
    small = sum(int(np.prod(t.dims)) for t in tensor_plan(SHAPES["smollm2-135m"], "q8_0"))
    assert 0.134e9 < small < 0.136e9                       # SmolLM2-135M: 134.5 M
    draft = shape_named("smollm2-135m", vocab=128256)      # a draft with the 1B target's vocabulary
    assert draft.vocab == 128256 and draft.hidden == 576
    with pytest.raises(SpecserveError, match="--vocab must be >= 1"):
        shape_named("smollm2-135m", vocab=0)
    with pytest.raises(SpecserveError, match="unknown shape 'llama9'; choose from llama3.2-1b"):
        shape_named("llama9")
    with pytest.raises(SpecserveError, match="--layers must be >= 1"):
        shape_named("llama3.2-1b", layers=0)
    with pytest.raises(SpecserveError, match="unknown quantisation 'q3_k'"):
        tensor_plan(one_b, "q3_k")


def test_llama3_rope_factors():
    f = SHAPES["llama3.2-1b"].rope_factors()
    assert len(f) == 32 and f[0] == 1.0 and f[-1] == 32.0            # high frequencies kept, low ones / 32
    assert all(a <= b for a, b in zip(f, f[1:]))                     # smoothly in between


@pytest.mark.parametrize("qtype", ["Q4_0", "Q5_0", "Q8_0", "Q4_K", "Q6_K"])
def test_random_blocks_dequantise_to_the_intended_spread(qtype):
    import gguf

    from specserve.models.make import SIGMA, random_blocks
    b = random_blocks(qtype, 2048, np.random.default_rng(1))
    v = gguf.quants.dequantize(b.reshape(-1), gguf.GGMLQuantizationType[qtype])
    assert np.all(np.isfinite(v))
    assert abs(v.std() - SIGMA) < 0.1 * SIGMA and abs(v.mean()) < 0.15 * SIGMA
    again = random_blocks(qtype, 2048, np.random.default_rng(1))
    assert np.array_equal(b, again)


def test_cli_refuses_bad_requests_in_one_line(capsys, tmp_path):
    from specserve.cli import main
    assert main(["make-model", "--shape", "llama9", "--quant", "q4_0", "--out", str(tmp_path / "x.gguf")]) == 2
    assert main(["make-model", "--shape", "llama3.2-1b", "--quant", "q2", "--out", str(tmp_path / "x.gguf")]) == 2
    assert main(["make-model", "--shape", "llama3.2-1b", "--quant", "q4_0", "--out", str(tmp_path / "no" / "x.gguf")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("specserve: error: ") for line in err)
    assert "unknown shape" in err[0] and "unknown quantisation" in err[1] and "does not exist" in err[2]
    assert not list(tmp_path.iterdir())


# ---- files written (the tokenizer comes from an installed model: the full tier) ----------------------

@pytest.mark.slow
def test_the_mix_is_llama_cpps_on_a_file_its_quantizer_wrote():
    from specserve.models.gguf_file import GGUFFile
    from specserve.models.loader import resolve_model_path

    real = GGUFFile(resolve_model_path("gemma3-270m"), skip=("tokenizer.ggml.tokens", "tokenizer.ggml.merges",
                                                             "tokenizer.ggml.scores", "tokenizer.ggml.token_type"))
    shape = replace(SHAPES["gemma3-1b"], name="gemma3-270m", hidden=640, layers=18, ffn=2048)
    plan = {t.name: (t.qtype, t.dims) for t in tensor_plan(shape, "q4_k_m")}
    assert plan == {t.name: (t.tensor_type.name, t.shape) for t in real.tensors}
    assert len(plan) == 236


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
@pytest.mark.parametrize("shape,quant", [(TINY_LLAMA, "q4_k_m"), (TINY_QWEN, "q8_0"), (TINY_LLAMA, "q4_0")])
def test_written_file_reads_back_with_gguf_py(tmp_path, shape, quant):
    import gguf

    from specserve.models.make import make_model
    out = tmp_path / "m.gguf"
    size = make_model(shape, quant, str(out), seed=3)
    assert out.stat().st_size == size and not (tmp_path / "m.gguf.partial").exists()
    r = gguf.GGUFReader(str(out))
    plan = tensor_plan(shape, quant)
    assert [(t.name, t.tensor_type.name, tuple(int(d) for d in t.shape)) for t in r.tensors] == \
        [(t.name, t.qtype, t.dims) for t in plan]
    field = lambda k: r.fields[k].contents()                                             # noqa: E731
    assert field("general.architecture") == shape.arch and field(f"{shape.arch}.block_count") == shape.layers
    tokens = field("tokenizer.ggml.tokens")
    assert len(tokens) == shape.vocab and tokens[-1] == f"[PAD{shape.vocab - 49152 - 1}]"
    assert field("tokenizer.ggml.token_type")[-1] == 5 and len(field("tokenizer.ggml.merges")) == 48900
    norm = next(t for t in r.tensors if t.name == "output_norm.weight")
    assert np.all(norm.data == 1.0)
    make_model(shape, quant, str(tmp_path / "same.gguf"), seed=3)
    make_model(shape, quant, str(tmp_path / "other.gguf"), seed=4)
    assert _sha(out) == _sha(tmp_path / "same.gguf") != _sha(tmp_path / "other.gguf")


@pytest.mark.slow
@pytest.mark.parametrize("shape,quant", [(TINY_LLAMA, "q4_k_m"), (TINY_QWEN, "q4_0")])
def test_written_file_runs_and_speculation_is_exact(tmp_path, shape, quant):
    from specserve.llm import LLM
    from specserve.sampling import SamplingParams

    from specserve.models.make import make_model
    out, draft = tmp_path / "m.gguf", tmp_path / "draft.gguf"
    make_model(shape, quant, str(out), seed=0)
    make_model(replace(shape, layers=1), "q8_0", str(draft), seed=1)     # a draft of the same vocabulary
    drafters = {"none": {"drafter": "none"}, "ngram-tree": {"drafter": "ngram-tree"},
                "draft-model": {"drafter": "draft-model", "model": str(draft)}}
    llm = LLM(str(out), drafters=drafters, max_batch=1, max_len=512)
    ids = llm.encode("The quick brown fox jumps over the lazy dog. The quick brown fox", raw=True)
    runs = {name: llm.engine.generate([llm.request(ids, 48, SamplingParams(), name, k)])[0]
            for name, k in (("none", 0), ("ngram-tree", "auto"), ("draft-model", 3))}
    assert len(runs["none"].tokens) == 48
    assert runs["none"].tokens == runs["ngram-tree"].tokens == runs["draft-model"].tokens
    assert runs["draft-model"].stats.drafted_tokens > 0
    assert llm.target.config.vocab_size == shape.vocab
    if quant == "q4_k_m":     # layer 1 (llama.cpp's "more bits") has a Q6_K v: its QKV runs as mixed parts
        from specserve.models.native import Q4_K
        from specserve.models.native.packed import MIXED, PACKED
        layers = llm.target.model.layers
        assert layers[0].qkv.fmt == PACKED + Q4_K and layers[1].qkv.fmt == MIXED


@pytest.mark.slow
def test_llama_cpp_loads_a_written_file(tmp_path):
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python (the benchmark's peer) is not installed")
    from specserve.models.make import make_model
    out = tmp_path / "m.gguf"
    make_model(TINY_LLAMA, "q4_k_m", str(out), seed=0)
    m = llama_cpp.Llama(str(out), n_ctx=256, n_threads=2, verbose=False)
    assert m.n_vocab() == TINY_LLAMA.vocab
    toks = m.tokenize(b"The quick brown fox", add_bos=False)
    got = []
    for t in m.generate(toks, temp=0.0):
        got.append(t)
        if len(got) == 8:
            break
    assert len(got) == 8 and all(0 <= t < TINY_LLAMA.vocab for t in got)
