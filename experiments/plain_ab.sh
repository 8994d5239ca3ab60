#!/usr/bin/env bash
# Plain decoding in two source trees, one after the other, Spec-Bench 5 prompts per group, 128 tokens,
# concurrency 1 and 16:  bash experiments/plain_ab.sh BEFORE_TREE OUT_DIR   (e.g. git worktree add /tmp/before REV)
set -euo pipefail
before=$(cd "${1:?usage: plain_ab.sh BEFORE_TREE OUT_DIR}" && pwd)
out=$(mkdir -p "${2:?}" && cd "$2" && pwd)
here=$(cd "$(dirname "$0")/.." && pwd)
for run in before:"$before" after:"$here" before2:"$before" after2:"$here"; do
  (cd "${run#*:}" && PYTHONPATH="${run#*:}" "$here/.venv/bin/python" -m specserve.cli bench --methods none --groups all \
    --per-group 5 --max-tokens 128 --concurrency 1,16 --cost-tokens '' --no-plots --out "$out/${run%%:*}" >/dev/null)
done
