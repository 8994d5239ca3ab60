#!/usr/bin/env bash
# Int8 against fp32 activations, and both against llama.cpp, greedy:
#   bash experiments/int8_bench.sh OUT_DIR
# 1. the default model with int8 activations (the default): plain decoding, oracle at alpha 0.6 and 0.8
#    (k = 4; synthetic), ngram-tree (auto), Spec-Bench 5 prompts per group, 128 tokens, concurrency 1 and 16,
#    llama.cpp on the same file; the pass cost curve (1 to 64 tokens, batch 1 and 16);
# 2. the same with fp32 activations (no peers);
# 3. Gemma 3 270M with int8 and fp32 activations: plain decoding and ngram-tree, 2 prompts per group, 64 tokens,
#    raw prompts, llama.cpp on the same file;
# 4. every drafter in both settings, 2 prompts per group, 64 tokens: divergent prompts (greedy identity).
# Needs `pip install -e .[peers]` (llama-cpp-python).  Run it with nothing else busy on the machine.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: experiments/int8_bench.sh OUT_DIR}
main="none,oracle:alpha=0.6:k=4,oracle:alpha=0.8:k=4,ngram-tree"
.venv/bin/specserve bench --methods "$main" --per-group 5 --max-tokens 128 --concurrency 1,16 --peers llama.cpp \
  --cost-tokens 1,2,5,9,17,33,64 --cost-batches 1,16 --no-plots --out "$out/smollm2-int8" >/dev/null
.venv/bin/specserve bench --activations f32 --methods "$main" --per-group 5 --max-tokens 128 --concurrency 1,16 \
  --cost-tokens 1,2,5,9,17,33,64 --cost-batches 1,16 --no-plots --out "$out/smollm2-f32" >/dev/null
for act in int8 f32; do
  .venv/bin/specserve bench --model gemma3-270m --activations $act --methods none,ngram-tree --per-group 2 --max-tokens 64 \
    --peers llama.cpp --cost-tokens 1,2,5,9,17 --cost-batches 1 --no-plots --out "$out/gemma3-270m-$act" >/dev/null
done
all="ngram:k=4,ngram-tree,suffix,lookahead,layerskip,eagle:k=4,medusa,draft-model:model=default:k=4,oracle:alpha=0.8:k=4"
for act in int8 f32; do
  .venv/bin/specserve bench --activations $act --methods "$all" --per-group 2 --max-tokens 64 --cost-tokens '' \
    --no-plots --out "$out/drafters-$act" >/dev/null
done
