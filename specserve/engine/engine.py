"""The speculative loop: draft, verify in one target pass, accept, compact the KV cache, roll back.

The engine knows no tokenization, HTTP, benchmark or command line.  It owns the target's KV cache
(every change of a row's length goes through its row table, ``specserve.engine.rows``), the
sequences, and the order of a step's phases; the controller (``specserve.control``) decides sizes
from the numbers the engine gives it, the drafters propose, ``specserve.verify`` verifies.

Requests are admitted with ``admit`` and advanced together by ``step``; ``generate`` runs a list
of requests to completion.  A batch shares each target pass; every sequence has its own drafter,
node budget, sampling settings and generators.  Prompts enter in chunks: ``admit`` only takes a
cache row (and copies any cached prefix into it); each step's pass then carries, besides the
decoding sequences' tokens, the next chunk of every prompt the prefill planner allows.  While its
prompt is being prefilled a sequence is in state PREFILL and drafts nothing; the pass that ends
its prompt gives its first token and it turns to DECODE.  The cost model is given, or measured once
at construction (``control.measure.target_cost``: from disk when this model, runtime and CPU were
measured before), never inside a step; greedy rows' argmax is the native kernel's (``rowops``).
"""

from __future__ import annotations

import itertools
import time

import torch
from torch import Tensor

from specserve.control import Controller, CostModel, PrefillPolicy, PromptState, SeqView, StepPlan, plan_chunks
from specserve.control.measure import target_cost
from specserve.drafters.base import DraftProposal, Drafter, Feedback
from specserve.engine.checks import check_request
from specserve.engine.constrained import attach, commit, constrain, first_token, score_prompt, shape_logits
from specserve.engine.drafting import Drafting, traits_of
from specserve.engine.faults import PLAIN, PassFailed
from specserve.engine.layout import Chunk, Entry, PassLayout
from specserve.engine.prefix import Prefixes
from specserve.engine.rows import RowTable
from specserve.engine.types import (Clock, EngineSnapshot, PrefixSnapshot, Request, Result, Sequence, State,
                                    StepReport, StepTimes, TokenLogprob)
from specserve.errors import SpecserveError
from specserve.limits import AUTO_SIZE, MAX_DRAFT
from specserve.models import rowops
from specserve.models.decoder import ForwardOutput
from specserve.models.loader import LoadedModel
from specserve.stats import RequestStats
from specserve.verify import Outcome, Row, verify_rows


