"""``specserve bench interleaved``: methods against plain decoding at one concurrency level, every
method running the whole prompt set in turn, repeated for several rounds.

Each round runs every method once over all the prompts through an engine of ``concurrency`` rows
(closed loop), in an order rotated from one round to the next (``datasets.rotation``), so that a
slow spell of a shared machine falls on every method alike; every drafter's memory across requests
is emptied before each run.  The prompts: every (N / ``num_prompts``)-th of the N in the file (default
Spec-Bench's), free text, greedy or sampled at ``temperature`` (prompt i seeded with i, the same in
every run).  A method's speed-up is its tokens per second over plain decoding's, summed over the
rounds (greedy: the same tokens, so plain decoding's seconds over its own); under greedy decoding
its identity count compares its first round's tokens with plain decoding's.

Its interval (``bootstrap_ratio``): each request's cost is its share of the engine's steps (a step's
seconds split equally among the sequences it advanced, ``RequestStats.share_s``); prompts and rounds
are resampled with replacement, the same draw for plain decoding and the method, and the ratio of
the summed rates taken each time: a 90% interval over both the prompts' spread and the machine's
drift from round to round.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from specserve.bench.datasets import load_jsonl, rotation
from specserve.bench.runner import Method, encode_all, load_llm
from specserve.errors import SpecserveError
from specserve.sampling import SamplingParams

MAX_LEN = 2048          # context length of the engine
BOOTSTRAP = 2000        # resamples behind each interval
LEVEL = 0.90            # the interval's coverage


@dataclass
class InterleavedConfig:
    methods: list[str]                  # drafter specs; plain decoding is added first when not named
    concurrency: int = 1
    num_prompts: int = 24
    rounds: int = 2
    max_tokens: int = 128
    prompts_file: str | None = None     # None: Spec-Bench
    model: str = "default"
    temperature: float = 0.0            # 0: greedy


def methods_of(specs: list[str], plain_first: bool) -> list[Method]:
    """The methods the specs name, each once, in order (plain decoding first when ``plain_first``)."""
    methods = list({m.label: m for m in map(Method.parse, specs)}.values())
    if not methods:
        raise SpecserveError("--methods names no method")
    if plain_first:
        if not any(m.drafter == "none" for m in methods):
            methods.insert(0, Method("none", 0, {}, "none"))
        methods.sort(key=lambda m: m.drafter != "none")
    return methods


def strided(num_prompts: int, path: str | None) -> list[str]:
    """Every (N / ``num_prompts``)-th prompt's text of the N in ``path`` (None: Spec-Bench)."""
    prompts = load_jsonl(path)
    if not 1 <= num_prompts <= len(prompts):
        raise SpecserveError(f"--num-prompts must lie in 1..{len(prompts)} (the prompts there are), got {num_prompts}")
    return [p.text for p in prompts[::len(prompts) // num_prompts][:num_prompts]]


def bootstrap_ratio(plain: np.ndarray, method: np.ndarray, plain_tokens: np.ndarray | None = None,
                    method_tokens: np.ndarray | None = None, level: float = LEVEL, reps: int = BOOTSTRAP,
                    seed: int = 0) -> tuple[float, float]:
    """The ``level`` interval of the method's rate over plain decoding's, (sum(method_tokens) /
    sum(method)) / (sum(plain_tokens) / sum(plain)), resampling rounds and prompts; without tokens
    (the same tokens on both sides, as under greedy decoding) sum(plain) / sum(method).

    plain, method, *_tokens: [R, P] seconds (tokens) of each prompt (column) in each round (row),
    the same prompts in the same columns.  Each resample draws R rounds and P prompts with
    replacement (one draw for every array, seeded), so a slow round or a costly prompt weighs on
    both sides alike."""
    arrays = [np.asarray(a, dtype=np.float64) for a in (plain, method, plain_tokens, method_tokens) if a is not None]
    if len({a.shape for a in arrays}) != 1 or arrays[0].ndim != 2 or arrays[0].size == 0:
        raise ValueError(f"every array must be [rounds, prompts] alike, got {[a.shape for a in arrays]}")
    rng = np.random.default_rng(seed)
    r, p = arrays[0].shape
    rows = rng.integers(0, r, size=(reps, r))
    cols = rng.integers(0, p, size=(reps, p))
    sums = [a[rows[:, :, None], cols[:, None, :]].sum(axis=(1, 2)) for a in arrays]     # [reps] each
    ratios = sums[0] / sums[1] if len(sums) == 2 else (sums[3] / sums[1]) / (sums[2] / sums[0])
    tail = (1.0 - level) / 2
    return float(np.quantile(ratios, tail)), float(np.quantile(ratios, 1.0 - tail))


def run_interleaved(cfg: InterleavedConfig, options=None, log: Callable[[str], None] = print) -> dict:
    """The runs of the module docstring; ``log`` gets one line per run.  Returns the configuration,
    every run (round, method, seconds, tokens) and per method its summary against plain decoding."""
    if cfg.concurrency < 1 or cfg.rounds < 1 or cfg.max_tokens < 1:
        raise SpecserveError("--concurrency, --rounds and --max-tokens must be >= 1")
    if not cfg.temperature >= 0:
        raise SpecserveError(f"--temperature must be >= 0, got {cfg.temperature}")
    methods = methods_of(cfg.methods, plain_first=True)
    texts = strided(cfg.num_prompts, cfg.prompts_file)
    llm = load_llm(cfg.model, options, methods, cfg.concurrency, MAX_LEN)
    ids = encode_all(llm, texts)
    greedy = cfg.temperature == 0

    def generate(m: Method, prompts: list[list[int]], max_tokens: int) -> list:
        reqs = [llm.request(p, max_tokens, SamplingParams(temperature=cfg.temperature, seed=None if greedy else i),
                            m.label, m.k) for i, p in enumerate(prompts)]
        return llm.engine.generate(reqs)

    for m in methods:                                              # warm-up
        generate(m, ids[:2], 16)
    runs, first = [], {}
    for r in range(cfg.rounds):
        for m in (methods[j] for j in rotation(len(methods), r)):
            llm.reset_memory()
            t = time.perf_counter()
            results = generate(m, ids, cfg.max_tokens)
            dt = time.perf_counter() - t
            out = [x.tokens for x in results]
            first.setdefault(m.label, out)
            tokens = sum(map(len, out))
            runs.append({"round": r, "method": m.label, "seconds": dt, "tokens": tokens,
                         "shares": [x.stats.share_s for x in results], "counts": list(map(len, out))})
            log(f"{m.label} {dt:.2f} s {tokens / dt:.1f} tok/s")
    summary = summarize(runs, [m.label for m in methods], first, greedy)
    return {"config": asdict(cfg), "prompts": len(ids), "runs": runs, "summary": summary}


def summarize(runs: list[dict], labels: list[str], first: dict[str, list], greedy: bool,
              key: str = "method") -> dict[str, dict]:
    """Per label (``labels[0]``: plain decoding) its seconds, its rate over plain decoding's with the
    interval (``bootstrap_ratio``) and, under greedy decoding, how many of its first round's outputs
    (``first``) are plain decoding's.  ``runs``: one record per run (round, ``key``: its label,
    seconds, tokens, and per prompt its share of the steps and its tokens)."""
    def total(label: str, field: str) -> float:
        return sum(x[field] for x in runs if x[key] == label)

    def cells(label: str, field: str) -> list[list[float]]:        # [round][prompt]
        return [x[field] for x in sorted(runs, key=lambda x: x["round"]) if x[key] == label]
    plain, summary = labels[0], {}
    for label in labels:
        rate, plain_rate = (total(x, "tokens") / total(x, "seconds") for x in (label, plain))
        tokens = () if greedy else (cells(plain, "counts"), cells(label, "counts"))
        summary[label] = {"seconds": total(label, "seconds"), "speedup": rate / plain_rate,
                          "interval": bootstrap_ratio(cells(plain, "shares"), cells(label, "shares"), *tokens),
                          "identical": sum(a == b for a, b in zip(first[label], first[plain])) if greedy else None}
    return summary


def render_interleaved(doc: dict) -> str:
    """One line: every method's speed-up over plain decoding and how many prompts it said identically."""
    c, n = doc["config"], doc["prompts"]
    parts = [f"{label} {s['speedup']:.3f}x [{LEVEL:.0%}: {s['interval'][0]:.3f}-{s['interval'][1]:.3f}]"
             + (f" ({s['identical']}/{n} identical)" if s["identical"] is not None else "")
             for label, s in list(doc["summary"].items())[1:]]
    sampled = f" temperature={c['temperature']:g}" if c.get("temperature") else ""
    return f"c={c['concurrency']} prompts={n} rounds={c['rounds']}{sampled}: " + ", ".join(parts)
