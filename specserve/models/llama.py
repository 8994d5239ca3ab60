"""The Llama-family decoder: one short class per block, weights given as a Hugging Face state dict.

The model knows nothing of speculation.  ``Transformer.forward`` feeds T new tokens per row,
writes their keys and values into the cache at the positions it is given, and returns logits
(and, on request, hidden states).  Which cache entries are valid is the caller's business.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from specserve.models.config import ModelConfig
from specserve.models.kv_cache import KVCache
from specserve.models.layers import (KEY_BLOCK, QUERY_BLOCK, Linear, RMSNorm, apply_rope,
                                     invariant_attention, invariant_attention_bias, rope_inv_freq,
                                     rope_tables, sdpa_attention)


@dataclass
class ForwardOutput:
    logits: Tensor                                  # [B, T, V] (or [B, 1, V] with last_only)
    hidden: dict[int, Tensor] = field(default_factory=dict)  # layer -> [B, T, hidden]


@dataclass
class _Step:
    """What every layer of one forward pass shares."""
    rows: slice | Tensor          # cache rows: a slice when contiguous, else an index tensor [B]
    positions: Tensor             # [B, T] absolute positions of the new tokens
    s_used: int                   # keys attended over (positions [0, s_used))
    cos: Tensor                   # [B, 1, T, D]
    sin: Tensor                   # [B, 1, T, D]
    mask: Tensor | None           # sdpa: [B, 1, T, S] bool
    bias: Tensor | None           # invariant: see invariant_attention_bias


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, sd: dict[str, Tensor], prefix: str, kernel: str):
        super().__init__()
        self.h, self.hkv, self.d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        names = ("q_proj", "k_proj", "v_proj")
        w = torch.cat([sd[f"{prefix}.{n}.weight"] for n in names])            # fused QKV
        b = torch.cat([sd[f"{prefix}.{n}.bias"] for n in names]) if cfg.attention_bias else None
        self.qkv = Linear(w, b, kernel)
        self.o = Linear(sd[f"{prefix}.o_proj.weight"], None, kernel)
        self.q_norm = RMSNorm(sd[f"{prefix}.q_norm.weight"], cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(sd[f"{prefix}.k_norm.weight"], cfg.rms_norm_eps) if cfg.qk_norm else None

    def forward(self, x: Tensor, step: _Step, k_cache: Tensor, v_cache: Tensor) -> Tensor:
        bsz, t, _ = x.shape
        qkv = self.qkv(x)
        q, k, v = qkv.split([self.h * self.d, self.hkv * self.d, self.hkv * self.d], dim=-1)
        q = q.view(bsz, t, self.h, self.d).transpose(1, 2)                     # [B, H, T, D]
        k = k.view(bsz, t, self.hkv, self.d).transpose(1, 2)                   # [B, Hkv, T, D]
        v = v.view(bsz, t, self.hkv, self.d).transpose(1, 2)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q = apply_rope(q, step.cos, step.sin).to(x.dtype)
        k = apply_rope(k, step.cos, step.sin).to(x.dtype)
        # write the new keys/values at their absolute positions; rows index the cache slots
        kc, vc = k_cache[step.rows], v_cache[step.rows]                        # views when rows is a slice
        if isinstance(step.rows, slice):
            b_idx = torch.arange(bsz, device=x.device)[:, None]
            kc[b_idx, :, step.positions] = k.transpose(1, 2)                   # [B, T, Hkv, D]
            vc[b_idx, :, step.positions] = v.transpose(1, 2)
            keys, values = kc[:, :, :step.s_used], vc[:, :, :step.s_used]
        else:
            r_idx = step.rows[:, None]
            k_cache[r_idx, :, step.positions] = k.transpose(1, 2)
            v_cache[r_idx, :, step.positions] = v.transpose(1, 2)
            keys, values = k_cache[step.rows, :, :step.s_used], v_cache[step.rows, :, :step.s_used]
        if step.bias is not None:
            out = invariant_attention(q, keys, values, step.bias)
        else:
            out = sdpa_attention(q, keys, values, step.mask)
        return self.o(out.transpose(1, 2).reshape(bsz, t, self.h * self.d))


class FeedForward(nn.Module):
    def __init__(self, sd: dict[str, Tensor], prefix: str, kernel: str):
        super().__init__()
        gate, up = sd[f"{prefix}.gate_proj.weight"], sd[f"{prefix}.up_proj.weight"]
        self.inter = gate.shape[0]
        self.gate_up = Linear(torch.cat([gate, up]), None, kernel)            # fused gate/up
        self.down = Linear(sd[f"{prefix}.down_proj.weight"], None, kernel)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate_up(x).split(self.inter, dim=-1)
        return self.down(torch.nn.functional.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, sd: dict[str, Tensor], i: int, kernel: str):
        super().__init__()
        p = f"model.layers.{i}"
        self.attn_norm = RMSNorm(sd[f"{p}.input_layernorm.weight"], cfg.rms_norm_eps)
        self.attn = Attention(cfg, sd, f"{p}.self_attn", kernel)
        self.ffn_norm = RMSNorm(sd[f"{p}.post_attention_layernorm.weight"], cfg.rms_norm_eps)
        self.ffn = FeedForward(sd, f"{p}.mlp", kernel)

    def forward(self, x: Tensor, step: _Step, k_cache: Tensor, v_cache: Tensor) -> Tensor:
        x = x + self.attn(self.attn_norm(x), step, k_cache, v_cache)
        return x + self.ffn(self.ffn_norm(x))


class Transformer(nn.Module):
    """A Llama-family decoder.  ``sd`` uses Hugging Face parameter names."""

    def __init__(self, cfg: ModelConfig, sd: dict[str, Tensor], kernel: str = "torch",
                 attention: str = "sdpa"):
        super().__init__()
        self.config, self.kernel, self.attention = cfg, kernel, attention
        self.embed = sd["model.embed_tokens.weight"]                            # [V, hidden]
        self.layers = nn.ModuleList(Block(cfg, sd, i, kernel) for i in range(cfg.num_layers))
        self.norm = RMSNorm(sd["model.norm.weight"], cfg.rms_norm_eps)
        head = self.embed if cfg.tie_word_embeddings else sd["lm_head.weight"]
        self.lm_head = Linear(head, None, kernel)
        inv = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
        self.cos, self.sin = rope_tables(inv, cfg.max_position_embeddings + 2 * KEY_BLOCK)

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype

    @property
    def device(self) -> torch.device:
        return self.embed.device

    def new_cache(self, rows: int, max_len: int, slack: int = 64) -> KVCache:
        """A cache of ``rows`` slots holding up to ``max_len`` positions each."""
        cfg = self.config
        return KVCache(cfg.num_layers, rows, cfg.num_kv_heads, max_len, cfg.head_dim,
                       self.dtype, self.device, block=KEY_BLOCK, slack=slack)

    @torch.inference_mode()
    def forward(self, tokens: Tensor, cache: KVCache, rows: list[int], start: list[int],
                last_only: bool = False, hidden_layers: tuple[int, ...] = ()) -> ForwardOutput:
        """Feed ``tokens`` [B, T]; row b's tokens go to cache row ``rows[b]`` at positions
        ``start[b] .. start[b]+T-1`` and attend to every cached position up to their own.

        last_only: return logits for the last position only ([B, 1, V]).
        hidden_layers: layer indices whose output to return (``num_layers`` = after final norm).
        """
        bsz, t = tokens.shape
        dev = tokens.device
        start_t = torch.tensor(start, dtype=torch.long, device=dev)
        positions = start_t[:, None] + torch.arange(t, device=dev)[None]       # [B, T]
        s_used = max(start) + t
        if self.attention == "invariant" and t <= QUERY_BLOCK:
            s_used = -(-s_used // KEY_BLOCK) * KEY_BLOCK
            q_pos = start_t[:, None] + torch.arange(QUERY_BLOCK, device=dev)[None]
            bias = invariant_attention_bias(q_pos, self.config.num_heads // self.config.num_kv_heads,
                                            s_used, self.dtype)
            mask = None
        else:
            bias = None
            mask = (torch.arange(s_used, device=dev)[None, None, :] <= positions[:, :, None])[:, None]
        if s_used > cache.capacity:
            raise ValueError(f"positions up to {s_used} exceed cache capacity {cache.capacity}")
        lo = rows[0]
        contiguous = rows == list(range(lo, lo + bsz))
        row_sel = slice(lo, lo + bsz) if contiguous else torch.tensor(rows, device=dev)
        cos = self.cos.to(dev)[positions].unsqueeze(1)
        sin = self.sin.to(dev)[positions].unsqueeze(1)
        step = _Step(row_sel, positions, s_used, cos, sin, mask, bias)

        x = self.embed[tokens]                                                  # [B, T, hidden]
        hidden: dict[int, Tensor] = {}
        for i, layer in enumerate(self.layers):
            if i in hidden_layers:
                hidden[i] = x
            x = layer(x, step, cache.k[i], cache.v[i])
        x = self.norm(x)
        if self.config.num_layers in hidden_layers:
            hidden[self.config.num_layers] = x
        if last_only:
            x = x[:, -1:]
        return ForwardOutput(logits=self.lm_head(x).float(), hidden=hidden)
