"""Repetition penalties, OpenAI's and the common extension, as pure functions over logits rows.

Terms.  For a position, ``counts[t]`` is how often token t occurs among the tokens *generated* before
it, and ``seen[t]`` whether t occurs in the prompt or among them.  OpenAI's penalties subtract from a
logit ``presence * [counts > 0] + frequency * counts``; the repetition penalty (Keskar et al. 2019, as
in transformers and vLLM) divides a positive logit of a seen token by ``repetition`` and multiplies a
negative one by it.  Presence and frequency apply first, then repetition, then (elsewhere) the grammar
mask, temperature, top-k and top-p.

Under speculation a drafted node's position follows the committed tokens *and its own path*: row
i + 1 of a draft's logits counts the tokens of node i's path as generated, so every node is verified
against the distribution plain decoding would use there (``path_counts``).
"""

from __future__ import annotations

import torch
from torch import Tensor


def path_counts(paths: list[tuple[int, ...]], vocab_size: int, device=None) -> Tensor:
    """float32 [N + 1, V]: row 0 zeros (the root), row i + 1 the token counts of path ``paths[i]``."""
    out = torch.zeros((len(paths) + 1, vocab_size), dtype=torch.float32, device=device)
    rows = [i + 1 for i, p in enumerate(paths) for _ in p]
    if rows:
        toks = [t for p in paths for t in p]
        out.index_put_((torch.tensor(rows, device=device), torch.tensor(toks, device=device)),
                       torch.ones(len(rows), device=device), accumulate=True)
    return out


def penalise(logits: Tensor, counts: Tensor, seen: Tensor, presence: float, frequency: float,
             repetition: float) -> Tensor:
    """The penalised logits.

    logits: [R, V] float; counts: [R, V] float32 (generated-token counts per row); seen: [R, V] bool
    (prompt or generated tokens per row).  Returns float32 [R, V]."""
    out = logits.float()
    if presence or frequency:
        out = out - (presence * (counts > 0).float() + frequency * counts)
    if repetition != 1.0:
        out = torch.where(seen, torch.where(out > 0, out / repetition, out * repetition), out)
    return out
