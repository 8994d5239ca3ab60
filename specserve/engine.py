"""The speculative decoding loop: draft, verify in one target pass, accept, roll back.

The engine knows no tokenization, HTTP, benchmark or command line.  It owns the target's KV
cache and every rollback of it.  Sequences are added with ``add`` and advanced together by
``step``; ``generate`` runs a list of requests to completion.  A batch shares each target pass;
every sequence has its own drafter, draft length and sampling settings.

Cache invariant: for a running sequence, ``cache.lengths[row] == len(tokens) - 1``; the last token
(the *pending* token) has been generated but not yet fed to the target.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from specserve.drafters.base import DraftRequest, Drafter
from specserve.errors import SpecserveError
from specserve.models.loader import LoadedModel
from specserve.sampling import SamplingParams, exponential_noise, processed_probs, sample
from specserve.stats import RequestStats
from specserve.verify import greedy_verify, rejection_verify

MAX_DRAFT = 32


@dataclass
class Request:
    prompt: list[int]
    max_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    drafter: str = "none"
    num_draft: int = 0
    eos_ids: frozenset[int] = frozenset()
    stop_fn: Callable[[list[int]], bool] | None = None   # True when generated tokens hit a stop string


@dataclass
class Result:
    tokens: list[int]
    finish_reason: str            # "stop" (EOS or stop string) or "length"
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

    @property
    def generated(self) -> list[int]:
        return self.tokens[len(self.request.prompt):]


class Engine:
    def __init__(self, target: LoadedModel, drafters: dict[str, Drafter], max_batch: int = 16,
                 max_len: int | None = None):
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
        self.free_rows = list(range(max_batch))
        self.running: list[Sequence] = []
        self.finished: dict[int, Result] = {}
        self._ids = itertools.count()

    # ------------------------------------------------------------------ admission
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
        if not 0 <= req.num_draft <= MAX_DRAFT:
            raise SpecserveError(f"num_draft must be in [0, {MAX_DRAFT}], got {req.num_draft}", "num_draft")
        vocab = self.target.config.vocab_size
        if any(not 0 <= t < vocab for t in req.prompt):
            raise SpecserveError(f"prompt token ids must be in [0, {vocab})", "prompt")
        self.drafters[req.drafter].validate(req.sampling)

    @property
    def has_capacity(self) -> bool:
        return bool(self.free_rows)

    @torch.inference_mode()
    def add(self, req: Request) -> int:
        """Admit a request: prefill its prompt and sample its first token.  Returns its id."""
        self.check(req)
        if not self.free_rows:
            raise RuntimeError("no free batch slot; check has_capacity first")
        seq_id = next(self._ids)
        drafter = self.drafters[req.drafter]
        drafter.begin(seq_id, req.prompt, req.sampling, req.max_tokens)
        gen = None
        if not req.sampling.greedy:
            gen = torch.Generator(device=self.model.device)
            gen.manual_seed(req.sampling.seed if req.sampling.seed is not None else int(torch.randint(2**62, (1,))))
        stats = RequestStats(drafter=req.drafter, synthetic=drafter.synthetic, prompt_tokens=len(req.prompt))
        # the clock starts after drafter.begin: the oracle's set-up is a study aid, not serving time
        seq = Sequence(seq_id, req, self.free_rows.pop(0), list(req.prompt), gen, stats, time.perf_counter())
        t0 = time.perf_counter()
        logits = self.model(torch.tensor([req.prompt], device=self.model.device), self.cache, [seq.row], [0],
                            last_only=True).logits[0, -1]
        first = int(sample(logits, req.sampling, gen))
        self.cache.truncate(seq.row, len(req.prompt))
        stats.target_passes = 1
        stats.verify_s += time.perf_counter() - t0
        self.running.append(seq)
        self._commit(seq, [first])
        if seq.finish_reason is not None:
            self._retire(seq)
        return seq_id

    # ------------------------------------------------------------------ the loop
    @torch.inference_mode()
    def step(self) -> list[int]:
        """Advance every running sequence by one verification pass.  Returns ids that finished."""
        seqs = list(self.running)
        if not seqs:
            return []

        # 1. draft: each sequence's drafter proposes up to k tokens; never past max_tokens
        t0 = time.perf_counter()
        drafts: dict[int, list[int]] = {}
        qs: dict[int, torch.Tensor | None] = {}
        by_drafter: dict[str, list[Sequence]] = {}
        for s in seqs:
            by_drafter.setdefault(s.request.drafter, []).append(s)
        for name, group in by_drafter.items():
            reqs = [DraftRequest(s.seq_id, s.tokens, self._draft_len(s), s.request.sampling) for s in group]
            for s, r, prop in zip(group, reqs, self.drafters[name].propose(reqs)):
                drafts[s.seq_id] = prop.tokens[: r.k]
                qs[s.seq_id] = prop.probs[: r.k] if prop.probs is not None else None
        t_draft = time.perf_counter() - t0

        # 2. verify pass: pending token + drafts for every sequence, padded to the longest draft
        t0 = time.perf_counter()
        width = max(len(drafts[s.seq_id]) for s in seqs)
        rows = [[s.tokens[-1]] + drafts[s.seq_id] + [0] * (width - len(drafts[s.seq_id])) for s in seqs]
        dev = self.model.device
        logits = self.model(torch.tensor(rows, device=dev), self.cache, [s.row for s in seqs],
                            [self.cache.lengths[s.row] for s in seqs]).logits      # [B, width+1, V]

        # 3. acceptance: greedy rows by argmax, sampled rows by rejection sampling
        emitted: dict[int, list[int]] = {}
        for greedy in (True, False):
            idx = [i for i, s in enumerate(seqs) if s.request.sampling.greedy == greedy]
            if idx:
                emitted.update(self._verify([seqs[i] for i in idx], logits[idx], drafts, qs, greedy))
        t_verify = time.perf_counter() - t0

        # 4. commit accepted tokens (stops inside the run end it there), 5. roll back the KV cache
        done = []
        for s in seqs:
            drafted, new = len(drafts[s.seq_id]), emitted[s.seq_id]
            old_len = self.cache.lengths[s.row]
            s.stats.record_step(drafted, len(new) - 1)
            self.drafters[s.request.drafter].feedback(s.seq_id, drafted, len(new) - 1)
            self._commit(s, new)
            # the cache now validly holds the pending token and the accepted drafts; the last
            # emitted token (recovered or bonus) becomes the new pending token
            self.cache.truncate(s.row, old_len + len(new))
            s.stats.draft_s += t_draft
            s.stats.verify_s += t_verify
            if s.finish_reason is not None:
                done.append(s.seq_id)
        for s in seqs:
            if s.finish_reason is not None:
                self._retire(s)
        return done

    def _draft_len(self, s: Sequence) -> int:
        remaining = s.request.max_tokens - len(s.generated)
        return max(0, min(s.request.num_draft, remaining - 1))

    def _verify(self, seqs: list[Sequence], logits: torch.Tensor, drafts: dict, qs: dict,
                greedy: bool) -> dict[int, list[int]]:
        """Run the pure verification functions on one homogeneous group.  logits: [B, K+1, V]."""
        dev = logits.device
        k = logits.shape[1] - 1
        draft = torch.tensor([drafts[s.seq_id] + [0] * (k - len(drafts[s.seq_id])) for s in seqs],
                             dtype=torch.long, device=dev).view(len(seqs), k)
        num_draft = torch.tensor([len(drafts[s.seq_id]) for s in seqs], dtype=torch.long, device=dev)
        if greedy:
            res = greedy_verify(draft, num_draft, logits)
        else:
            vocab = logits.shape[-1]
            p = torch.stack([processed_probs(logits[i], s.request.sampling) for i, s in enumerate(seqs)])
            q = None
            if any(qs[s.seq_id] is not None for s in seqs):
                q = torch.zeros(len(seqs), k, vocab, device=dev)
                for i, s in enumerate(seqs):
                    n = len(drafts[s.seq_id])
                    if qs[s.seq_id] is not None:
                        q[i, :n] = qs[s.seq_id].to(dev)
                    elif n:
                        q[i, torch.arange(n), draft[i, :n]] = 1.0
            uniform = torch.stack([torch.rand(k, generator=s.generator, device=s.generator.device) for s in seqs])
            noise = torch.stack([exponential_noise((vocab,), s.generator) for s in seqs])
            res = rejection_verify(draft, num_draft, q, p, uniform.to(dev), noise.to(dev))
        return {s.seq_id: res.row(i) for i, s in enumerate(seqs)}

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
        s.stats.generated_tokens = len(s.generated)
        s.stats.total_s = time.perf_counter() - s.arrival
        self.drafters[s.request.drafter].end(s.seq_id)
        self.running.remove(s)
        self.free_rows.append(s.row)
        self.finished[s.seq_id] = Result(s.generated, s.finish_reason or "length", s.stats)

    def abort(self, seq_id: int) -> None:
        """Drop a running sequence now (client gone); its slot is free for the next step."""
        for s in self.running:
            if s.seq_id == seq_id:
                s.finish_reason = "abort"
                self._retire(s)
                return

    # ------------------------------------------------------------------ convenience
    def generate(self, requests: list[Request]) -> list[Result]:
        """Run requests to completion, batching up to max_batch at a time; results in order."""
        for r in requests:
            self.check(r)
        waiting = list(enumerate(requests))
        ids: dict[int, int] = {}
        while waiting or self.running:
            while waiting and self.has_capacity:
                i, r = waiting.pop(0)
                ids[i] = self.add(r)
            self.step()
        return [self.finished.pop(ids[i]) for i in range(len(requests))]
