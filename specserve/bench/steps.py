"""``specserve bench steps``: where a decoding step's time goes, per method, at concurrency 1.

Methods are interleaved prompt by prompt (``datasets.rotation``), and every drafter's memory across
requests is emptied before each request.  Each decoding step's ``StepReport`` adds its phases'
seconds (``stats.TIMERS``) to its method's; a step that only carried prompt chunks is not counted.
Per method: tokens per second over the requests' wall time, steps, tokens per step, the mean
decoding step's time outside its pass (the step's wall time less the pass), and per step each phase
and the rest (prefill, admission, Python around the steps), in milliseconds.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from specserve.bench.datasets import rotation, sample
from specserve.bench.interleaved import methods_of
from specserve.bench.runner import encode_all, load_llm
from specserve.errors import SpecserveError
from specserve.sampling import SamplingParams
from specserve.stats import Timings

MAX_LEN = 4096          # context length of the engine


@dataclass
class StepsConfig:
    methods: list[str]                  # drafter specs, run as named (plain decoding only when named)
    per_group: int = 2
    groups: list[str] | None = None     # None: all
    max_tokens: int = 128
    prompts_file: str | None = None     # None: Spec-Bench
    model: str = "default"


def _run_one(llm, ids: list[int], max_tokens: int, label: str, k, acc: dict) -> None:
    """One request alone through the engine, step by step, its steps' phases added to ``acc``."""
    eng = llm.engine
    t0 = time.perf_counter()
    sid = eng.admit(llm.request(ids, max_tokens, SamplingParams(), label, k))
    while eng.num_running:
        s0 = time.perf_counter()
        eng.step()
        wall = time.perf_counter() - s0
        report = eng.last_step
        if report.sequences:
            acc["times"].add(report)
            acc["steps"] += 1
            if not report.prefill_tokens:          # a decoding step alone: its time outside the pass
                acc["decode_steps"] += 1
                acc["outside_s"] += wall - report.pass_s
    acc["tokens"] += len(eng.take_result(sid).tokens)
    acc["wall_s"] += time.perf_counter() - t0


def run_steps(cfg: StepsConfig, options=None) -> dict:
    """Every method on every prompt (the module docstring's order); per method its tokens, steps,
    wall seconds and each phase's seconds over its decoding steps."""
    if cfg.per_group < 1 or cfg.max_tokens < 1:
        raise SpecserveError("--per-group and --max-tokens must be >= 1")
    methods = methods_of(cfg.methods, plain_first=False)
    prompts, groups = sample(cfg.per_group, cfg.groups, cfg.prompts_file)
    llm = load_llm(cfg.model, options, methods, 1, MAX_LEN)
    ids = encode_all(llm, [p.text for p in prompts])
    for m in methods:                                                   # warm-up
        llm.engine.generate([llm.request(ids[0][:32], 8, SamplingParams(), m.label, m.k)])
    acc = {m.label: {"times": Timings(), "wall_s": 0.0, "steps": 0, "tokens": 0, "decode_steps": 0, "outside_s": 0.0}
           for m in methods}
    for i, pid in enumerate(ids):
        for m in (methods[j] for j in rotation(len(methods), i)):
            llm.reset_memory()
            _run_one(llm, pid, cfg.max_tokens, m.label, m.k, acc[m.label])
    out = {label: a | {"times": a["times"].asdict()} for label, a in acc.items()}
    return {"config": asdict(cfg) | {"groups": groups}, "prompts": len(ids), "methods": out}


def render_steps(doc: dict) -> list[str]:
    """One line per method: tok/s, steps, tokens per step, the mean decoding step's milliseconds
    outside its pass (every line of ``Engine.step`` but the pass: steps that also carried a prompt
    chunk left out), then ms per step by phase and the rest."""
    lines = []
    for label, m in doc["methods"].items():
        n = max(m["steps"], 1)
        rest = m["wall_s"] - sum(m["times"].values())
        parts = " ".join(f"{k.removesuffix('_s')} {v / n * 1e3:.2f}" for k, v in m["times"].items())
        outside = m.get("outside_s", 0.0) / max(m.get("decode_steps", 0), 1)
        lines.append(f"{label:<42} {m['tokens'] / m['wall_s']:6.1f} tok/s  {m['steps']} steps  "
                     f"{m['tokens'] / n:.2f} tok/step  outside the pass {outside * 1e3:.2f} ms | ms per step: "
                     f"{parts} rest {rest / n * 1e3:.2f}")
    return lines
