#!/usr/bin/env bash
# The figures of BENCHMARKS.md's "each step at the price of its pass" section, one command per part:
#   bash experiments/step_path_bench.sh OUT_DIR [PART...]     (parts: profile steps spec gemma identity; default all)
# Needs llama-cpp-python in .venv for the peer (`pip install llama-cpp-python`).
set -euo pipefail
out=$(mkdir -p "${1:?usage: step_path_bench.sh OUT_DIR [PART...]}" && cd "$1" && pwd)
shift
parts=${*:-profile steps spec gemma identity}
cd "$(dirname "$0")/.."
ss=.venv/bin/specserve
real="ngram:k=4,ngram-tree,suffix,lookahead,layerskip,eagle:k=4,medusa,draft-model:model=default:k=4,auto"
for part in $parts; do
  case $part in
    profile)   # a pass by part, 1 / 5 / 9 tokens at context 256, both KV cache types, and the roofline
      $ss profile --runtimes native,native:int8:bf16 --tokens 1,5,9 --reps 40 --context 256 >"$out/profile.md" ;;
    steps)     # a decoding step's time outside its pass, per method, concurrency 1
      $ss bench steps --methods none,ngram-tree,auto --per-group 2 --max-tokens 128 --json "$out/steps.json" >"$out/steps.txt" ;;
    spec)      # Spec-Bench, 5 prompts per group, 128 tokens, concurrency 1 and 16, against llama.cpp
      $ss bench --methods none,oracle:alpha=0.8:k=4,auto,ngram-tree --groups all --per-group 5 --max-tokens 128 \
        --concurrency 1,16 --peers llama.cpp --cost-tokens 1,5,9 --no-plots --out "$out/spec-bench" >/dev/null ;;
    gemma)     # plain decoding on Gemma 3 270M against llama.cpp
      $ss bench --model gemma3-270m --methods none --groups all --per-group 5 --max-tokens 128 --concurrency 1 \
        --peers llama.cpp --cost-tokens '' --no-plots --out "$out/gemma" >/dev/null ;;
    identity)  # every drafter against plain decoding, each KV cache type
      for kv in f32 bf16; do
        $ss bench --kv "$kv" --methods "$real,oracle:alpha=0.8:k=4" --per-group 2 --max-tokens 64 --cost-tokens '' \
          --no-plots --out "$out/identity-$kv" >/dev/null
      done ;;
    *) echo "unknown part $part" >&2; exit 2 ;;
  esac
done
