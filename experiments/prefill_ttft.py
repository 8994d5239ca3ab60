"""Time to first token of one prompt of random tokens, alone, in process (best of 3): the prefill.
Run it from a checkout to measure that checkout (PYTHONPATH=. from its folder).

    python experiments/prefill_ttft.py 60 200 500 1000 1500
"""
import sys
import time

import torch

from specserve.engine import Request
from specserve.llm import LLM


def main() -> None:
    llm = LLM("default", drafters=[], max_batch=2, max_len=4096)
    g = torch.Generator().manual_seed(0)
    for n in [int(x) for x in sys.argv[1:]] or [200, 1000]:
        prompt = torch.randint(100, 40000, (n,), generator=g).tolist()
        llm.engine.generate([Request(prompt, 1)])
        best = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            llm.engine.generate([Request(prompt, 1)])
            best = min(best, time.perf_counter() - t)
        print(f"{n} tokens: {best * 1e3:.0f} ms", flush=True)


if __name__ == "__main__":
    main()
