"""`auto` with and without its guard against plain decoding, in one process, runs rotated round by
round (a slow spell of a shared machine falls on every configuration alike): the interleaved
benchmark's closed loop (every (480 / N)-th Spec-Bench prompt through one engine of C rows, 128
tokens, greedy or sampled at --temperature with prompt i seeded with i).  ``auto`` runs with the
guard on (what every request naming no drafter gets), keeping what the guard learnt from one run to
the next as a server would; ``auto-unguarded`` with it off (the cost model alone decides).  Each
ratio comes with the 90% bootstrap interval of ``specserve bench interleaved`` (prompts and rounds
resampled); the guard's leading arm per batch level is printed at the end.

    .venv/bin/python experiments/guard_ab.py --concurrency 16 --num-prompts 48 --rounds 3 --json benchmarks/guard/c16.json
"""
from __future__ import annotations

import argparse
import json
import time

from specserve.bench.datasets import rotation
from specserve.bench.interleaved import methods_of, strided, summarize
from specserve.bench.runner import encode_all, load_llm
from specserve.sampling import SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--num-prompts", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--json")
    args = ap.parse_args()
    methods = methods_of(["auto"], plain_first=True)
    llm = load_llm("default", None, methods, args.concurrency, 2048)
    guard = llm.engine.controller.guard
    ids = encode_all(llm, strided(args.num_prompts, None))
    greedy = args.temperature == 0

    def run(m, n: int):
        reqs = [llm.request(p, n, SamplingParams(temperature=args.temperature, seed=None if greedy else i),
                            m.label, m.k) for i, p in enumerate(ids)]
        return llm.engine.generate(reqs)

    configs = [("none", methods[0], True), ("auto", methods[1], True), ("auto-unguarded", methods[1], False)]
    for _, m, on in configs:                                        # warm-up
        guard.enabled = on
        run(m, 16)
    runs, first = [], {}
    for r in range(args.rounds):
        for name, m, on in (configs[j] for j in rotation(len(configs), r)):
            guard.enabled = on
            llm.reset_memory()
            t = time.perf_counter()
            res = run(m, args.max_tokens)
            dt = time.perf_counter() - t
            out = [x.tokens for x in res]
            first.setdefault(name, out)
            runs.append({"round": r, "config": name, "seconds": dt, "tokens": sum(map(len, out)),
                         "shares": [x.stats.share_s for x in res], "counts": list(map(len, out))})
            print(f"r{r} {name:15s} {dt:7.2f} s {runs[-1]['tokens'] / dt:6.1f} tok/s", flush=True)

    summary = summarize(runs, [name for name, _, _ in configs], first, greedy, key="config")
    for name, s in summary.items():
        same = f" ({s['identical']}/{len(ids)} identical)" if greedy else ""
        print(f"{name}: {s['speedup']:.3f}x plain [90%: {s['interval'][0]:.3f}-{s['interval'][1]:.3f}]{same}")
    leaders = guard.leaders()
    print("guard's leading arm by batch level (lowest sequence count):", leaders)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": vars(args), "runs": runs, "summary": summary, "leaders": leaders}, f, indent=1)


if __name__ == "__main__":
    main()
