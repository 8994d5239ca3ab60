#!/usr/bin/env bash
# The parallel-drafting EAGLE head (eagle-parallel) against plain decoding, the one-token-per-pass
# head (eagle) and ngram-tree on Spec-Bench (5 prompts per group, 128 tokens): fixed node budgets
# and the controller's budget at concurrency 1, greedy; sampled (T 0.7, top-p 0.9); and auto with
# and without the head at concurrency 1 to 32 (BENCHMARKS.md, section 24).
set -euo pipefail
OUT=${1:-results/eagle-parallel}
B=".venv/bin/specserve bench --groups all --per-group 5 --max-tokens 128 --cost-tokens ''"
eval "$B --concurrency 1 --methods eagle-parallel:k=4,eagle-parallel:k=8,eagle-parallel,eagle:k=4,eagle,ngram-tree --out $OUT/fixed"
eval "$B --concurrency 1 --methods eagle-parallel,eagle-parallel:k=4,eagle:k=4 --temperature 0.7 --top-p 0.9 --seed 0 --out $OUT/sampled"
eval "$B --concurrency 1,4,16,32 --concurrency-prompts 48 --methods auto,auto:parts=ngram-tree+suffix/own=0+eagle-parallel --out $OUT/auto"
