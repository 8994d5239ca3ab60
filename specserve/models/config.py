"""Model configuration: one dataclass for every supported decoder architecture.

Supported: Llama 2/3 (including Llama 3 RoPE scaling), SmolLM/SmolLM2, Mistral, Qwen2 (bias on
q/k/v), Qwen3 (RMSNorm on q and k) and, from GGUF files, Gemma 3 (GELU-tanh MLP, norms before and
after attention and MLP, q/k norms, embeddings scaled by sqrt(hidden), sliding-window attention in
five layers of six with their own rotary base).  Anything else is refused at load time with the
reason.  Norm weights are the multipliers themselves (GGUF's Gemma files store 1 + w already).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specserve.errors import SpecserveError

SUPPORTED_HF_TYPES = ("llama", "mistral", "qwen2", "qwen3")
SUPPORTED_GGUF_ARCHS = ("llama", "qwen2", "qwen3", "gemma3")      # GGUF's names (Mistral files are "llama")
GEMMA3_SLIDING_PATTERN = 6      # every 6th layer attends globally, the others within the window
GEMMA3_LOCAL_THETA = 10000.0    # rotary base of the windowed layers (llama.cpp and transformers' default)


@dataclass(frozen=True)
class ModelConfig:
    arch: str                     # one of SUPPORTED_HF_TYPES
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None   # llama3 (Hugging Face), or freq_factors (GGUF rope_freqs)
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2: bias on q, k, v projections
    qk_norm: bool = False         # Qwen3: RMSNorm over each head of q and k
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    # Gemma 3
    post_norms: bool = False      # RMSNorm on the attention and MLP outputs before each residual add
    activation: str = "silu"      # MLP gate: silu, or gelu_tanh
    embed_scale: float = 1.0      # embeddings are multiplied by this (Gemma: sqrt(hidden), in fp32)
    sliding_window: int = 0       # windowed layers attend to the last this many positions (0: none)
    sliding_pattern: int = 0      # every n-th layer is global, the others windowed (0: all windowed)
    local_rope_theta: float | None = None   # rotary base of the windowed layers (None: rope_theta)

    def layer_window(self, i: int) -> int:
        """Positions layer i attends to (the query's own included), or 0 for all."""
        if not self.sliding_window or (self.sliding_pattern and (i + 1) % self.sliding_pattern == 0):
            return 0
        return self.sliding_window

    def layer_rope_theta(self, i: int) -> float:
        return self.local_rope_theta if self.layer_window(i) and self.local_rope_theta is not None else self.rope_theta

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise SpecserveError(
                f"num_attention_heads {self.num_heads} is not a multiple of num_key_value_heads {self.num_kv_heads}")
        if self.head_dim % 2:
            raise SpecserveError(f"head_dim {self.head_dim} must be even for rotary embeddings")
        if self.activation not in ("silu", "gelu_tanh"):
            raise SpecserveError(f"unknown MLP activation {self.activation!r}; supported: silu, gelu_tanh")

    @property
    def num_params(self) -> int:
        """Parameter count (tied embedding counted once)."""
        h, i, d = self.hidden_size, self.intermediate_size, self.head_dim
        attn = h * d * (self.num_heads * 2 + self.num_kv_heads * 2)
        per_layer = attn + 3 * h * i + 2 * h
        emb = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * per_layer + emb + h

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> "ModelConfig":
        """Build from a Hugging Face ``config.json`` dictionary; refuse unsupported architectures."""
        arch = cfg.get("model_type")
        if arch not in SUPPORTED_HF_TYPES:
            raise SpecserveError(
                f"unsupported architecture model_type={arch!r}; supported: {', '.join(SUPPORTED_HF_TYPES)}")
        try:
            heads = int(cfg["num_attention_heads"])
            hidden = int(cfg["hidden_size"])
            rope_scaling = cfg.get("rope_scaling")
            rope_theta = cfg.get("rope_theta")
            rope_params = cfg.get("rope_parameters")  # transformers >= 5 nests rope settings here
            if isinstance(rope_params, dict):
                rope_theta = rope_params.get("rope_theta", rope_theta)
                if rope_params.get("rope_type", "default") != "default":
                    rope_scaling = rope_params
            if rope_scaling is not None:
                kind = rope_scaling.get("rope_type", rope_scaling.get("type"))
                if kind == "default":
                    rope_scaling = None
                elif kind != "llama3":
                    raise SpecserveError(f"unsupported rope_scaling type {kind!r}; supported: llama3")
            sliding = cfg.get("sliding_window") if cfg.get("use_sliding_window", arch == "mistral") else None
            max_pos = int(cfg.get("max_position_embeddings", 4096))
            if sliding is not None and int(sliding) < max_pos:
                # Sliding-window attention equals full attention up to the window: cap the context there.
                max_pos = int(sliding)
            eos = cfg.get("eos_token_id")
            eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
            return cls(
                arch=arch,
                vocab_size=int(cfg["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(cfg["intermediate_size"]),
                num_layers=int(cfg["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
                head_dim=int(cfg.get("head_dim") or hidden // heads),
                max_position_embeddings=max_pos,
                rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                rope_theta=float(rope_theta if rope_theta is not None else 10000.0),
                rope_scaling=rope_scaling,
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                attention_bias=bool(cfg.get("attention_bias", arch == "qwen2")),
                qk_norm=arch == "qwen3",
                bos_token_id=cfg.get("bos_token_id"),
                eos_token_ids=eos_ids,
            )
        except KeyError as e:
            raise SpecserveError(f"config.json lacks required field {e.args[0]!r}") from None

    @classmethod
    def from_gguf(cls, fields: dict[str, Any], has_output_tensor: bool, rope_factors: list[float] | None = None,
                  has_qkv_bias: bool = False) -> "ModelConfig":
        """Build from GGUF metadata; ``general.architecture`` one of SUPPORTED_GGUF_ARCHS (Mistral files
        say ``llama``).  ``rope_factors``: the file's ``rope_freqs`` tensor (Llama 3.1 scaling)."""
        arch = fields.get("general.architecture")
        if arch not in SUPPORTED_GGUF_ARCHS:
            raise SpecserveError(f"unsupported GGUF architecture {arch!r}; supported: {', '.join(SUPPORTED_GGUF_ARCHS)}")
        p = arch + "."
        try:
            hidden = int(fields[p + "embedding_length"])
            heads = int(fields[p + "attention.head_count"])
            vocab = fields.get(p + "vocab_size")
            if vocab is None:
                vocab = len(fields["tokenizer.ggml.tokens"])
            eos = fields.get("tokenizer.ggml.eos_token_id")
            head_dim = fields.get(p + "attention.key_length", fields.get(p + "rope.dimension_count", hidden // heads))
            return cls(
                arch=arch,
                vocab_size=int(vocab),
                hidden_size=hidden,
                intermediate_size=int(fields[p + "feed_forward_length"]),
                num_layers=int(fields[p + "block_count"]),
                num_heads=heads,
                num_kv_heads=int(fields.get(p + "attention.head_count_kv", heads)),
                head_dim=int(head_dim),
                max_position_embeddings=int(fields.get(p + "context_length", 4096)),
                rms_norm_eps=float(fields.get(p + "attention.layer_norm_rms_epsilon", 1e-5)),
                rope_theta=float(fields.get(p + "rope.freq_base", 10000.0)),
                rope_scaling={"rope_type": "freq_factors", "factors": list(rope_factors)} if rope_factors else None,
                tie_word_embeddings=not has_output_tensor,
                attention_bias=has_qkv_bias,
                qk_norm=arch in ("qwen3", "gemma3"),
                bos_token_id=fields.get("tokenizer.ggml.bos_token_id"),
                eos_token_ids=(int(eos),) if eos is not None else (),
                **(_gemma3(fields, hidden) if arch == "gemma3" else {}),
            )
        except KeyError as e:
            raise SpecserveError(f"GGUF file lacks metadata key {e.args[0]!r}") from None


def _gemma3(fields: dict[str, Any], hidden: int) -> dict[str, Any]:
    """Gemma 3's fields beyond the Llama family's, as llama.cpp and transformers read its GGUF files."""
    import numpy as np

    scaling = fields.get("gemma3.rope.scaling.type")
    if scaling not in (None, "none") and float(fields.get("gemma3.rope.scaling.factor", 1.0)) != 1.0:
        raise SpecserveError(f"unsupported Gemma 3 rope scaling {scaling!r} (the 4B and larger models); "
                             "supported: none (Gemma 3 270M and 1B)")
    return dict(post_norms=True, activation="gelu_tanh", embed_scale=float(np.float32(hidden ** 0.5)),
                sliding_window=int(fields.get("gemma3.attention.sliding_window", 0)),
                sliding_pattern=GEMMA3_SLIDING_PATTERN, local_rope_theta=GEMMA3_LOCAL_THETA)
