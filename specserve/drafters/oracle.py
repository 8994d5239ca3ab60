"""``oracle``: a SYNTHETIC drafter for studies, never a real speed-up.

At each drafted position it proposes the target's own next token with probability ``alpha`` and a
wrong token otherwise, so the acceptance rate is set by hand.  It knows the target's next tokens
because ``begin`` runs plain greedy decoding of the prompt with the target (time not counted in the
request's statistics, which are labelled ``synthetic``).  It is defined for greedy decoding only:
under sampling the target's next token is random and cannot be known in advance.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from specserve.drafters.base import DraftProposal, DraftRequest, Drafter, option
from specserve.drafters.decode import greedy_continuation
from specserve.drafters.registry import register
from specserve.errors import SpecserveError
from specserve.models.loader import LoadedModel
from specserve.sampling import SamplingParams


@dataclass(frozen=True)
class OracleOptions:
    alpha: float = option(0.8, "probability of proposing the target's own next token")
    seed: int = option(0, "seed of the right/wrong draws")

    def __post_init__(self) -> None:
        if not isinstance(self.alpha, (int, float)) or not 0 <= self.alpha <= 1:
            raise SpecserveError(f"oracle alpha must be in [0, 1], got {self.alpha}")


@register("oracle")
class OracleDrafter(Drafter):
    synthetic = True
    max_auto_draft = 8
    Options = OracleOptions

    def __init__(self, target: LoadedModel, **options: Any):
        o = self.opts = self.Options(**options)
        self.target, self.alpha, self.seed = target, float(o.alpha), int(o.seed)
        self.vocab = target.config.vocab_size
        self.known: dict[tuple[int, ...], list[int]] = {}   # prompt -> greedy continuation
        self.state: dict[int, tuple[int, list[int], np.random.Generator]] = {}

    def validate(self, sampling: SamplingParams) -> None:
        if not sampling.greedy:
            raise SpecserveError("the oracle drafter is defined for greedy decoding only (temperature 0): "
                                 "under sampling the target's next token is not known in advance", "temperature")

    def begin(self, seq_id: int, prompt: list[int], sampling: SamplingParams, max_new_tokens: int,
              generator=None) -> None:
        # the right/wrong draws are the study's own (``seed``), not the request's: greedy only
        key = tuple(prompt)
        if len(self.known.get(key, ())) < max_new_tokens:
            self.known[key] = greedy_continuation(self.target.model, prompt, max_new_tokens)
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
