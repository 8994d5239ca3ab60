"""The drafter interface: begin, propose, feedback, end.

A drafter is called by the engine and never drives it.  Per sequence the engine calls
``begin`` once with the prompt, then every step ``propose`` with the whole sequence so far
(prompt + generated tokens; the last one is the pending token whose successor is being drafted),
then ``feedback`` with how many drafted tokens were accepted, and finally ``end``.
``propose`` takes a batch so drafters that run a model can batch their own passes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

from torch import Tensor

from specserve.sampling import SamplingParams


@dataclass
class DraftRequest:
    seq_id: int
    tokens: list[int]          # prompt + generated so far; tokens[-1] is the pending token
    k: int                     # propose at most this many tokens
    sampling: SamplingParams


@dataclass
class DraftProposal:
    tokens: list[int]          # 0..k drafted tokens
    probs: Tensor | None = None  # [len(tokens), V] q each token was drawn from; None means one-hot


class Drafter(ABC):
    name: ClassVar[str] = ""
    synthetic: ClassVar[bool] = False   # True when outputs are a study, not a real drafter

    def bind(self, max_batch: int, max_len: int) -> None:
        """The engine will run at most ``max_batch`` sequences of at most ``max_len`` tokens."""

    def validate(self, sampling: SamplingParams) -> None:
        """Refuse (SpecserveError) sampling settings this drafter cannot serve, before admission."""

    def begin(self, seq_id: int, prompt: list[int], sampling: SamplingParams, max_new_tokens: int) -> None:
        """A new sequence starts; ``prompt`` is its full prompt."""

    @abstractmethod
    def propose(self, requests: list[DraftRequest]) -> list[DraftProposal]:
        """Draft up to ``request.k`` tokens for each request, in order."""

    def feedback(self, seq_id: int, num_drafted: int, num_accepted: int) -> None:
        """The last proposal for ``seq_id`` had ``num_accepted`` of ``num_drafted`` tokens accepted."""

    def end(self, seq_id: int) -> None:
        """The sequence finished; drop its state."""
