"""What speculation will buy on a set of prompts, predicted from a short calibration, and checked.

Terms.  The **sample**: a few of the user's prompts, decoded once plainly (greedy) at each
concurrency level asked for; that run gives each prompt's **continuation** (what the target says,
which under greedy decoding every method must say too), and plain decoding's **wall** seconds at
each level.  A **replay** runs one method over the sample without the target: the engine itself, every phase
of its step (the controller, the method's real drafter, a grammar, verification, commit,
feedback), over a ``ReplayTarget`` (``specserve.bench.replay_target``) whose greedy choice is the
continuation, with the target's features from one teacher-forced pass over prompt and
continuation, and the engine's cost model frozen as plain decoding left it.  Sequences are
admitted as rows free (closed loop), as in the engine.  A replay's **predicted seconds**: the cost
model's seconds for every pass (prompt chunks included), the seconds the rest of every step takes
as it runs (measured: the same code as in the engine), and a per-step **overhead** (what a real
pass adds to the step around it: caches emptied by the weights' stream) calibrated so that plain
decoding's replay takes its measured wall.  The **predicted speed-up** of a method at a level:
plain's wall over the method's predicted seconds.

Drafters that need the target's prediction at rejected nodes (``lookahead``) cannot be replayed.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import torch

from specserve.bench.replay_target import FrozenCost, ReplayTarget
from specserve.control import CostModel
from specserve.drafters.base import parts_of
from specserve.errors import SpecserveError
from specserve.sampling import SamplingParams
from specserve.stats import TIMERS

GREEDY = SamplingParams()


@dataclass
class Replayed:
    """One method's replay at one level."""
    pass_s: float          # the cost model's seconds of every pass (decoding steps and prompt chunks)
    outside_s: float       # every step's seconds outside its pass (drafting, controller, verify, commit...), measured
    steps: int             # decoding steps (passes with a decoding sequence)
    tokens: int            # tokens the decoding steps committed, over all sequences
    seq_steps: int         # decoding steps, counted per sequence

    @property
    def mean_accepted_length(self) -> float:
        return self.tokens / self.seq_steps if self.seq_steps else 1.0


def teacher_features(llm, prompts: list[list[int]], continuations: list[list[int]], layers: tuple[int, ...]) -> list[dict]:
    """Per prompt: layer -> [len(prompt) + len(continuation), hidden], the target's features over
    prompt and continuation in one pass (what the engine hands drafters position by position)."""
    if not layers:
        return [{} for _ in prompts]
    model, out = llm.target.model, []
    for p, c in zip(prompts, continuations):
        toks = p + c
        cache = model.new_cache(1, len(toks) + 8)
        with torch.inference_mode():
            got = model(torch.tensor([toks]), cache, [0], [0], features=layers)
        out.append({layer: f[0].clone() for layer, f in got.features.items()})
    return out


def replay_level(llm, label: str, k, prompts: list[list[int]], continuations: list[list[int]], feats: list[dict],
                 level: int, max_tokens: int, cost: CostModel | None = None) -> Replayed:
    """``label``'s replay over the sample at ``level`` rows (the module docstring): the engine's own
    steps over a ``ReplayTarget``; ``cost``: the cost model with its correction as plain decoding at
    this level left it (default: the LLM engine's), frozen for the replay."""
    drafter = llm.drafter(label)
    if drafter.wants_predictions or any(p.wants_predictions for p in parts_of(drafter).values()):
        raise SpecserveError(f"{label!r} needs the target's prediction at every node: it cannot be replayed")
    frozen = FrozenCost.of(cost or llm.engine.cost)
    replay = ReplayTarget(llm.target.config, llm.target.model.invariant_tokens,
                          [p + c for p, c in zip(prompts, continuations)], feats, frozen,
                          min(llm.tokenizer.eos_ids, default=0))
    # the guard off: it times steps by the wall clock, which a replay's passes do not take
    eng = llm.engine_with(level, [label], target=dataclasses.replace(llm.target, model=replay), cost=frozen, guard=False)
    drafter.reset_memory()
    out = Replayed(0.0, 0.0, 0, 0, 0)
    waiting, ids = [llm.request(p, max_tokens, GREEDY, label, k) for p in prompts], []
    while waiting or eng.num_running:
        while waiting and eng.has_capacity:
            ids.append(eng.admit(waiting.pop(0)))
        eng.step()
        step = eng.last_step
        out.outside_s += sum(getattr(step, t) for t in TIMERS if t != "pass_s")    # measured: all but the pass
        out.steps += 1 if step.sequences else 0
    for seq_id in ids:
        stats = eng.take_result(seq_id).stats
        out.tokens += max(stats.generated_tokens - 1, 0)          # the first token is the prompt pass's
        out.seq_steps += stats.verify_passes
    out.pass_s = replay.pass_s
    return out