class Engine:
    def __init__(self, target: LoadedModel, drafters: dict[str, Drafter], max_batch: int = 16,
                 max_len: int | None = None, prefill: PrefillPolicy | None = None, cost: CostModel | None = None,
                 guard: bool = True):
        if max_batch < 1:
            raise SpecserveError(f"max_batch must be >= 1, got {max_batch}")
        limit = target.config.max_position_embeddings
        self.max_len = min(max_len or limit, limit)
        if self.max_len < 2:
            raise SpecserveError(f"max_len must be >= 2, got {max_len}")
        self.policy = prefill or PrefillPolicy()
        self.policy.check()
        self.target, self.model = target, target.model
        self.drafters = dict(drafters)
        for d in self.drafters.values():
            d.bind(max_batch, self.max_len)
        self.rows = RowTable(self.model.new_cache(max_batch, self.max_len, slack=MAX_DRAFT + 1))
        layers = tuple(sorted({x for d in self.drafters.values() for x in d.feature_layers}))
        self.prefixes = Prefixes(self.policy.prefix_cache_mb, self.rows.cache, layers, target.config.hidden_size)
        # most prompt tokens per pass: the policy's chunk, within the runtime's batch-invariant run
        chunk = self.policy.chunk
        self.prompt_tokens_max = min(chunk, self.model.invariant_tokens or chunk) if chunk is not None else self.max_len
        top = max((d.max_auto_draft for d in self.drafters.values()), default=0)
        cost = cost or target_cost(target, min(max_batch * (top + 1), 128))   # measured once per model, on disk
        self.controller = Controller(traits_of(self.drafters), cost, MAX_DRAFT, self.model.thread_choices(),
                                     guard=guard)      # off: the cost model alone decides whether auto drafts
        self._threads_set = 0
        self.drafting = Drafting(self.controller, target.config.vocab_size)    # every call to a drafter
        self._running: list[Sequence] = []
        self._finished: dict[int, Result] = {}
        self._ids = itertools.count()
        self.last_step: StepReport | None = None

    @property
    def cost(self) -> CostModel:   # the pass cost model, as this engine's passes have corrected it
        return self.controller.cost

    def make_resident(self) -> int:
        """Write every page of the preallocated KV rows and prefix pool now (the native runtime leaves
        them untouched until written, so a server's memory would grow for hours towards its fixed
        budget, like a leak); a server calls it before serving.  Returns the bytes made resident."""
        pool, cache = self.prefixes.pool, self.rows.cache
        tensors = [cache.k_all, cache.v_all] + ([pool.k, pool.v, pool.f] if pool is not None else [])
        tensors = [t for t in tensors if t is not None]
        for t in tensors:
            t.zero_()          # never read before written: zeros change no result
        return sum(t.numel() * t.element_size() for t in tensors)

    def release_threads(self) -> bool:
        """Call from a thread that has run passes (loading, calibration) and will run no more, before
        another thread runs the engine: ends the calling thread's pool of compute threads, since
        with more pooled threads than cores every parallel region would wake its workers through the
        kernel (``experiments/engine_thread.py`` measures it).  Returns whether a pool was ended."""
        return self.model.release_threads()

    # ------------------------------------------------------------------ what the scheduler may use
    def check(self, req: Request) -> None:
        """Refuse a request that cannot be served, before anything is allocated."""
        check_request(req, self.max_len, self.drafters, self.target.config.vocab_size)

    @property
    def free_capacity(self) -> int:
        """Sequences that can still be admitted (free KV rows)."""
        return self.rows.free

    @property
    def has_capacity(self) -> bool:
        return self.rows.free > 0

    @property
    def num_running(self) -> int:
        return len(self._running)

    def snapshot(self) -> EngineSnapshot:
        """Rows, sequences and the prefix pool, for a server's gauges (between steps)."""
        pool = self.prefixes.pool
        prefix = None if pool is None else PrefixSnapshot(
            pool.used_bytes, pool.capacity * pool.block_bytes, pool.blocks, pool.stats.hit_tokens,
            pool.stats.miss_tokens, pool.stats.stored_blocks, pool.stats.evicted_blocks)
        pre = sum(1 for s in self._running if s.state is State.PREFILL)
        return EngineSnapshot(self.rows.rows, self.rows.free, len(self._running) - pre, pre, prefix,
                              dict(self.drafting.faults.counts))

    def progress(self, seq_id: int) -> list[int] | None:
        """Tokens generated so far by a running sequence (None once it is no longer running)."""
        s = self._find(seq_id)
        return s.generated if s is not None else None

    def progress_logprobs(self, seq_id: int) -> list[TokenLogprob] | None:
        """The logprobs of a running sequence's generated tokens so far (None if not asked or not running)."""
        s = self._find(seq_id)
        return s.logprobs if s is not None else None

    def take_result(self, seq_id: int) -> Result | None:
        """The result of a finished sequence, handed over once (None if it has not finished)."""
        return self._finished.pop(seq_id, None)

    def admit(self, req: Request) -> int:
        """Admit a request: take a cache row and copy in any cached prefix of its prompt; the rest
        is prefilled in chunks by the next steps.  Returns its id."""
        self.check(req)
        if not self.rows.free:                # before the drafter's begin: nothing to undo
            raise RuntimeError("no free row; check has_capacity first")
        seq_id = next(self._ids)
        drafter = self.drafters[req.drafter]
        gen, draft_gen = self._generators(req)
        drafter = self.drafting.begin(seq_id, req, drafter, draft_gen)
        stats = RequestStats(drafter=req.drafter, synthetic=drafter.synthetic, prompt_tokens=len(req.prompt),
                             auto=req.num_draft == AUTO_SIZE, drafter_faults=int(drafter is PLAIN))
        # the clock starts after drafter.begin: the oracle's set-up is a study aid, not serving time
        seq = Sequence(seq_id, req, self.rows.take(), list(req.prompt), gen, draft_gen, stats, time.perf_counter(),
                       drafter=drafter)
        attach(seq, self.target.config.vocab_size, self.drafting.spelling(req.drafter))   # shaper, logprob lists
        scored = req.prompt_logprobs is not None        # every prompt position's logits: nothing reused
        match = None if scored else self.prefixes.match(req.prompt, bool(drafter.feature_layers))
        if match is not None:
            got = self.rows.copy_prefix(seq.row, self.prefixes.pool, match)
            seq.blocks = list(match.blocks)
            seq.prefilled = stats.cached_tokens = match.tokens
            seq.prompt_feats = {layer: [got[layer]] for layer in drafter.feature_layers}
        self._running.append(seq)
        return seq_id

    def _generators(self, req: Request) -> tuple[torch.Generator | None, torch.Generator | None]:
        """A sampled request's two streams: verification's (seeded with the request's seed) and its
        drafter's (the next seed), so drafting never shifts the verification draws; an unseeded
        request takes a random seed.  Greedy: none."""
        if req.sampling.greedy:
            return None, None
        seed = req.sampling.seed if req.sampling.seed is not None else int(torch.randint(2**62, (1,)))
        dev = self.model.device
        return torch.Generator(device=dev).manual_seed(seed), torch.Generator(device=dev).manual_seed(seed + 1)

    def abort(self, seq_id: int) -> None:
        """Drop a running sequence now (client gone); its row is free for the next step."""
        s = self._find(seq_id)
        if s is not None:
            s.finish("abort")
            self._retire(s)
            self._finished.pop(seq_id, None)

    def reset(self) -> None:
        """Drop every sequence, running or finished: drafters and the controller forget them, all
        rows are free."""
        for s in self._running:
            self.drafting.end(s)
            self.controller.forget(s.seq_id)
        self._running.clear()
        self._finished.clear()
        self.rows.release_all()

    # ------------------------------------------------------------------ the loop
    @torch.inference_mode()
    def step(self) -> list[int]:
        """Advance every decoding sequence by one verification pass, and the prompts being
        prefilled by one chunk each, as the budget allows.  Returns ids that finished."""
        decoding = [s for s in self._running if s.state is State.DECODE]
        prompts = [s for s in self._running if s.state is State.PREFILL]
        if not decoding and not prompts:
            return []
        times, clock = StepTimes(), Clock()
        # 1. plan: each decoding sequence as the controller sees it (``SeqView``); 2. budgets (and probes), once
        views = [self._view(s) for s in decoding]
        plan = self.controller.plan(views)
        times.size_s += clock.lap()
        # 3. propose: each drafter drafts a chain or a tree within its sequences' budgets
        proposals = self.drafting.propose(decoding, views, plan, times)
        clock.lap()
        # 3b. grammar: the drafts it forbids out, the tokens it forces in (free drafts, priced by keep)
        constrain(decoding, views, proposals)
        times.shape_s += clock.lap()
        # 4. keep: over the whole batch, the auto drafts' nodes that maximise tokens per second
        predicted = self.controller.keep(views, proposals, plan)
        # 5. prompt chunks: as many prompt tokens as keep the step within the planner's budget
        chunks = self._chunks(prompts, views, proposals)
        times.size_s += clock.lap()
        try:           # a fault from here to the commit fails this pass's sequences only (PassFailed)
            # 6. layout: the ragged pass (pending tokens and kept nodes, then the chunks), built once
            layout = self._layout(decoding, proposals, chunks)
            # 7. pass: one target pass, on the governor's threads (threads change the speed, never the bits)
            threads = self._set_threads()
            clock.lap()
            out = layout.run(self.model, self.rows.cache)
            times.pass_s = clock.lap()
            if not chunks:                 # the cost model's correction learns from decoding passes only
                self.controller.observe_pass(threads, layout.decode_lengths, layout.decode_starts, times.pass_s)
            # 8. shape each row's logits (penalties, grammar) from every node's own path, the raw rows kept for
            #    logprobs; verify: greedy rows by argmax, sampled rows by (recursive) rejection sampling
            raw = shape_logits(decoding, proposals, layout.offsets, layout.lengths, out.logits)
            times.shape_s += clock.lap()
            outcomes = self._verify(decoding, proposals, layout, out)
            times.verify_s = clock.lap()
            # 9. commit: accepted tokens (a stop inside the run ends it there) and their KV entries;
            #    the chunks' positions and prefix blocks, and a finished prompt's first token
            feedback = self._commit_decoding(decoding, proposals, outcomes, layout, out, raw)
            feedback += self._commit_prompts(chunks, layout, out)
        except Exception as e:  # noqa: BLE001 - the model, verification or commit raised
            raise self._drop_pass(decoding + [s for s, _ in chunks], e) from e
        # 10. feed back: to the drafters, the verified drafts to the controller, a decoding step's yield to the guard
        self._feed_back(feedback, views, proposals, outcomes, plan)
        times.commit_s = clock.lap()
        self.controller.observe_step(plan, len(decoding), sum(len(o.tokens) for o in outcomes), clock.elapsed(), bool(chunks))
        # 11. report, and retire the finished
        return self._finish_step(decoding, views, chunks, layout, times, predicted, threads)

    def _view(self, s: Sequence) -> SeqView:
        depth = max(0, s.request.max_tokens - len(s.generated) - 1)     # never draft past max_tokens
        num_draft = 0 if s.drafter is PLAIN else s.request.num_draft    # after a fault: plain decoding
        return SeqView(s.seq_id, s.request.drafter, num_draft, self.rows.length(s.row), depth)

    def _drop_pass(self, seqs: list[Sequence], error: Exception) -> PassFailed:
        """The pass of ``seqs`` failed: drop them (rows freed, drafters and controller told)."""
        for s in seqs:
            self.drafting.end(s)
            self.controller.forget(s.seq_id)
            self._running.remove(s)
            self.rows.release(s.row)
        return PassFailed([s.seq_id for s in seqs], error)

    def _chunks(self, prompts: list[Sequence], views: list[SeqView],
                proposals: dict[int, DraftProposal]) -> list[tuple[Sequence, int]]:
        """(prompt, tokens) for each prompt this step's pass advances, in pass order."""
        if not prompts:
            return []
        lengths = [len(proposals[x.seq_id]) + 1 for x in views]
        states = [PromptState(s.prefilled, len(s.request.prompt) - s.prefilled) for s in prompts]
        plan = plan_chunks(self.policy, self.controller.cost, self.prompt_tokens_max, lengths,
                           [x.context for x in views], states)
        return [(prompts[i], n) for i, n in plan]

    def _layout(self, decoding: list[Sequence], proposals: dict[int, DraftProposal],
                chunks: list[tuple[Sequence, int]]) -> PassLayout:
        entries = [Entry(s.row, self.rows.length(s.row), s.tokens[-1], proposals[s.seq_id].tokens,
                         proposals[s.seq_id].parent_list()) for s in decoding]
        parts = [Chunk(s.row, s.prefilled, s.request.prompt[s.prefilled:s.prefilled + n],
                       s.prefilled + n == len(s.request.prompt), s.prompt_logprobs is not None) for s, n in chunks]
        used = [s.drafter for s in decoding + [s for s, _ in chunks]]
        layers = {x for d in used for x in d.feature_layers} | set(self.prefixes.feature_layers if chunks else ())
        return PassLayout.build(entries, parts, tuple(sorted(layers)))

    def _set_threads(self) -> int:
        n = self.controller.threads()
        if n and n != self._threads_set:
            self._threads_set = self.model.set_threads(n)
        return n

    def _verify(self, decoding: list[Sequence], proposals: dict[int, DraftProposal], layout: PassLayout,
                out: ForwardOutput) -> list[Outcome]:
        rows = [Row(p.tokens, p.parents, p.probs, layout.offsets[i], s.request.sampling, s.generator)
                for i, (s, p) in enumerate((s, proposals[s.seq_id]) for s in decoding)]
        return verify_rows(rows, out.logits, rowops.argmax, rowops.greedy_walk) if rows else []

    def _commit_decoding(self, decoding: list[Sequence], proposals: dict[int, DraftProposal], outcomes: list[Outcome],
                         layout: PassLayout, out: ForwardOutput, raw: dict[int, Tensor]) -> list[tuple[Sequence, Feedback]]:
        """Keep each accepted path's KV entries and commit its tokens; the drafters' feedback."""
        feedback = []
        for i, (s, o) in enumerate(zip(decoding, outcomes)):
            prop, at = proposals[s.seq_id], layout.offsets[i]
            kept = [0] + [n + 1 for n in o.path]              # pass indices the cache keeps, in order
            self.rows.keep_path(s.row, kept)
            drafted, drafted_path = prop.drafted(o.path)   # the drafter hears of its own nodes only
            s.stats.record_step(len(prop), prop.depth, len(o.path), prop.forced, len(o.path) - len(drafted_path))
            drafter = s.drafter
            feats = {layer: out.features[layer][[at + j for j in kept]] for layer in drafter.feature_layers}
            argmax = (out.logits[at:at + layout.lengths[i]].argmax(-1).tolist()
                      if drafter.wants_predictions else None)
            feedback.append((s, Feedback(s.seq_id, drafted, drafted_path, o.tokens, feats, argmax)))
            commit(s, o.tokens, raw.get(s.seq_id), kept)
        return feedback

    def _commit_prompts(self, chunks: list[tuple[Sequence, int]], layout: PassLayout,
                        out: ForwardOutput) -> list[tuple[Sequence, Feedback]]:
        """Keep each chunk's positions (and store the prefix blocks it completed); a prompt whose last
        chunk this was samples its first token and starts decoding.  Its drafter's feedback."""
        feedback = []
        for j, (s, n) in enumerate(chunks):
            drafter, at = s.drafter, layout.chunk_offset(j)
            feats = {layer: f[at:at + n] for layer, f in out.features.items()}
            for layer in drafter.feature_layers:
                s.prompt_feats.setdefault(layer, []).append(feats[layer].clone())
            start = s.prefilled
            if s.prompt_logprobs is not None:
                score_prompt(s, start, out.logits[layout.scored[j]:layout.scored[j] + n])
            self.rows.extend(s.row, n)
            s.prefilled += n
            s.blocks = self.prefixes.store(s.blocks, s.tokens, self.rows.views(s.row), start, s.prefilled, feats)
            s.stats.target_passes += 1
            s.stats.prefill_passes += 1
            if layout.first_token[j] is None:
                continue
            row = out.logits[layout.first_token[j]:layout.first_token[j] + 1]                  # [1, V]
            if s.request.max_tokens == 0:            # a scored prompt that asks for no token
                s.finish("length")
                continue
            first = first_token(s, row)
            prompt_feats = {layer: torch.cat(fs) for layer, fs in s.prompt_feats.items()}
            s.prompt_feats = {}
            feedback.append((s, Feedback(s.seq_id, DraftProposal([]), [], [first], prompt_feats)))
            s.state = State.DECODE
            commit(s, [first], row if s.logprobs is not None else None, [0])
        return feedback

    def _feed_back(self, feedback: list[tuple[Sequence, Feedback]], views: list[SeqView],
                   proposals: dict[int, DraftProposal], outcomes: list[Outcome], plan: StepPlan) -> None:
        self.drafting.feed_back(feedback)
        plain = {s.seq_id for s, _ in feedback if s.drafter is PLAIN}
        for v, o in zip(views, outcomes):
            if v.seq_id in plain:
                continue
            self.controller.learn(v, proposals[v.seq_id], o.path, plan)

    def _finish_step(self, decoding: list[Sequence], views: list[SeqView], chunks: list[tuple[Sequence, int]],
                     layout: PassLayout, times: StepTimes, predicted: float | None, threads: int) -> list[int]:
        """Charge the step's times to its sequences, report it, retire the finished."""
        times.charge_step([s.stats for s in decoding], [s.stats for s, _ in chunks])
        for s in decoding if predicted is not None else ():
            s.stats.step_predicted_s.append(predicted)
            s.stats.step_measured_s.append(times.pass_s)
        nodes, prefill = [n - 1 for n in layout.decode_lengths], sum(n for _, n in chunks)
        self.last_step = StepReport(sequences=len(decoding), nodes=nodes, auto=[x.auto_size for x in views],
                                    predicted_s=predicted, threads=threads, prefill_tokens=prefill, **times.asdict())
        done = [s for s in decoding + [s for s, _ in chunks] if s.state is State.FINISHED]
        for s in done:
            self._retire(s)
        return [s.seq_id for s in done]

    def _retire(self, s: Sequence) -> None:
        if s.finish_reason != "abort" and s.prefilled == len(s.request.prompt):
            valid = min(self.rows.length(s.row), len(s.tokens))    # positions cached for committed tokens
            s.blocks = self.prefixes.store(s.blocks, s.tokens, self.rows.views(s.row), 0, valid, None)
        self.controller.forget(s.seq_id)
        s.stats.generated_tokens = len(s.generated)
        s.stats.total_s = time.perf_counter() - s.arrival
        self.drafting.end(s)
        self._running.remove(s)
        self.rows.release(s.row)
        self._finished[s.seq_id] = Result(s.generated, s.finish_reason or "length", s.stats, s.logprobs,
                                          s.prompt_logprobs)

    def _find(self, seq_id: int) -> Sequence | None:
        return next((s for s in self._running if s.seq_id == seq_id), None)

    # ------------------------------------------------------------------ convenience
    def generate(self, requests: list[Request]) -> list[Result]:
        """Run requests to completion, batching up to max_batch at a time; results in order."""
        for r in requests:
            self.check(r)
        waiting, ids = list(requests), []
        while waiting or self._running:
            while waiting and self.has_capacity:
                ids.append(self.admit(waiting.pop(0)))
            self.step()
        return [self._finished.pop(i) for i in ids]
