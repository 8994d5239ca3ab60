"""Methods (plain decoding, drafters) on the engine under two or more int8 paths, in one process:
each round runs every (path, method) pair over every prompt at one concurrency level, in rotated
order, as ``specserve bench interleaved`` rotates methods; greedy outputs are compared across paths
(every path gives the same bits, so they must be identical).

    .venv/bin/python experiments/engine_paths.py [--model default] [--methods none,oracle:alpha=0.8:k=4]
        [--paths avx512-vnni,avx512-vnni-tiles] [--concurrency 16] [--num-prompts 48] [--rounds 2]
        [--max-tokens 128] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="default")
    ap.add_argument("--methods", default="none")
    ap.add_argument("--paths", default="avx512-vnni,avx512-vnni-tiles")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--num-prompts", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--json")
    args = ap.parse_args()
    from specserve.bench.datasets import rotation
    from specserve.bench.interleaved import MAX_LEN, methods_of, strided
    from specserve.bench.runner import encode_all, load_llm
    from specserve.host import cpu_info
    from specserve.models.native import packed as pk
    from specserve.sampling import SamplingParams

    methods = methods_of(args.methods.split(","), plain_first=True)
    paths = args.paths.split(",")
    llm = load_llm(args.model, None, methods, args.concurrency, MAX_LEN)
    ids = encode_all(llm, strided(args.num_prompts, None))

    def generate(m, prompts, max_tokens):
        reqs = [llm.request(p, max_tokens, SamplingParams(), m.label, m.k) for p in prompts]
        return [r.tokens for r in llm.engine.generate(reqs)]

    pairs = [(p, m) for p in paths for m in methods]
    for p, m in pairs:                                           # warm-up
        pk.set_path(p)
        generate(m, ids[:2], 16)
    runs, first = [], {}
    for r in range(args.rounds):
        for p, m in (pairs[j] for j in rotation(len(pairs), r)):
            pk.set_path(p)
            llm.reset_memory()
            t = time.perf_counter()
            out = generate(m, ids, args.max_tokens)
            dt = time.perf_counter() - t
            first.setdefault((p, m.label), out)
            tokens = sum(map(len, out))
            runs.append({"round": r, "path": p, "method": m.label, "seconds": dt, "tokens": tokens})
            print(f"{p} {m.label} {dt:.2f} s {tokens / dt:.1f} tok/s", flush=True)
    pk.set_path(None)
    secs = {(p, m.label): sum(x["seconds"] for x in runs if (x["path"], x["method"]) == (p, m.label)) for p, m in pairs}
    toks = {(p, m.label): sum(x["tokens"] for x in runs if (x["path"], x["method"]) == (p, m.label)) for p, m in pairs}
    plain = methods[0].label
    print(f"\n{args.model}; CPU {cpu_info().name}; concurrency {args.concurrency}, {len(ids)} prompts, "
          f"{args.rounds} rounds, {args.max_tokens} tokens")
    print("| path | method | tok/s | vs plain on this path | vs the same method on " + paths[0] + " | identical to "
          + paths[0] + " |")
    print("|---|---|---:|---:|---:|---:|")
    summary = {}
    for p, m in pairs:
        k = (p, m.label)
        same = sum(a == b for a, b in zip(first[k], first[paths[0], m.label]))
        row = {"tok_s": toks[k] / secs[k], "vs_plain": secs[p, plain] / secs[k], "vs_first_path": secs[paths[0], m.label] / secs[k],
               "identical": same}
        summary[f"{p}/{m.label}"] = row
        print(f"| {p} | {m.label} | {row['tok_s']:.1f} | {row['vs_plain']:.3f}x | {row['vs_first_path']:.3f}x | {same}/{len(ids)} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"config": vars(args), "cpu": cpu_info().name, "prompts": len(ids),
                                               "runs": runs, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
