"""eagle with `auto` against plain decoding through the Python API, runs interleaved (order alternating):
    python scripts/auto_interleaved.py BATCH PROMPTS REPS   (BENCHMARKS.md, section 16)"""
import json, time, sys
from specserve.llm import LLM
qs = [json.loads(l) for l in open("specserve/data/spec_bench/question.jsonl")]
batch, n, reps = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
prompts = [[{"role": "user", "content": q["turns"][0]}] for q in qs[::480 // n][:n]]
llm = LLM("default", drafters=["eagle"], max_batch=batch, max_len=2048)
llm.generate(prompts[:2], max_tokens=16)
tot = {"none": 0.0, "eagle": 0.0}
for r in range(reps):
    for d in (["none", "eagle"] if r % 2 == 0 else ["eagle", "none"]):
        t = time.perf_counter(); out = llm.generate(prompts, max_tokens=128, drafter=d)
        dt = time.perf_counter() - t; tot[d] += dt
        print(d, round(dt, 2), round(sum(len(o.token_ids) for o in out) / dt, 1), flush=True)
print(f"c={batch} prompts={n} reps={reps}: eagle auto / plain = {tot['none'] / tot['eagle']:.3f}")
