"""Where a step's time goes for the learned drafters (eagle, medusa), per decoding step, on the
default model, greedy, 128 tokens, at draft sizes K = 4, 8 and auto and at concurrency 1 and 4:

    .venv/bin/python experiments/eagle_step_time.py                      # every configuration, this code
    .venv/bin/python experiments/eagle_step_time.py --impl ref,new       # the pre-vectorisation drafters too
    .venv/bin/python experiments/eagle_step_time.py --only eagle:8:1 --repeat 20   # one configuration (for py-spy)
    .venv/bin/python experiments/eagle_step_time.py --split --impl ref,new       # propose() alone, and its products

Times are the engine's own (``StepReport`` of each decoding step: each of ``specserve.stats.TIMERS``),
the median over the steps that carried no prompt chunk (``step``: their sum; ``prod_s``:
the part of draft_s in the head's matrix products, the native linear calls timed one by one); ``tok/step`` is tokens per
sequence per step, ``nodes`` the nodes verified per step (all sequences).  ``--impl ref`` runs the
drafters copied from before their drafting was vectorised (tests/eagle_reference.py); configurations
of one run alternate implementations prompt set by prompt set, so they see the same machine.

``--split`` times ``propose`` alone (the median of repeated calls on the prompts' prefill state, so
no catch-up) for 1 and 4 sequences at once, and within it the head's matrix products (the native
linear calls, timed one by one): what drafting costs beside its arithmetic.  Its times are the
calling thread's CPU time, which other jobs on the machine do not inflate: run it with
OMP_NUM_THREADS=1, so that the products run on that thread.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from specserve.bench.datasets import MT_BENCH, load_jsonl
from specserve.engine import Engine, Request
from specserve.llm import LLM
from specserve.stats import TIMERS

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
FIELDS = TIMERS
CLOCK = [0.0]                    # the drafters' matrix products in the current step (seconds)


def prompts(llm: LLM, n: int) -> list[list[int]]:
    ps = load_jsonl()
    chosen = [next(p for p in ps if p.category == c) for c in MT_BENCH][:n]
    return [llm.encode([{"role": "user", "content": p.text}]) for p in chosen]


def run(engine: Engine, reqs: list[Request]) -> tuple[list, list]:
    """Admit ``reqs`` together, step to the end; (decoding steps' reports, results)."""
    ids = [engine.admit(r) for r in reqs]
    done: set[int] = set()
    steps = []
    while len(done) < len(ids):
        CLOCK[0] = 0.0
        done |= set(engine.step())
        rep = engine.last_step
        if rep is not None and rep.sequences and not rep.prefill_tokens:
            steps.append((rep, CLOCK[0]))
    return steps, [engine.take_result(i) for i in ids]


def measure(engine: Engine, name: str, k, conc: int, toks: list[list[int]], max_tokens: int) -> dict:
    steps, results = [], []
    for i in range(0, len(toks), conc):
        s, r = run(engine, [Request(t, max_tokens, drafter=name, num_draft=k) for t in toks[i:i + conc]])
        steps += s
        results += r
    row = {f: 1e3 * statistics.median(getattr(s, f) for s, _ in steps) for f in FIELDS}
    row["prod_s"] = 1e3 * statistics.median(p for _, p in steps)
    steps = [s for s, _ in steps]
    seq_steps = sum(r.stats.target_passes - r.stats.prefill_passes for r in results)
    row["tok/step"] = sum(r.stats.generated_tokens - 1 for r in results) / max(seq_steps, 1)
    row["nodes"] = statistics.fmean(sum(s.nodes) for s in steps)
    row["step"] = sum(row[f] for f in FIELDS)
    row["draft%"] = 100 * row["draft_s"] / row["step"]
    row["tok/s"] = 1e3 * row["tok/step"] * statistics.fmean(s.sequences for s in steps) / row["step"]
    row["tokens"] = [r.tokens for r in results]
    return row


def drafters(llm: LLM, impl: str) -> dict:
    if impl == "new":
        return {n: llm._drafters[n] for n in ("none", "eagle", "medusa")}
    from eagle_reference import RefEagle, RefMedusa
    return {"none": llm._drafters["none"], "eagle": RefEagle(llm.target), "medusa": RefMedusa(llm.target)}


def time_products(d, clock: list[float], now=time.perf_counter):
    """Make the drafter ``d``'s matrix products (its native linear calls) add their seconds to clock[0]."""
    def timed(f):
        def call(x):
            t0 = now()
            y = f(x)
            clock[0] += now() - t0
            return y
        return call
    for attr in ("lin", "lm", "stacked", "blocks"):
        v = getattr(d, attr, None)
        if v is not None and not getattr(d, "_timed", False):
            setattr(d, attr, {k: timed(f) for k, f in v.items()} if isinstance(v, dict)
                    else [timed(f) for f in v] if isinstance(v, list) else timed(v))
    d._timed = True
    return d


def timed_copy(llm: LLM, d, clock: list[float], toks: list[list[int]]):
    """A fresh drafter like ``d`` whose matrix products add their thread time to clock[0], having
    begun every prompt of ``toks`` and seen its prefill's features."""
    from specserve.drafters import DraftProposal, Feedback
    from specserve.sampling import SamplingParams
    d = time_products(type(d)(llm.target), clock, time.thread_time)
    for sid, t in enumerate(toks):
        cache = llm.target.model.new_cache(1, len(t) + 8)
        out = llm.target.model(torch.tensor([t]), cache, [0], [0], features=tuple(d.feature_layers))
        d.begin(sid, t, SamplingParams(), 128)
        d.feedback(Feedback(sid, DraftProposal([]), [], [t[-1]], {k: f[0] for k, f in out.features.items()}))
    return d


def split(llm: LLM, toks: list[list[int]], impls: list[str], reps: int = 40) -> None:
    """``--split`` (module docstring); the implementations alternate call by call."""
    from specserve.drafters import DraftRequest
    from specserve.sampling import SamplingParams
    clock = [0.0]
    for name in ("eagle", "medusa"):
        ds = {impl: timed_copy(llm, drafters(llm, impl)[name], clock, toks) for impl in impls}
        for seqs in (1, 4):
            for k in (4, 8, 24):
                reqs = [DraftRequest(sid, toks[sid] + [toks[sid][-1]], k, SamplingParams()) for sid in range(seqs)]
                runs: dict[str, list] = {impl: [] for impl in impls}
                for rep in range(reps + 1):
                    for impl, d in ds.items():
                        clock[0] = 0.0
                        t0 = time.thread_time()
                        d.propose(reqs)
                        if rep:                                    # the first call warms up
                            runs[impl].append((time.thread_time() - t0, clock[0]))
                for impl in impls:
                    total, prod = sorted(runs[impl])[reps // 2]
                    print(f"{name:7s}{impl:5s} seqs={seqs} k={k:2d}: propose {1e3 * total:6.3f} ms, of which products "
                          f"{1e3 * prod:6.3f} ms ({100 * prod / total:4.1f}%), the rest {1e3 * (total - prod):6.3f} ms",
                          flush=True)


def configs(args) -> list[tuple[str, object, int]]:
    if args.only:
        name, k, c = args.only.split(":")
        return [(name, k if k == "auto" else int(k), int(c))]
    out = [("none", 0, c) for c in (1, 4)]
    return out + [(n, k, c) for n in ("eagle", "medusa") for c in (1, 4) for k in (4, 8, "auto")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--impl", default="new", help="comma-separated: new (this code), ref (before vectorising)")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--only", default="", help="one configuration name:K:concurrency")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--split", action="store_true", help="time propose() alone, and its matrix products")
    args = ap.parse_args()
    llm = LLM("default", drafters=["eagle", "medusa"], max_batch=4)
    toks = prompts(llm, args.prompts)
    impls = args.impl.split(",")
    if args.split:
        return split(llm, toks, impls)
    engines = {}
    for i in impls:
        for c in (1, 4):
            ds = {name: d if name == "none" else time_products(d, CLOCK) for name, d in drafters(llm, i).items()}
            engines[(i, c)] = Engine(llm.target, ds, max_batch=c, max_len=1024)
    for e in engines.values():                                  # warm up every path once
        for name in ("eagle", "medusa"):
            run(e, [Request(toks[0], 16, drafter=name, num_draft=4)])
    cols = ("draft_s", "prod_s", "pass_s", "verify_s", "shape_s", "commit_s", "size_s", "step", "draft%", "nodes", "tok/step", "tok/s")
    print(f"{'config':22s}{'impl':5s}" + "".join(f"{c:>10s}" for c in cols) + "   (ms per step)")
    for name, k, conc in configs(args):
        ref_tokens = None
        for _ in range(args.repeat):
            for impl in (impls if name != "none" else impls[:1]):
                row = measure(engines[(impl, conc)], name, k, conc, toks, args.max_tokens)
                same = "" if ref_tokens is None or row["tokens"] == ref_tokens else "  OUTPUT DIFFERS"
                ref_tokens = ref_tokens or row["tokens"]
                print(f"{f'{name} K={k} c={conc}':22s}{impl:5s}" + "".join(
                    f"{row[c]:10.2f}" if c not in ("nodes", "tok/step", "draft%") else f"{row[c]:10.1f}" for c in cols)
                    + same, flush=True)


if __name__ == "__main__":
    main()
