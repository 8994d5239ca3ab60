#!/bin/bash
# the shipped one-layer eagle-parallel head trained on two features folders together: the earlier
# answers it was trained on (results/feat-new, ../eagle-parallel/commands.sh) and the first 3,000
# answers to the public prompt sets (results/feat-shared, ../eagle-parallel-shared/commands.sh);
# each folder's last shard held out. Stopped after step 120 of 180 for the time (config.json: the
# head kept at step 120); resumable with --resume.
set -e
cd "$(dirname "$0")/../../.." && source .venv/bin/activate   # the repository root
time specserve train eagle --data-dir results/feat-new --also-data results/feat-shared --out results/heads/eagle-parallel-mixed --features fused --parallel 4 --init specserve/data/heads/eagle-parallel --positions both --epochs 1 --max-steps 180 --lr 3e-4 --val-every 60 --checkpoint-every 20 --seed 2
.venv/bin/python experiments/head_validation.py --data-dir results/feat-new --head results/heads/eagle-parallel-mixed/at-step-120
.venv/bin/python experiments/head_validation.py --data-dir results/feat-shared --head results/heads/eagle-parallel-mixed/at-step-120
