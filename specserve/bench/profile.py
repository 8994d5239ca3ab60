"""Where the time of one target pass goes: projections, attention, LM head, the rest.

Each part is timed by wrapping the calls that make it (native: the kernel library's functions and
the linear calls; torch runtimes: forward hooks on the modules), over ``reps`` passes of ``tokens``
new tokens at ``context`` cached positions; "overhead" is the pass time not inside any timed part
(Python, allocation, indexing).  Wrapping adds a little time of its own, so the parts are reported
next to an unwrapped pass time.
"""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager

import torch

from specserve.models.loader import LoadedModel

PARTS = ("qkv", "o", "gate_up", "down", "attention", "lm_head", "norms+activation")


def _median_pass(model, x, cache, context: int, reps: int) -> float:
    times = []
    for _ in range(reps):
        s = time.perf_counter()
        model(x, cache, list(range(x.shape[0])), [context] * x.shape[0])
        times.append(time.perf_counter() - s)
    return sorted(times)[len(times) // 2]


@contextmanager
def _native_timers(model, acc: dict):
    import specserve.models.native.model as nm

    roles = {}
    for layer in model.layers:
        roles.update({id(layer.qkv): "qkv", id(layer.o): "o", id(layer.gate_up): "gate_up", id(layer.down): "down"})
    roles[id(model.lm_head)] = "lm_head"
    lib_roles = {"ss_rope_cache": "attention", "ss_attention": "attention", "ss_rmsnorm": "norms+activation",
                 "ss_silu_mul": "norms+activation", "ss_embed": "norms+activation"}
    orig_linear, orig_lib = nm.linear, model.lib

    def timed_linear(x, w, bias=None, out=None, accumulate=False):
        s = time.perf_counter()
        r = orig_linear(x, w, bias, out=out, accumulate=accumulate)
        acc[roles.get(id(w), "lm_head")] += time.perf_counter() - s
        return r

    class Lib:
        def __getattr__(self, name):
            fn = getattr(orig_lib, name)

            def call(*args):
                s = time.perf_counter()
                r = fn(*args)
                acc[lib_roles.get(name, "norms+activation")] += time.perf_counter() - s
                return r
            return call

    nm.linear, model.lib = timed_linear, Lib()
    try:
        yield
    finally:
        nm.linear, model.lib = orig_linear, orig_lib


@contextmanager
def _torch_timers(model, acc: dict):
    starts: dict[int, float] = {}
    handles = []

    def add(module, role):
        def pre(mod, args):
            starts[id(mod)] = time.perf_counter()

        def post(mod, args, out):
            acc[role] += time.perf_counter() - starts.pop(id(mod))
        handles.extend([module.register_forward_pre_hook(pre), module.register_forward_hook(post)])

    for block in model.layers:
        add(block.attn.qkv, "qkv")
        add(block.attn.o, "o")
        add(block.ffn.gate_up, "gate_up")
        add(block.ffn.down, "down")
        add(block.attn_norm, "norms+activation")
        add(block.ffn_norm, "norms+activation")
        add(block.attn, "attention+projections")
    add(model.lm_head, "lm_head")
    add(model.norm, "norms+activation")
    try:
        yield
    finally:
        for h in handles:
            h.remove()
        # the attention module's time includes its two projections: keep the rest
        acc["attention"] += acc.pop("attention+projections", 0.0) - acc["qkv"] - acc["o"]


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
    acc: dict[str, float] = defaultdict(float)
    timers = _native_timers if lm.options.kernels == "native" else _torch_timers
    with timers(m, acc):
        s = time.perf_counter()
        for _ in range(reps):
            m(x, cache, list(range(batch)), [context] * batch)
        wrapped = (time.perf_counter() - s) / reps
    parts = {p: 1e3 * acc.get(p, 0.0) / reps for p in PARTS}
    parts["overhead"] = max(0.0, 1e3 * wrapped - sum(parts.values()))
    return {"runtime": vars(lm.options), "tokens": tokens, "batch": batch, "context": context, "reps": reps,
            "pass_ms": 1e3 * total, "wrapped_pass_ms": 1e3 * wrapped, "parts_ms": parts}


def format_profile(rows: list[dict]) -> str:
    """A markdown table: one column per profiled pass."""
    head = "| part (ms) | " + " | ".join(f"{r['runtime']['kernels']} b{r['batch']} t{r['tokens']}" for r in rows) + " |"
    lines = [head, "|---|" + "---:|" * len(rows)]
    for p in (*PARTS, "overhead"):
        lines.append(f"| {p} | " + " | ".join(f"{r['parts_ms'][p]:.2f}" for r in rows) + " |")
    lines.append("| **pass (unwrapped median)** | " + " | ".join(f"**{r['pass_ms']:.2f}**" for r in rows) + " |")
    return "\n".join(lines)
