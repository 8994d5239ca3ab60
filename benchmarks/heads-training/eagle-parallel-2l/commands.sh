#!/bin/bash
# a parallel head of two decoder layers, warm-started from the shipped one-layer eagle-parallel head
# (its layer, placeholder and vocabulary; the second layer starting as the identity), on the same
# features the shipped head was trained on (results/feat-new, see ../eagle-parallel/commands.sh).
# Stopped after step 140 of 260 for the time; config.json is the head kept at step 130.
set -e
cd "$(dirname "$0")/../../.." && source .venv/bin/activate   # the repository root
# first try, stopped at step 68 (held-out acceptance 0.97 at step 50, from 1.11: the first layer
# unlearned at --lr 1e-3):
#   specserve train eagle ... --max-steps 300 --val-every 50 (default --lr 1e-3) --seed 1
time specserve train eagle --data-dir results/feat-new --out results/heads/eagle-parallel-2l --features fused --parallel 4 --head-layers 2 --init specserve/data/heads/eagle-parallel --positions both --epochs 1 --max-steps 260 --lr 3e-4 --val-every 65 --checkpoint-every 20 --seed 1
# resume: the same command with --resume
