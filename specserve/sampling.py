"""Logits processing shared by the target and every drafter: temperature, top-k, top-p.

The same ``processed_probs`` turns target logits into p and draft logits into q, so the two
distributions are filtered identically (a requirement for exact speculative sampling).

Sampling uses the exponential race: ``argmax(probs / E)`` with ``E ~ Exp(1)`` i.i.d. draws an index
with probability proportional to ``probs``; it needs no normalisation and makes the randomness an
explicit tensor, so fast and reference implementations can be compared bit for bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from specserve.errors import SpecserveError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0     # 0 means greedy (argmax)
    top_k: int = 0               # 0 means no top-k filter
    top_p: float = 1.0           # nucleus mass in (0, 1]
    seed: int | None = None      # None: a fresh random seed per request

    def __post_init__(self) -> None:
        if not isinstance(self.temperature, (int, float)) or math.isnan(self.temperature) or self.temperature < 0:
            raise SpecserveError(f"temperature must be >= 0, got {self.temperature}", "temperature")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise SpecserveError(f"top_k must be an integer >= 0 (0 disables it), got {self.top_k}", "top_k")
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise SpecserveError(f"top_p must be in (0, 1], got {self.top_p}", "top_p")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise SpecserveError(f"seed must be an integer, got {self.seed!r}", "seed")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def processed_probs(logits: Tensor, params: SamplingParams) -> Tensor:
    """Probabilities after temperature, top-k and top-p, in that order.

    logits: [..., V] (any float dtype).  Returns float32 [..., V] summing to 1 over V.
    Under greedy decoding this returns the one-hot distribution of the argmax.
    """
    logits = logits.float()
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = logits / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]           # [..., 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(-1)
        mass_before = sorted_probs.cumsum(-1) - sorted_probs                       # exclusive cumsum
        drop_sorted = mass_before >= params.top_p                                  # never drops the top token
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(-1)


def exponential_noise(shape: tuple[int, ...], generator: torch.Generator) -> Tensor:
    """i.i.d. Exp(1) draws (float32, on the generator's device) for the exponential race."""
    u = torch.rand(shape, generator=generator, device=generator.device, dtype=torch.float64)
    return (-torch.log1p(-u)).float().clamp_min_(1e-30)


def race(probs: Tensor, noise: Tensor) -> Tensor:
    """Sample one index per row.  probs, noise: [..., V] -> [...]; probs need not be normalised."""
    return (probs / noise).argmax(-1)


def sample(logits: Tensor, params: SamplingParams, generator: torch.Generator | None) -> Tensor:
    """Next token(s) from logits [..., V]: argmax when greedy, else a draw from processed_probs."""
    if params.greedy:
        return logits.argmax(-1)
    probs = processed_probs(logits, params)
    return race(probs, exponential_noise(tuple(probs.shape), generator).to(probs.device))
