"""How often a step of `auto` asks its parts to draft, and how often it probes, under the
interleaved benchmark's closed loop at concurrency 32 (64 Spec-Bench prompts, 128 tokens), counted over
sequence-steps of steps with 12 or more sequences.

    .venv/bin/python experiments/auto_plans.py
"""
import collections
import specserve.control.controller as C
from specserve.bench.interleaved import methods_of, strided
from specserve.bench.runner import encode_all, load_llm
from specserve.sampling import SamplingParams
st = collections.Counter()
orig = C.Controller.plan
def plan(self, slots):
    p = orig(self, slots)
    if len(slots) >= 12:
        st["steps"] += 1; st["seqs"] += len(slots); st["crowded"] += getattr(self, "crowded", False)
        st["drafting"] += sum(1 for v in p.budgets.values() if v > 0)
        st["probed"] += len(p.probed); st["part_probes"] += len(p.part_probes)
        for sid, per in p.parts.items():
            for part, k in per.items():
                if k: st["ask_" + part] += 1
    return p
C.Controller.plan = plan
methods = methods_of(["auto"], plain_first=False)
llm = load_llm("default", None, methods, 32, 2048)
ids = encode_all(llm, strided(64, None))
eng = llm.engine
waiting = [llm.request(i, 128, SamplingParams(), "auto", "auto") for i in ids]
while waiting or eng.num_running:
    while waiting and eng.has_capacity:
        eng.admit(waiting.pop(0))
    eng.step()
print(dict(st))
