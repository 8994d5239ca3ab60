"""``specserve bench``: every method on the same prompts, in the same order, in one process.

Plain decoding (``none``) is always run first as the baseline.  Concurrency 1 (one request at a
time); batched concurrency levels, peers, plots and the cost curve come with the benchmark issue.
"""

from __future__ import annotations

import json
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from specserve.bench.datasets import GROUPS, Prompt, load_jsonl, spec_bench_sample
from specserve.bench.metrics import speedups, summarize
from specserve.errors import SpecserveError
from specserve.sampling import SamplingParams


@dataclass(frozen=True)
class Method:
    """One engine configuration, written ``drafter[:key=value]...`` (``k`` is the draft length)."""
    drafter: str
    k: int = 0
    options: dict = field(default_factory=dict)
    label: str = ""

    @classmethod
    def parse(cls, text: str) -> "Method":
        name, *parts = text.strip().split(":")
        k, opts = (0 if name == "none" else 4), {}
        for part in parts:
            if "=" not in part:
                raise SpecserveError(f"method {text!r}: expected key=value, got {part!r}")
            key, val = part.split("=", 1)
            if key == "k":
                k = int(val)
            else:
                opts[key] = int(val) if val.isdigit() else (float(val) if val.replace(".", "", 1).isdigit() else val)
        return cls(name, k, opts, text.strip())


def run_bench(methods: list[str], groups: list[str], per_group: int, max_tokens: int, out: str,
              model: str = "default", prompts_file: str | None = None, options=None) -> dict:
    from specserve.drafters import drafter_class
    from specserve.llm import LLM

    parsed = [Method.parse(m) for m in methods]
    if not any(m.drafter == "none" for m in parsed):
        parsed.insert(0, Method("none", 0, {}, "none"))
    parsed.sort(key=lambda m: m.drafter != "none")
    for m in parsed:
        drafter_class(m.drafter)
    bad = [g for g in groups if g not in GROUPS]
    if bad:
        raise SpecserveError(f"unknown group {bad[0]!r}; choose from all, {', '.join(GROUPS)}")
    prompts: list[Prompt] = load_jsonl(prompts_file)[: per_group * len(groups)] if prompts_file else \
        spec_bench_sample(per_group, tuple(groups))
    # one drafter instance per method, named by the method's label
    llm = LLM(model, options, drafters={m.label: {"drafter": m.drafter, **m.options} for m in parsed},
              max_batch=1, max_len=4096)
    ids = [llm.encode(p.text) for p in prompts]
    sampling = SamplingParams()
    # warm-up: every method once on a short prompt
    for m in parsed:
        llm.engine.generate([llm.request(ids[0][:32], 8, sampling, m.label, m.k)])
    records: dict[str, list[dict]] = {}
    for m in parsed:
        recs = []
        for i, (p, pid) in enumerate(zip(prompts, ids)):
            res = llm.engine.generate([llm.request(pid, max_tokens, sampling, m.label, m.k)])[0]
            rec = res.stats.to_dict() | {"prompt_id": p.id, "group": p.group, "tokens": res.tokens}
            recs.append(rec)
            print(f"\r{m.label:<28} {i + 1}/{len(prompts)}", end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)
        records[m.label] = recs
    base = records[next(m.label for m in parsed if m.drafter == "none")]
    summary: dict = {}
    for m in parsed:
        recs = records[m.label]
        by_group = {g: [r for r in recs if r["group"] == g] for g in groups}
        base_by_group = {g: [r for r in base if r["group"] == g] for g in groups}
        summary[m.label] = {
            "synthetic": any(r["synthetic"] for r in recs),
            "overall": summarize(recs) | {"speedup": speedups(recs, base),
                                          "divergent_prompts": sum(r["tokens"] != b["tokens"] for r, b in zip(recs, base))},
            "groups": {g: summarize(by_group[g]) | {"speedup": speedups(by_group[g], base_by_group[g])}
                       for g in groups if by_group[g]},
        }
    doc = {"config": {"methods": [m.label for m in parsed], "groups": groups, "per_group": per_group,
                      "max_tokens": max_tokens, "model": llm.target.path, "runtime": vars(llm.target.options),
                      "command": " ".join(sys.argv)},
           "machine": {"python": platform.python_version(), "platform": platform.platform(),
                       "processor": platform.processor(), "torch": __import__("torch").__version__},
           "summary": summary, "records": records, "created": time.strftime("%Y-%m-%d %H:%M:%S")}
    outdir = Path(out)
    outdir.mkdir(parents=True, exist_ok=True)
    (outdir / "results.json").write_text(json.dumps(doc, indent=1))
    (outdir / "report.md").write_text(render_report(doc))
    return doc


def render_report(doc: dict) -> str:
    lines = [f"# specserve bench", "", f"Command: `{doc['config']['command']}`", "",
             f"Model `{Path(doc['config']['model']).name}`, runtime {doc['config']['runtime']}, "
             f"{doc['config']['max_tokens']} new tokens, greedy, concurrency 1.", "",
             "| method | tok/s (mean) | tok/s (total) | speed-up (Spec-Bench) | speed-up (total time) | "
             "mean accepted length | acceptance by position | TTFT p50 ms | TPOT p50 ms | draft % | verify % | divergent |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for label, s in doc["summary"].items():
        o = s["overall"]
        acc = " ".join(f"{a:.2f}" for a in o["acceptance_by_position"][:8]) or "-"
        name = f"{label} (SYNTHETIC)" if s["synthetic"] else label
        lines.append(f"| {name} | {o['tokens_per_second_mean']:.1f} | {o['tokens_per_second_total']:.1f} | "
                     f"{o['speedup']['spec_bench']:.2f}x | {o['speedup']['total_time']:.2f}x | "
                     f"{o['mean_accepted_length']:.2f} | {acc} | {o['ttft_s']['p50'] * 1e3:.0f} | "
                     f"{o['tpot_s']['p50'] * 1e3:.1f} | {o['share_draft'] * 100:.0f} | {o['share_verify'] * 100:.0f} | "
                     f"{o['divergent_prompts']}/{o['requests']} |")
    lines += ["", "Per group (speed-up, Spec-Bench definition / mean accepted length):", "",
              "| method | " + " | ".join(doc["config"]["groups"]) + " |",
              "|---|" + "---|" * len(doc["config"]["groups"])]
    for label, s in doc["summary"].items():
        cells = [f"{s['groups'][g]['speedup']['spec_bench']:.2f}x / {s['groups'][g]['mean_accepted_length']:.2f}"
                 if g in s["groups"] else "-" for g in doc["config"]["groups"]]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
