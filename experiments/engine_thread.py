"""Plain decoding run from the main thread, then from a second thread while the main thread still
holds its pool of compute threads, then from a second thread after the main thread released it
(``Engine.release_threads``, what the server does before its engine thread starts): 128 greedy
tokens, tokens per second, two runs each.

    .venv/bin/python experiments/engine_thread.py
"""

from __future__ import annotations

import threading
import time

from specserve.llm import LLM
from specserve.sampling import SamplingParams


def main() -> None:
    llm = LLM("default", max_batch=1, max_len=1024)
    ids = llm.encode("Write a short story about a robot learning to paint.")

    def run(tag: str) -> None:
        rates = []
        for _ in range(2):
            t = time.perf_counter()
            r = llm.engine.generate([llm.request(ids, 128, SamplingParams(), "none", 0)])[0]
            rates.append(len(r.tokens) / (time.perf_counter() - t))
        print(f"| {tag} | {rates[0]:.1f} | {rates[1]:.1f} |", flush=True)

    def in_thread(tag: str) -> None:
        t = threading.Thread(target=run, args=(tag,))
        t.start()
        t.join()

    llm.engine.generate([llm.request(ids, 8, SamplingParams(), "none", 0)])        # warm-up
    print("| engine runs in | tok/s, run 1 | tok/s, run 2 |\n|---|---|---|")
    run("the main thread")
    in_thread("a second thread, the main thread's pool still there")
    llm.engine.release_threads()
    in_thread("a second thread, after the main thread released its pool")


if __name__ == "__main__":
    main()
