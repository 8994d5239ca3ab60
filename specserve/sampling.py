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
    presence_penalty: float = 0.0     # OpenAI's, in [-2, 2] (``specserve.constrain.penalties``)
    frequency_penalty: float = 0.0    # OpenAI's, in [-2, 2]
    repetition_penalty: float = 1.0   # > 0; 1 disables it

    def __post_init__(self) -> None:
        if not isinstance(self.temperature, (int, float)) or math.isnan(self.temperature) or self.temperature < 0:
            raise SpecserveError(f"temperature must be >= 0, got {self.temperature}", "temperature")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise SpecserveError(f"top_k must be an integer >= 0 (0 disables it), got {self.top_k}", "top_k")
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise SpecserveError(f"top_p must be in (0, 1], got {self.top_p}", "top_p")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise SpecserveError(f"seed must be an integer, got {self.seed!r}", "seed")
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not -2 <= v <= 2:
                raise SpecserveError(f"{name} must be in [-2, 2], got {v!r}", name)
        r = self.repetition_penalty
        if isinstance(r, bool) or not isinstance(r, (int, float)) or math.isnan(r) or not 0 < r <= 100:
            raise SpecserveError(f"repetition_penalty must be in (0, 100], got {r!r}", "repetition_penalty")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalised(self) -> bool:
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0)


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
        logits = top_p_filtered(logits, params.top_p)
    return logits.softmax(-1)


TOP_P_FIRST = 256      # candidates top-p looks at first (grown fourfold while they hold less than p)


def top_p_filtered(logits: Tensor, top_p: float) -> Tensor:
    """logits [..., V] with every token outside the nucleus at -inf: in order of probability, a token
    is kept while the mass of the tokens before it is below ``top_p`` (so the top token always is).

    The nucleus is found among the likeliest ``TOP_P_FIRST`` tokens (``topk``, a fraction of the
    cost of sorting the whole vocabulary), grown fourfold while some row's candidates hold less
    than ``top_p``: every token after them then has at least that mass before it, so none is kept,
    and the result is that of a full sort (``top_p_sorted``, kept as the reference).  The masses are
    summed in float64 (in float32 a nucleus of thousands of tokens gathers enough rounding to move
    its last token across the threshold, differently for different summation orders), so the two
    agree unless a token's mass before it lies within about 1e-12 of ``top_p``."""
    vocab = logits.shape[-1]
    k = min(TOP_P_FIRST, vocab)
    lse = torch.logsumexp(logits.double(), -1, keepdim=True)                         # [..., 1]
    while True:
        vals, idx = torch.topk(logits, k, dim=-1)                                    # [..., k], likeliest first
        probs = (vals.double() - lse).exp()
        mass = probs.cumsum(-1)
        if k == vocab or bool((mass[..., -1] >= top_p).all()):
            break
        k = min(4 * k, vocab)
    keep = (mass - probs) < top_p                                                    # exclusive cumsum
    return torch.full_like(logits, float("-inf")).scatter(-1, idx, vals.masked_fill(~keep, float("-inf")))


def top_p_sorted(logits: Tensor, top_p: float) -> Tensor:
    """``top_p_filtered`` by sorting the whole vocabulary (the slow reference)."""
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    sorted_probs = sorted_logits.double().softmax(-1)
    mass_before = sorted_probs.cumsum(-1) - sorted_probs                           # exclusive cumsum
    drop_sorted = mass_before >= top_p                                             # never drops the top token
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


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


def logprobs_of(logits: Tensor, tokens: list[int], top: int | None) -> list[tuple[float, tuple[tuple[int, float], ...]]]:
    """Per row: the log-probability of ``tokens[i]`` under ``log_softmax(logits[i])`` and the ``top``
    likeliest tokens with theirs.  logits: [R, V] (R >= len(tokens)).  Each row is
    computed alone, so a row's numbers do not depend on the rows beside it."""
    out = []
    for i, t in enumerate(tokens):
        lp = torch.log_softmax(logits[i].float(), -1)                                  # [V]
        best: tuple[tuple[int, float], ...] = ()
        if top:
            vals, idx = torch.topk(lp, top)
            best = tuple((int(j), float(v)) for j, v in zip(idx.tolist(), vals.tolist()))
        out.append((float(lp[t]), best))
    return out
