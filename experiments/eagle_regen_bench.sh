#!/usr/bin/env bash
# The shipped EAGLE head against the EAGLE-3-layout head trained on one pass over the target's
# regenerated answers (NEW), plain decoding and ngram-tree (greedy); sampled trees against sampled
# chains (sample_width=1) for eagle and medusa.  Spec-Bench 5 prompts per group, 128 tokens,
# concurrency 1 (BENCHMARKS.md, section 15).
set -euo pipefail
OUT=${1:-results/eagle-regen}
NEW=${NEW:-results/heads/eagle3-regen}
B=".venv/bin/specserve bench --groups all --per-group 5 --max-tokens 128 --concurrency 1 --cost-tokens ''"
eval "$B --methods ngram-tree,eagle,eagle:k=4,eagle:k=8,eagle:head=$NEW:k=8 --out $OUT/greedy"
eval "$B --methods ngram-tree,eagle,eagle:k=4,eagle:k=4:sample_width=1,medusa:k=4,medusa:k=4:sample_width=1 \
    --temperature 0.7 --top-p 0.9 --seed 0 --out $OUT/sampled"
