"""A head on disk and the target it was trained for: config, save, load, the target check.
(Writing an ``eagle3`` head in the layout vLLM and SGLang load: ``specserve.export``.)

A head is a folder: ``head.safetensors`` (the module's tensors in float16, and ``vocab_ids``
int64 [Vr]) and ``config.json`` (``HeadConfig``).  The format is the one the shipped heads in
``specserve/data/heads/`` were written in (``FORMAT_VERSION``); a head written by an older build
loads unchanged.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor, nn

from specserve.drafters.heads.modules import HeadConfig, build
from specserve.errors import SpecserveError

FORMAT_VERSION = 1


def new_config(kind: str, target, feature_layers: list[int], num_medusa: int = 0,
               intermediate_size: int = 0) -> HeadConfig:
    """A head config shaped for ``target`` (a LoadedModel): the EAGLE layer takes the target's shape."""
    t = target.config
    return HeadConfig(kind=kind, feature_layers=list(feature_layers), hidden_size=t.hidden_size,
                      num_heads=t.num_heads, num_kv_heads=t.num_kv_heads, head_dim=t.head_dim,
                      intermediate_size=intermediate_size or t.intermediate_size, rope_theta=t.rope_theta,
                      rms_norm_eps=t.rms_norm_eps, num_medusa=num_medusa, vocab_size=t.vocab_size,
                      target=target_signature(target))


def save_head(directory: str | Path, cfg: HeadConfig, module: nn.Module, vocab_ids: Tensor) -> None:
    """``head.safetensors`` (the module's tensors in float16, and ``vocab_ids`` int64) + ``config.json``."""
    from safetensors.torch import save_file

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to(torch.float16).contiguous() for k, v in module.state_dict().items()}
    tensors["vocab_ids"] = vocab_ids.to(torch.int64).contiguous()
    save_file(tensors, str(d / "head.safetensors"), metadata={"format": str(FORMAT_VERSION)})
    (d / "config.json").write_text(cfg.to_json())


def read_config(directory: str | Path) -> HeadConfig:
    """A saved head's config alone (no tensors read)."""
    return HeadConfig(**json.loads((Path(directory) / "config.json").read_text()))


def load_head(directory: str | Path) -> tuple[HeadConfig, nn.Module, Tensor]:
    """The config, the module (float32, eval mode) and ``vocab_ids`` of a saved head."""
    from safetensors.torch import load_file

    d = Path(directory)
    cfg = read_config(d)
    tensors = load_file(str(d / "head.safetensors"))
    vocab_ids = tensors.pop("vocab_ids")
    module = build(cfg)
    module.load_state_dict({k: v.float() for k, v in tensors.items()})
    return cfg, module.eval(), vocab_ids


def check_eagle3_layers(layers, num_layers: int) -> None:
    """Refuse feature layers vLLM and SGLang cannot feed an EAGLE-3 head: they fuse exactly three
    layers' inputs (the residual stream entering decoder layer i, 1 <= i <= L - 1), each once."""
    layers = list(layers)
    if len(layers) != 3 or len(set(layers)) != 3 or not all(1 <= l <= num_layers - 1 for l in layers):
        raise SpecserveError(f"the eagle3 layout reads three distinct feature layers in 1..{num_layers - 1} (the "
                             f"inputs of three decoder layers, as vLLM and SGLang capture them), got {layers}; "
                             f"use --features fused or three such layer numbers")


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
