#!/usr/bin/env bash
# Every drafter's tokens from one source tree, for `specserve bench compare`:
#   bash experiments/tokens_run.sh SRC_DIR OUT_DIR
# SRC_DIR: a checkout (e.g. `git worktree add /tmp/before HEAD~1`), run with this project's venv.
# 1. greedy: every drafter, Spec-Bench 10 prompts per group (60), 64 tokens;
# 2. sampled (temperature 0.8, prompt i seeded 7 + i): every real drafter, 2 prompts per group, 64 tokens.
set -euo pipefail
src=$(cd "${1:?usage: tokens_run.sh SRC_DIR OUT_DIR}" && pwd)
out=$(mkdir -p "${2:?}" && cd "$2" && pwd)
py=$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/python
real="ngram:k=4,ngram-tree,suffix,lookahead,layerskip,eagle:k=4,medusa,draft-model:model=default:k=4"
cd "$src"
PYTHONPATH="$src" "$py" -m specserve.cli bench --methods "$real,oracle:alpha=0.8:k=4" --per-group 10 --max-tokens 64 \
  --cost-tokens '' --no-plots --out "$out/greedy" >/dev/null
PYTHONPATH="$src" "$py" -m specserve.cli bench --methods "$real" --per-group 2 --max-tokens 64 --cost-tokens '' \
  --no-plots --temperature 0.8 --seed 7 --out "$out/sampled" >/dev/null
