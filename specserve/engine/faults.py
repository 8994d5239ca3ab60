"""Faults: a drafter's exception costs its sequence the speculation, never its answer; a target
pass's exception costs that pass's sequences their requests, never the others'.

A drafter is an optimisation.  When one raises in ``begin``, ``propose``, ``feedback`` or ``end``
for a sequence (or returns a malformed proposal), the engine ends the drafter's state for that
sequence (``end``, whose own exception is swallowed) and the sequence continues with ``PLAIN``, a
drafter that proposes nothing: every later step is one plain decoding pass, so its output is
exactly what plain decoding gives (greedy: the same tokens; sampled: the same distribution, since
verification draws from its own stream).  A batched ``propose`` that raises is retried one
sequence at a time, so only the sequences it fails for lose their drafts.  Each fault is counted
per drafter (``EngineSnapshot.drafter_faults``) and logged once: with its traceback the first time
a drafter raises a given exception type, on one line after that.

A fault in the target pass itself (or in verifying and committing its output) cannot be isolated
below the pass: the engine drops the pass's sequences and raises ``PassFailed`` naming them; the
sequences that were not in the pass continue.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from specserve.drafters.none import NoDrafter

log = logging.getLogger("specserve.engine")

PLAIN = NoDrafter()      # the drafter of a sequence whose own drafter failed: no drafts, no state


class PassFailed(Exception):
    """The target pass (or the verification and commit of its output) raised.  ``seq_ids``: the
    sequences of that pass, already dropped from the engine; ``message``: the error, for their clients."""

    def __init__(self, seq_ids: list[int], error: BaseException):
        self.seq_ids = list(seq_ids)
        self.message = f"target pass failed: {type(error).__name__}: {error}"
        super().__init__(self.message)


class Faults:
    """The drafter faults so far, per drafter name, and the logging of each."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self._traced: set[tuple[str, str]] = set()

    def record(self, drafter: str, seq_id: int, phase: str, error: BaseException) -> None:
        """Count a fault of ``drafter`` in ``phase`` for ``seq_id`` and log it."""
        self.counts[drafter] = self.counts.get(drafter, 0) + 1
        key = (drafter, type(error).__name__)
        first = key not in self._traced
        self._traced.add(key)
        log.error("drafter %r failed in %s for sequence %d (%s: %s); it continues by plain decoding",
                  drafter, phase, seq_id, type(error).__name__, error, exc_info=error if first else None)

    def call(self, drafter: str, seq_id: int, phase: str, fn: Callable[..., Any], *args: Any) -> bool:
        """Run one drafter call for one sequence; False (counted and logged) if it raised."""
        try:
            fn(*args)
            return True
        except Exception as e:  # noqa: BLE001 - any drafter bug: the sequence falls back to plain decoding
            self.record(drafter, seq_id, phase, e)
            return False


def quietly_end(drafter: Any, seq_id: int) -> None:
    """End a failed drafter's state for a sequence; a second exception there changes nothing."""
    try:
        drafter.end(seq_id)
    except Exception:  # noqa: BLE001 - already counted as this sequence's fault
        pass
