"""The engine's types: a request, its result, a sequence with an explicit state, a step's report."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import Tensor

from specserve.sampling import SamplingParams
from specserve.stats import TIMERS, RequestStats, Timings


@dataclass
class Request:
    prompt: list[int]
    max_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    drafter: str = "none"
    num_draft: int | str = 0           # draft length (tree drafters: node budget), or "auto": the controller's
    eos_ids: frozenset[int] = frozenset()
    stop_fn: Callable[[list[int]], bool] | None = None   # True when generated tokens hit a stop string
    grammar: Any = None                # a compiled ``constrain.Grammar`` the output must follow (None: free)
    logprobs: int | None = None        # per generated token: its logprob and the top this-many (None: off)
    prompt_logprobs: int | None = None  # the same per prompt token (the first has none); then max_tokens
                                        # may be 0 (score the prompt only) and no cached prefix is used


@dataclass(frozen=True)
class TokenLogprob:
    """A token's log-probability under the target's raw distribution at its position (before
    penalties, grammar and temperature), and the likeliest tokens there with theirs."""
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass
class Result:
    tokens: list[int]
    finish_reason: str            # "stop" (EOS or stop string), "length" or "abort"
    stats: RequestStats
    logprobs: list[TokenLogprob] | None = None           # one per token (Request.logprobs)
    prompt_logprobs: list[TokenLogprob | None] | None = None   # one per prompt token, None for the first


class State(enum.Enum):
    PREFILL = "prefill"           # its prompt is entering the cache, chunk by chunk; it drafts nothing
    DECODE = "decode"             # tokens[-1] is pending: generated, not yet fed to the target
    FINISHED = "finished"         # finish_reason is set; retired at the end of the step


@dataclass
class Sequence:
    """A running request.  Its fields are written by the engine only."""
    seq_id: int
    request: Request
    row: int                      # its row of the target's KV cache (lengths: the row table's)
    tokens: list[int]             # prompt + generated; in DECODE, tokens[-1] is pending
    generator: torch.Generator | None          # verification's randomness (None: greedy)
    draft_generator: torch.Generator | None    # its drafter's (None: greedy)
    stats: RequestStats
    arrival: float
    state: State = State.PREFILL
    finish_reason: str | None = None
    prefilled: int = 0            # prompt positions in the cache (the whole prompt once decoding)
    prompt_feats: dict[int, list[Tensor]] = field(default_factory=dict)   # the drafter's, until the prompt ends
    blocks: list | None = field(default_factory=list)    # its chain in the prefix cache (None: broken)
    drafter: Any = None           # the drafter serving it: its request's, or ``faults.PLAIN`` after a fault
    shaper: Any = None            # its ``constrain.Shaper`` (grammar state, token counts); None: neither
    logprobs: list | None = None          # TokenLogprob per generated token (None: not asked)
    prompt_logprobs: list | None = None   # TokenLogprob per prompt token (None: not asked)

    @property
    def generated(self) -> list[int]:
        return self.tokens[len(self.request.prompt):]

    def finish(self, reason: str) -> None:
        self.finish_reason, self.state = reason, State.FINISHED

    def commit(self, new: list[int]) -> int:
        """Append tokens one at a time, stopping exactly where plain decoding would: at an EOS id,
        a stop string, or ``max_tokens``.  Returns how many were appended."""
        req = self.request
        before = len(self.tokens)
        for tok in new:
            self.tokens.append(tok)
            self.stats.token_times.append(time.perf_counter() - self.arrival)
            if len(self.generated) == 1:
                self.stats.ttft_s = self.stats.token_times[-1]
            if tok in req.eos_ids or (req.stop_fn is not None and req.stop_fn(self.generated)):
                self.finish("stop")
            elif len(self.generated) >= req.max_tokens:
                self.finish("length")
            if self.finish_reason is not None:
                break
        return len(self.tokens) - before


class Clock:
    """Seconds since the last lap, and since the clock started."""

    def __init__(self):
        self.t = self.start = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def lap(self) -> float:
        now = time.perf_counter()
        took, self.t = now - self.t, now
        return took


@dataclass
class StepTimes(Timings):
    """Seconds of one step by phase; a sequence's stats add those of the steps it took part in."""

    def charge(self, stats: RequestStats, decoding: bool) -> None:
        """Add this step to a sequence's stats (a prompt chunk: only the pass it rode in)."""
        stats.add(self, TIMERS if decoding else ("pass_s",))

    def charge_step(self, decoding: list[RequestStats], chunks: list[RequestStats]) -> None:
        """Add this step to the stats of every sequence it advanced (``charge``), and to each an equal
        share of its seconds (``RequestStats.share_s``)."""
        share = sum(self.asdict().values()) / max(len(decoding) + len(chunks), 1)
        for group, whole in ((decoding, True), (chunks, False)):
            for stats in group:
                self.charge(stats, whole)
                stats.share_s += share


@dataclass(kw_only=True)
class StepReport(Timings):
    """What one step did, for metrics: the controller's prediction against the measured pass, and
    the step's seconds by phase."""
    sequences: int
    nodes: list[int]              # nodes verified per sequence
    auto: list[bool]              # whether each sequence's draft size was chosen by the controller
    predicted_s: float | None     # the cost model's prediction for the pass (None: no auto request)
    threads: int = 0              # compute threads of the pass (0: the runtime cannot switch)
    prefill_tokens: int = 0       # prompt tokens the pass carried (chunked prefill)


@dataclass(frozen=True)
class PrefixSnapshot:
    used_bytes: int
    capacity_bytes: int
    blocks: int
    hit_tokens: int
    miss_tokens: int
    stored_blocks: int
    evicted_blocks: int


@dataclass(frozen=True)
class EngineSnapshot:
    """The engine's state for a server's gauges and counters, taken between steps."""
    rows: int                     # KV rows (the most sequences at once)
    free_rows: int
    running: int                  # sequences decoding
    prefilling: int               # sequences whose prompt is still being prefilled
    prefix: PrefixSnapshot | None = None   # the prefix pool's (None: no pool)
    drafter_faults: dict[str, int] = field(default_factory=dict)   # drafter name -> faults so far
