"""``oracle``: a SYNTHETIC drafter for studies, never a real speed-up.

At each drafted position it proposes the target's own next token with probability ``alpha`` and a
wrong token otherwise, so the acceptance rate is set by hand.  It knows the target's next tokens
because ``begin`` runs plain greedy decoding of the prompt with the target (time not counted in the
request's statistics, which are labelled ``synthetic``).  It is defined for greedy decoding only:
under sampling the target's next token is random and cannot be known in advance.
"""

from __future__ import annotations

import numpy as np
import torch

from specserve.drafters.base import DraftProposal, DraftRequest, Drafter, Option
from specserve.drafters.registry import register
from specserve.errors import SpecserveError
from specserve.models.loader import LoadedModel
from specserve.sampling import SamplingParams


def greedy_continuation(target: LoadedModel, prompt: list[int], n: int) -> list[int]:
    """The target's plain greedy continuation of ``prompt``: n tokens, one pass each."""
    model = target.model
    cache = model.new_cache(1, len(prompt) + n + 1)
    logits = model(torch.tensor([prompt], device=model.device), cache, [0], [0], last_only=True).logits
    out = [int(logits[0, -1].argmax())]
    while len(out) < n:
        pos = len(prompt) + len(out) - 1
        logits = model(torch.tensor([[out[-1]]], device=model.device), cache, [0], [pos]).logits
        out.append(int(logits[0, -1].argmax()))
    return out


@register("oracle")
class OracleDrafter(Drafter):
    synthetic = True
    max_auto_draft = 8
    options = (Option("alpha", float, 0.8, "probability of proposing the target's own next token"),
               Option("seed", int, 0, "seed of the right/wrong draws"))

    def __init__(self, target: LoadedModel, alpha: float = 0.8, seed: int = 0):
        if not isinstance(alpha, (int, float)) or not 0 <= alpha <= 1:
            raise SpecserveError(f"oracle alpha must be in [0, 1], got {alpha}")
        self.target, self.alpha, self.seed = target, float(alpha), int(seed)
        self.vocab = target.config.vocab_size
        self.known: dict[tuple[int, ...], list[int]] = {}   # prompt -> greedy continuation
        self.state: dict[int, tuple[int, list[int], np.random.Generator]] = {}

    def validate(self, sampling: SamplingParams) -> None:
        if not sampling.greedy:
            raise SpecserveError("the oracle drafter is defined for greedy decoding only (temperature 0): "
                                 "under sampling the target's next token is not known in advance", "temperature")

    def begin(self, seq_id: int, prompt: list[int], sampling: SamplingParams, max_new_tokens: int) -> None:
        key = tuple(prompt)
        if len(self.known.get(key, ())) < max_new_tokens:
            self.known[key] = greedy_continuation(self.target, prompt, max_new_tokens)
        rng = np.random.default_rng([self.seed, hash(key) & 0xFFFFFFFF])
        self.state[seq_id] = (len(prompt), self.known[key], rng)

    def end(self, seq_id: int) -> None:
        self.state.pop(seq_id, None)

    def propose(self, requests: list[DraftRequest]) -> list[DraftProposal]:
        out = []
        for r in requests:
            prompt_len, future, rng = self.state[r.seq_id]
            g = len(r.tokens) - prompt_len                 # index of the next token to generate
            tokens = []
            for i in range(min(r.k, r.max_depth, len(future) - g)):
                right = future[g + i]
                if rng.random() < self.alpha:
                    tokens.append(right)
                else:
                    tokens.append(int((right + 1 + rng.integers(self.vocab - 1)) % self.vocab))
            out.append(DraftProposal(tokens))
        return out
