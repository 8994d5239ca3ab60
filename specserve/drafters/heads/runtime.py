"""Shared by the learned drafters at draft time: finding a head, and drawing from one.

A head is a folder (``head.safetensors`` + ``config.json``, see ``files``).  A head's matrix
products run on the target runtime's own kernels, through the decoder protocol's ``matmul``
(heads run on the CPU whatever the target's device).  Also here: the option
the learned drafters share (``head``), the base of their options and of the drafters (``HeadOptions``,
``HeadDrafter``: opening the head and describing it), siblings drawn without replacement from a head's q, and the
depth-first emission of a scored tree.  The ``default`` head of a drafter is the one shipped in
``specserve/data/heads/<kind>/`` for the default model; a head trained for another target is
refused with the reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor

from specserve.drafters.base import CheckedOptions, DraftProposal, Drafter, option, positive
from specserve.drafters.heads.files import check_target, load_head
from specserve.drafters.heads.modules import HeadConfig
from specserve.errors import SpecserveError
from specserve.models.layers import rope_inv_freq
from specserve.sampling import exponential_noise, race


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


def open_head(kind: str, spec: str, target, kinds: tuple[str, ...] | None = None, train: str = ""
              ) -> tuple[HeadConfig, torch.nn.Module, Tensor]:
    """Load and check the head ``spec`` (``default``: the shipped one) of drafter ``kind`` for ``target``;
    ``kinds``: the head kinds (``HeadConfig.kind``) the drafter runs (default: ``kind`` alone);
    ``train``: the command that trains one (default: ``specserve train KIND --out DIR``)."""
    path = head_path(kind, spec)
    if not (path / "config.json").exists():
        raise SpecserveError(f"no {kind} head is shipped in this install ({path}); train one with "
                             f"`{train or f'specserve train {kind} --out DIR'}` and pass head=DIR")
    cfg, module, vocab_ids = load_head(path)
    if cfg.kind not in (kinds or (kind,)):
        raise SpecserveError(f"the head at {path} is a {cfg.kind} head, which the {kind} drafter does not run")
    check_target(cfg, target, str(path))
    return cfg, module, vocab_ids


def sample_width_option(drafter: str):
    """The ``sample_width`` option the learned drafters share."""
    return option(2, "under sampling: children drawn without replacement per expanded node, and nodes "
                  "expanded per depth (1: a chain)", check=positive(drafter, "sample_width"))


def draw_distinct(q: Tensor, width: int, gen: torch.Generator) -> tuple[list[int], list[Tensor]]:
    """Up to ``width`` distinct indices drawn one after another without replacement from q [Vr]
    (processed probabilities): draw j from q renormalised over the indices not drawn before it (the
    first from q itself, as ``sample_reduced`` draws), each by one exponential race from ``gen``.
    Fewer when q has fewer nonzero entries.  Returns (the indices, the distribution [Vr] each was
    drawn from: the q rows verification needs for siblings drawn without replacement)."""
    drawn: list[int] = []
    rows: list[Tensor] = []
    left = q
    for j in range(width):
        if j:
            left = left.clone()
            left[drawn[-1]] = 0.0
            total = float(left.sum())
            if total <= 0.0:
                break
            left = left / total
        drawn.append(int(race(left, exponential_noise(tuple(left.shape), gen))))
        rows.append(left)
    return drawn, rows


def head_option(kind: str):
    """The ``head`` field every learned drafter's options declare."""
    return option("default", f"head folder, or 'default': the {kind} head shipped for the default model",
                  check=check_head_path)


@dataclass(frozen=True)
class HeadOptions(CheckedOptions):
    """The base of a learned drafter's options (the ``head`` folder's check is left to ``open_head``)."""
    unchecked = ("head",)


class HeadDrafter(Drafter):
    """A drafter that runs a learned head (``eagle``, ``medusa``) on the target's kernels; its options
    (a ``HeadOptions``) name the head and its ``topk``."""
    tree = True
    confidence = True
    head_kinds: ClassVar[tuple[str, ...] | None] = None   # the head kinds it runs (None: its own name's)
    train_command: ClassVar[str] = ""                      # how one is trained ("": specserve train NAME)

    def _open(self, target: Any, options: dict[str, Any]) -> torch.nn.Module:
        """Set ``opts`` from ``options`` and open the head for ``target``: its config, folder, feature
        layers, reduced vocabulary and the target's LM-head rows over it.  Returns the head's module."""
        o = self.opts = self.Options(**options)
        self.cfg, module, self.vocab_ids = open_head(self.name, o.head, target, kinds=self.head_kinds,
                                                           train=self.train_command)
        self.head_dir = str(head_path(self.name, o.head))
        self.topk = o.topk
        self.feature_layers = tuple(self.cfg.feature_layers)
        m = target.model
        self.lm = m.matmul(m.weight_rows("lm_head", self.vocab_ids).cpu())   # the reduced LM head [Vr, hidden]
        self.vocab_list = self.vocab_ids.tolist()
        self.vocab_size = target.config.vocab_size
        return module

    def describe(self) -> dict:
        return describe_head(self.cfg, self.head_dir, len(self.vocab_list))


class RopeTable:
    """Rotate-half RoPE with cos and sin read from a table of positions: ``rotate(x, pos)`` gives
    ``modules.rotary(x, pos, theta)`` bit for bit.  The table (grown by doubling) is computed by the
    same operations, a block of positions per call (below torch's grain: one thread, whole vectors);
    rotate_half(x) * sin is x with its halves swapped times sin with its first half negated."""

    BLOCK = 256

    def __init__(self, head_dim: int, theta: float):
        d, half = head_dim, head_dim // 2
        self.inv = rope_inv_freq(d, theta, None)
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
