"""The speculative loop: draft, verify in one target pass, accept, compact the KV cache, roll back.

The engine knows no tokenization, HTTP, benchmark or command line.  It owns the target's KV
cache: every compaction and rollback of it.  Requests are admitted with ``admit`` and advanced
together by ``step``; ``generate`` runs a list of requests to completion.  A batch shares each
target pass; every sequence has its own drafter, node budget and sampling settings, and each
drafter proposes a chain or a tree (``specserve.drafters.base``).

Prompts enter in chunks (``specserve.prefill``): ``admit`` only takes a cache row (and copies any
cached prefix into it); each step's pass then carries, besides the running sequences' tokens, the
next chunk of every prompt the controller's step-time budget allows.  While its prompt is being
prefilled a sequence holds ``cache.lengths[row] == prefilled`` positions and drafts nothing; the
pass that ends its prompt gives its first token.

Cache invariant: for a running sequence, ``cache.lengths[row] == len(tokens) - 1``; the last token
(the *pending* token) has been generated but not yet fed to the target.  A step feeds the pending
token and every drafted node at slots ``L .. L + N`` (L = the row's length), verifies, moves the
accepted path's entries to slots ``L + 1 .. L + a`` (``KVCache.compact``; nothing moves for a
chain) and sets the row's length to ``L + 1 + a``: entries past it are dead and overwritten later.
"""

from __future__ import annotations

import bisect
import itertools
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import Tensor

from specserve.control import CostModel, prefill_shares
from specserve.drafters.base import DraftProposal, DraftRequest, Drafter, Feedback
from specserve.drafters.registry import AUTO
from specserve.errors import SpecserveError
from specserve.models.loader import LoadedModel
from specserve.prefill import Prefill, PrefillPolicy
from specserve.prefix_cache import BLOCK
from specserve.sampling import SamplingParams, sample
from specserve.sizing import Sizer, Slot
from specserve.stats import RequestStats
from specserve.step_verify import verify_rows

MAX_DRAFT = 32          # largest node budget (draft length) a request may ask for
SWITCH_INTERVAL_S = 0.0002


@dataclass
class Request:
    prompt: list[int]
    max_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    drafter: str = "none"
    num_draft: int | str = 0           # draft length (tree drafters: node budget), or "auto": the controller's
    eos_ids: frozenset[int] = frozenset()
    stop_fn: Callable[[list[int]], bool] | None = None   # True when generated tokens hit a stop string


@dataclass
class Result:
    tokens: list[int]
    finish_reason: str            # "stop" (EOS or stop string), "length" or "abort"
    stats: RequestStats


@dataclass
class Sequence:
    seq_id: int
    request: Request
    row: int
    tokens: list[int]             # prompt + generated; tokens[-1] is pending
    generator: torch.Generator | None
    stats: RequestStats
    arrival: float
    finish_reason: str | None = None
    prefilled: int = 0            # prompt positions in the cache (the whole prompt once running)
    prompt_feats: dict[int, list[Tensor]] = field(default_factory=dict)   # the drafter's, until the prompt ends
    blocks: list | None = field(default_factory=list)    # its chain in the prefix cache (None: broken)

    @property
    def generated(self) -> list[int]:
        return self.tokens[len(self.request.prompt):]

    @property
    def prefilling(self) -> bool:
        return self.prefilled < len(self.request.prompt)


@dataclass
class StepReport:
    """What one step did, for metrics: the controller's prediction against the measured pass."""
    sequences: int
    nodes: list[int]              # nodes verified per sequence
    auto: list[bool]              # whether each sequence's draft size was chosen by the controller
    predicted_s: float | None     # the cost model's prediction for the pass (None: no auto request)
    measured_s: float             # the pass and verification, measured
    threads: int = 0              # compute threads of the pass (0: the runtime cannot switch)
    prefill_tokens: int = 0       # prompt tokens the pass carried (chunked prefill)


