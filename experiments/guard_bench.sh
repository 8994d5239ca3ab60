#!/usr/bin/env bash
# auto with and without its guard against plain decoding (experiments/guard_ab.py), greedy at
# concurrency 1, 4, 16 and 32, then sampled at temperature 1.0 (the server's default); one process per
# row, configurations rotated inside it.  Records in benchmarks/guard/.  About 30 minutes on 2 vCPUs.
#   bash experiments/guard_bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out=benchmarks/guard
mkdir -p "$out"
run() { .venv/bin/python experiments/guard_ab.py "$@"; }
run --concurrency 16 --num-prompts 48 --rounds 3 --json "$out/ab-c16.json"
run --concurrency 4 --num-prompts 32 --rounds 3 --json "$out/ab-c4.json"
run --concurrency 32 --num-prompts 64 --rounds 3 --json "$out/ab-c32.json"
run --concurrency 1 --num-prompts 16 --rounds 3 --json "$out/ab-c1.json"
for c in 1 4 16; do
    run --concurrency "$c" --num-prompts $((c == 1 ? 16 : 48)) --rounds 3 --temperature 1.0 --json "$out/ab-c$c-t1.0.json"
done
