"""Shared by the learned drafters at draft time: finding a head, and drawing from one.

A head is a folder (``head.safetensors`` + ``config.json``, see ``files``).  A head's matrix
products run on the target runtime's own kernels, through the decoder protocol's ``matmul``
(heads run on the CPU whatever the target's device).  Also here: the option
the learned drafters share (``head``), a sampled chain over a reduced vocabulary, and the
depth-first emission of a scored tree.  The ``default`` head of a drafter is the one shipped in
``specserve/data/heads/<kind>/`` for the default model; a head trained for another target is
refused with the reason.
"""

from __future__ import annotations

import math
from importlib import resources
from pathlib import Path
from typing import Callable

import torch
from torch import Tensor

from specserve.drafters.base import DraftProposal, option
from specserve.drafters.heads.files import check_target, load_head
from specserve.drafters.heads.modules import HeadConfig
from specserve.errors import SpecserveError
from specserve.sampling import SamplingParams, exponential_noise, processed_probs, race


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


def head_option(kind: str):
    """The ``head`` field every learned drafter's options declare."""
    return option("default", f"head folder, or 'default': the {kind} head shipped for the default model",
                  check=check_head_path)


def rms(norm: torch.nn.Module, x: Tensor) -> Tensor:
    """``norm(x)`` for a head's ``RMSNorm``, as one call: ``rms_norm`` runs the same operations in the
    same order (x * rsqrt(mean(x^2) + eps) * weight), so the same bits, without five dispatches."""
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), norm.weight, norm.eps)


class RopeTable:
    """Rotate-half RoPE with cos and sin read from a table of positions: ``rotate(x, pos)`` gives
    ``modules.rotary(x, pos, theta)`` bit for bit.  The table (grown by doubling) is computed by the
    same operations, a block of positions per call (below torch's grain: one thread, whole vectors);
    rotate_half(x) * sin is x with its halves swapped times sin with its first half negated."""

    BLOCK = 256

    def __init__(self, head_dim: int, theta: float):
        d, half = head_dim, head_dim // 2
        self.inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
        self.swap = torch.cat([torch.arange(half, d), torch.arange(half)])
        self.cos = self.sin = torch.empty(0, 1, d)                # [P, 1, d]

    def reserve(self, n: int) -> None:
        """Positions 0..n-1 in the table."""
        if n > len(self.cos):
            size = max(n, 2 * len(self.cos), self.BLOCK)
            cos, sin = [], []
            for lo in range(0, size, self.BLOCK):
                ang = torch.arange(lo, min(lo + self.BLOCK, size)).to(torch.float32)[:, None] * self.inv
                c, s = ang.cos(), ang.sin()
                cos.append(torch.cat([c, c], -1))
                sin.append(torch.cat([-s, s], -1))
            self.cos, self.sin = torch.cat(cos)[:, None], torch.cat(sin)[:, None]

    def rotate(self, x: Tensor, pos: Tensor) -> Tensor:
        """x [M, heads, d], pos [M] (reserved positions) -> x rotated (a new tensor)."""
        return x * self.cos[pos] + x.index_select(-1, self.swap) * self.sin[pos]


def sampled_chain(logits_at: Callable[[int, list[int]], Tensor], depth: int, vocab_ids: Tensor, vocab_size: int,
                  sampling: SamplingParams, gen: torch.Generator) -> DraftProposal:
    """A chain of ``depth`` tokens drawn one by one with ``sample_reduced``, with its q rows.

    ``logits_at(d, drawn)``: the head's reduced-vocabulary logits [Vr] for depth d + 1, given the
    tokens ``drawn`` at depths 1..d.  A node's confidence is the product of its path's draws' q."""
    tokens: list[int] = []
    probs: list[Tensor] = []
    conf: list[float] = []
    c = 1.0
    for d in range(depth):
        tok, p, q = sample_reduced(logits_at(d, tokens), vocab_ids, vocab_size, sampling, gen)
        c *= p
        tokens.append(tok)
        probs.append(q)
        conf.append(c)
    return DraftProposal(tokens, torch.stack(probs), None, conf)


def sampled_chains(logits_at: Callable[[int, list[int], list[list[int]]], Tensor], depths: list[int],
                   vocab_ids: Tensor, vocab_size: int, samplings: list[SamplingParams],
                   gens: list[torch.Generator]) -> list[DraftProposal]:
    """``sampled_chain`` for several sequences at once, drawn a depth at a time: ``logits_at(d, live,
    drawn)`` gives the logits [len(live), Vr] of depth d + 1 for the chains ``live`` (those with
    depths[j] > d), given ``drawn[j]``, the tokens each chain drew so far.  Chain j draws from
    ``gens[j]`` in the order ``sampled_chain`` does, so it gets the same tokens and q rows."""
    drawn: list[list[int]] = [[] for _ in depths]
    probs: list[list[Tensor]] = [[] for _ in depths]
    conf: list[list[float]] = [[] for _ in depths]
    for d in range(max(depths, default=0)):
        live = [j for j, n in enumerate(depths) if n > d]
        for j, row in zip(live, logits_at(d, live, drawn)):
            tok, p, q = sample_reduced(row, vocab_ids, vocab_size, samplings[j], gens[j])
            conf[j].append(conf[j][-1] * p if conf[j] else 1.0 * p)
            drawn[j].append(tok)
            probs[j].append(q)
    return [DraftProposal(t, torch.stack(q), None, c) for t, q, c in zip(drawn, probs, conf)]


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