class Engine:
    def __init__(self, target: LoadedModel, drafters: dict[str, Drafter], max_batch: int = 16,
                 max_len: int | None = None, prefill: PrefillPolicy | None = None):
        if max_batch < 1:
            raise SpecserveError(f"max_batch must be >= 1, got {max_batch}")
        limit = target.config.max_position_embeddings
        self.max_len = min(max_len or limit, limit)
        if self.max_len < 2:
            raise SpecserveError(f"max_len must be >= 2, got {max_len}")
        self.target, self.model = target, target.model
        self.drafters = dict(drafters)
        for d in self.drafters.values():
            d.bind(max_batch, self.max_len)
        self.cache = self.model.new_cache(max_batch, self.max_len, slack=MAX_DRAFT + 1)
        self._free_rows = list(range(max_batch))
        self._running: list[Sequence] = []
        self._finished: dict[int, Result] = {}
        self._ids = itertools.count()
        self.sizer = Sizer(self.model, self.drafters, max_batch, MAX_DRAFT)    # auto draft sizes, threads
        policy = prefill or PrefillPolicy()
        layers = tuple(sorted({x for d in self.drafters.values() for x in d.feature_layers}))
        self.prefill = Prefill(policy, self.cache, layers, target.config.hidden_size)
        # most prompt tokens per pass: the policy's chunk, within the runtime's batch-invariant run
        self.prompt_tokens_max = min(policy.chunk, self.model.invariant_tokens or policy.chunk) \
            if policy.chunk is not None else self.max_len
        self.last_step: StepReport | None = None
        # Python hands its lock between threads every 5 ms by default: a busy thread elsewhere in the
        # process would then hold the engine's thread up to 5 ms at each handoff (every torch call
        # releases the lock).  Unless the user chose an interval, use 0.2 ms.
        if sys.getswitchinterval() >= 0.005:
            sys.setswitchinterval(SWITCH_INTERVAL_S)

    def calibrate(self) -> CostModel:
        """Measure the cost model now (a few seconds; done anyway before the first auto request)."""
        return self.sizer.calibrate()

    def release_threads(self) -> bool:
        """Call from a thread that has run passes (loading, calibration) and will run no more, before
        another thread runs the engine: ends the calling thread's pool of compute threads, since
        with more pooled threads than cores every parallel region would wake its workers through the
        kernel (``scripts/engine_thread.py``: 63-65 against 100-101 tok/s).  Returns whether a pool was ended."""
        return self.model.release_threads()

    # ------------------------------------------------------------------ what the scheduler may use
    def check(self, req: Request) -> None:
        """Refuse a request that cannot be served, before anything is allocated."""
        if not req.prompt:
            raise SpecserveError("empty prompt", "prompt")
        if req.max_tokens < 1:
            raise SpecserveError(f"max_tokens must be >= 1, got {req.max_tokens}", "max_tokens")
        if len(req.prompt) + req.max_tokens > self.max_len:
            raise SpecserveError(f"prompt ({len(req.prompt)} tokens) + max_tokens ({req.max_tokens}) exceeds "
                                 f"the context length {self.max_len}", "max_tokens")
        if req.drafter not in self.drafters:
            raise SpecserveError(f"drafter {req.drafter!r} is not loaded; loaded: {', '.join(self.drafters)}",
                                 "drafter")
        if req.num_draft != AUTO and (isinstance(req.num_draft, bool) or not isinstance(req.num_draft, int)
                                      or not 0 <= req.num_draft <= MAX_DRAFT):
            raise SpecserveError(f"num_draft must be 'auto' or in [0, {MAX_DRAFT}], got {req.num_draft!r}",
                                 "num_draft")
        vocab = self.target.config.vocab_size
        if any(not 0 <= t < vocab for t in req.prompt):
            raise SpecserveError(f"prompt token ids must be in [0, {vocab})", "prompt")
        self.drafters[req.drafter].validate(req.sampling)

    @property
    def free_capacity(self) -> int:
        """Sequences that can still be admitted (free KV rows)."""
        return len(self._free_rows)

    @property
    def has_capacity(self) -> bool:
        return bool(self._free_rows)

    @property
    def num_running(self) -> int:
        return len(self._running)

    def progress(self, seq_id: int) -> list[int] | None:
        """Tokens generated so far by a running sequence (None once it is no longer running)."""
        s = self._find(seq_id)
        return s.generated if s is not None else None

    def take_result(self, seq_id: int) -> Result | None:
        """The result of a finished sequence, handed over once (None if it has not finished)."""
        return self._finished.pop(seq_id, None)

    def admit(self, req: Request) -> int:
        """Admit a request: take a cache row and copy in any cached prefix of its prompt; the rest
        is prefilled in chunks by the next steps.  Returns its id."""
        self.check(req)
        if not self._free_rows:
            raise RuntimeError("no free batch slot; check has_capacity first")
        if req.num_draft == AUTO:
            self.calibrate()
        seq_id = next(self._ids)
        drafter = self.drafters[req.drafter]
        drafter.begin(seq_id, req.prompt, req.sampling, req.max_tokens)
        gen = None
        if not req.sampling.greedy:
            gen = torch.Generator(device=self.model.device)
            gen.manual_seed(req.sampling.seed if req.sampling.seed is not None else int(torch.randint(2**62, (1,))))
        stats = RequestStats(drafter=req.drafter, synthetic=drafter.synthetic, prompt_tokens=len(req.prompt),
                             auto=req.num_draft == AUTO)
        # the clock starts after drafter.begin: the oracle's set-up is a study aid, not serving time
        seq = Sequence(seq_id, req, self._free_rows.pop(0), list(req.prompt), gen, stats, time.perf_counter())
        self.cache.truncate(seq.row, 0)
        for layer, f in self.prefill.reuse(seq, self.cache, drafter.feature_layers).items():
            seq.prompt_feats[layer] = [f]
        self._running.append(seq)
        return seq_id

    def abort(self, seq_id: int) -> None:
        """Drop a running sequence now (client gone); its slot is free for the next step."""
        s = self._find(seq_id)
        if s is not None:
            s.finish_reason = "abort"
            self._retire(s)
            self._finished.pop(seq_id, None)

    def reset(self) -> None:
        """Drop every sequence, running or finished: drafters forget them, all rows are free."""
        for s in list(self._running):
            self.drafters[s.request.drafter].end(s.seq_id)
        self._running.clear()
        self._finished.clear()
        self._free_rows = list(range(self.cache.rows))

    # ------------------------------------------------------------------ the loop
    @torch.inference_mode()
    def step(self) -> list[int]:
        """Advance every running sequence by one verification pass, and the prompts being prefilled
        by one chunk each, as the budget allows.  Returns ids that finished."""
        seqs = [s for s in self._running if not s.prefilling]
        prompts = [s for s in self._running if s.prefilling]
        if not seqs and not prompts:
            return []
        slots = {s.seq_id: Slot(s.seq_id, s.request.drafter, s.request.num_draft, self.cache.lengths[s.row])
                 for s in seqs}
        auto = any(x.num_draft == AUTO for x in slots.values())

        # 1. draft: each drafter proposes a chain or a tree within its sequence's node budget (for
        #    auto requests, an upper bound from the controller)
        t0 = time.perf_counter()
        proposals = self._draft(seqs, slots)
        # 2. size: over the whole batch, keep the auto drafts' nodes that maximise tokens per second
        probed = {i for i, x in slots.items() if x.num_draft == AUTO and self.sizer.probe(x).due()}
        predicted = self.sizer.size(list(slots.values()), proposals, probed) if auto else None
        t_draft = time.perf_counter() - t0
        lengths = [len(proposals[s.seq_id]) + 1 for s in seqs]
        contexts = [slots[s.seq_id].context for s in seqs]
        # 3. prompts: the next chunk of each prompt being prefilled, as many tokens as keep the pass
        #    within the step-time budget (first come, first served)
        chunks = self._chunks(prompts, lengths, contexts)

        # 4. one ragged target pass: the pending token and every kept node, for all sequences, then
        #    the prompt chunks (on the number of threads the governor picks: threads change the
        #    speed, never the bits)
        threads = self.sizer.pick_threads()
        t0 = time.perf_counter()
        out, offsets = self._target_pass(seqs, proposals, lengths, contexts, chunks)
        t_pass = time.perf_counter() - t0
        if not chunks:                # the cost model's correction learns from decoding passes only
            self.sizer.observe_pass(threads, lengths, contexts, t_pass)

        # 5. verification: greedy rows by argmax, sampled rows by (recursive) rejection sampling
        outcomes = verify_rows(seqs, proposals, out.logits, offsets) if seqs else {}
        t_verify = time.perf_counter() - t0

        # 6. commit accepted tokens (a stop inside the run ends it there), 7. compact and roll back
        #    the KV cache, 8. feed back to the drafters and to the controller's models
        for i, s in enumerate(seqs):
            o, prop = outcomes[s.seq_id], proposals[s.seq_id]
            old_len = self.cache.lengths[s.row]
            kept = [0] + [n + 1 for n in o.path]              # pass indices the cache keeps, in order
            self.cache.compact(s.row, old_len, kept)
            self.cache.truncate(s.row, old_len + len(kept))
            depth = max(prop.depths(), default=0)
            s.stats.record_step(len(prop), depth, len(o.path))
            drafter = self.drafters[s.request.drafter]
            feats = {layer: out.features[layer][[offsets[i] + j for j in kept]] for layer in drafter.feature_layers}
            argmax = (out.logits[offsets[i]:offsets[i] + lengths[i]].argmax(-1).tolist()
                      if drafter.wants_predictions else None)
            drafter.feedback(Feedback(s.seq_id, prop, o.path, o.tokens, feats, argmax))
            self.sizer.learn(slots[s.seq_id], prop, depth, len(o.path), s.seq_id in probed)
            self._commit(s, o.tokens)
            s.stats.draft_s += t_draft
            s.stats.verify_s += t_verify
            if predicted is not None:
                s.stats.step_predicted_s.append(predicted)
                s.stats.step_measured_s.append(t_pass)
        # 9. prompts: keep the chunk's positions (and store the prefix blocks it completed); a prompt
        #    whose last chunk this was takes its first token from the pass and starts decoding
        self._advance_prompts(chunks, out, offsets[len(seqs):], sum(lengths), t_pass)
        self.last_step = StepReport(len(seqs), [n - 1 for n in lengths],
                                    [slots[s.seq_id].num_draft == AUTO for s in seqs], predicted, t_pass, threads,
                                    sum(n for _, n in chunks))
        done = [s for s in seqs + [s for s, _ in chunks] if s.finish_reason is not None]
        for s in done:
            self._retire(s)
        return [s.seq_id for s in done]

    def _chunks(self, prompts: list[Sequence], lengths: list[int], contexts: list[int]) -> list[tuple[Sequence, int]]:
        """(prompt, tokens) for each prompt this step's pass advances: prompts that one chunk can
        finish first (a short prompt does not wait behind a long one), then the others, each class
        first come first served."""
        if not prompts:
            return []
        prompts = sorted(prompts, key=lambda s: len(s.request.prompt) - s.prefilled > self.prompt_tokens_max)
        cost = None                                # chunking off: every prompt whole, whatever runs beside it
        if lengths and self.prefill.policy.chunk is not None:
            cost = self.sizer.calibrate()          # a few seconds, once (the server does it at start)
        left = [(s.prefilled, len(s.request.prompt) - s.prefilled) for s in prompts]
        shares = prefill_shares(cost, lengths, contexts, left, self.prompt_tokens_max, BLOCK,
                                self.prefill.policy.stall)
        return [(s, n) for s, n in zip(prompts, shares) if n > 0]

    def _advance_prompts(self, chunks: list[tuple[Sequence, int]], out, offsets: list[int], first_logit: int,
                         t_pass: float) -> None:
        """After the pass: each chunk's positions are now cached; a finished prompt samples its first
        token from logits row ``first_logit + j`` (j: its rank among the finished) and is fed back."""
        j = 0
        for (s, n), at in zip(chunks, offsets):
            drafter = self.drafters[s.request.drafter]
            feats = {layer: f[at:at + n] for layer, f in out.features.items()}
            for layer in drafter.feature_layers:
                s.prompt_feats.setdefault(layer, []).append(feats[layer].clone())
            start = s.prefilled
            s.prefilled += n
            self.cache.truncate(s.row, s.prefilled)
            self.prefill.store_chunk(s, self.cache, start, feats)
            s.stats.target_passes += 1
            s.stats.prefill_passes += 1
            s.stats.verify_s += t_pass
            if s.prefilling:
                continue
            first = int(sample(out.logits[first_logit + j], s.request.sampling, s.generator))
            j += 1
            prompt_feats = {layer: torch.cat(fs) for layer, fs in s.prompt_feats.items()}
            s.prompt_feats = {}
            drafter.feedback(Feedback(s.seq_id, DraftProposal([]), [], [first], prompt_feats))
            self._commit(s, [first])

    def _draft(self, seqs: list[Sequence], slots: dict[int, Slot]) -> dict[int, DraftProposal]:
        """Proposals per sequence, cut to the node budget and to the tokens still to generate."""
        out: dict[int, DraftProposal] = {}
        by_drafter: dict[str, list[Sequence]] = {}
        for s in seqs:
            by_drafter.setdefault(s.request.drafter, []).append(s)
        vocab = self.target.config.vocab_size
        batch = list(slots.values())
        for name, group in by_drafter.items():
            reqs = []
            for s in group:
                depth = max(0, s.request.max_tokens - len(s.generated) - 1)   # never draft past max_tokens
                budget = self.sizer.budget(slots[s.seq_id], batch, depth) if depth else 0
                reqs.append(DraftRequest(s.seq_id, s.tokens, budget, s.request.sampling, depth))
            t0 = time.perf_counter()
            props = self.drafters[name].propose(reqs)
            self.sizer.observe_draft(name, time.perf_counter() - t0, sum(1 for r in reqs if r.k > 0))
            for s, r, prop in zip(group, reqs, props):
                prop = prop.truncated(r.k, r.max_depth)
                prop.check(vocab)
                out[s.seq_id] = prop
        return out

    def _target_pass(self, seqs: list[Sequence], proposals: dict[int, DraftProposal], lengths: list[int],
                     contexts: list[int], chunks: list[tuple[Sequence, int]]):
        """One ragged pass: sequence b contributes [pending token] + its node tokens (lengths[b]),
        nothing padded, after its contexts[b] cached positions; node parents shift by one (the pending
        token is the sequence's index 0).  Then each prompt chunk, a chain after the prompt's cached
        positions.  Logits come back for the sequences' rows (in pass order) and then for the last
        row of each chunk that ends its prompt; no LM head runs for the other chunk rows.  A pass of
        chains only passes no parents.  Returns the pass output and each sequence's and chunk's
        first row in it."""
        tokens, parents, rows = [], [], [s.row for s in seqs]
        for s in seqs:
            prop = proposals[s.seq_id]
            tokens += [s.tokens[-1]] + prop.tokens
            parents += [-1] + [p + 1 for p in prop.parent_list()]
        decode_rows = len(tokens)
        ends = []
        for s, n in chunks:
            tokens += s.request.prompt[s.prefilled:s.prefilled + n]
            parents += list(range(-1, n - 1))
            if s.prefilled + n == len(s.request.prompt):
                ends.append(len(tokens) - 1)
        all_lengths = lengths + [n for _, n in chunks]
        trees = not all(proposals[s.seq_id].is_chain for s in seqs)
        used = [self.drafters[s.request.drafter] for s in seqs + [s for s, _ in chunks]]
        layers = {x for d in used for x in d.feature_layers}
        layers = tuple(sorted(layers | set(self.prefill.feature_layers if chunks else ())))
        dev = self.model.device
        out = self.model(torch.tensor(tokens, device=dev), self.cache, rows + [s.row for s, _ in chunks],
                         contexts + [s.prefilled for s, _ in chunks], lengths=all_lengths,
                         parents=torch.tensor(parents, device=dev) if trees else None, features=layers,
                         logits_for=list(range(decode_rows)) + ends if chunks else None)
        offsets = list(itertools.accumulate([0] + all_lengths[:-1]))
        return out, offsets

    def _commit(self, s: Sequence, new: list[int]) -> None:
        """Append tokens one at a time, stopping exactly where plain decoding would."""
        req = s.request
        for tok in new:
            s.tokens.append(tok)
            s.stats.token_times.append(time.perf_counter() - s.arrival)
            if len(s.generated) == 1:
                s.stats.ttft_s = s.stats.token_times[-1]
            if tok in req.eos_ids or (req.stop_fn is not None and req.stop_fn(s.generated)):
                s.finish_reason = "stop"
            elif len(s.generated) >= req.max_tokens:
                s.finish_reason = "length"
            if s.finish_reason is not None:
                break

    def _retire(self, s: Sequence) -> None:
        if s.finish_reason != "abort" and not s.prefilling:
            self.prefill.store_generated(s, self.cache)
        self.sizer.forget(s.seq_id)
        s.stats.generated_tokens = len(s.generated)
        s.stats.total_s = time.perf_counter() - s.arrival
        self.drafters[s.request.drafter].end(s.seq_id)
        self._running.remove(s)
        # the lowest free row is taken next, so the cache pages touched follow the concurrency, not the history
        bisect.insort(self._free_rows, s.row)
        self._finished[s.seq_id] = Result(s.generated, s.finish_reason or "length", s.stats)

    def _find(self, seq_id: int) -> Sequence | None:
        return next((s for s in self._running if s.seq_id == seq_id), None)

    # ------------------------------------------------------------------ convenience
    def generate(self, requests: list[Request]) -> list[Result]:
        """Run requests to completion, batching up to max_batch at a time; results in order."""
        for r in requests:
            self.check(r)
        waiting = list(enumerate(requests))
        ids: dict[int, int] = {}
        while waiting or self._running:
            while waiting and self.has_capacity:
                i, r = waiting.pop(0)
                ids[i] = self.admit(r)
            self.step()
        return [self._finished.pop(ids[i]) for i in range(len(requests))]
