"""``none``: proposes nothing, so every step is one plain decoding pass."""

from __future__ import annotations

from typing import Any

from specserve.drafters.base import DraftProposal, DraftRequest, Drafter
from specserve.drafters.registry import register


@register("none")
class NoDrafter(Drafter):
    max_auto_draft = 0
    speculates = False
    preload = True

    def __init__(self, target: Any = None, **options: Any):
        self.opts = self.Options(**options)

    def propose(self, requests: list[DraftRequest]) -> list[DraftProposal]:
        return [DraftProposal([]) for _ in requests]
