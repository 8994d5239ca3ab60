"""Where the time of one target pass goes: projections, attention, LM head, the rest.

Each part is timed through the decoder's timer hook (``Decoder.set_timer``: the native runtime's
one foreign call times each of its kernel calls, the torch runtimes add forward hooks to their
modules), over ``reps`` passes of ``tokens`` new tokens at ``context`` cached positions; "overhead"
is the pass time not inside any timed part (Python, allocation, indexing).  Timing adds a little
time of its own, so the parts are reported next to an untimed pass time.
"""

from __future__ import annotations

import time

import torch

from specserve.models.decoder import PARTS, PartTimer, timed
from specserve.models.loader import LoadedModel


def runtime_name(lm: LoadedModel) -> str:
    """The runtime as a label: kernels, and for the native kernels the activations and the KV cache's
    element type (native:int8, native:int8:bf16; an fp32 cache is not named)."""
    act = getattr(lm.model, "activations", None)
    kv = getattr(lm.model, "kv", "f32")
    return lm.options.kernels + (f":{act}" if act else "") + (f":{kv}" if kv != "f32" else "")


def _median_pass(model, x, cache, context: int, reps: int) -> float:
    times = []
    for _ in range(reps):
        s = time.perf_counter()
        model(x, cache, list(range(x.shape[0])), [context] * x.shape[0])
        times.append(time.perf_counter() - s)
    return sorted(times)[len(times) // 2]


@torch.inference_mode()
def profile_pass(lm: LoadedModel, tokens: int = 1, context: int = 256, reps: int = 20, batch: int = 1) -> dict:
    """Milliseconds per pass by part for ``batch`` rows of ``tokens`` new tokens at ``context``."""
    m = lm.model
    g = torch.Generator().manual_seed(0)
    cache = m.new_cache(batch, context + tokens + 1)
    prompt = torch.randint(0, lm.config.vocab_size, (1, context), generator=g)
    for row in range(batch):
        m(prompt, cache, [row], [0], last_only=True)
    x = torch.randint(0, lm.config.vocab_size, (batch, tokens), generator=g)
    _median_pass(m, x, cache, context, 3)                                   # warm-up
    total = _median_pass(m, x, cache, context, reps)
    with timed(m, PartTimer()) as timer:
        s = time.perf_counter()
        for _ in range(reps):
            m(x, cache, list(range(batch)), [context] * batch)
        wrapped = (time.perf_counter() - s) / reps
    parts = {p: 1e3 * timer.seconds.get(p, 0.0) / reps for p in PARTS}
    parts["overhead"] = max(0.0, 1e3 * wrapped - sum(parts.values()))
    return {"runtime": {**vars(lm.options), "name": runtime_name(lm)}, "tokens": tokens, "batch": batch, "context": context, "reps": reps,
            "pass_ms": 1e3 * total, "wrapped_pass_ms": 1e3 * wrapped, "parts_ms": parts}


LINEAR_PARTS = ("qkv", "o", "gate_up", "down", "lm_head")


def part_macs(cfg) -> dict[str, int]:
    """Multiply-adds per token of each linear part, over all layers (``cfg``: a ModelConfig)."""
    h, d, layers = cfg.hidden_size, cfg.head_dim, cfg.num_layers
    return {"qkv": layers * h * d * (cfg.num_heads + 2 * cfg.num_kv_heads), "o": layers * cfg.num_heads * d * h,
            "gate_up": layers * 2 * cfg.intermediate_size * h, "down": layers * cfg.intermediate_size * h,
            "lm_head": cfg.vocab_size * h}


def part_rates(row: dict, macs: dict[str, int], ceiling: float, weight_bytes: int, bandwidth: float) -> dict:
    """What a profiled pass (``profile_pass``'s row) did against the machine: each linear part's
    multiply-adds per second and its fraction of ``ceiling`` (multiply-adds/s, the activations'
    register-only ceiling measured in the same run), and the pass's floor: the longer of reading the
    weights once at ``bandwidth`` (bytes/s) and doing every token's multiply-adds at the ceiling."""
    n = row["tokens"] * row["batch"]
    rates = {p: n * macs[p] / (row["parts_ms"][p] / 1e3) for p in LINEAR_PARTS if row["parts_ms"].get(p, 0) > 0}
    memory_ms, compute_ms = 1e3 * weight_bytes / bandwidth, 1e3 * n * sum(macs.values()) / ceiling
    return {"multiply_adds_per_s": rates, "of_ceiling": {p: r / ceiling for p, r in rates.items()},
            "floor_ms": max(memory_ms, compute_ms), "floor": "memory" if memory_ms >= compute_ms else "arithmetic"}


def format_rates(rows: list[dict]) -> str:
    """A markdown table of each row's ``rates`` (``part_rates``): per linear part the percentage of the
    ceiling, then the pass's floor and the measured pass against it."""
    head = "| % of the multiply-add ceiling | " + " | ".join(f"{r['runtime']['name']} b{r['batch']} t{r['tokens']}" for r in rows) + " |"
    lines = [head, "|---|" + "---:|" * len(rows)]
    for p in LINEAR_PARTS:
        lines.append(f"| {p} | " + " | ".join(f"{100 * r['rates']['of_ceiling'][p]:.0f}%" if p in r["rates"]["of_ceiling"]
                                             else "-" for r in rows) + " |")
    lines.append("| floor of the pass (ms) | " + " | ".join(f"{r['rates']['floor_ms']:.2f} ({r['rates']['floor']})" for r in rows) + " |")
    lines.append("| pass over its floor | " + " | ".join(f"{r['pass_ms'] / r['rates']['floor_ms']:.2f}x" for r in rows) + " |")
    return "\n".join(lines)


def format_profile(rows: list[dict]) -> str:
    """A markdown table: one column per profiled pass."""
    head = "| part (ms) | " + " | ".join(f"{r['runtime']['name']} b{r['batch']} t{r['tokens']}" for r in rows) + " |"
    lines = [head, "|---|" + "---:|" * len(rows)]
    for p in (*PARTS, "overhead"):
        lines.append(f"| {p} | " + " | ".join(f"{r['parts_ms'][p]:.2f}" for r in rows) + " |")
    lines.append("| **pass (unwrapped median)** | " + " | ".join(f"**{r['pass_ms']:.2f}**" for r in rows) + " |")
    return "\n".join(lines)
