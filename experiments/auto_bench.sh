#!/usr/bin/env bash
# The runs behind BENCHMARKS.md section 17 (`auto`, the merged drafter, and the advisor), in order:
# Spec-Bench in two group orders, the repetitive workload, and the advisor's check on both.
# Usage: bash experiments/auto_bench.sh OUTDIR   (about 45 minutes on 2 vCPUs)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-results/auto-merged}
mkdir -p "$out"
methods=ngram-tree,suffix,eagle,auto,auto:parts=ngram-tree+suffix/own=0+eagle
common=(--per-group 5 --max-tokens 128 --concurrency 1,4,16,32 --cost-tokens '')
.venv/bin/specserve bench --methods "$methods" --groups all "${common[@]}" --out "$out/order-a" > "$out/order-a.log" 2>&1
.venv/bin/specserve bench --methods "$methods" --groups rag,math_reasoning,qa,summarization,translation,mt_bench \
  "${common[@]}" --out "$out/order-b" > "$out/order-b.log" 2>&1
.venv/bin/specserve bench --methods ngram-tree,suffix,auto --prompts specserve/data/bench/repetitive.jsonl \
  --per-group 12 --max-tokens 128 --concurrency 1,4 --cost-tokens '' --out "$out/repetitive" > "$out/repetitive.log" 2>&1
.venv/bin/specserve advise --per-group 2 --concurrency 1,4 --check --json "$out/advise-specbench.json" \
  > "$out/advise-specbench.md" 2> "$out/advise-specbench.log"
.venv/bin/specserve advise --prompts specserve/data/bench/repetitive.jsonl --per-group 6 --concurrency 1,4 \
  --methods ngram-tree,suffix,auto --check --json "$out/advise-repetitive.json" > "$out/advise-repetitive.md" \
  2> "$out/advise-repetitive.log"
