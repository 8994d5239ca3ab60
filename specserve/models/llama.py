"""The Llama-family decoder on torch ops: one short class per block, weights given as a Hugging
Face state dict.  It implements the decoder protocol (``specserve.models.decoder``): a pass feeds
T tokens per row, chain or tree, writes their keys and values at the cache slots the layout gives,
and returns logits (and, on request, features).  Which cache entries are valid is the caller's
business.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor, nn

from specserve.models.config import ModelConfig
from specserve.models.decoder import (DraftLayerSpec, ForwardOutput, Layout, PartTimer, ancestor_mask,
                                      check_parents, logit_rows, tree_depths)
from specserve.models.kv_cache import KVCache
from specserve.models.layers import (KEY_BLOCK, QUERY_BLOCK, VIRTUAL_MAX_TOKENS, Linear, RMSNorm, apply_rope,
                                     invariant_attention, invariant_attention_bias, rope_tables_by_base,
                                     sdpa_attention, virtual_key_slots)

SOLO_TOKENS = 64      # a ragged pass's sequences longer than this (prompt chunks) run unpadded, alone


@dataclass
class _Step:
    """What every layer of one forward pass shares."""
    rows: slice | Tensor          # cache rows: a slice when contiguous, else an index tensor [B]
    slots: Tensor                 # [B, T] cache slots the new tokens are written to
    s_used: int                   # keys attended over (slots [0, s_used))
    cos: Tensor                   # [B, 1, T, D] at the rotary positions
    sin: Tensor                   # [B, 1, T, D]
    mask: Tensor | None           # sdpa: [B, 1, T, S] bool
    bias: Tensor | None           # invariant: see invariant_attention_bias
    virtual: Tensor | None = None  # invariant, one virtual row per token: [B, T, S'] key slots


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
        self.core = AttentionCore(self.hkv)

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
        return self.o(self.core(q, k, v, step, k_cache, v_cache).transpose(1, 2).reshape(bsz, t, self.h * self.d))


class AttentionCore(nn.Module):
    """The cache write and the attention itself (its own module so that a timer hook sees it)."""

    def __init__(self, kv_heads: int):
        super().__init__()
        self.hkv = kv_heads

    def forward(self, q: Tensor, k: Tensor, v: Tensor, step: _Step, k_cache: Tensor, v_cache: Tensor) -> Tensor:
        """q: [B, H, T, D]; k, v: [B, Hkv, T, D] (rotated) -> [B, H, T, D]."""
        bsz = q.shape[0]
        # write the new keys/values at their cache slots; rows index the cache rows
        kc, vc = k_cache[step.rows], v_cache[step.rows]                        # views when rows is a slice
        if isinstance(step.rows, slice):
            b_idx = torch.arange(bsz, device=q.device)[:, None]
            kc[b_idx, :, step.slots] = k.transpose(1, 2)                       # [B, T, Hkv, D]
            vc[b_idx, :, step.slots] = v.transpose(1, 2)
        else:
            r_idx = step.rows[:, None]
            k_cache[r_idx, :, step.slots] = k.transpose(1, 2)
            v_cache[r_idx, :, step.slots] = v.transpose(1, 2)
            kc, vc = k_cache[step.rows], v_cache[step.rows]
        if step.virtual is not None:
            return self._virtual_rows(q, kc, vc, step)
        if step.bias is not None:
            return invariant_attention(q, kc[:, :, :step.s_used], vc[:, :, :step.s_used], step.bias)
        return sdpa_attention(q, kc[:, :, :step.s_used], vc[:, :, :step.s_used], step.mask)

    def _virtual_rows(self, q: Tensor, kc: Tensor, vc: Tensor, step: _Step) -> Tensor:
        """Invariant attention with every token as a one-query row over its own keys in virtual
        order (prefix, then its path): exactly a decoding pass of that token.  q: [B, H, T, D];
        kc, vc: [B, Hkv, C, D] -> [B, H, T, D]."""
        bsz, h, t, d = q.shape
        idx = step.virtual                                                     # [B, T, S']
        b_idx = torch.arange(bsz, device=q.device)[:, None, None]
        keys = kc[b_idx, :, idx].permute(0, 1, 3, 2, 4).reshape(bsz * t, self.hkv, idx.shape[-1], d)
        values = vc[b_idx, :, idx].permute(0, 1, 3, 2, 4).reshape(bsz * t, self.hkv, idx.shape[-1], d)
        qv = q.transpose(1, 2).reshape(bsz * t, h, 1, d)
        out = invariant_attention(qv, keys, values, step.bias)                # [B*T, H, 1, D]
        return out.view(bsz, t, h, d).transpose(1, 2)


class FeedForward(nn.Module):
    def __init__(self, sd: dict[str, Tensor], prefix: str, kernel: str, gelu: bool = False):
        super().__init__()
        gate, up = sd[f"{prefix}.gate_proj.weight"], sd[f"{prefix}.up_proj.weight"]
        self.inter, self.gelu = gate.shape[0], gelu
        self.gate_up = Linear(torch.cat([gate, up]), None, kernel)            # fused gate/up
        self.down = Linear(sd[f"{prefix}.down_proj.weight"], None, kernel)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate_up(x).split(self.inter, dim=-1)
        act = (torch.nn.functional.gelu(gate, approximate="tanh") if self.gelu
               else torch.nn.functional.silu(gate))
        return self.down(act * up)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, sd: dict[str, Tensor], i: int, kernel: str):
        super().__init__()
        p = f"model.layers.{i}"
        eps = cfg.rms_norm_eps
        self.attn_norm = RMSNorm(sd[f"{p}.input_layernorm.weight"], eps)
        self.attn = Attention(cfg, sd, f"{p}.self_attn", kernel)
        self.post_attn_norm = self.post_ffn_norm = None
        if cfg.post_norms:        # Gemma 3: norms after attention and MLP as well
            self.post_attn_norm = RMSNorm(sd[f"{p}.post_attention_layernorm.weight"], eps)
            self.ffn_norm = RMSNorm(sd[f"{p}.pre_feedforward_layernorm.weight"], eps)
            self.post_ffn_norm = RMSNorm(sd[f"{p}.post_feedforward_layernorm.weight"], eps)
        else:
            self.ffn_norm = RMSNorm(sd[f"{p}.post_attention_layernorm.weight"], eps)
        self.ffn = FeedForward(sd, f"{p}.mlp", kernel, gelu=cfg.activation == "gelu_tanh")
        self.window = cfg.layer_window(i)                # 0: attends to every earlier position
        self.theta = cfg.layer_rope_theta(i)

    def forward(self, x: Tensor, step: _Step, k_cache: Tensor, v_cache: Tensor) -> Tensor:
        h = self.attn(self.attn_norm(x), step, k_cache, v_cache)
        x = x + (self.post_attn_norm(h) if self.post_attn_norm is not None else h)
        f = self.ffn(self.ffn_norm(x))
        return x + (self.post_ffn_norm(f) if self.post_ffn_norm is not None else f)


class Transformer(nn.Module):
    """A Llama-family decoder.  ``sd`` uses Hugging Face parameter names."""

    def __init__(self, cfg: ModelConfig, sd: dict[str, Tensor], kernel: str = "torch",
                 attention: str = "sdpa"):
        super().__init__()
        self.config, self.kernel, self.attention = cfg, kernel, attention
        # fbgemm rows are invariant; invariant attention covers a sequence's run of up to
        # VIRTUAL_MAX_TOKENS, and a ragged pass pads runs of up to SOLO_TOKENS together
        self.invariant_tokens = SOLO_TOKENS if kernel == "fbgemm" and attention == "invariant" else 0
        self.embed = sd["model.embed_tokens.weight"]                            # [V, hidden]
        self.layers = nn.ModuleList(Block(cfg, sd, i, kernel) for i in range(cfg.num_layers))
        self.norm = RMSNorm(sd["model.norm.weight"], cfg.rms_norm_eps)
        head = self.embed if cfg.tie_word_embeddings else sd["lm_head.weight"]
        self.lm_head = Linear(head, None, kernel)
        self._head_weight = head                                                # rows for weight_rows
        if attention == "invariant" and any(b.window for b in self.layers):
            raise ValueError("attention=invariant has no sliding-window layers (Gemma 3): use kernels=native, "
                             "or attention=sdpa")
        self.rope = rope_tables_by_base(cfg, cfg.max_position_embeddings + 2 * KEY_BLOCK)  # per rotary base

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

    def weight_rows(self, which: str, ids: Tensor) -> Tensor:
        w = {"embed": self.embed, "lm_head": self._head_weight}[which]
        return w[ids.to(w.device)].float()

    def weight_bytes(self) -> int:
        """Bytes of weights a decoding pass reads: fp16 for fbgemm, the model dtype otherwise."""
        per = 2 if self.kernel == "fbgemm" else torch.empty(0, dtype=self.dtype).element_size()
        return self.config.num_params * per

    def thread_choices(self) -> tuple[int, ...]:
        """None: torch's GEMMs may round differently with another thread count."""
        return ()

    def set_threads(self, n: int) -> int:
        raise ValueError("the torch runtimes keep torch's thread count (their numerics may depend on it)")

    def release_threads(self) -> bool:
        """Nothing to release that torch would let go of: False."""
        return False

    def set_timer(self, timer: PartTimer | None) -> None:
        """Time later passes by part, through forward hooks on the modules (None: remove them)."""
        for handle in getattr(self, "_timer_hooks", []):
            handle.remove()
        self._timer_hooks = []
        if timer is None:
            return
        starts: dict[int, float] = {}

        def add(module, part):
            def pre(mod, args):
                starts[id(mod)] = time.perf_counter()

            def post(mod, args, out):
                timer.seconds[part] += time.perf_counter() - starts.pop(id(mod))
            self._timer_hooks += [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]

        for block in self.layers:
            for module, part in ((block.attn.qkv, "qkv"), (block.attn.o, "o"), (block.ffn.gate_up, "gate_up"),
                                 (block.ffn.down, "down"), (block.attn_norm, "norms+activation"),
                                 (block.ffn_norm, "norms+activation"), (block.attn.core, "attention")):
                add(module, part)
        add(self.lm_head, "lm_head")
        add(self.norm, "norms+activation")

    def layer_subset(self, keep: list[int]) -> "Transformer":
        """A decoder that runs only layers ``keep`` (in order) of this one, sharing every weight."""
        view = copy.copy(self)
        view._modules = dict(self._modules)
        view._modules["layers"] = nn.ModuleList([self.layers[i] for i in keep])
        view.config = dataclasses.replace(self.config, num_layers=len(keep))
        return view

    def matmul(self, weight: Tensor, bias: Tensor | None = None) -> Callable[[Tensor], Tensor]:
        """y = x W^T (+ b) in float32 torch on the CPU (see the protocol): weight [out, in], bias [out]."""
        w = weight.detach().to("cpu", torch.float32)
        b = bias.detach().to("cpu", torch.float32) if bias is not None else None

        def apply(x: Tensor) -> Tensor:
            y = x.to("cpu", torch.float32) @ w.T                                 # [M, out]
            return y + b if b is not None else y
        return apply

    def draft_layer(self, spec: DraftLayerSpec) -> None:
        """None: the torch runtimes run a drafter's layer op by op (see the protocol)."""

    @torch.inference_mode()
    def forward(self, tokens: Tensor, cache: KVCache, rows: list[int], start: list[int], *,
                lengths: list[int] | None = None, parents: Tensor | None = None, last_only: bool = False,
                features: tuple[int, ...] = (), logits_for: list[int] | None = None) -> ForwardOutput:
        """One pass (layout: ``specserve.models.decoder``).  A ragged pass is run padded to its
        longest sequence (pads continue a chain or are roots of their own; their cache writes land
        past the sequence and are dead), and its outputs are returned flat; a sequence longer than
        ``SOLO_TOKENS`` (a prompt chunk) runs as a pass of its own, so nothing is padded to it."""
        pick = logit_rows(lengths, last_only, logits_for)
        if lengths is None:
            return self._forward(tokens, cache, rows, start, parents, last_only, features)
        lay = Layout.of(tokens, lengths, parents)
        hidden, feats = self._ragged_hidden(tokens, lay, cache, rows, start, features)
        if pick is not None:
            hidden = hidden[torch.as_tensor(pick, dtype=torch.long, device=hidden.device)]
        return ForwardOutput(self.lm_head(hidden.to(self.dtype)).float(), feats)

    def _ragged_hidden(self, tokens: Tensor, lay: Layout, cache: KVCache, rows: list[int], start: list[int],
                       features: tuple[int, ...]) -> tuple[Tensor, dict[int, Tensor]]:
        """A ragged pass's final normed hidden states [N, hidden] and features [N, hidden], run as
        padded groups: each sequence longer than ``SOLO_TOKENS`` alone, the others together."""
        groups = [[b] for b, n in enumerate(lay.lengths) if n > SOLO_TOKENS]
        rest = [b for b, n in enumerate(lay.lengths) if n <= SOLO_TOKENS]
        groups += [rest] if rest else []
        hidden = torch.empty(len(tokens), self.config.hidden_size, device=tokens.device)
        feats: dict[int, Tensor] = {}
        for group in groups:
            flat, dense, out = self._padded(tokens, lay, group, cache, rows, start, features)
            hidden[flat] = out.logits.reshape(-1, out.logits.shape[-1])[dense].to(hidden.dtype)
            for k, v in out.features.items():
                f = feats.setdefault(k, torch.empty(len(tokens), v.shape[-1], dtype=v.dtype, device=v.device))
                f[flat] = v.reshape(-1, v.shape[-1])[dense]
        return hidden, feats

    def _padded(self, tokens: Tensor, lay: Layout, group: list[int], cache: KVCache, rows: list[int],
                start: list[int], features: tuple[int, ...]) -> tuple[Tensor, Tensor, ForwardOutput]:
        """The sequences ``group`` as one [len(group), width] pass padded to their longest; returns
        their flat token indices, where those tokens sit in the padded [len(group) * width] pass, and
        the pass output, whose ``logits`` are the normed hidden states."""
        width, dev = max(lay.lengths[b] for b in group), tokens.device
        flat = torch.cat([torch.arange(int(lay.offsets[b]), int(lay.offsets[b + 1])) for b in group]).to(dev)
        dense = torch.cat([i * width + torch.arange(lay.lengths[b]) for i, b in enumerate(group)]).to(dev)
        padded = torch.zeros(len(group), width, dtype=tokens.dtype, device=dev)
        par = None
        if lay.parents is not None:
            par = torch.full((len(group), width), -1, dtype=torch.long, device=dev)
        for i, b in enumerate(group):
            lo, hi = int(lay.offsets[b]), int(lay.offsets[b + 1])
            padded[i, :hi - lo] = tokens[lo:hi]
            if par is not None:
                par[i, :hi - lo] = torch.from_numpy(lay.parents[lo:hi]).to(dev)
        out = self._forward(padded, cache, [rows[b] for b in group], [start[b] for b in group], par, False, features,
                            head=False)
        return flat, dense, out

    def _forward(self, tokens: Tensor, cache: KVCache, rows: list[int], start: list[int], parents: Tensor | None,
                 last_only: bool, features: tuple[int, ...], head: bool = True) -> ForwardOutput:
        """A [B, T] pass; without ``head``, ``logits`` holds the final normed hidden states instead."""
        steps = self._steps(tokens, cache, rows, start, parents)
        x, feats = self._run_layers(tokens, steps, cache, features)
        if last_only:
            x = x[:, -1:]
        return ForwardOutput(logits=self.lm_head(x).float() if head else x, features=feats)

    def _run_layers(self, tokens: Tensor, steps: dict[tuple[int, float], _Step], cache: KVCache,
                    features: tuple[int, ...]) -> tuple[Tensor, dict[int, Tensor]]:
        """Embedding -> every layer -> final norm: the normed hidden states [B, T, hidden] and the
        features asked for (layer i: layer i's input; num_layers: the normed output)."""
        x = self.embed[tokens]                                                  # [B, T, hidden]
        if self.config.embed_scale != 1.0:
            x = x * torch.tensor(self.config.embed_scale, dtype=x.dtype)
        feats: dict[int, Tensor] = {}
        for i, layer in enumerate(self.layers):
            if i in features:
                feats[i] = x
            x = layer(x, steps[(layer.window, layer.theta)], cache.k[i], cache.v[i])
        x = self.norm(x)
        if self.config.num_layers in features:
            feats[self.config.num_layers] = x
        return x, feats

    def _steps(self, tokens: Tensor, cache: KVCache, rows: list[int], start: list[int],
               parents: Tensor | None) -> dict[tuple[int, float], _Step]:
        """What the layers of a [B, T] pass share, one ``_Step`` per (window, rotary base) they use."""
        bsz, t = tokens.shape
        dev = tokens.device
        start_t = torch.tensor(start, dtype=torch.long, device=dev)
        arange = torch.arange(t, device=dev)
        slots = start_t[:, None] + arange[None]                                 # [B, T]
        if parents is not None:
            parents = parents.to(device=dev, dtype=torch.long)
            check_parents(parents, t)
        depth = arange[None].expand(bsz, t) if parents is None else tree_depths(parents)
        positions = start_t[:, None] + depth                                   # rotary positions [B, T]
        s_used = max(start) + t
        if s_used > cache.capacity:
            raise ValueError(f"positions up to {s_used} exceed cache capacity {cache.capacity}")
        s_used, mask, bias, virtual = self._attention_inputs(start_t, parents, depth, positions, s_used)
        lo = rows[0]
        contiguous = rows == list(range(lo, lo + bsz))
        row_sel = slice(lo, lo + bsz) if contiguous else torch.tensor(rows, device=dev)
        steps: dict[tuple[int, float], _Step] = {}
        for layer in self.layers:
            key = (layer.window, layer.theta)
            if key not in steps:
                cos, sin = self.rope[layer.theta]
                m = mask
                if layer.window:                   # keys at positions > the query's - window
                    m = mask & (self._key_positions(start_t, depth, s_used, t)[:, None, None, :]
                                > positions[:, None, :, None] - layer.window)
                steps[key] = _Step(row_sel, slots, s_used, cos.to(dev)[positions].unsqueeze(1),
                                   sin.to(dev)[positions].unsqueeze(1), m, bias, virtual)
        return steps

    def _attention_inputs(self, start_t: Tensor, parents: Tensor | None, depth: Tensor, positions: Tensor,
                          s_used: int) -> tuple[int, Tensor | None, Tensor | None, Tensor | None]:
        """(keys attended over, sdpa mask [B, 1, T, S], invariant bias, virtual key slots [B, T, S'])
        for the attention path this pass takes; the unused ones are None.  start_t [B]; depth and
        positions [B, T]."""
        bsz, t = depth.shape
        dev = start_t.device
        groups = self.config.num_heads // self.config.num_kv_heads
        if self.attention == "invariant" and parents is None and t <= QUERY_BLOCK:
            s_used = -(-s_used // KEY_BLOCK) * KEY_BLOCK
            q_pos = start_t[:, None] + torch.arange(QUERY_BLOCK, device=dev)[None]
            return s_used, None, invariant_attention_bias(q_pos, groups, s_used, self.dtype), None
        if self.attention == "invariant" and t <= VIRTUAL_MAX_TOKENS:
            virtual = virtual_key_slots(start_t, parents, depth)
            q_pos = positions.reshape(-1, 1).expand(-1, QUERY_BLOCK)
            return s_used, None, invariant_attention_bias(q_pos, groups, virtual.shape[-1], self.dtype), virtual
        keys = torch.arange(s_used, device=dev)
        if parents is None:
            mask = keys[None, None, :] <= positions[:, :, None]                 # causal
        else:
            rel = keys[None, :] - start_t[:, None]                             # [B, S] slot - start
            in_pass = (rel >= 0) & (rel < t)
            anc = ancestor_mask(parents)                                       # [B, T, T]
            tree = anc.gather(2, rel.clamp(0, t - 1)[:, None, :].expand(bsz, t, s_used))
            mask = (rel < 0)[:, None, :] | (in_pass[:, None, :] & tree)
        return s_used, mask[:, None], None, None

    @staticmethod
    def _key_positions(start: Tensor, depth: Tensor, s_used: int, t: int) -> Tensor:
        """[B, S] rotary position of each key slot: the slot for the cached prefix, start + depth for
        the pass's own tokens (a tree's nodes sit at their depth)."""
        slots = torch.arange(s_used, device=start.device)[None].expand(len(start), s_used)
        rel = slots - start[:, None]
        inside = (rel >= 0) & (rel < t)
        return torch.where(inside, start[:, None] + depth.gather(1, rel.clamp(0, t - 1)), slots)
