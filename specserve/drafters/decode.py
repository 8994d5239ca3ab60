"""Plain greedy decoding with a model, for drafters that need the target's own continuation
(``oracle``'s future tokens, ``layerskip``'s calibration)."""

from __future__ import annotations

import torch


@torch.inference_mode()
def greedy_continuation(model, prompt: list[int], n: int) -> list[int]:
    """The model's plain greedy continuation of ``prompt``: n >= 1 tokens, one pass each."""
    cache = model.new_cache(1, len(prompt) + n + 1)
    logits = model(torch.tensor([prompt], device=model.device), cache, [0], [0], last_only=True).logits
    out = [int(logits[0, -1].argmax())]
    while len(out) < n:
        pos = len(prompt) + len(out) - 1
        logits = model(torch.tensor([[out[-1]]], device=model.device), cache, [0], [pos]).logits
        out.append(int(logits[0, -1].argmax()))
    return out
