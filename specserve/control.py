"""Adaptive speculation: what a pass costs, what a draft is worth, and how big each draft should be.

The controller decides from numbers the engine gives it and calls nothing.  Terms:

* **gain** of a draft node: the expected number of tokens it adds to its sequence, i.e. the
  probability that it is accepted (for a chain's d-th token: the product of the per-depth
  acceptance rates up to d; for a node with a drafter-supplied confidence: that confidence times a
  calibration factor learnt from what was accepted), plus the node's ``future_gain`` if the drafter
  gives one (tokens it is expected to win in later steps, as lookahead's window nodes do; never
  calibrated against this step's acceptance).  A draft's expected accepted length is the sum
  of its nodes' gains.
* **rate** of a step: the expected tokens committed by the whole batch (one per sequence, plus the
  gains of every kept node) divided by the predicted seconds of its target pass.

Each step the controller keeps, over the whole batch, the nodes with the highest gains, as many as
maximise the rate; a node is never kept without its parent (gains never grow along a path), and 0
nodes, plain decoding, is always a candidate, so speculation is only kept where it is predicted to
pay.  A sequence whose drafts have not been kept for a while is probed (its best node kept anyway),
so that a drafter that became useful again is noticed.

``CostModel``: seconds of one ragged pass as a function of its total tokens (interpolated from a
calibration at start-up) plus attention work (tokens times cached keys), times an online correction
(the ratio of measured to predicted step times, which also shows contention with other programs).
``AcceptanceModel``: per sequence and per drafter, exponentially decayed counts of acceptance at
each depth and of predicted against accepted tokens for confidence-carrying drafts; a new sequence
starts from its drafter's recent history.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field, replace

import numpy as np
import torch

# ------------------------------------------------------------------------------------------ cost
LONG_RUN = 16      # a sequence's run of this many tokens in a pass (a prompt chunk) has its own measured attention term


@dataclass
class CostModel:
    tokens: list[int]             # calibrated pass sizes (total tokens)
    seconds: list[float]          # their measured seconds, at a short context
    per_key: float                # seconds per (token x cached key) of attention
    context: int = 64             # the context the table was measured at
    scale: float = 1.0            # online correction: measured / predicted, decayed average
    observed: int = 0
    per_key_run: float | None = None   # the same for a sequence's run of >= LONG_RUN tokens (a prompt
                                       # chunk: its queries share each key read); None: per_key

    def base(self, m: int) -> float:
        """Seconds of a pass of m tokens at the calibration context (linear beyond the table)."""
        if m <= self.tokens[-1]:
            return float(np.interp(m, self.tokens, self.seconds))
        slope = (self.seconds[-1] - self.seconds[-2]) / max(self.tokens[-1] - self.tokens[-2], 1)
        return self.seconds[-1] + slope * (m - self.tokens[-1])

    def raw(self, lengths: list[int], contexts: list[int]) -> float:
        """Seconds of a ragged pass on the machine as calibrated: lengths[b] tokens of a sequence
        holding contexts[b] positions."""
        run = self.per_key if self.per_key_run is None else self.per_key_run
        attention = sum(n * max(c + n - self.context, 0) * (run if n >= LONG_RUN else self.per_key)
                        for n, c in zip(lengths, contexts))
        return self.base(sum(lengths)) + attention

    def predict(self, lengths: list[int], contexts: list[int]) -> float:
        """``raw`` times the online correction: the machine as it has been lately."""
        return self.scale * self.raw(lengths, contexts)

    def observe(self, lengths: list[int], contexts: list[int], seconds: float, weight: float = 0.2) -> None:
        """Fold a measured pass time into the correction factor."""
        raw = self.raw(lengths, contexts)
        if raw > 0 and seconds > 0:
            ratio = min(max(seconds / raw, 0.1), 20.0)
            self.scale = (1 - weight) * self.scale + weight * ratio if self.observed else ratio
            self.observed += 1

    def describe(self) -> list[str]:
        """Rows for ``specserve profile``: the table and the attention term."""
        out = [f"| {m} | {s * 1e3:.2f} |" for m, s in zip(self.tokens, self.seconds)]
        return ["| tokens in the pass | ms (context %d) |" % self.context, "|---|---|", *out,
                f"attention: {self.per_key * 1e9:.2f} ns per token per cached key beyond {self.context}"
                + (f" ({self.per_key_run * 1e9:.2f} in runs of {LONG_RUN}+ tokens)" if self.per_key_run is not None else "")]


_CALIBRATED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
CALIBRATION_TOKENS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32, 48, 64, 96, 128)


@torch.inference_mode()
def calibrate(model, max_tokens: int = 128, context: int = 64, long_context: int = 1024,
              reps: int = 3, seed: int = 0) -> CostModel:
    """Measure pass times of ``model`` (a Decoder) on a scratch cache: total tokens 1 .. max_tokens
    split into rows of at most 8, at ``context`` cached positions, and a 1-token pass at
    ``long_context`` for the attention term.  A few seconds on the default model; cached per model."""
    cached = _CALIBRATED.get(model)
    if cached is not None and cached.tokens[-1] >= min(max_tokens, CALIBRATION_TOKENS[-1]):
        return replace(cached)          # a copy: its online correction is the caller's
    sizes = [m for m in CALIBRATION_TOKENS if m <= max(max_tokens, 2)]
    rows = -(-sizes[-1] // 8)
    long_context = max(min(long_context, model.config.max_position_embeddings - 16), context + 1)
    short = model.new_cache(rows, context + 4 * LONG_RUN + 16)
    long = model.new_cache(1, long_context + 16)
    g = torch.Generator().manual_seed(seed)
    vocab, dev = model.config.vocab_size, model.device
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)   # time kernels, not launches
    for r in range(rows):
        model(torch.randint(0, vocab, (1, context), generator=g).to(dev), short, [r], [0], last_only=True)
    model(torch.randint(0, vocab, (1, long_context), generator=g).to(dev), long, [0], [0], last_only=True)

    def timed(cache, lengths: list[int], start: int) -> float:
        x = torch.randint(0, vocab, (sum(lengths),), generator=g).to(dev)
        best = []
        for rep in range(reps + 1):
            sync()
            t = time.perf_counter()
            model(x, cache, list(range(len(lengths))), [start] * len(lengths), lengths=lengths)
            sync()
            if rep:
                best.append(time.perf_counter() - t)
        return sorted(best)[len(best) // 2]

    seconds = [timed(short, [8] * (m // 8) + ([m % 8] if m % 8 else []), context) for m in sizes]
    near = timed(short, [1], context)
    far = timed(long, [1], long_context)
    per_key = max(far - near, 0.0) / max(long_context - context, 1)
    run = 4 * LONG_RUN                                             # a prompt chunk's run, near and far
    near_run = timed(short, [run], context)
    far_run = timed(long, [run], long_context - run)
    per_key_run = max(far_run - near_run, 0.0) / (run * max(long_context - run - context, 1))
    seconds = list(np.maximum.accumulate(seconds))                 # a bigger pass never costs less
    cost = CostModel(sizes, seconds, per_key, context, per_key_run=per_key_run)
    _CALIBRATED[model] = cost
    return replace(cost)


# ------------------------------------------------------------------------------------ prefill
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


# ------------------------------------------------------------------------------------ acceptance
@dataclass
class _Counts:
    """Decayed counts: per depth, trials and acceptances; for confidences, predicted and accepted."""
    trials: list[float] = field(default_factory=list)
    accepted: list[float] = field(default_factory=list)
    predicted_sum: float = 0.0
    accepted_sum: float = 0.0

    def add_depths(self, reached: int, accepted: int, decay: float) -> None:
        """A chain of ``reached`` tokens of which ``accepted`` were accepted: depth d was a trial
        if d <= reached and the d-1 before it were accepted."""
        while len(self.trials) < reached:
            self.trials.append(0.0)
            self.accepted.append(0.0)
        for d in range(min(reached, accepted + 1)):
            self.trials[d] = decay * self.trials[d] + 1.0
            self.accepted[d] = decay * self.accepted[d] + (1.0 if d < accepted else 0.0)

    def add_confidence(self, predicted: float, accepted: int, decay: float) -> None:
        self.predicted_sum = decay * self.predicted_sum + predicted
        self.accepted_sum = decay * self.accepted_sum + accepted


class AcceptanceModel:
    """Acceptance per sequence, with its drafter's recent history as the prior."""

    def __init__(self, prior_weight: float = 3.0, decay: float = 0.9, drafter_decay: float = 0.98,
                 initial_rate: float = 0.5):
        self.prior_weight, self.decay, self.drafter_decay = prior_weight, decay, drafter_decay
        self.initial_rate = initial_rate
        self.by_seq: dict[int, _Counts] = {}
        self.by_drafter: dict[str, _Counts] = {}

    def forget(self, seq_id: int) -> None:
        self.by_seq.pop(seq_id, None)

    def _rate(self, drafter: str, seq_id: int, d: int) -> float:
        """P(accept depth d+1 | depths 1..d accepted): the sequence's counts, shrunk to the drafter's."""
        prior = self.by_drafter.get(drafter, _Counts())
        p_trials = prior.trials[d] if d < len(prior.trials) else 0.0
        p_acc = prior.accepted[d] if d < len(prior.accepted) else 0.0
        if d and p_trials < 1.0:                       # no history this deep: carry the rate above
            prior_rate = self._rate(drafter, seq_id, d - 1) if p_trials <= 0 else (p_acc + 1.0 * self._rate(
                drafter, seq_id, d - 1)) / (p_trials + 1.0)
        else:
            prior_rate = (p_acc + self.initial_rate) / (p_trials + 1.0)
        own = self.by_seq.get(seq_id, _Counts())
        o_trials = own.trials[d] if d < len(own.trials) else 0.0
        o_acc = own.accepted[d] if d < len(own.accepted) else 0.0
        return (o_acc + self.prior_weight * prior_rate) / (o_trials + self.prior_weight)

    def chain_gains(self, drafter: str, seq_id: int, k: int) -> list[float]:
        """Gain of each of a chain's first k tokens: products of the per-depth rates."""
        out, p = [], 1.0
        for d in range(k):
            p *= self._rate(drafter, seq_id, d)
            out.append(p)
        return out

    def calibration(self, drafter: str, seq_id: int) -> float:
        """Accepted tokens per unit of drafter confidence (1.0 until something was measured)."""
        prior = self.by_drafter.get(drafter, _Counts())
        prior_cal = (prior.accepted_sum + 1.0) / (prior.predicted_sum + 1.0)
        own = self.by_seq.get(seq_id, _Counts())
        return (own.accepted_sum + self.prior_weight * prior_cal) / (own.predicted_sum + self.prior_weight)

    def node_gains(self, drafter: str, seq_id: int, depths: list[int], confidence: list[float] | None) -> list[float]:
        """Gain of every node of a proposal: calibrated confidences, or the chain gains by depth."""
        if confidence is not None:
            c = self.calibration(drafter, seq_id)
            return [min(max(x * c, 0.0), 1.0) for x in confidence]
        by_depth = self.chain_gains(drafter, seq_id, max(depths, default=0))
        return [by_depth[d - 1] for d in depths]

    def observe(self, drafter: str, seq_id: int, reached: int, accepted: int, predicted: float | None) -> None:
        """A verified draft: ``reached`` = its depth, ``accepted`` tokens, ``predicted`` = the sum of
        its calibrated-before-use confidences (None for drafts without confidences)."""
        for counts, decay in ((self.by_seq.setdefault(seq_id, _Counts()), self.decay),
                              (self.by_drafter.setdefault(drafter, _Counts()), self.drafter_decay)):
            if predicted is None:
                counts.add_depths(reached, accepted, decay)
            else:
                counts.add_confidence(predicted, accepted, decay)


