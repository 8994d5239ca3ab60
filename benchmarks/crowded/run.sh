#!/usr/bin/env bash
# The interleaved benchmark (plain decoding against auto, Spec-Bench, greedy, 128 tokens) on this
# commit and on a base commit checked out at $BASE (a git worktree), alternately, one after another:
#   BASE=/tmp/base bash benchmarks/crowded/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
out=$PWD/benchmarks/crowded
py=$PWD/.venv/bin/python
run() {   # label, source tree (imported from the working directory), concurrency, prompts, rounds
    (cd "$2" && "$py" -m specserve.cli bench interleaved --methods auto --concurrency "$3" \
        --num-prompts "$4" --rounds "$5" --json "$out/$1-c$3.json" > "$out/$1-c$3.log" 2>&1)
    tail -1 "$out/$1-c$3.log"
}
for c in 32 1; do
    n=64; r=3; [ "$c" = 1 ] && n=24 && r=2
    run now "$PWD" "$c" "$n" "$r"
    run base "$BASE" "$c" "$n" "$r"
done
