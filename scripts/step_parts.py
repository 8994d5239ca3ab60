"""Where a decoding step's time goes, per method, at concurrency 1 (methods interleaved prompt by
prompt, drafters' memory emptied before each request):
    python scripts/step_parts.py PER_GROUP METHOD...   (BENCHMARKS.md, section 17)
Per method: tokens/s, steps, tokens per step, and per step the pass, drafting, the controller,
verification, shaping, commit (with the drafters' feedback) and the rest (ms)."""
import sys, time
from specserve.bench.datasets import sample
from specserve.drafters import DrafterSpec
from specserve.llm import LLM
from specserve.sampling import SamplingParams
from specserve.stats import Timings

per_group, methods = int(sys.argv[1]), sys.argv[2:]
prompts, _ = sample(per_group, None)
specs = {m: DrafterSpec.parse(m) for m in methods}
llm = LLM("default", drafters={m: {"drafter": s.name, **s.options} for m, s in specs.items() if m != "none"},
          max_batch=1)
eng, greedy = llm.engine, SamplingParams()
ids = [llm.encode(p.text) for p in prompts]
for m in methods:                                                   # warm-up
    eng.generate([llm.request(ids[0][:32], 8, greedy, m)])
tot = {m: dict(times=Timings(), wall=0.0, steps=0, toks=0) for m in methods}
for i, pid in enumerate(ids):
    for m in methods[i % len(methods):] + methods[:i % len(methods)]:
        llm.reset_memory()
        t, t0 = tot[m], time.perf_counter()
        sid = eng.admit(llm.request(pid, 128, greedy, m))
        while eng.num_running:
            eng.step()
            r = eng.last_step
            if r.sequences:
                t["times"].add(r)
                t["steps"] += 1
        t["toks"] += len(eng.take_result(sid).tokens)
        t["wall"] += time.perf_counter() - t0
for m, t in tot.items():
    n = t["steps"]
    rest = t["wall"] - t["times"].total()
    parts = " ".join(f"{k.removesuffix('_s')} {v / n * 1e3:.2f}" for k, v in t["times"].asdict().items())
    print(f"{m:<42} {t['toks'] / t['wall']:6.1f} tok/s  {n} steps  {t['toks'] / n:.2f} tok/step | ms per step: "
          f"{parts} rest {rest / n * 1e3:.2f}")