# ------------------------------------------------------------------------------------ controller
@dataclass
class Candidate:
    """One sequence in a step, as the controller sees it."""
    seq_id: int
    context: int                  # positions cached before the step
    gains: list[float]            # per drafted node (in proposal order); fixed drafts: their gains
    parents: list[int]            # per node (-1: child of the pending token)
    fixed: bool = False           # a request that asked for an exact draft length: keep every node
    probe: bool = False           # keep the best node even if it does not pay
    draft_s: float = 0.0          # what drafting costs this sequence per step (seconds), paid again
                                  # next step only if some of its nodes are kept now


def choose(cands: list[Candidate], cost: CostModel) -> tuple[dict[int, list[int]], float]:
    """Nodes to keep per sequence (indices into its proposal, in order), maximising the rate.

    Nodes enter best-first; a node's gain is first capped at its parent's, so that with ties broken
    by index a parent always enters before its children and every prefix of the order is a set of
    trees.  Fixed drafts are kept whole; a probed sequence's first node is kept whatever it pays.
    A sequence that keeps nodes is charged its drafter's cost (``draft_s``) on top of the pass, so
    a drafter whose drafting costs more than its tokens save is not kept.
    Returns ({seq_id: kept node indices}, predicted seconds of the chosen pass).
    """
    order: list[tuple[float, int, int]] = []           # (-gain, candidate, node)
    forced: list[tuple[int, int]] = []
    for i, c in enumerate(cands):
        if c.fixed:
            continue
        capped: list[float] = []
        for n, (g, p) in enumerate(zip(c.gains, c.parents)):
            capped.append(min(g, capped[p]) if p >= 0 else g)
            if c.probe and n == 0:
                forced.append((i, 0))
            else:
                order.append((-capped[n], i, n))
    order.sort()
    steps = forced + [(i, n) for _, i, n in order]
    lengths = [1 + (len(c.gains) if c.fixed else 0) for c in cands]
    contexts = [c.context for c in cands]
    gain = sum(sum(c.gains) for c in cands if c.fixed) + len(cands)     # expected tokens committed
    best_n, best_rate, best_cost = 0, -1.0, 0.0
    drafting = 0.0
    for n in range(len(steps) + 1):
        if n:
            i, node = steps[n - 1]
            lengths[i] += 1
            gain += cands[i].gains[node]
            if lengths[i] == 2:
                drafting += cands[i].draft_s
        if n < len(forced):
            continue
        seconds = cost.predict(lengths, contexts)
        rate = gain / (seconds + drafting) if seconds > 0 else 0.0
        if rate > best_rate * (1 + 1e-9):
            best_n, best_rate, best_cost = n, rate, seconds
    keep = {c.seq_id: (list(range(len(c.gains))) if c.fixed else []) for c in cands}
    for i, node in steps[:best_n]:
        keep[cands[i].seq_id].append(node)
    return {k: sorted(v) for k, v in keep.items()}, best_cost


