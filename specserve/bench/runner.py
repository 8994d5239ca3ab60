"""``specserve bench``: every method on the same prompts, in the same order, in one process.

Phases: 1. roofline card; 2. cost curve of one target pass; 3. every method at concurrency 1,
interleaved prompt by prompt (plain decoding is the baseline); 4. each higher concurrency level
through the batched engine, closed loop (a request is admitted as soon as a slot frees); 5. peer
engines; 6. results.json, report.md and plots.

Drafters with memory across requests (suffix's corpus, ``auto`` over it) start phases 3 and 4
each as on a fresh server, their memory emptied after the warm-up (``warm_phases`` keeps it from
one phase to the next instead, for a workload meant to be warm); the report says which.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from specserve.bench.datasets import rotation, sample, turns
from specserve.bench.metrics import speedups, summarize
from specserve.bench.structured import grammars, valid
from specserve.drafters import DrafterSpec
from specserve.errors import SpecserveError
from specserve.host import cpu_info
from specserve.sampling import SamplingParams

MAX_LEN = 4096          # context length of the bench's engines


@dataclass(frozen=True)
class Method:
    """One engine configuration: a drafter spec ``name[:option=value]...[:k=N]`` (see
    ``specserve.drafters.registry``); ``k`` defaults to the drafter's own draft length."""
    drafter: str
    k: int | str = 0                            # a number, or "auto"
    options: dict = field(default_factory=dict)
    label: str = ""
    grammar: bool = True                        # follow the prompts' response formats (``:grammar=off``: ignore them)

    @classmethod
    def parse(cls, text: str) -> "Method":
        parts = text.split(":")
        grammar = "grammar=off" not in parts
        spec = DrafterSpec.parse(":".join(p for p in parts if p != "grammar=off"))
        return cls(spec.name, spec.k, spec.options, spec.label + ("" if grammar else ":grammar=off"), grammar)


@dataclass
class BenchConfig:
    methods: list[str]
    groups: list[str] | None                    # None: all (Spec-Bench's six, or a prompt file's categories)
    per_group: int = 5
    max_tokens: int = 128
    out: str = "results/bench"
    model: str = "default"
    prompts_file: str | None = None
    concurrency: list[int] = field(default_factory=lambda: [1])
    concurrency_prompts: int | None = None      # prompts per level > 1 (default: all)
    peers: list[str] = field(default_factory=list)   # transformers, llama.cpp
    assistant: str | None = None                # draft model for the transformers assistant peer
    peer_k: int = 4                             # draft length of the peers' prompt lookup
    cost_tokens: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16])
    cost_batches: list[int] = field(default_factory=lambda: [1, 4, 16])
    plots: bool = True
    temperature: float = 0.0                    # 0: greedy; else every method samples (prompt i: seed + i)
    top_p: float = 1.0
    seed: int = 0
    system_prompt: str | None = None            # --endpoint: a system message sent before every prompt
    warm_phases: bool = False                   # drafters keep their memory across phases (a warm workload)

    def sampling(self, i: int) -> SamplingParams:
        """Prompt i's sampling settings (the same for every method)."""
        if self.temperature <= 0:
            return SamplingParams()
        return SamplingParams(self.temperature, 0, self.top_p, self.seed + i)


def cpu_name() -> str:
    """The CPU's model name (figures are only comparable on one CPU)."""
    return cpu_info().name


def _progress(label: str, i: int, n: int) -> None:
    print(f"\r  {label:<34} {i}/{n}", end="\n" if i == n else "", file=sys.stderr, flush=True)