@dataclass
class Prediction:
    method: str
    concurrency: int
    speedup: float
    mean_accepted_length: float
    seconds: float


def pass_share(results) -> float | None:
    """Of the engine's time in plain decoding's steps (the ``RequestStats`` of its requests), the
    share spent in target passes; the rest is the per-step overhead (None: no stats)."""
    stats = [r.stats if hasattr(r, "stats") else r for r in results]
    get = (lambda x, k: x[k]) if stats and isinstance(stats[0], dict) else getattr
    passes = sum(get(x, "pass_s") for x in stats)
    engine = sum(get(x, k) for x in stats for k in TIMERS)
    return passes / engine if engine > 0 else None


def predict(llm, methods: list[tuple[str, object]], prompts: list[list[int]], continuations: list[list[int]],
            plain_wall: dict[int, float], max_tokens: int, costs: dict[int, CostModel] | None = None,
            shares: dict[int, float | None] | None = None) -> list[Prediction]:
    """Every method's predicted speed-up at every level of ``plain_wall`` (level -> plain decoding's
    measured wall seconds over the sample; ``costs``: level -> the cost model as that run left it;
    ``shares``: level -> plain decoding's ``pass_share``).  Plain decoding's replay is calibrated to
    its wall: its passes take their measured share of it (the cost model's passes scaled to that),
    the rest is spread over its steps as overhead; without a share, the passes are scaled only when
    they alone exceed the wall."""
    layers = tuple(sorted({x for label, _ in methods for x in llm.drafter(label).feature_layers}))
    feats = teacher_features(llm, prompts, continuations, layers)
    out = []
    for level, wall in sorted(plain_wall.items()):
        cost = (costs or {}).get(level)
        base = replay_level(llm, "none", 0, prompts, continuations, feats, level, max_tokens, cost)
        share = (shares or {}).get(level)
        if not base.pass_s:
            scale = 1.0
        elif share is not None:
            scale = share * wall / base.pass_s
        else:
            scale = min(1.0, 0.95 * wall / base.pass_s)
        overhead = (wall - scale * base.pass_s - base.outside_s) / max(base.steps, 1)
        for label, k in methods:
            r = base if label == "none" else replay_level(llm, label, k, prompts, continuations, feats, level,
                                                          max_tokens, cost)
            seconds = scale * r.pass_s + r.outside_s + overhead * r.steps
            out.append(Prediction(label, level, wall / seconds, r.mean_accepted_length, seconds))
    return out


# ---------------------------------------------------------------------------------------------- the command
DEFAULT_METHODS = ("ngram-tree", "suffix", "eagle", "auto")
CHECK_ROUNDS = 2        # --check runs every method this many times, in rotated orders


def timed_runs(llm, methods: list[tuple[str, object]], ids: list[list[int]], level: int, max_tokens: int):
    """Each method run for real over the sample at ``level`` rows, closed loop, in order: its wall
    seconds, its results, and its engine's cost model afterwards.  Each engine's KV rows are made
    resident and warmed up first, and memory across requests emptied (a fresh server)."""
    out = {}
    for label, k in methods:
        eng = llm.engine_with(level, [label])
        eng.make_resident()
        eng.generate([llm.request(ids[0][:32], 8, GREEDY, label, k)])            # warm-up
        llm.reset_memory()
        t0 = time.perf_counter()
        res = eng.generate([llm.request(p, max_tokens, GREEDY, label, k) for p in ids])
        out[label] = (time.perf_counter() - t0, res, eng.cost)
    return out


