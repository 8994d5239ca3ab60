"""Fit and check ngram-tree's settings on training prompts, never on the evaluation set.

1. Greedy outputs of the target for a seeded sample of training prompts (cached in --cache).
2. Calibration: the drafter's node confidences against how often each node was on the accepted
   path, replayed exactly (``specserve.bench.replay``: greedy acceptance needs no target pass).
3. Every setting given with --try (drafter specs), replayed: mean accepted length, nodes per step,
   and the speed-up predicted from this machine's measured cost curve.

    .venv/bin/python experiments/tune_ngram_tree.py --prompts ../shared/data/train/mixed_prompts.jsonl:50 \\
        ../shared/data/train/gsm8k_train_prompts.jsonl:30 --try ngram:k=4 ngram-tree:k=6
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import numpy as np

from specserve.bench.costs import cost_curve
from specserve.bench.replay import accepted_path, replay
from specserve.drafters import DrafterSpec
from specserve.drafters.ngram_tree import ngram_tree_propose
from specserve.drafters.trie import TrieOptions
from specserve.llm import LLM
from specserve.sampling import SamplingParams


def greedy_outputs(llm: LLM, sources: list[str], max_tokens: int) -> list[dict]:
    rows = []
    for src in sources:
        path, _, n = src.partition(":")
        lines = [json.loads(x) for x in open(path)]
        random.Random(0).shuffle(lines)
        rows += lines[: int(n or 50)]
    out = []
    for i, r in enumerate(rows):
        ids = llm.encode(r["prompt"])
        res = llm.engine.generate([llm.request(ids, max_tokens, SamplingParams(), "none", 0)])[0]
        out.append({"id": r["id"], "prompt_ids": ids, "continuation": res.tokens})
        print(f"\r  greedy outputs {i + 1}/{len(rows)}", end="", file=sys.stderr)
    print(file=sys.stderr)
    return out


def calibration(data: list[dict], every: int = 3) -> list[tuple[float, float, int]]:
    """(confidence bin low edge, fraction accepted, nodes) for the default ngram-tree."""
    tot, hit = np.zeros(10), np.zeros(10)
    for r in data:
        seq = r["prompt_ids"] + r["continuation"]
        for pos in range(len(r["prompt_ids"]), len(seq) - 1, every):
            prop = ngram_tree_propose(np.array(seq[: pos + 1]), 16, 8, TrieOptions(min_score=0.0))
            on_path = set(accepted_path(prop, seq[pos + 1:]))
            for i, c in enumerate(prop.confidence or []):
                b = min(int(c * 10), 9)
                tot[b] += 1
                hit[b] += i in on_path
    return [(b / 10, hit[b] / tot[b], int(tot[b])) for b in range(10) if tot[b]]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", nargs="+", required=True, help="JSONL files of {prompt}, each as PATH[:N]")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--cache", default="results/tune-ngram-tree/greedy.json")
    ap.add_argument("--try", dest="tries", nargs="+", default=["ngram:k=4", "ngram-tree"])
    args = ap.parse_args()
    llm = LLM("default", max_batch=1, max_len=4096)
    cache = Path(args.cache)
    if cache.is_file():
        data = json.loads(cache.read_text())
    else:
        data = greedy_outputs(llm, args.prompts, args.max_tokens)
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(data))
    curve = {c["tokens"]: c["seconds"] for c in cost_curve(llm.target, [1, 2, 3, 4, 5, 8, 9, 16], [1], trees=False)}
    xs = sorted(curve)

    def cost(n: int) -> float:
        return float(np.interp(n, xs, [curve[x] for x in xs]))

    print(f"{len(data)} prompts, {sum(len(r['continuation']) for r in data)} greedy tokens")
    print("cost curve (ms, batch 1): " + ", ".join(f"{t}: {curve[t] * 1e3:.1f}" for t in xs))
    print("\ncalibration of ngram-tree's confidence (min_score 0, budget 16):")
    for lo, frac, n in calibration(data):
        print(f"  confidence {lo:.1f}-{lo + 0.1:.1f}: accepted {frac:.3f} of {n} nodes")
    print("\n| drafter | mean accepted length | nodes per step | predicted speed-up |\n|---|---|---|---|")
    for text in args.tries:
        spec = DrafterSpec.parse(text)
        drafter = spec.build(llm.target)
        toks, secs, acc, passes, nodes = 0, 0.0, 0, 0, 0
        for i, r in enumerate(data):
            s = replay(drafter, r["prompt_ids"], r["continuation"], spec.k, seq_id=i)
            toks += s.generated_tokens
            secs += cost(1) + sum(cost(n + 1) for n in s.nodes_per_step)
            acc, passes, nodes = acc + s.accepted_tokens, passes + s.verify_passes, nodes + s.drafted_tokens
        print(f"| {text} | {(acc + passes) / passes:.3f} | {nodes / passes:.2f} | {toks * cost(1) / secs:.3f} |")


if __name__ == "__main__":
    main()
