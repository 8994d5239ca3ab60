"""Timing a pass: the one rule every measurement of pass time uses."""

from __future__ import annotations

import time
from typing import Callable

import torch


def median_seconds(fn: Callable[[], object], reps: int = 3, device: torch.device | str = "cpu") -> float:
    """Median wall seconds of ``fn()`` over ``reps`` runs after one unmeasured warm-up run; on CUDA
    each run is synchronised, so kernels are timed, not launches."""
    dev = torch.device(device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    fn()
    sync()
    took = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        sync()
        took.append(time.perf_counter() - t)
    return sorted(took)[len(took) // 2]
