"""The learned heads: an EAGLE head (one decoder layer over target features) and Medusa heads.

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

Tensors are float32 on the CPU at draft time; training runs the same modules.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

FORMAT_VERSION = 1


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


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """Grouped-query attention: q [Q, H, d], k, v [K, Hkv, d], mask [Q, K] bool (True: attend) -> [Q, H * d]."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~mask, float("-inf"))
    return torch.einsum("hqk,khd->qhd", s.softmax(-1), v).flatten(-2)


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


def new_config(kind: str, target, feature_layers: list[int], num_medusa: int = 0,
               intermediate_size: int = 0) -> HeadConfig:
    """A head config shaped for ``target`` (a LoadedModel): the EAGLE layer takes the target's shape."""
    t = target.config
    return HeadConfig(kind=kind, feature_layers=list(feature_layers), hidden_size=t.hidden_size,
                      num_heads=t.num_heads, num_kv_heads=t.num_kv_heads, head_dim=t.head_dim,
                      intermediate_size=intermediate_size or t.intermediate_size, rope_theta=t.rope_theta,
                      rms_norm_eps=t.rms_norm_eps, num_medusa=num_medusa, vocab_size=t.vocab_size,
                      target=target_signature(target))


def build(cfg: HeadConfig) -> nn.Module:
    if cfg.kind == "eagle":
        return EagleHead(cfg)
    if cfg.kind == "medusa":
        return MedusaHeads(cfg)
    raise ValueError(f"unknown head kind {cfg.kind!r}")


def save_head(directory: str | Path, cfg: HeadConfig, module: nn.Module, vocab_ids: Tensor) -> None:
    """``head.safetensors`` (the module's tensors in float16, and ``vocab_ids`` int64) + ``config.json``."""
    from safetensors.torch import save_file

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to(torch.float16).contiguous() for k, v in module.state_dict().items()}
    tensors["vocab_ids"] = vocab_ids.to(torch.int64).contiguous()
    save_file(tensors, str(d / "head.safetensors"), metadata={"format": str(FORMAT_VERSION)})
    (d / "config.json").write_text(cfg.to_json())


def load_head(directory: str | Path) -> tuple[HeadConfig, nn.Module, Tensor]:
    """The config, the module (float32, eval mode) and ``vocab_ids`` of a saved head."""
    from safetensors.torch import load_file

    d = Path(directory)
    cfg = HeadConfig(**json.loads((d / "config.json").read_text()))
    tensors = load_file(str(d / "head.safetensors"))
    vocab_ids = tensors.pop("vocab_ids")
    module = build(cfg)
    module.load_state_dict({k: v.float() for k, v in tensors.items()})
    return cfg, module.eval(), vocab_ids


def _probe_ids(vocab_size: int) -> Tensor:
    return torch.linspace(0, vocab_size - 1, 16).long()


def target_signature(target) -> dict:
    """What a head is bound to: the target's shape and a fingerprint of its weights (16 embedding
    rows' first 16 values, rounded; compared with a tolerance so that another quantisation of the
    same weights still matches)."""
    cfg, model = target.config, target.model
    rows = model.weight_rows("embed", _probe_ids(cfg.vocab_size))[:, :16].cpu()
    return {"vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size, "num_layers": cfg.num_layers,
            "num_heads": cfg.num_heads, "num_kv_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim,
            "fingerprint": [round(float(x), 5) for x in rows.flatten()]}


def check_target(cfg: HeadConfig, target, where: str) -> None:
    """Refuse (SpecserveError) a head trained for another target, saying what differs."""
    from specserve.errors import SpecserveError

    mine = target_signature(target)
    for key in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim"):
        if cfg.target.get(key) != mine[key]:
            raise SpecserveError(f"the head at {where} was trained for a target with {key} {cfg.target.get(key)}; "
                                 f"this model has {mine[key]}")
    a, b = torch.tensor(cfg.target.get("fingerprint", [])), torch.tensor(mine["fingerprint"])
    rel = float((a - b).norm() / b.norm().clamp_min(1e-12)) if a.shape == b.shape else 1.0
    if rel > 0.1:
        raise SpecserveError(f"the head at {where} was trained for another model with the same shape "
                             f"(weight fingerprint differs by {rel:.0%}); train one for this model with "
                             f"`specserve train {cfg.kind} --model ...`")
