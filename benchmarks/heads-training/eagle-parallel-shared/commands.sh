#!/bin/bash
# the shipped one-layer eagle-parallel head fine-tuned on the target's answers to the public prompt
# sets (tool use, rewriting, translation, reading comprehension, summarisation): features of the
# first 3,000 answered prompts of data/regen/smollm2-135m-shared, then one pass at --lr 3e-4.
set -e
cd "$(dirname "$0")/../../.." && source .venv/bin/activate   # the repository root
time specserve train data --from-sequences data/regen/smollm2-135m-shared --data-dir results/feat-shared --num-prompts 3000
time specserve train eagle --data-dir results/feat-shared --out results/heads/eagle-parallel-shared --features fused --parallel 4 --init specserve/data/heads/eagle-parallel --positions both --epochs 1 --lr 3e-4 --val-every 50 --checkpoint-every 20 --seed 1
