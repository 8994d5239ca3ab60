"""The learned heads' modules: an EAGLE head (one decoder layer over target features) and Medusa heads.

Both predict over a *reduced vocabulary* (FR-Spec): ``vocab_ids`` [Vr], the most frequent tokens of
the training data; their logits are the target's own LM-head rows for those tokens (frozen, not
stored with the head) applied to the head's normed output.  Outside the subset q is zero.

Terms.  Position t of a sequence has token x_t and target features f_t (computed with x_t as the
newest token; the target's distribution at t is over x_{t+1}).  Layers are named as in
``Decoder.forward``: i < L is the input of layer i, L the final normed output.

* **EAGLE** (one layer of the target's shape): the fused feature g_t = fuse(f_t) (the chosen layers
  concatenated, one linear map), and the embedding of x_{t+1}, go in; the output o_t predicts
  x_{t+2}.  Drafting deeper, the output o_t stands in for g_{t+1}, whose real features are not yet
  known.  The layer attends causally over the sequence (rotary positions as the target's).
* **Medusa**: head j (1..M) is a residual block over f^L_t whose output predicts x_{t+1+j}.

Tensors are float32 on the CPU at draft time; training (``specserve.train``) runs the same modules.
Saving, loading and the target check: ``specserve.drafters.heads.files``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass
class HeadConfig:
    kind: str                           # eagle | medusa
    feature_layers: list[int]           # target layers read (see the module docstring)
    hidden_size: int
    num_heads: int = 0                  # eagle: the layer's attention shape (the target's)
    num_kv_heads: int = 0
    head_dim: int = 0
    intermediate_size: int = 0
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    num_medusa: int = 0                 # medusa: heads (offsets +2 .. +1+M from the pending token)
    vocab_size: int = 0                 # the target's vocabulary
    target: dict = field(default_factory=dict)     # what the head was trained for (see ``target_signature``)
    training: dict = field(default_factory=dict)   # command, data and results behind the head

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)


class RMSNorm(nn.Module):
    def __init__(self, n: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotary(x: Tensor, pos: Tensor, theta: float) -> Tensor:
    """Rotate-half RoPE: x [..., T, heads, d], pos [..., T] (int) -> same shape."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d)
    ang = pos.to(torch.float32)[..., None] * inv                                 # [..., T, d/2]
    cos, sin = torch.cat([ang.cos()] * 2, -1)[..., None, :], torch.cat([ang.sin()] * 2, -1)[..., None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class EagleHead(nn.Module):
    """fuse -> [embedding ; fused feature] -> one pre-norm decoder layer -> norm (-> reduced LM head)."""

    def __init__(self, cfg: HeadConfig):
        super().__init__()
        h = cfg.hidden_size
        self.cfg = cfg
        self.fuse = nn.Linear(len(cfg.feature_layers) * h, h, bias=False)
        self.emb_norm, self.feat_norm = RMSNorm(h, cfg.rms_norm_eps), RMSNorm(h, cfg.rms_norm_eps)
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.attn_norm, self.ffn_norm = RMSNorm(h, cfg.rms_norm_eps), RMSNorm(h, cfg.rms_norm_eps)
        self.q = nn.Linear(h, cfg.num_heads * cfg.head_dim, bias=False)
        self.kv = nn.Linear(h, 2 * cfg.num_kv_heads * cfg.head_dim, bias=False)
        self.o = nn.Linear(cfg.num_heads * cfg.head_dim, h, bias=False)
        self.gate_up = nn.Linear(h, 2 * cfg.intermediate_size, bias=False)
        self.down = nn.Linear(cfg.intermediate_size, h, bias=False)
        self.norm = RMSNorm(h, cfg.rms_norm_eps)

    def fused(self, feats: Tensor) -> Tensor:
        """feats [..., F, hidden] (the configured layers, in order) -> g [..., hidden]."""
        return self.fuse(feats.flatten(-2))

    def inputs(self, g: Tensor, emb: Tensor) -> Tensor:
        """g, emb [..., hidden] -> the layer's input x [..., hidden]."""
        return self.fc(torch.cat([self.emb_norm(emb), self.feat_norm(g)], -1))

    def qkv(self, x: Tensor, pos: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x [..., T, hidden], pos [..., T] -> q [..., T, H, d], k, v [..., T, Hkv, d] (RoPE applied)."""
        c = self.cfg
        hn = self.attn_norm(x)
        q = self.q(hn).unflatten(-1, (c.num_heads, c.head_dim))
        k, v = self.kv(hn).unflatten(-1, (2, c.num_kv_heads, c.head_dim)).unbind(-3)
        return rotary(q, pos, c.rope_theta), rotary(k, pos, c.rope_theta), v

    def finish(self, x: Tensor, att: Tensor) -> Tensor:
        """x [..., hidden] (the layer input), att [..., H * d] -> the layer output o [..., hidden]."""
        x = x + self.o(att)
        a, b = self.gate_up(self.ffn_norm(x)).chunk(2, -1)
        return x + self.down(F.silu(a) * b)


class MedusaHeads(nn.Module):
    """M residual blocks h + SiLU(W h + b) over the final normed feature."""

    def __init__(self, cfg: HeadConfig):
        super().__init__()
        self.cfg = cfg
        self.blocks = nn.ModuleList(nn.Linear(cfg.hidden_size, cfg.hidden_size) for _ in range(cfg.num_medusa))
        for b in self.blocks:
            nn.init.zeros_(b.weight)          # start as the target's own head (Medusa's initialisation)
            nn.init.zeros_(b.bias)

    def forward(self, f: Tensor) -> Tensor:
        """f [..., hidden] -> [..., M, hidden], block j predicting x_{t+2+j} (j from 0)."""
        return torch.stack([f + F.silu(b(f)) for b in self.blocks], -2)


MODULES: dict[str, type[nn.Module]] = {"eagle": EagleHead, "medusa": MedusaHeads}   # HeadConfig.kind -> module


def build(cfg: HeadConfig) -> nn.Module:
    """A new (untrained) head module of ``cfg.kind``."""
    if cfg.kind not in MODULES:
        raise ValueError(f"unknown head kind {cfg.kind!r}")
    return MODULES[cfg.kind](cfg)
