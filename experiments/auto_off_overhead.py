"""What `auto` costs when it drafts (almost) nothing: plain decoding against the 0.1 oracle with
`auto` (whose drafts are rarely kept, and cost nothing to make), alternated prompt by prompt on the
same prompts, with the thread governor's switches.

    .venv/bin/python experiments/auto_off_overhead.py --groups mt_bench,summarization --per-group 4 --reps 2
"""

from __future__ import annotations

import argparse
import statistics
import time

from specserve.bench.datasets import sample
from specserve.llm import LLM
from specserve.sampling import SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", default="mt_bench,summarization")
    ap.add_argument("--per-group", type=int, default=4)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args()
    llm = LLM("default", drafters=["oracle:alpha=0.1"], max_batch=1)
    prompts, _ = sample(args.per_group, args.groups.split(","))
    ids = [llm.encode(p.text) for p in prompts]
    gov = llm.engine.controller.governor

    def rate(prompt: list[int], drafter: str) -> tuple[float, int]:
        t = time.perf_counter()
        r = llm.engine.generate([llm.request(prompt, args.max_tokens, SamplingParams(), drafter, None)])[0]
        return len(r.tokens) / (time.perf_counter() - t), sum(n == 0 for n in r.stats.nodes_per_step)

    for p in ids:                       # warm-up; the oracle computes the target's continuations here
        rate(p, "oracle")
    switches = gov.switches if gov else 0
    ratios = []
    print("| prompt | group | plain tok/s | oracle 0.1 auto tok/s | ratio | steps without a draft |")
    print("|---|---|---|---|---|---|")
    for rep in range(args.reps):
        for i, (p, meta) in enumerate(zip(ids, prompts)):
            order = ["none", "oracle"] if (i + rep) % 2 == 0 else ["oracle", "none"]
            got = {d: rate(p, d) for d in order}
            ratios.append(got["oracle"][0] / got["none"][0])
            print(f"| {meta.id} | {meta.group} | {got['none'][0]:.1f} | {got['oracle'][0]:.1f} | {ratios[-1]:.3f} "
                  f"| {got['oracle'][1]} |")
    print(f"\nratio mean {statistics.mean(ratios):.3f}, median {statistics.median(ratios):.3f}, "
          f"min {min(ratios):.3f}, max {max(ratios):.3f} over {len(ratios)} pairs; "
          f"thread governor switches: {(gov.switches - switches) if gov else 'no governor'}")


if __name__ == "__main__":
    main()
