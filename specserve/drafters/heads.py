"""Shared by the learned drafters: finding a head, fast inference matmuls, and the head's KV cache.

A head is a folder (``head.safetensors`` + ``config.json``, see ``specserve.train.heads``).  Also
here: the options the learned drafters share, and the depth-first emission of a scored tree.  The
``default`` head of a drafter is the one shipped in ``specserve/data/heads/<kind>/`` for the
default model; a head trained for another target is refused with the reason.
"""

from __future__ import annotations

import math
from importlib import resources
from pathlib import Path

import torch
from torch import Tensor

from specserve.drafters.base import DraftProposal, Option
from specserve.errors import SpecserveError
from specserve.sampling import SamplingParams, exponential_noise, processed_probs, race
from specserve.train.heads import HeadConfig, check_target, load_head


def shipped_head(kind: str) -> Path:
    return Path(str(resources.files("specserve") / "data" / "heads" / kind))


def check_head_path(value: str) -> str:
    """Option check: ``default`` or a folder holding a head."""
    if value == "default":
        return value
    p = Path(value)
    if not (p / "config.json").exists() or not (p / "head.safetensors").exists():
        raise SpecserveError(f"no head at {value} (a head folder holds config.json and head.safetensors)")
    return value


def describe_head(cfg: HeadConfig, path: str, vocab: int) -> dict:
    """A head's record for reports: where it is, its shape and how it was trained."""
    t = cfg.training
    return {"head": path, "feature_layers": cfg.feature_layers, "reduced_vocabulary": vocab,
            "training_command": t.get("command", ""), "training_data": t.get("data", {}),
            "training_wall_seconds": t.get("wall_seconds"), "validation": t.get("validation", {}),
            "positions": t.get("settings", {}).get("positions")}


def head_path(kind: str, spec: str) -> Path:
    return shipped_head(kind) if spec == "default" else Path(spec)


def open_head(kind: str, spec: str, target) -> tuple[HeadConfig, torch.nn.Module, Tensor]:
    """Load and check the head ``spec`` (``default``: the shipped one) for ``target``."""
    path = head_path(kind, spec)
    if not (path / "config.json").exists():
        raise SpecserveError(f"no {kind} head is shipped in this install ({path}); train one with "
                             f"`specserve train {kind} --out DIR` and pass head=DIR")
    cfg, module, vocab_ids = load_head(path)
    if cfg.kind != kind:
        raise SpecserveError(f"the head at {path} is a {cfg.kind} head, not {kind}")
    check_target(cfg, target, str(path))
    return cfg, module, vocab_ids


class Matmul:
    """y = x W^T (+ b) with the target runtime's own kernels when it is the native CPU runtime
    (weights as Q8_0 blocks on the int8 kernels when the target runs int8 activations, else kept in
    float16), else plain float32 torch.  Heads run on the CPU whatever the target's device (their
    inputs are moved there)."""

    def __init__(self, weight: Tensor, bias: Tensor | None, model):
        self.native = getattr(model, "kernel", "") == "native"
        if self.native:
            from specserve.models.native import F16, NativeWeight
            from specserve.models.native.packed import PackedWeight, quantize_q8_0
            if getattr(model, "activations", "f32") == "int8" and weight.shape[1] % 32 == 0:
                self.w = PackedWeight.pack(quantize_q8_0(weight))
            else:
                self.w = NativeWeight.from_float(weight.detach().float(), F16)
            self.b = bias.detach().float().contiguous() if bias is not None else None
        else:
            self.w = weight.detach().to("cpu", torch.float32)
            self.b = bias.detach().to("cpu", torch.float32) if bias is not None else None

    def __call__(self, x: Tensor) -> Tensor:
        if self.native:
            from specserve.models.native import linear
            return linear(x.contiguous(), self.w, self.b)
        y = x @ self.w.T
        return y + self.b if self.b is not None else y


def positive(drafter: str, name: str):
    def check(v: int) -> int:
        if v < 1:
            raise SpecserveError(f"{drafter} option {name} must be >= 1, got {v}")
        return v
    return check


def sample_reduced(logits: Tensor, vocab_ids: Tensor, vocab_size: int, sampling: SamplingParams,
                   gen: torch.Generator) -> tuple[int, float, Tensor]:
    """Draw one token from a head's logits over its reduced vocabulary.

    logits: [Vr] over ``vocab_ids`` [Vr].  Temperature, top-k and top-p over the Vr tokens give the
    same law as over the whole vocabulary with the others at -inf (they have no mass and sort last),
    at a fraction of the cost.  Returns (token id, its probability, q [V] zero outside the subset).
    """
    q_sub = processed_probs(logits, sampling)                                   # [Vr]
    i = int(race(q_sub, exponential_noise(tuple(q_sub.shape), gen)))
    q = torch.zeros(vocab_size)
    q[vocab_ids] = q_sub
    return int(vocab_ids[i]), float(q_sub[i]), q


def head_option(kind: str) -> Option:
    """The ``head`` option every learned drafter declares."""
    return Option("head", str, "default", f"head folder, or 'default': the {kind} head shipped for the default model",
                  check=check_head_path)


def depth_first(tokens: list[int], parents: list[int], score: list[float], keep: set[int]) -> DraftProposal:
    """The kept nodes (each one's parent kept) in depth-first order, likeliest child first;
    confidence = exp(score) (score: cumulative log-probability)."""
    children: dict[int, list[int]] = {}
    for i in sorted(keep, key=lambda i: -score[i]):
        children.setdefault(parents[i], []).append(i)
    order: list[int] = []
    stack = list(reversed(children.get(-1, [])))
    while stack:
        i = stack.pop()
        order.append(i)
        stack.extend(reversed(children.get(i, [])))
    index = {old: new for new, old in enumerate(order)}
    return DraftProposal([tokens[i] for i in order], None, [index.get(parents[i], -1) for i in order],
                         [math.exp(score[i]) for i in order])
