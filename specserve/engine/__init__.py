"""The engine: sequences, the KV cache's rows, and a step's phases in order.

* ``types``: the request, its result, a sequence with an explicit state, a step's report and times.
* ``rows``: the row table, the one owner of the target KV cache's row lengths.
* ``prefix``: the prefix pool's bookkeeping (finding and storing a prompt's cached blocks).
* ``layout``: one step's ragged pass, built once.
* ``engine``: ``Engine``, whose ``step`` reads as numbered phases.
"""

from specserve.control.prefill import PrefillPolicy
from specserve.engine.engine import Engine
from specserve.engine.types import (EngineSnapshot, PrefixSnapshot, Request, Result, Sequence, State, StepReport,
                                    StepTimes)
from specserve.limits import MAX_DRAFT

__all__ = ["MAX_DRAFT", "Engine", "EngineSnapshot", "PrefillPolicy", "PrefixSnapshot", "Request", "Result",
           "Sequence", "State", "StepReport", "StepTimes"]
