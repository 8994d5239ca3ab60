"""This machine's cost table for the default model and how crowded a step is (what one more drafted
token adds to the pass over a sequence's share of it: ``Controller.crowding``) by batch size and
context; a step is crowded above ``ControllerConfig.crowded``.  The table is the engine's own (measured once per
machine and cached; ``--measure`` measures it afresh, 7 repetitions per size).

    .venv/bin/python experiments/crowding.py [--measure]
"""
import sys

from specserve.control import SeqView
from specserve.control.measure import _MEASURED, calibrate
from specserve.llm import LLM

llm = LLM("default", drafters=["auto"], max_batch=32)
ctl = llm.engine.controller
if "--measure" in sys.argv:
    _MEASURED.pop(llm.engine.model, None)
    ctl.cost = calibrate(llm.engine.model, max_tokens=128, reps=7)
print("\n".join(ctl.cost.describe()))
contexts = (100, 300, 600, 1200, 2000)
print(f"\ncrowding (crowded above {ctl.config.crowded})\n| sequences | " + " | ".join(f"context {c}" for c in contexts) + " |")
print("|---|" + "---|" * len(contexts))
for b in (1, 2, 4, 8, 16, 32):
    row = [ctl.crowding([SeqView(i, "auto", "auto", c, 10) for i in range(b)]) for c in contexts]
    print(f"| {b} | " + " | ".join(f"{x:.2f}" for x in row) + " |")
