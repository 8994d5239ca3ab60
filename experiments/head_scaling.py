"""What more training data buys an EAGLE head: validation acceptance against training positions.

Every head given is measured the same way, on two held-out sets of the target's own greedy
sequences: the validation split of a training-data directory (its last shard, never trained on)
and Spec-Bench's prompts answered by the target (evaluation only: ``specserve train regen`` +
``specserve train data --from-sequences`` into a directory of its own, every shard measured).
The figure is the trainer's validation figure: drafted tokens a greedy 5-deep chain accepts per
step, teacher-forced on the target's features (no engine, no timing: it needs no quiet machine).

The heads: ``name=DIR`` pairs, and ``--along OUT`` for a training run made with ``--val-every``:
every ``OUT/at-step-N`` head it kept, with the positions it had trained on by then (its config's
``training.along``) and the final head in OUT.  Writes ``results.json`` and ``scaling.png``.

    python experiments/head_scaling.py --data-dir results/feat-regen --specbench-dir results/feat-specbench \
        --head shipped=specserve/data/heads/eagle --along results/heads/eagle3-regen --out benchmarks/head-scaling
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch


def held_out_sets(data_dir: str, specbench_dir: str) -> dict[str, tuple[dict, list]]:
    """Each set's meta and the shards measured, read once: the held-out split is the training data's
    last shard; Spec-Bench's answers are every shard of their directory."""
    from specserve.train import data as tdata

    meta, shards = tdata.load(data_dir)
    spec_meta, spec_shards = tdata.load(specbench_dir)
    return {"held_out": (meta, shards[-1:]), "spec_bench": (spec_meta, spec_shards)}


def measure(target, head_dir: str, sets: dict[str, tuple[dict, list]]) -> dict:
    """The head at ``head_dir``'s validation figure on every set, by the trainer's own ``validate``."""
    from specserve.drafters.heads import load_head
    from specserve.train.trainer import Data, TrainConfig, Trainer

    cfg, module, vocab_ids = load_head(head_dir)
    layers = tuple(cfg.feature_layers)
    out = {}
    for name, (meta, shards) in sets.items():
        data = Data(meta, shards * 2, layers)                 # (Data holds out its last shard)
        data.val = [s for sh in shards for s in data._split(sh)]
        tr = Trainer(TrainConfig(kind=cfg.kind, layers=layers, vocab=len(vocab_ids)), target, data, "/nonexistent")
        tr.module, tr.vocab_ids = module.float(), vocab_ids
        tr.rows = target.model.weight_rows("lm_head", vocab_ids).cpu()
        v = tr.validate()
        out[name] = {"accepted": round(v["accepted"], 4), "by_depth": [round(x, 4) for x in v["by_depth"]],
                     "starts": v["starts"]}
    return out


def heads(args) -> list[dict]:
    from specserve.drafters.heads.files import read_config
    rows = []
    for spec in args.head:
        name, _, d = spec.partition("=")
        t = read_config(d).training
        rows.append({"name": name, "dir": d, "positions": t.get("data", {}).get("train_positions"),
                     "epochs": t.get("settings", {}).get("epochs"), "kind": read_config(d).kind})
    for run in args.along:
        t = read_config(run).training
        for e in t.get("along", []):
            rows.append({"name": f"{Path(run).name}@{e['step']}", "dir": str(Path(run) / f"at-step-{e['step']}"),
                         "positions": e["positions"], "epochs": None, "kind": read_config(run).kind, "run": run})
        rows.append({"name": Path(run).name, "dir": run, "positions": t.get("positions_seen"),
                     "epochs": t.get("settings", {}).get("epochs"), "kind": read_config(run).kind, "run": run})
    return rows


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
    for a, which in zip(ax, ("held_out", "spec_bench")):
        runs = {}
        for r in rows:
            runs.setdefault(r.get("run") or r["name"], []).append(r)
        for name, rs in runs.items():
            rs = [r for r in rs if r["positions"]]
            a.plot([r["positions"] / 1e6 for r in rs], [r[which]["accepted"] for r in rs], "o-", label=Path(name).name)
        a.set_xlabel("training positions seen (millions)")
        a.set_title(which.replace("_", " "))
    ax[0].set_ylabel("drafted tokens accepted / step (greedy 5-chain)")
    ax[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="default")
    p.add_argument("--data-dir", required=True, help="training data whose last shard is the held-out split")
    p.add_argument("--specbench-dir", required=True, help="features of Spec-Bench sequences (evaluation only)")
    p.add_argument("--head", action="append", default=[], help="name=DIR")
    p.add_argument("--along", action="append", default=[], help="a training OUT made with --val-every")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    from specserve.models.loader import load_model
    target = load_model(args.model)
    rows = heads(args)
    sets = held_out_sets(args.data_dir, args.specbench_dir)
    for r in rows:
        with torch.no_grad():
            r.update(measure(target, r["dir"], sets))
        print(f"{r['name']}: positions {r['positions']}, held-out {r['held_out']['accepted']:.3f}, "
              f"Spec-Bench {r['spec_bench']['accepted']:.3f}", file=sys.stderr)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"command": "python " + " ".join(sys.argv), "heads": rows}, indent=1))
    plot(rows, out / "scaling.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
