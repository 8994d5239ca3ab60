"""EAGLE and Medusa drafting time with the heads' matrix products as float16 weights (fp32 kernels)
against Q8_0 blocks on the int8 kernels, on the default model with int8 activations:

    .venv/bin/python experiments/head_matmul_speed.py

6 reference prompts of tests/test_real_model.py, 64 tokens, k = 4, greedy; prints wall time and the
time spent drafting.
"""
import sys, time; sys.path.insert(0, str(__import__("pathlib").Path(__file__).parents[1] / "tests"))
from specserve.llm import LLM
from specserve.engine import Engine, Request
from specserve.drafters import create
from specserve.bench.datasets import load_jsonl
from test_real_model import MT_BENCH
llm = LLM("default", max_batch=1, max_len=1024)
ps = load_jsonl()
chosen = [next(p for p in ps if p.category == c) for c in MT_BENCH + ("translation", "math_reasoning")]
prompts = [llm.encode(p.text) for p in chosen][:6]
m = llm.target.model
for name in ("eagle", "medusa"):
    for label in ("f16 head weights", "q8_0 head weights (int8)"):
        m.activations = "f32" if label.startswith("f16") else "int8"
        d = create(name, llm.target)
        m.activations = "int8"
        eng = Engine(llm.target, {name: d}, max_batch=1, max_len=1024)
        eng.generate([Request(prompts[0], 16, drafter=name, num_draft=4)])
        t = time.perf_counter(); outs = [eng.generate([Request(p, 64, drafter=name, num_draft=4)])[0] for p in prompts]
        e = time.perf_counter() - t
        dr = sum(o.stats.draft_s for o in outs) if hasattr(outs[0].stats, "draft_s") else float("nan")
        print(name, label, f"{e:.2f} s, drafting {dr:.2f} s")
