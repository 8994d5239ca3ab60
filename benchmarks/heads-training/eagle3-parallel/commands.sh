#!/bin/bash
# The shipped parallel head's EAGLE-3 twin (specserve/data/heads/eagle3-parallel, what
# `specserve export eagle default` writes): a parallel head of EAGLE-3's layout trained from scratch
# on both features folders together (results/feat-new: ../eagle-parallel/commands.sh; results/feat-shared:
# ../eagle-parallel-shared/commands.sh), its reduced vocabulary chosen over both; each folder's last
# shard held out. One run of 480 steps (about 1.9 M positions, 0.7 of a pass over both).
set -e
cd "$(dirname "$0")/../../.." && source .venv/bin/activate   # the repository root
time specserve train eagle --layout eagle3 --data-dir results/feat-new --also-data results/feat-shared --out results/heads/eagle3-parallel --features 2,15,27 --parallel 4 --positions both --epochs 1 --max-steps 480 --val-every 120 --checkpoint-every 20 --seed 3
rm -rf specserve/data/heads/eagle3-parallel && mkdir -p specserve/data/heads/eagle3-parallel
cp results/heads/eagle3-parallel/{config.json,head.safetensors} specserve/data/heads/eagle3-parallel/
cp results/heads/eagle3-parallel/loss.png benchmarks/heads-training/eagle3-parallel/   # the plot stays out of the package
.venv/bin/python experiments/head_validation.py --data-dir results/feat-new --head specserve/data/heads/eagle3-parallel
.venv/bin/python experiments/head_validation.py --data-dir results/feat-shared --head specserve/data/heads/eagle3-parallel
specserve bench --groups all --per-group 5 --max-tokens 128 --cost-tokens '' --concurrency 1 --methods eagle-parallel:k=4,eagle-parallel:head=specserve/data/heads/eagle3-parallel:k=4 --out benchmarks/eagle-heads/twin
specserve export eagle default --out results/eagle3-parallel-hf
