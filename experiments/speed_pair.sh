#!/usr/bin/env bash
# Speed of two source trees in turns (A B A B), the same bench each time, so drift falls on both:
#   bash experiments/speed_pair.sh SRC_A SRC_B OUT_DIR
# plain decoding, ngram-tree (auto) and the oracle (alpha 0.8, k 4): Spec-Bench 2 prompts per group,
# 128 tokens, concurrency 1 and 8.  Run it with nothing else busy on the machine.
set -euo pipefail
a=$(cd "${1:?usage: speed_pair.sh SRC_A SRC_B OUT_DIR}" && pwd)
b=$(cd "${2:?}" && pwd)
out=$(mkdir -p "${3:?}" && cd "$3" && pwd)
py=$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/python
for round in 1 2; do
  for side in a b; do
    src=$a; [ $side = b ] && src=$b
    (cd "$src" && PYTHONPATH="$src" "$py" -m specserve.cli bench --methods none,ngram-tree,oracle:alpha=0.8:k=4 \
      --per-group 2 --max-tokens 128 --concurrency 1,8 --cost-tokens '' --no-plots --out "$out/$side-$round" >/dev/null)
  done
done
