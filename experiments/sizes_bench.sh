#!/usr/bin/env bash
# Random-weight targets of real shapes against llama.cpp, and what speculation at a given acceptance
# buys at each size (the synthetic oracle), greedy, concurrency 1:
#   bash experiments/sizes_bench.sh OUT_DIR MODELS_DIR [SHAPE:QUANT ...]
# (default: every shape in q4_k_m, then llama3.2-1b in q4_0 and q8_0).  For each: `specserve make-model`
# writes MODELS_DIR/SHAPE-QUANT.gguf unless it is there, then `specserve bench` runs plain decoding and the
# oracle at alpha 0.6 and 0.8 with k = 4, 1 Spec-Bench prompt per group, 64 tokens, llama.cpp on the same
# file, and the pass cost curve of 1, 2, 5, 9 and 17 tokens.  Needs llama-cpp-python; run it alone.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: experiments/sizes_bench.sh OUT_DIR MODELS_DIR [SHAPE:QUANT ...]}
models=${2:?usage: experiments/sizes_bench.sh OUT_DIR MODELS_DIR [SHAPE:QUANT ...]}
shift 2
runs=("$@")
[ ${#runs[@]} -gt 0 ] || runs=(llama3.2-1b:q4_k_m gemma3-1b:q4_k_m qwen2.5-3b:q4_k_m llama3.1-8b:q4_k_m llama3.2-1b:q4_0 llama3.2-1b:q8_0)
mkdir -p "$out" "$models"
for run in "${runs[@]}"; do
  shape=${run%%:*}; quant=${run##*:}
  file="$models/$shape-$quant.gguf"
  [ -f "$file" ] || .venv/bin/specserve make-model --shape "$shape" --quant "$quant" --out "$file"
  [ -f "$out/$shape-$quant/report.md" ] && continue           # done in an earlier run
  /usr/bin/time -v .venv/bin/specserve bench --model "$file" \
    --methods none,oracle:alpha=0.6:k=4,oracle:alpha=0.8:k=4 --per-group 1 --max-tokens 64 --peers llama.cpp \
    --cost-tokens 1,2,5,9,17 --cost-batches 1 --no-plots --out "$out/$shape-$quant" > "$out/$shape-$quant.log" 2>&1
done
