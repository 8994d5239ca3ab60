"""``draft-model``: a smaller model drafts autoregressively.

The drafter keeps its own KV cache in step with the sequence: it remembers which tokens its cache
holds, rolls back to the longest prefix that still agrees with the sequence, feeds the rest in one
pass, then drafts k tokens one pass each.  Under sampling each drafted token is drawn from q, the
draft's logits processed exactly like the target's, and q is returned for verification.

A draft whose vocabulary differs from the target's (another tokenizer) drafts through text
(``vocab_bridge``): it reads the sequence re-encoded with its own tokenizer and its tokens are
re-encoded with the target's; it then drafts greedily, also under sampling, so that q is one-hot on
the proposed tokens and verification stays exact.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specserve.drafters.base import DraftProposal, DraftRequest, Drafter, draw_generator, option
from specserve.drafters.registry import register
from specserve.drafters.vocab_bridge import TextBridge
from specserve.errors import SpecserveError
from specserve.models.layers import QUERY_BLOCK
from specserve.models.loader import LoadedModel, load_model, resolve_model_path
from specserve.sampling import SamplingParams, exponential_noise, processed_probs, race


def vocabulary_bridge(target: LoadedModel, draft: LoadedModel) -> TextBridge | None:
    """None when the draft shares the target's vocabulary; a text bridge between the two tokenizers
    when it does not; refused when there is no tokenizer to translate with (in-memory models)."""
    from specserve.tokenizer import load_tokenizer

    files = Path(draft.path).exists() and Path(target.path).exists()
    if draft.config.vocab_size == target.config.vocab_size and (draft.path == target.path or not files):
        return None   # the same files, or in-memory models of the same size (nothing to compare)
    if not files:
        raise SpecserveError(f"draft model vocabulary size {draft.config.vocab_size} differs from the "
                             f"target's {target.config.vocab_size}, and there are no tokenizers to translate with")
    tt, dt = load_tokenizer(target), load_tokenizer(draft)
    return None if tt.vocab() == dt.vocab() else TextBridge(tt, dt)


@dataclass(frozen=True)
class DraftModelOptions:
    model: str = option(help="the draft model: a GGUF file or a Hugging Face directory", check=resolve_model_path)


@register("draft-model")
class DraftModelDrafter(Drafter):
    max_auto_draft = 8
    Options = DraftModelOptions

    def __init__(self, target: LoadedModel, **options: Any):
        self.opts = self.Options(**options)
        model = self.opts.model
        self._start(target, model if isinstance(model, LoadedModel) else load_model(model, target.options))

    def _start(self, target: LoadedModel, draft: LoadedModel) -> None:
        """Draft with ``draft`` (a subclass's own model, say a view of the target's layers)."""
        self.draft = draft
        self.bridge = vocabulary_bridge(target, self.draft)
        self.cache = None
        self.free_rows: list[int] = []
        self.row: dict[int, int] = {}
        self.cached: dict[int, list[int]] = {}          # tokens whose keys/values the row holds
        self.gen: dict[int, torch.Generator] = {}

    def bind(self, max_batch: int, max_len: int) -> None:
        if self.bridge is not None:      # another tokenizer may need more tokens for the same text
            max_len = min(2 * max_len, self.draft.config.max_position_embeddings)
        self.cache = self.draft.model.new_cache(max_batch, max_len)
        self.free_rows = list(range(max_batch))

    def begin(self, seq_id: int, prompt: list[int], sampling: SamplingParams, max_new_tokens: int,
              generator: torch.Generator | None = None) -> None:
        if self.cache is None:
            raise RuntimeError("draft-model drafter used before bind()")
        self.row[seq_id] = self.free_rows.pop(0)
        self.cached[seq_id] = []
        gen = draw_generator(sampling, generator)
        if gen is not None:
            self.gen[seq_id] = gen

    def end(self, seq_id: int) -> None:
        self.free_rows.append(self.row.pop(seq_id))
        self.cached.pop(seq_id, None)
        self.gen.pop(seq_id, None)

    def _catch_up(self, reqs: list[DraftRequest]) -> torch.Tensor:
        """Feed each sequence's uncached tokens; return logits after its pending token [B, V]."""
        model, dev = self.draft.model, self.draft.model.device
        feeds, starts = [], []
        for r in reqs:
            cached = self.cached[r.seq_id]
            common = 0
            limit = min(len(cached), len(r.tokens) - 1)   # always re-feed at least the pending token
            while common < limit and cached[common] == r.tokens[common]:
                common += 1
            feeds.append(r.tokens[common:])
            starts.append(common)
            self.cached[r.seq_id] = list(r.tokens)
        out = [None] * len(reqs)
        short = [i for i, f in enumerate(feeds) if len(f) <= QUERY_BLOCK]
        for group in [short] + [[i] for i in range(len(reqs)) if i not in short]:
            if not group:
                continue
            width = max(len(feeds[i]) for i in group)
            toks = torch.tensor([feeds[i] + [0] * (width - len(feeds[i])) for i in group], device=dev)
            # a long feed (a prompt, or the tokens accepted while no draft was asked for) runs alone
            # and needs only its last logits: the LM head over every position would cost more than
            # the rest of the draft model
            alone = len(group) == 1 and width > QUERY_BLOCK
            logits = model(toks, self.cache, [self.row[reqs[i].seq_id] for i in group],
                           [starts[i] for i in group], last_only=alone).logits
            for j, i in enumerate(group):
                out[i] = logits[j, -1 if alone else len(feeds[i]) - 1]
        return torch.stack(out)

    def describe(self) -> dict:
        return {"vocabulary": "translated through text" if self.bridge is not None else "shared"}

    @torch.inference_mode()
    def propose(self, requests: list[DraftRequest]) -> list[DraftProposal]:
        if self.bridge is None:
            return self._propose(requests)
        # another vocabulary: draft greedily on the text re-encoded, translate the tokens back
        greedy = SamplingParams()
        mine = [DraftRequest(r.seq_id, self.bridge.to_draft(r.tokens), min(r.k, r.max_depth) + 1 if r.k else 0,
                             greedy) for r in requests]
        out = []
        for r, p in zip(requests, self._propose(mine)):
            tokens = self.bridge.to_target(r.tokens, p.tokens)[:min(r.k, r.max_depth)] if len(p) else []
            out.append(DraftProposal(tokens))
        return out

    def _propose(self, requests: list[DraftRequest]) -> list[DraftProposal]:
        active = [r for r in requests if min(r.k, r.max_depth) > 0]
        proposals = {id(r): DraftProposal([], None) for r in requests}
        if active:
            logits = self._catch_up(active)                                   # [B, V]
            tokens: list[list[int]] = [[] for _ in active]
            probs: list[list[torch.Tensor]] = [[] for _ in active]
            want = [min(r.k, r.max_depth) for r in active]
            for j in range(max(want)):
                for b, r in enumerate(active):
                    if j >= want[b]:
                        continue
                    if r.sampling.greedy:
                        tok = int(logits[b].argmax())
                    else:
                        q = processed_probs(logits[b], r.sampling)
                        tok = int(race(q, exponential_noise(tuple(q.shape), self.gen[r.seq_id]).to(q.device)))
                        probs[b].append(q)
                    tokens[b].append(tok)
                feeding = [b for b in range(len(active)) if j + 1 < want[b]]
                if not feeding:
                    break
                toks = torch.tensor([[tokens[b][-1]] for b in feeding], device=self.draft.model.device)
                rows = [self.row[active[b].seq_id] for b in feeding]
                starts = [len(self.cached[active[b].seq_id]) for b in feeding]
                step_logits = self.draft.model(toks, self.cache, rows, starts).logits[:, 0]
                for i, b in enumerate(feeding):
                    self.cached[active[b].seq_id].append(tokens[b][-1])
                    logits[b] = step_logits[i]
            for b, r in enumerate(active):
                proposals[id(r)] = DraftProposal(tokens[b], torch.stack(probs[b]) if probs[b] else None)
        return [proposals[id(r)] for r in requests]
