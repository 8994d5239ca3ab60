"""Tokens of two ``specserve bench`` runs, method by method, on the prompts both ran.

    .venv/bin/python scripts/compare_tokens.py benchmarks/before-trees/results.json \\
        benchmarks/tree-final/results.json --methods none,ngram:k=4,oracle:alpha=0.8:k=4
"""

from __future__ import annotations

import argparse
import json


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--methods", default="", help="comma-separated labels (default: every method both ran)")
    args = ap.parse_args()
    before, after = json.load(open(args.before)), json.load(open(args.after))
    labels = args.methods.split(",") if args.methods else [m for m in after["records"] if m in before["records"]]
    for label in labels:
        b = {r["prompt_id"]: r["tokens"] for r in before["records"][label]}
        a = {r["prompt_id"]: (r["tokens"], r["group"]) for r in after["records"][label]}
        common = sorted(set(a) & set(b))
        same = sum(a[i][0] == b[i] for i in common)
        groups = sorted({a[i][1] for i in common})
        print(f"{label}: {same}/{len(common)} prompts with identical tokens ({', '.join(groups)})")


if __name__ == "__main__":
    main()
