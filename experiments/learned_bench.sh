#!/usr/bin/env bash
# The learned drafters' benchmark runs (nothing else should run meanwhile):
#   1. greedy, concurrency 1: eagle and medusa (auto and fixed node budgets) beside n-gram (chain
#      and tree), the SYNTHETIC oracle at alpha 0.8, k = 4, and plain decoding;
#   2. sampled (temperature 0.7, top-p 0.9), concurrency 1;
#   3. auto across concurrency 1 to 32 against plain and a fixed budget.
# Results: results/learned-{greedy,sampled,concurrency}/ (report.md, results.json, plots).
set -euo pipefail
cd "$(dirname "$0")/.."
SS=.venv/bin/specserve
$SS bench --methods none,ngram,ngram-tree,eagle,eagle:k=2,eagle:k=4,eagle:k=8,eagle:k=16,medusa,medusa:k=4,medusa:k=8,oracle:alpha=0.8:k=4 \
  --groups all --per-group 5 --max-tokens 128 --concurrency 1 --cost-tokens 1,2,4,8,16 --cost-batches 1 \
  --out results/learned-greedy > /dev/null
$SS bench --methods none,ngram-tree,eagle,eagle:k=3,medusa,medusa:k=3 --temperature 0.7 --top-p 0.9 --seed 0 \
  --groups all --per-group 5 --max-tokens 128 --concurrency 1 --cost-tokens '' \
  --out results/learned-sampled > /dev/null
$SS bench --methods none,eagle,eagle:k=4,medusa --groups all --per-group 4 --max-tokens 128 \
  --concurrency 1,2,4,8,16,32 --concurrency-prompts 24 --cost-tokens '' --out results/learned-concurrency > /dev/null