def run_advise(model: str, options, prompts_file: str | None, per_group: int, methods: list[str] | None,
               levels: list[int], max_tokens: int, check: bool, log=print) -> dict:
    """``specserve advise``: calibrate on a sample, predict every method at every level, recommend;
    with ``check``, run them and set the measurement beside the prediction."""
    from specserve.bench.datasets import rotation, sample
    from specserve.drafters import DrafterSpec
    from specserve.llm import LLM
    from specserve.models.loader import load_model

    prompts, _ = sample(per_group, None, prompts_file)
    target = load_model(model, options)
    specs, skipped = [], {}
    for text in methods or DEFAULT_METHODS:
        spec = DrafterSpec.parse(text)
        try:
            spec.build(target)                       # a default method that cannot load here is skipped
        except SpecserveError as e:
            if methods:
                raise
            skipped[text] = str(e)
            continue
        specs.append(spec)
    llm = LLM(loaded=target, drafters={s.label: {"drafter": s.name, **s.options} for s in specs}, max_batch=1,
              max_len=4096)
    chat = llm.tokenizer.hf.chat_template is not None
    ids = [llm.encode(p.text, raw=not chat) for p in prompts]
    log(f"calibrating: plain decoding of {len(ids)} prompts at concurrency {', '.join(map(str, levels))}")
    plain = {level: timed_runs(llm, [("none", 0)], ids, level, max_tokens)["none"] for level in levels}
    walls = {level: wall for level, (wall, _, _) in plain.items()}
    conts = [r.tokens for r in plain[levels[0]][1]]
    methods = [("none", 0)] + [(s.label, s.k) for s in specs if s.label != "none"]
    preds = predict(llm, methods, ids, conts, walls, max_tokens, {lv: c for lv, (_, _, c) in plain.items()},
                    {lv: pass_share(res) for lv, (_, res, _) in plain.items()})
    doc = {"prompts": len(ids), "max_tokens": max_tokens, "skipped": skipped, "plain_wall_s": walls,
           "predictions": [vars(p) for p in preds]}
    if check:                          # plain decoding again beside the methods, at each level
        for level in levels:
            walls_m = {label: 0.0 for label, _ in methods}
            for r in range(CHECK_ROUNDS):                # rounds in rotated orders: drift falls on all alike
                log(f"checking at concurrency {level}, round {r + 1} of {CHECK_ROUNDS}")
                got = timed_runs(llm, [methods[j] for j in rotation(len(methods), r)], ids, level, max_tokens)
                for label, (wall, _, _) in got.items():
                    walls_m[label] += wall
            for p in doc["predictions"]:
                if p["concurrency"] == level:
                    p["measured_wall_s"] = walls_m[p["method"]] / CHECK_ROUNDS
                    p["measured_speedup"] = walls_m["none"] / walls_m[p["method"]]
    doc["recommendation"] = {level: max((p for p in doc["predictions"] if p["concurrency"] == level),
                                        key=lambda p: p["speedup"])["method"] for level in levels}
    return doc


def render_advice(doc: dict) -> str:
    checked = any("measured_speedup" in p for p in doc["predictions"])
    lines = [f"Predicted speed-up over plain decoding ({doc['prompts']} prompts, {doc['max_tokens']} tokens, greedy):", "",
             "| method | concurrency | predicted | mean accepted length (predicted) |"
             + (" measured | error |" if checked else ""),
             "|---|---|---|---|" + ("---|---|" if checked else "")]
    for p in doc["predictions"]:
        row = f"| {p['method']} | {p['concurrency']} | {p['speedup']:.2f}x | {p['mean_accepted_length']:.2f} |"
        if "measured_speedup" in p:
            m = p["measured_speedup"]
            row += f" {m:.2f}x | {(p['speedup'] - m) / m * 100:+.0f}% |"
        lines.append(row)
    for name, why in doc["skipped"].items():
        lines.append(f"\n(not loaded: {name}: {why})")
    best = [f"{m} at concurrency {c} (predicted {next(p['speedup'] for p in doc['predictions'] if p['method'] == m and p['concurrency'] == c):.2f}x)"
            for c, m in doc["recommendation"].items()]
    lines += ["", "Recommended: " + "; ".join(best)]
    return "\n".join(lines) + "\n"
