#!/usr/bin/env bash
# The training-free drafters against plain decoding and prompt lookup, greedy, concurrency 1:
#   bash experiments/training_free_bench.sh OUT_DIR
# 1. Spec-Bench, 3 prompts per group, 128 tokens: ngram, ngram-tree, suffix, layerskip, lookahead (auto draft
#    sizes), and lookahead at a fixed node budget of 24 (its whole window, pool and own-text trie every step);
# 2. the repetitive workload (specserve/data/bench/repetitive.jsonl, 24 prompts, 128 tokens): ngram,
#    ngram-tree, suffix, and suffix at a fixed node budget of 8 (its corpus grows request by request).
# Run it with nothing else busy on the machine.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: experiments/training_free_bench.sh OUT_DIR}
.venv/bin/specserve bench --methods ngram,ngram-tree,suffix,layerskip,lookahead,lookahead:k=24 --per-group 3 --max-tokens 128 \
  --cost-tokens '' --no-plots --out "$out/specbench" >/dev/null
.venv/bin/specserve bench --prompts specserve/data/bench/repetitive.jsonl --methods ngram,ngram-tree,suffix,suffix:k=8 \
  --per-group 12 --max-tokens 128 --cost-tokens '' --no-plots --out "$out/repetitive" >/dev/null
