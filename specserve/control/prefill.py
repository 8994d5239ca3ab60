"""How prompts enter the running batch: the prefill planner (chunked prefill).

A prompt is prefilled in **chunks**, each one more ragged sequence in the same target pass as the
running sequences' decoding and verification tokens, so a long prompt never freezes the streams
already running.  How many prompt tokens a step takes: everything up to ``chunk`` when nothing
else runs, otherwise as much as keeps the step within ``stall`` times a decoding step of the whole
batch (every sequence one token, the prompts' included), so the running streams' inter-token
latency stays within about ``stall`` times its usual value while prompts enter.  Prompts that one
chunk can finish go first (a short prompt does not wait behind a long one), each class first come
first served.  Chunks end at multiples of ``limits.PREFIX_BLOCK`` (unless they end the prompt), so
every block of a prompt lies in one chunk.

The bits do not depend on the chunking: on a batch-invariant runtime each position's keys,
values, features and logits are computed by the same operations whether its prompt is prefilled
whole, in chunks of any size, or beside other sequences (``Decoder.invariant_tokens`` bounds the
chunk where that holds only for runs of limited length).
"""

from __future__ import annotations

from dataclasses import dataclass

from specserve.control.cost import CostModel
from specserve.errors import SpecserveError
from specserve.limits import PREFIX_BLOCK

PREFILL_CHUNK = 256     # the default chunk: most prompt tokens one pass takes
PREFILL_STALL = 5.0     # the default stall: a step with prompt chunks may take this many times a decoding step


@dataclass(frozen=True)
class PrefillPolicy:
    chunk: int | None = PREFILL_CHUNK   # most prompt tokens one pass takes; None: every prompt whole, in one pass
    stall: float = PREFILL_STALL        # a step with prompt chunks may take this many times a decoding step
    prefix_cache_mb: float = 0.0        # the prefix pool's memory (0: no reuse)

    def check(self) -> None:
        """Refuse settings that cannot work (at construction: nothing is rewritten silently)."""
        if self.chunk is not None and (self.chunk < PREFIX_BLOCK or self.chunk % PREFIX_BLOCK):
            raise SpecserveError(f"prefill chunk must be a positive multiple of {PREFIX_BLOCK} tokens, "
                                 f"got {self.chunk}")
        if not self.stall >= 1.0:
            raise SpecserveError(f"prefill stall must be >= 1 (times a decoding step of the batch), got {self.stall}")
        if not self.prefix_cache_mb >= 0:
            raise SpecserveError(f"prefix cache size must be >= 0 MB, got {self.prefix_cache_mb}")


@dataclass(frozen=True)
class PromptState:
    """A prompt being prefilled, as the planner sees it."""
    cached: int                   # prompt positions already in the cache
    left: int                     # prompt tokens still to prefill


def plan_chunks(policy: PrefillPolicy, cost: CostModel, most: int, lengths: list[int], contexts: list[int],
                prompts: list[PromptState]) -> list[tuple[int, int]]:
    """(index into ``prompts``, tokens) for each prompt this step's pass advances, in pass order.

    ``lengths``/``contexts``: the pass's decoding sequences (tokens fed, positions cached);
    ``prompts`` in arrival order; ``most``: the most prompt tokens one pass takes.  With chunking
    off (``policy.chunk`` None) every prompt goes whole, whatever runs beside it."""
    order = sorted(range(len(prompts)), key=lambda i: prompts[i].left > most)      # stable
    limit = cost if policy.chunk is not None else None
    shares = prefill_shares(limit, lengths, contexts, [(prompts[i].cached, prompts[i].left) for i in order],
                            most, PREFIX_BLOCK, policy.stall)
    return [(i, n) for i, n in zip(order, shares) if n > 0]


def prefill_shares(cost: CostModel | None, lengths: list[int], contexts: list[int],
                   prompts: list[tuple[int, int]], most: int, grain: int, stall: float) -> list[int]:
    """Prompt tokens each waiting prompt adds to this step's pass (chunked prefill).

    ``lengths``/``contexts``: the pass's decoding sequences (tokens fed, positions cached);
    ``prompts``: (positions cached, tokens left) per prompt being prefilled, in priority order.  The
    prompts share a total of at most ``most`` tokens in that order, each share ending at a multiple
    of ``grain`` unless it ends the prompt.  With nothing decoding (or no cost model yet) the total
    is ``most``; otherwise it is the largest for which the pass is predicted to take at most
    ``stall`` times the reference step, every sequence of the batch decoding one token (the
    prompts' included), and never less than ``grain`` (a prompt always advances).
    Example: one prompt (0 cached, 100 left), most 64, grain 16 -> [64]."""
    def shares(total: int) -> list[int]:
        out, left = [], total
        for ctx, rest in prompts:
            take = min(rest, left)
            if take < rest:
                take = (ctx + take) // grain * grain - ctx
            take = max(take, 0)
            out.append(take)
            left -= take
        return out

    if not lengths or cost is None:
        return shares(most)
    # the reference step: every sequence of the batch decoding, the prompts' included (one token each)
    limit = stall * cost.predict(lengths + [1] * len(prompts), contexts + [c for c, _ in prompts])

    def fits(total: int) -> bool:
        sh = shares(total)
        return cost.predict(lengths + [n for n in sh if n], contexts + [c for (c, _), n in zip(prompts, sh) if n]) <= limit

    lo, hi = grain, max(most, grain)            # the largest total that fits, by bisection (cost grows with it)
    if not fits(lo):
        return shares(lo)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return shares(lo)
