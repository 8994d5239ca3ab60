"""Methods against plain decoding through the Python API at one concurrency level, runs interleaved
(order rotated each round), every drafter's memory across requests emptied before each run:
    python scripts/interleaved.py BATCH PROMPTS ROUNDS METHOD...   (BENCHMARKS.md, section 17)
Prompts: every (480 / PROMPTS)-th Spec-Bench prompt; 128 tokens each, greedy."""
import json, sys, time
from specserve.llm import LLM
qs = [json.loads(l) for l in open("specserve/data/spec_bench/question.jsonl")]
batch, n, rounds, methods = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), ["none"] + sys.argv[4:]
prompts = [[{"role": "user", "content": q["turns"][0]}] for q in qs[::480 // n][:n]]
llm = LLM("default", drafters=[m for m in methods if m != "none"], max_batch=batch, max_len=2048)
for m in methods:
    llm.generate(prompts[:2], max_tokens=16, drafter=m)
tot, outs = {m: 0.0 for m in methods}, {}
for r in range(rounds):
    for m in methods[r % len(methods):] + methods[:r % len(methods)]:
        llm.reset_memory()
        t = time.perf_counter(); out = llm.generate(prompts, max_tokens=128, drafter=m)
        dt = time.perf_counter() - t; tot[m] += dt
        outs.setdefault(m, [o.token_ids for o in out])
        print(m, round(dt, 2), round(sum(len(o.token_ids) for o in out) / dt, 1), flush=True)
same = {m: sum(a == b for a, b in zip(outs[m], outs["none"])) for m in methods}
print(f"c={batch} prompts={n} rounds={rounds}: " + ", ".join(
    f"{m} {tot['none'] / tot[m]:.3f}x ({same[m]}/{n} identical)" for m in methods[1:]))