@dataclass
class ProbeState:
    """When a sequence's drafts were last kept, and how long to wait before probing again."""
    idle: int = 0
    gap: int = 8

    def due(self) -> bool:
        return self.idle >= self.gap

    def update(self, kept: int, accepted: int, probed: bool, max_gap: int = 128) -> None:
        if kept:
            self.idle = 0
            if probed:
                self.gap = 8 if accepted else min(self.gap * 2, max_gap)
        else:
            self.idle += 1


# ------------------------------------------------------------------------------------- threads
class ThreadGovernor:
    """How many compute threads the runtime should use, from measured pass times.

    On a machine shared with other busy programs, threads that must meet at every kernel run at the
    pace of the one whose core is taken: two threads can then be three times slower than one.  The
    governor keeps, for each thread count, a decayed average of measured over calibrated pass time,
    uses the count with the lowest, and now and then runs one step with the other count to notice
    when the machine changed (rarely when the other was much worse, since each such step costs).
    Threads never change the numerics (see the native kernels), only the speed.
    """

    def __init__(self, choices: tuple[int, ...], explore_every: int = 24, weight: float = 0.3, burst: int = 2):
        self.choices, self.explore_every, self.weight, self.burst = choices, explore_every, weight, burst
        self.ratio: dict[int, float | None] = {n: None for n in choices}
        self.current = choices[0]
        self.steps = 0
        self.switches = 0
        self._exploring: int | None = None     # the count a look at the other is running with
        self._left = 0                         # steps of that look still to run
        self._skip = False                     # the look's first pass pays for the switch: not counted

    def next(self) -> int:
        """The thread count for the next step."""
        self.steps += 1
        others = [n for n in self.choices if n != self.current]
        if not others:
            return self.current
        if self._left:
            self._left -= 1
            return self._exploring
        other = min(others, key=lambda n: self.ratio[n] if self.ratio[n] is not None else 0.0)
        mine, theirs = self.ratio[self.current], self.ratio[other]
        gap = 1.0 if theirs is None or not mine else theirs / mine
        # a much worse option is looked at rarely, unless it is the default: a machine that became
        # free again should get all its cores back soon.  A look runs ``burst`` passes and counts only
        # the last: the first pass after a change of thread count wakes or parks threads, and would
        # make every look at the other count seem slower than it is
        every = self.explore_every * (4 if gap > 1.4 and self.current == self.choices[0] else 1)
        if self.steps % every:
            return self.current
        self._exploring, self._left, self._skip = other, self.burst - 1, self.burst > 1
        return other

    def observe(self, threads: int, ratio: float) -> None:
        """A step ran with ``threads`` and took ``ratio`` times its calibrated time."""
        if threads not in self.ratio or ratio <= 0:
            return
        if self._skip and threads == self._exploring:
            self._skip = False
            return
        old = self.ratio[threads]
        w = self.weight if threads == self.current else 1.0      # a rare look at the other: take it as is
        self.ratio[threads] = ratio if old is None else (1 - w) * old + w * ratio
        known = {n: r for n, r in self.ratio.items() if r is not None}
        best = min(known, key=known.get)
        # (the current count may not be measured yet: steps that carry prompt chunks are not observed)
        if best != self.current and self.current in known and known[best] < known[self.current] * 0.9:
            self.current = best
            self.switches += 1
