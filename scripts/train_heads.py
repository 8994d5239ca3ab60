"""Train the shipped heads for the default model, choosing the EAGLE variant by measurement.

    python scripts/train_heads.py [--data-dir results/train-data] [--work results/heads]

1. the self-distillation data (1,600 shipped training prompts answered by the target; resumed if
   present; the last shard of 64 prompts is the held-out validation split);
2. EAGLE over the last layer and over the fused low/middle/high layers, both trained on every
   position for the same ``--compare-steps`` optimiser steps: the better validation acceptance wins;
3. the winner trained on answer positions only, as long: the better of the two wins;
4. the final EAGLE head: the winning settings for ``--final-epochs`` epochs, into the package;
5. Medusa heads with the winning positions for ``--medusa-epochs`` epochs, into the package.

Every run is ``specserve train ...`` (its command is recorded inside the head); this script only
chooses between them and writes ``benchmarks/heads-training/summary.json``.  Nothing else should
run on the machine meanwhile: the timings are part of the record.
"""

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def train(kind: str, out: Path, extra: list[str], data_dir: str, resume: bool) -> dict:
    cfg = out / "config.json"
    if cfg.exists():                                   # finished before: reuse
        return json.loads(cfg.read_text())["training"]
    cmd = [sys.executable, "-m", "specserve.cli", "train", kind, "--data-dir", data_dir, "--out", str(out), *extra]
    if resume and (out / "checkpoint.pt").exists():
        cmd.append("--resume")
    print("+", " ".join(cmd[2:]), flush=True)
    t0 = time.time()
    subprocess.run(cmd, check=True, cwd=ROOT)
    print(f"  {time.time() - t0:.0f} s", flush=True)
    return json.loads(cfg.read_text())["training"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", default="results/train-data")
    ap.add_argument("--work", default="results/heads")
    ap.add_argument("--compare-steps", type=int, default=50)
    ap.add_argument("--final-epochs", type=int, default=4)
    ap.add_argument("--medusa-epochs", type=int, default=2)
    args = ap.parse_args()
    work = Path(args.work)
    summary: dict = {"runs": {}}

    def run(name: str, kind: str, extra: list[str]) -> float:
        t = train(kind, work / name, extra, args.data_dir, resume=True)
        summary["runs"][name] = {"command": t["command"], "validation": t["validation"],
                                 "wall_seconds": t.get("wall_seconds"), "vocab_coverage": t.get("vocab_coverage")}
        (ROOT / "benchmarks/heads-training/summary.json").write_text(json.dumps(summary, indent=1))
        return t["validation"]["accepted"]

    cap = ["--max-steps", str(args.compare_steps)]
    last = run("eagle-last-both", "eagle", ["--features", "last", "--positions", "both", *cap])
    fused = run("eagle-fused-both", "eagle", ["--features", "fused", "--positions", "both", *cap])
    features = "fused" if fused > last else "last"
    answer = run(f"eagle-{features}-answer", "eagle", ["--features", features, "--positions", "answer", *cap])
    positions = "answer" if answer > max(last, fused) else "both"
    summary["chosen"] = {"features": features, "positions": positions}
    final = ["--features", features, "--positions", positions, "--epochs", str(args.final_epochs)]
    run("eagle-final", "eagle", final)
    run("medusa-final", "medusa", ["--positions", positions, "--epochs", str(args.medusa_epochs), "--lr", "3e-3"])
    for kind in ("eagle", "medusa"):
        dest = ROOT / "specserve/data/heads" / kind
        dest.mkdir(parents=True, exist_ok=True)
        for f in ("head.safetensors", "config.json"):
            shutil.copy(work / f"{kind}-final" / f, dest / f)
        shutil.copy(work / f"{kind}-final" / "loss.png", ROOT / f"benchmarks/heads-training/{kind}-loss.png")   # not in the package
    (ROOT / "benchmarks/heads-training/summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary["chosen"]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
