"""Greedy identity and seeded sampling of every drafter with the target on a CUDA device.

    python experiments/cuda_check.py [--device cuda]

Tiny random targets (no model files needed): for each drafter, 6 prompts alone and batched at
fixed k and ``auto`` must give plain decoding's tokens; sampled runs must repeat under a seed.
Exits 1 on any difference.
"""

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from conftest import tiny_config, tiny_head, tiny_state_dict  # noqa: E402

from specserve.drafters import create  # noqa: E402
from specserve.engine import Engine, Request  # noqa: E402
from specserve.models.loader import LoadedModel, RuntimeOptions, build_model  # noqa: E402
from specserve.sampling import SamplingParams  # noqa: E402


def model(seed: int, device: str, layers: int = 2) -> LoadedModel:
    cfg = tiny_config(vocab=64, layers=layers)
    opts = RuntimeOptions("float32", device, "torch", "auto").resolve()
    return LoadedModel(build_model(cfg, tiny_state_dict(cfg, seed), opts), cfg, f"<tiny {seed}>", opts)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    dev = ap.parse_args().device
    target = model(31, dev)
    print(f"device {target.model.device}, runtime {target.options}", flush=True)
    prompts = [[1, 2, 3, 4, 5, 1, 2, 3], [7, 7, 7, 7], [10, 20, 30, 10, 20, 30, 10, 20, 31, 10, 20]] * 2
    plain = [Engine(target, {"none": create("none", target)}, max_batch=1, max_len=128)
             .generate([Request(p, 24)])[0].tokens for p in prompts]
    specs = {"ngram": {}, "ngram-tree": {}, "draft-model": {"model": model(32, dev, 1)},
             "eagle": {"head": tiny_head("eagle", target)}, "medusa": {"head": tiny_head("medusa", target)}}
    bad = 0
    for name, opts in specs.items():
        for k in (2, 6, "auto"):
            t = time.perf_counter()
            eng = Engine(target, {name: create(name, target, **opts)}, max_batch=3, max_len=128)
            outs = eng.generate([Request(p, 24, drafter=name, num_draft=k) for p in prompts])
            same = sum(o.tokens == ref for o, ref in zip(outs, plain))
            drafted = sum(o.stats.drafted_tokens for o in outs)
            print(f"{name:12s} k={k!s:5s} greedy identical {same}/{len(prompts)}, drafted {drafted}, "
                  f"{time.perf_counter() - t:.2f} s", flush=True)
            bad += same != len(prompts)
        sp = [SamplingParams(0.8, 0, 0.9, seed=i) for i in range(len(prompts))]
        runs = []
        for _ in range(2):
            eng = Engine(target, {name: create(name, target, **opts)}, max_batch=3, max_len=128)
            runs.append([o.tokens for o in eng.generate([Request(p, 24, sampling=s, drafter=name, num_draft=3)
                                                         for p, s in zip(prompts, sp)])])
        print(f"{name:12s} sampled: seeded runs equal {runs[0] == runs[1]}", flush=True)
        bad += runs[0] != runs[1]
    print("OK" if not bad else f"{bad} FAILURES", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