def _versions() -> dict:
    out = {}
    for pkg in ("specserve", "torch", "transformers", "gguf", "numpy", "llama_cpp_python"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    return out


def _checkpoint(doc: dict, out: str) -> None:
    """Write results.json as it stands, so that a failure late in a long run loses nothing before it."""
    outdir = Path(out)
    outdir.mkdir(parents=True, exist_ok=True)
    (outdir / "results.json").write_text(json.dumps(doc, indent=1, default=str))


def load_llm(model: str, options, methods: list[Method], max_batch: int, max_len: int):
    """An ``LLM`` with every method's drafter loaded under the method's label."""
    from specserve.llm import LLM
    return LLM(model, options, drafters={m.label: {"drafter": m.drafter, **m.options} for m in methods},
               max_batch=max_batch, max_len=max_len)


def has_chat_template(llm) -> bool:
    """Whether prompts go through the model's chat template (a base model's file may have none)."""
    return llm.tokenizer.hf.chat_template is not None


def encode_all(llm, texts: list[str]) -> list[list[int]]:
    """Each prompt's ids, under the chat template where the model has one (else as raw text)."""
    chat = has_chat_template(llm)
    return [llm.encode(t, raw=not chat) for t in texts]


def run_bench(cfg: BenchConfig, options=None) -> dict:
    """The phases of the module docstring, in order; results.json is written after each of them."""
    from specserve.bench.costs import cost_curve
    from specserve.llm import freeze_heap

    methods = _methods(cfg)
    prompts, cfg.groups = sample(cfg.per_group, cfg.groups, cfg.prompts_file)
    if any(c < 1 for c in cfg.concurrency):
        raise SpecserveError("concurrency levels must be >= 1")
    llm = load_llm(cfg.model, options, methods, 1, MAX_LEN)
    cfg_grammars = grammars(llm, prompts)
    freeze_heap()                        # what is loaded, out of the collector's full walks (as a server does)
    ids = encode_all(llm, [p.text for p in prompts])
    doc = _header(cfg, llm.target, has_chat_template(llm))
    doc["roofline"] = _roofline(llm.target)                  # 1. printed before anything is measured
    print("cost curve", file=sys.stderr)                     # 2.
    doc["cost_curve"] = cost_curve(llm.target, cfg.cost_tokens, cfg.cost_batches) if cfg.cost_tokens else []
    doc["memory"] = {"drafters": [], "phases": "warm" if cfg.warm_phases else "fresh"}
    records = _every_method(llm, methods, prompts, ids, cfg, doc["memory"], cfg_grammars)  # 3.
    # what each drafter reports after the run (a corpus, learned rates; a calibration from start-up)
    described = llm.describe_drafters()
    doc["drafters"] = {m.label: described[m.label] for m in methods}
    doc["summary"] = _summaries(methods, records, cfg.groups)
    doc["records"] = records
    _checkpoint(doc, cfg.out)
    doc["concurrency"] = []                                  # 4.
    n_conc = min(cfg.concurrency_prompts or len(prompts), len(prompts))
    doc["concurrency_requests"] = n_conc                     # the prompts selected bound what was asked for
    for level in sorted(set(cfg.concurrency)):
        if level == 1:
            runs = {m.label: (records[m.label][:n_conc], sum(r["total_s"] for r in records[m.label][:n_conc]))
                    for m in methods}
        else:
            runs = _concurrency_level(llm, methods, ids[:n_conc], level, cfg.max_tokens, cfg.sampling,
                                      doc["memory"], cfg.warm_phases, cfg_grammars[:n_conc])
        doc["concurrency"] += [_concurrency_row(m.label, level, *runs[m.label]) for m in methods]
        _checkpoint(doc, cfg.out)
    if any(cfg_grammars):
        doc["not_predicted"] = {m.label: "the advisor replays free text, not a grammar" for m in methods[1:]}
    else:
        _predicted(llm, methods, ids[:n_conc], records[methods[0].label][:n_conc], doc, cfg)
    doc["peers"] = run_peers(cfg, llm.target.path, ids, records[methods[0].label], llm.tokenizer)   # 5.
    _checkpoint(doc, cfg.out)
    _write_files(doc, cfg)                                   # 6.
    return doc


def _predicted(llm, methods: list[Method], ids: list[list[int]], plain: list[dict], doc: dict, cfg: BenchConfig) -> None:
    """The advisor's prediction beside each measured concurrency row (``specserve.bench.advise``),
    calibrated on plain decoding's measured wall at that level; greedy runs only."""
    from specserve.bench.advise import predict

    if cfg.temperature > 0:
        return
    walls = {c["concurrency"]: c["wall_s"] for c in doc["concurrency"] if c["method"] == methods[0].label}
    conts = [r["tokens"] for r in plain]
    for m in methods[1:]:
        try:
            got = predict(llm, [(m.label, m.k)], ids, conts, walls, cfg.max_tokens)
        except SpecserveError as e:                       # a drafter that cannot be replayed: said so
            doc.setdefault("not_predicted", {})[m.label] = str(e)
            continue
        for p in got:
            row = next(c for c in doc["concurrency"] if c["method"] == m.label and c["concurrency"] == p.concurrency)
            row["predicted_vs_plain"] = p.speedup
            row["predicted_mean_accepted_length"] = p.mean_accepted_length
    _checkpoint(doc, cfg.out)


def _methods(cfg: BenchConfig) -> list[Method]:
    """The configured methods, plain decoding first (added if not named: it is the baseline)."""
    methods = [Method.parse(m) for m in cfg.methods]
    if not any(m.drafter == "none" for m in methods):
        methods.insert(0, Method("none", 0, {}, "none"))
    methods.sort(key=lambda m: m.drafter != "none")
    return methods


def _header(cfg: BenchConfig, target, chat: bool) -> dict:
    """What a results document says before any figure: the configuration, the machine, the versions."""
    return {"config": vars(cfg) | {"command": " ".join(sys.argv), "runtime": vars(target.options),
                                   "model_path": target.path,
                                   "prompt_format": "chat template" if chat else "raw text (no chat template)"},
            "machine": {"python": platform.python_version(), "platform": platform.platform(),
                        "processor": cpu_name(), "cpus": os.cpu_count()},
            "versions": _versions(), "created": time.strftime("%Y-%m-%d %H:%M:%S")}


def _roofline(target) -> dict:
    """1. The roofline card, printed."""
    from specserve.bench.costs import roofline

    r = roofline(target)
    print(f"roofline: {r['parameters'] / 1e6:.1f}M parameters, {r['weight_bytes'] / 2**20:.0f} MiB of weights, "
          f"measured bandwidth {r['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s -> plain decoding ceiling "
          f"{r['plain_decoding_ceiling_tok_s']:.0f} tok/s", file=sys.stderr)
    return r


def _fresh(llm, memory: dict) -> None:
    """Drafters forget what they learnt across requests (the warm-up's text included)."""
    memory["drafters"] = sorted(set(memory["drafters"]) | set(llm.reset_memory()))


def _every_method(llm, methods: list[Method], prompts, ids: list[list[int]], cfg: BenchConfig,
                  memory: dict, grammar: list) -> dict[str, list[dict]]:
    """3. Every method at concurrency 1 (warm-up first: one short run of each; then drafters with
    memory across requests start empty).  Methods are interleaved prompt by prompt, in an order
    rotated from one prompt to the next, so that a slow spell of a shared machine falls on every
    method alike instead of on one of them.  A prompt with a response format is decoded under its
    grammar (``grammar``, per prompt), and its output checked (``valid``).  Returns per method its
    records, in prompt order."""
    greedy = SamplingParams()
    for m in methods:
        llm.engine.generate([llm.request(ids[0][:32], 8, greedy, m.label, m.k, grammar=grammar[0] if m.grammar else None)])
    _fresh(llm, memory)
    records: dict[str, list[dict]] = {m.label: [] for m in methods}
    for i, (p, pid) in enumerate(zip(prompts, ids)):
        for m in (methods[j] for j in rotation(len(methods), i)):
            g = grammar[i] if m.grammar else None
            res = llm.engine.generate([llm.request(pid, cfg.max_tokens, cfg.sampling(i), m.label, m.k, grammar=g)])[0]
            ok = valid(llm.tokenizer.decode(res.tokens), p.response_format) if g is not None else None
            records[m.label].append(res.stats.to_dict() | {"prompt_id": p.id, "group": p.group, "tokens": res.tokens,
                                                           "valid": ok})
        _progress("every method", i + 1, len(prompts))
    return records


def _summaries(methods: list[Method], records: dict[str, list[dict]], groups: list[str]) -> dict:
    """Per method: the summary over all prompts and per group, with speed-ups against plain decoding."""
    base = records[methods[0].label]
    out = {}
    for m in methods:
        recs = records[m.label]
        by_group = {g: ([r for r in recs if r["group"] == g], [b for b in base if b["group"] == g]) for g in groups}
        out[m.label] = {
            "synthetic": any(r["synthetic"] for r in recs),
            "overall": summarize(recs) | {"speedup": speedups(recs, base),
                                          "divergent_prompts": sum(r["tokens"] != b["tokens"] for r, b in zip(recs, base)),
                                          "constrained": sum(r.get("valid") is not None for r in recs),
                                          "valid": sum(bool(r.get("valid")) for r in recs),
                                          "forced_tokens": sum(r.get("forced_tokens", 0) for r in recs),
                                          "forced_accepted": sum(r.get("forced_accepted", 0) for r in recs)},
            "groups": {g: summarize(rs) | {"speedup": speedups(rs, bs)} for g, (rs, bs) in by_group.items() if rs},
        }
    return out


def _concurrency_row(label: str, level: int, recs: list[dict], wall: float) -> dict:
    """One method at one concurrency level: throughput over the wall time, latency distributions."""
    s = summarize(recs)
    return {"method": label, "concurrency": level, "requests": len(recs), "wall_s": wall,
            "request_throughput": len(recs) / wall,
            "output_tok_s": sum(r["generated_tokens"] for r in recs) / wall,
            "ttft_s": s["ttft_s"], "tpot_s": s["tpot_s"], "itl_s": s["itl_s"], "e2e_s": s["e2e_s"],
            "mean_accepted_length": s["mean_accepted_length"], "mean_nodes_per_step": s["mean_nodes_per_step"],
            "draft_sizes": s["draft_sizes"]}


def _write_files(doc: dict, cfg: BenchConfig) -> None:
    """6. results.json, the plots and report.md."""
    from specserve.bench.report import render_report, write_plots

    outdir = Path(cfg.out)
    outdir.mkdir(parents=True, exist_ok=True)
    (outdir / "results.json").write_text(json.dumps(doc, indent=1, default=str))
    doc["plots"] = write_plots(doc, outdir) if cfg.plots else []
    (outdir / "report.md").write_text(render_report(doc))


def _concurrency_level(llm, methods: list[Method], ids: list[list[int]], level: int, max_tokens: int, sampling,
                       memory: dict, warm: bool, grammar: list) -> dict[str, tuple[list[dict], float]]:
    """Every method through an engine of ``level`` rows, closed loop (drafters with memory across
    requests start empty unless ``warm``).  The prompts are cut into chunks of at least 2 x level,
    and the methods take turns chunk by chunk (in a rotated order), so that a slow spell of a shared
    machine falls on every method alike; prompts that make one chunk run twice (``datasets.turns``),
    drafters' memory emptied before each run.  Returns per method its records and the wall seconds of
    its runs."""
    greedy = SamplingParams()
    # the same drafter objects as at concurrency 1 (the oracle keeps its look-ahead); each engine
    # holds one method's drafter, and these engines run one after another
    engines = {m.label: llm.engine_with(level, [m.label]) for m in methods}
    for m in methods:              # warm-up
        engines[m.label].generate([llm.request(ids[0][:32], 8, greedy, m.label, m.k)])
    if not warm:
        _fresh(llm, memory)
    out: dict[str, tuple[list[dict], float]] = {m.label: ([], 0.0) for m in methods}
    plan = turns(len(ids), level, len(methods), repeat=not warm)     # warm drafters would recall a repeat
    repeated = len({(p.start, p.stop) for p, _ in plan}) < len(plan)
    for c, (part, order) in enumerate(plan):
        for m in (methods[j] for j in order):
            if repeated:
                _fresh(llm, memory)          # the same prompts again: nothing learnt from their first run
            t = time.perf_counter()
            recs = [r.stats.to_dict() for r in engines[m.label].generate(
                [llm.request(ids[i], max_tokens, sampling(i), m.label, m.k, grammar=grammar[i] if m.grammar else None)
                 for i in range(len(ids))[part]])]
            recs_so_far, wall = out[m.label]
            out[m.label] = (recs_so_far + recs, wall + time.perf_counter() - t)
        _progress(f"concurrency {level}", c + 1, len(plan))
    return out


def run_peers(cfg: BenchConfig, model_path: str, ids: list[list[int]], base: list[dict], tokenizer) -> list[dict]:
    from specserve.bench import peers as peer_mod

    k = cfg.peer_k
    out = []
    for name in cfg.peers:
        if name == "transformers":
            runners = peer_mod.transformers_peer(model_path, k, cfg.assistant)
        elif name == "llama.cpp":
            if not model_path.endswith(".gguf"):
                raise SpecserveError("the llama.cpp peer needs a GGUF model")
            runners = peer_mod.llama_cpp_peer(model_path, k)
        else:
            raise SpecserveError(f"unknown peer {name!r}; choose from transformers, llama.cpp")
        ours = [tokenizer.decode(b["tokens"]) for b in base]
        for label, go in runners.items():
            recs = []
            try:
                go(ids[0][:32], 8)                                 # warm-up
                for i, pid in enumerate(ids):
                    toks, secs = go(pid, cfg.max_tokens)
                    recs.append({"generated_tokens": len(toks), "seconds": secs,
                                 "tokens_per_second": len(toks) / secs if secs else 0.0,
                                 "same_text": tokenizer.decode(toks) == ours[i]})
                    _progress(label, i + 1, len(ids))
            except Exception as e:  # noqa: BLE001 - a peer's failure is reported, not fatal
                out.append({"peer": label, "error": f"{type(e).__name__}: {e}"[:300], "requests": len(recs)})
                print(f"\n  {label} failed: {e}", file=sys.stderr)
                continue
            total_s = sum(r["seconds"] for r in recs)
            out.append({"peer": label, "requests": len(recs),
                        "tokens_per_second_mean": sum(r["tokens_per_second"] for r in recs) / len(recs),
                        "tokens_per_second_total": sum(r["generated_tokens"] for r in recs) / total_s,
                        "same_greedy_text": sum(r["same_text"] for r in recs), "records": recs})
    return out


def run_endpoint_bench(cfg: BenchConfig, url: str, model: str, methods: list[str]) -> dict:
    """``--endpoint``: the concurrency sweep against a running OpenAI-compatible server.

    ``methods`` (e.g. ``none,ngram:k=4``) become specserve's ``speculative`` request extension; with
    none given, requests carry no extension (any server).
    """
    from specserve.bench.endpoint import bench_endpoint
    from specserve.bench.report import render_endpoint_report

    prompts, cfg.groups = sample(cfg.per_group, cfg.groups, cfg.prompts_file)
    prompts = prompts[: cfg.concurrency_prompts or len(prompts)]
    texts = [p.text for p in prompts]
    formats = [{"response_format": p.response_format} if p.response_format else {} for p in prompts]
    if cfg.system_prompt is not None:
        texts = [[{"role": "system", "content": cfg.system_prompt}, {"role": "user", "content": t}] for t in texts]
    variants = [(m.label, {"speculative": {"drafter": m.drafter, "num_draft": m.k}}) for m in map(Method.parse, methods)] \
        or [("default", {})]
    rows = bench_endpoint(url, model, texts, cfg.max_tokens, sorted(set(cfg.concurrency)), variants, formats)
    for r in rows:       # every structured output checked
        checked = [valid(t, p.response_format) for t, p in zip(r["texts"], prompts) if p.response_format and t is not None]
        r["valid"], r["constrained"] = sum(bool(v) for v in checked), len(checked)
    doc = {"config": vars(cfg) | {"command": " ".join(sys.argv), "endpoint": url, "endpoint_model": model},
           "machine": {"python": platform.python_version(), "platform": platform.platform(),
                       "cpus": os.cpu_count()},
           "versions": _versions(), "created": time.strftime("%Y-%m-%d %H:%M:%S"), "endpoint": rows}
    base = next((r for r in rows if r["label"] in ("none", "default")), None)
    for r in rows:   # greedy identity across variants at the same concurrency
        ref = next((b for b in rows if b["label"] == (base or r)["label"] and b["concurrency"] == r["concurrency"]), None)
        r["same_text_as_baseline"] = sum(a == b for a, b in zip(r["texts"], ref["texts"])) if ref else None
    _checkpoint(doc, cfg.out)
    (Path(cfg.out) / "report.md").write_text(render_endpoint_report(doc))
    return doc
