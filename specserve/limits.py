"""The limits every layer shares, each defined once (this module imports nothing from specserve)."""

from __future__ import annotations

AUTO_SIZE = "auto"      # a request's draft size when the controller chooses it each step (not the ``auto`` drafter)
MAX_DRAFT = 32          # largest node budget (draft length) a request may ask for, or the controller may choose
MAX_LOGPROBS = 20       # most top logprobs a request may ask for per position (OpenAI's limit)
NO_LIMIT = 1 << 30      # a bound that never binds: no depth limit on a draft, no size limit on a pass
PREFIX_BLOCK = 16       # positions per block of the prefix pool (``specserve.prefix_cache``); prompt chunks
                        # (``specserve.control.prefill``) end at multiples of it, so a block lies in one chunk
