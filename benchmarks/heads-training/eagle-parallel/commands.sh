#!/bin/bash
# features of regenerated sequences not used by the shipped eagle head, then the parallel head
set -e
cd "$(dirname "$0")/../../.." && source .venv/bin/activate   # the repository root
date
time specserve train data --from-sequences data/regen/smollm2-135m --data-dir results/feat-new --skip-sequences 4608 --num-prompts 7000
date
time specserve train eagle --data-dir results/feat-new --out results/heads/eagle-parallel --features fused --parallel 4 --init default --positions both --epochs 1 --val-every 100 --checkpoint-every 20
date
