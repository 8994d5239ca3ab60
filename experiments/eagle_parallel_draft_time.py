"""Where an `eagle-parallel` draft's time goes on the default model: the median of each part of
`propose` (the head's one call over real and placeholder entries, the reduced LM head, the tree)
over three Spec-Bench prompts of 128 tokens at a budget of 4 nodes, one sequence; then the head's
int8 products alone at 5 rows (one real entry and 3 placeholders, plus one row of new features).
``--compare``: also the head's layer run op by op in torch (around the same products) instead of the
runtime's one call (``Decoder.draft_layer``), a second drafter in the same process, the two timed in
alternating rounds.

``--head DIR``: another head than the drafter's shipped one (a deeper head, for instance).

    .venv/bin/python experiments/eagle_parallel_draft_time.py [--drafter eagle-parallel] [--k 4] [--compare] [--head DIR]
"""

import argparse
import statistics
import time

import torch

from specserve.bench.datasets import load_jsonl
from specserve.drafters import create
from specserve.engine import Engine, Request
from specserve.llm import LLM


def timed(obj, name: str, times: dict) -> None:
    """Wrap ``obj.name`` so that each call's wall seconds are appended to ``times[name]``."""
    f = getattr(obj, name)

    def g(*a, **k):
        t = time.perf_counter()
        r = f(*a, **k)
        times.setdefault(name, []).append(time.perf_counter() - t)
        return r
    setattr(obj, name, g)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drafter", default="eagle-parallel")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--head", default="default")
    ap.add_argument("--compare", action="store_true",
                    help="also the layer op by op (the same drafter, rounds alternating with the one call)")
    args = ap.parse_args()
    llm = LLM("default", max_batch=1, max_len=1024)
    prompts = [llm.encode(p.text) for p in load_jsonl()[:4]]
    runs = {}                                                    # path -> (drafter, engine, times, [seconds, steps])
    for path in ("one call", "op by op") if args.compare else ("one call",):
        d = create(args.drafter, llm.target, head=args.head)
        if path == "op by op" or d.layer is None:
            d.layer, path = None, "op by op"
        times: dict[str, list[float]] = {}
        for name in ("propose", "_catch_up", "_entries", "_logits"):
            timed(d, name, times)
        eng = Engine(llm.target, {"d": d}, max_batch=1, max_len=1024)
        eng.generate([Request(prompts[0], 32, drafter="d", num_draft=args.k)])       # warm-up
        times.clear()
        runs[path] = (d, eng, times, [0.0, 0])
    for _ in range(2):                                           # two rounds, the paths alternating
        for d, eng, times, total in runs.values():
            t0 = time.perf_counter()
            for p in prompts[1:]:
                total[1] += eng.generate([Request(p, 128, drafter="d", num_draft=args.k)])[0].stats.target_passes
            total[0] += time.perf_counter() - t0
    for path, (d, _, times, (seconds, steps)) in runs.items():
        print(f"{args.drafter} k={args.k} ({path}): {steps} steps, {1000 * seconds / steps:.2f} ms a step on average")
        for name, v in times.items():
            print(f"  {name:10s} {len(v):4d} calls, median {1000 * statistics.median(v):.3f} ms")
    d = next(iter(runs.values()))[0]
    total = 0.0
    first = d.lin | d.ops[0]                         # the fusion and the first layer's products
    for name in [n for n in USED if n in first]:     # an eagle3 head has no fc
        lin = first[name]
        x = torch.randn(5, in_features(d, name))
        ts = []
        for _ in range(220):
            t = time.perf_counter()
            lin(x)
            ts.append(time.perf_counter() - t)
        total += statistics.median(ts[20:])
        print(f"  product {name:8s} 5 rows, median {1e6 * statistics.median(ts[20:]):.1f} us")
    print(f"  the products together: {1000 * total:.3f} ms")


def in_features(d, name: str) -> int:
    """The input width of the head's product ``name``: its weight's columns (``qkv``: q's)."""
    return getattr(d.head, "q" if name == "qkv" else name).weight.shape[1]


USED = ("fuse", "fc", "qkv", "o", "gate_up", "down")    # the products a draft runs (q and kv: as qkv)


if __name__ == "__main__":
    main()
