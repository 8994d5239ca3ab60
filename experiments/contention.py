"""Plain decoding alone and beside one busy thread (another process spinning on one core), for
specserve (with its thread governor, and with the governor off) and, when llama-cpp-python is
installed, llama.cpp: 128 greedy tokens, tokens per second (median of --runs).

    .venv/bin/python experiments/contention.py --runs 3
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import time

from specserve.llm import LLM
from specserve.sampling import SamplingParams

PROMPT = "Write a short story about a robot learning to paint."


def busy() -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    time.sleep(0.5)
    return p


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    args = ap.parse_args()
    llm = LLM("default", max_batch=1, max_len=1024)
    ids = llm.encode(PROMPT)

    def ours() -> float:
        t = time.perf_counter()
        r = llm.engine.generate([llm.request(ids, args.tokens, SamplingParams(), "none", 0)])[0]
        return len(r.tokens) / (time.perf_counter() - t)

    def ours_fixed() -> float:
        """The same with the thread governor off: all cores at every pass."""
        ctl = llm.engine.controller
        governor, ctl.governor = ctl.governor, None
        llm.engine.model.set_threads(0)
        try:
            return ours()
        finally:
            ctl.governor, llm.engine._threads_set = governor, 0     # the governor sets its count again

    runners = {"specserve": ours, "specserve, governor off (all cores)": ours_fixed}

    def theirs() -> float:
        """llama.cpp, loaded only when its turn comes (a loaded llama.cpp slows the others' runs)."""
        if "cpp" not in loaded:
            from llama_cpp import Llama
            loaded["cpp"] = Llama(llm.target.path, n_ctx=1024, verbose=False)
        cpp = loaded["cpp"]
        cpp.reset()
        t = time.perf_counter()
        n = 0
        for n, _ in enumerate(cpp.generate(ids, temp=0.0, top_k=1), 1):
            if n >= args.tokens:
                break
        return n / (time.perf_counter() - t)

    loaded: dict = {}
    if importlib.util.find_spec("llama_cpp") is not None:      # not imported before its turn either
        runners["llama.cpp"] = theirs
    else:
        print("llama-cpp-python not installed: specserve only", file=sys.stderr)
    print("| engine | alone tok/s | beside a busy process tok/s | kept | alone again tok/s |\n|---|---|---|---|---|")
    for name, go in runners.items():
        go()                                                            # warm-up
        alone = [go() for _ in range(args.runs)]
        p = busy()
        try:
            shared = [go() for _ in range(args.runs)]
        finally:
            p.kill()
            p.wait()
        again = [go() for _ in range(args.runs)]
        med = lambda xs: sorted(xs)[len(xs) // 2]                      # noqa: E731
        print(f"| {name} | {med(alone):.1f} | {med(shared):.1f} | {med(shared) / med(alone) * 100:.0f}% | "
              f"{med(again):.1f} |")


if __name__ == "__main__":
    main()
