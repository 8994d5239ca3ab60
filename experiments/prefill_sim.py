"""A burst in process: 12 Spec-Bench prompts (2 per group) admitted at once, 64 tokens each, plain
greedy decoding, the engine stepped in a loop; one run per chunked-prefill step budget.  Prints
output tokens per second, steps, and the gaps between a stream's tokens (ITL, p50/p99).

    python experiments/prefill_sim.py 4 5 6 8        # --prefill-stall values (chunk 256)
"""
import sys
import time

import numpy as np

from specserve.bench.datasets import sample
from specserve.engine import Engine, Request
from specserve.llm import LLM
from specserve.control import PrefillPolicy


def run(llm: LLM, prompts: list[list[int]], stall: float) -> str:
    eng = Engine(llm.target, llm.engine.drafters, max_batch=16, max_len=4096, prefill=PrefillPolicy(256, stall))
    t0 = time.perf_counter()
    ids = [eng.admit(Request(p, 64)) for p in prompts]
    seen, last, itl, steps = {i: 0 for i in ids}, {i: None for i in ids}, [], 0
    while eng.num_running:
        eng.step()
        steps += 1
        now = time.perf_counter()
        for i in ids:
            g = eng.progress(i)
            n = len(g) if g is not None else 64
            if n > seen[i]:
                if last[i] is not None:
                    itl.append(now - last[i])
                last[i], seen[i] = now, n
    wall = time.perf_counter() - t0
    p50, p99 = np.percentile(itl, 50), np.percentile(itl, 99)
    return (f"stall {stall}: {len(prompts) * 64 / wall:.1f} tok/s, {steps} steps, ITL p50/p99 "
            f"{p50 * 1e3:.0f}/{p99 * 1e3:.0f} ms ({p99 / p50:.1f}x)")


def main() -> None:
    llm = LLM("default", max_batch=1, max_len=4096)
    prompts = [llm.encode(p.text) for p in sample(2, None, None)[0]]
    for stall in sys.argv[1:] or ["5"]:
        print(run(llm, prompts, float(stall)), flush=True)


if __name__ == "__main__":
    main()
