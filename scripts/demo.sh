#!/usr/bin/env bash
# The main job: a short generation on the default model with speculation on, printing the text and
# the speed against plain decoding (same runtime, same prompt).  The first run sets up .venv
# (installs, and builds the native kernels: several minutes, a line at least every 30 s); later
# runs take seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "demo: setting up .venv (the first run installs packages and builds the native kernels: minutes)"
bash scripts/setup.sh
echo "demo: loading the default model (SmolLM2-135M-Instruct), then generating 128 tokens with speculation" \
     "and again plainly, to compare"
exec .venv/bin/specserve generate --model default --max-tokens 128 \
  --prompt "Summarize the following text in two sentences, reusing its wording: Speculative decoding lets a cheap drafter propose several tokens, verifies all of them in one pass of the target model, and keeps the longest prefix the target agrees with, plus one token of the target's own. Under greedy decoding the output is token for token the target's greedy output." \
  --compare-plain "$@"
