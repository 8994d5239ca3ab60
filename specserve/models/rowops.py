"""Operations on a pass's logits rows, on the native kernels where they run, else on torch.

``argmax`` gives each row's first maximum (greedy verification reads nothing else of a row),
``greedy_walk`` walks decoding rows' chains and trees over those maxima in one native call (greedy
verification's outcomes, ``verify.verify_rows``' ``walk_of``), and
``mask`` sets every token a bitmask forbids to -inf, in place (a grammar's mask, from
``specserve.constrain``, which alone knows the grammar library: this layer sees only bits).  The
native kernels (``logit_ops.cpp``) are faster than torch's on a row of the default model's logits
(BENCHMARKS.md, section 18).  Both give the same bits as the
fallbacks: the argmax is torch's choice among equal maxima (the first) and of NaN (the first),
and the mask writes -inf and nothing else.
"""

from __future__ import annotations

from functools import lru_cache

import torch
from torch import Tensor


@lru_cache(maxsize=1)
def native() -> bool:
    """The native kernel library loads on this machine (built on first use)."""
    from specserve.models.native import unavailable_reason
    return unavailable_reason() is None


def _native_rows(x: Tensor) -> bool:
    return x.device.type == "cpu" and x.dtype == torch.float32 and x.dim() == 2 and x.stride(1) == 1 and native()


def argmax(logits: Tensor) -> Tensor:
    """logits: [M, V] -> int64 [M]: each row's first maximum, on ``logits``' device."""
    if _native_rows(logits) and logits.shape[1]:
        from specserve.models.native import argmax_rows
        return argmax_rows(logits)
    return logits.argmax(-1)


def greedy_walk(logits: Tensor, offsets: list[int], tokens: list[list[int]],
                  parents: list[list[int]] | None) -> list[tuple[list[int], int]] | None:
    """Greedy verification of decoding rows on the native kernel (logits: [M, V]; per row its pending
    token's logits row, node tokens and parents, -1 the pending token; ``parents`` None: chains):
    per row (accepted node indices, the emitted token after them), the bits of
    ``verify.tree.greedy_tree_verify_argmax``; None where the native kernel does not run (the
    caller verifies on torch)."""
    if not (_native_rows(logits) and logits.shape[1]):
        return None
    from specserve.models.native import greedy_walk_rows
    return greedy_walk_rows(logits, offsets, tokens, parents)


def mask(logits: Tensor, bitmask: Tensor) -> None:
    """logits: float32 [R, V]; bitmask: int32 [R, ceil(V / 32)] (bit j of word w: token 32w + j
    allowed).  Every forbidden token of each row set to -inf, in place."""
    if _native_rows(logits) and bitmask.device.type == "cpu":
        from specserve.models.native import mask_rows
        mask_rows(logits, bitmask.contiguous())
        return
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    ok = ((bitmask.unsqueeze(-1) >> shifts) & 1).reshape(bitmask.shape[0], -1)[:, :logits.shape[-1]].bool()
    logits.masked_fill_(~ok.to(logits.device), float("-inf"))
