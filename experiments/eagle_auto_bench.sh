#!/usr/bin/env bash
# EAGLE with the shipped head, greedy and sampled, against plain decoding and ngram-tree: fixed node
# budgets at concurrency 1, then `auto` (the default draft size) at concurrency 1 to 32 over 60
# prompts (BENCHMARKS.md, section 16).  OLD: a previous head, run beside the shipped one at k=8.
set -euo pipefail
OUT=${1:-results/eagle-auto}
OLD=${OLD:-}
B=".venv/bin/specserve bench --groups all --per-group 5 --max-tokens 128 --cost-tokens ''"
EXTRA=${OLD:+,eagle:head=$OLD:k=8}
eval "$B --concurrency 1 --methods eagle:k=4,eagle:k=8$EXTRA --out $OUT/fixed"
eval "$B --concurrency 1,4,16,32 --concurrency-prompts 60 --methods eagle,ngram-tree --out $OUT/auto"
eval "$B --concurrency 1 --methods eagle,eagle:k=4 --temperature 0.7 --top-p 0.9 --seed 0 --out $OUT/sampled"
