"""A trained EAGLE head's held-out acceptance on a features folder (the one ``specserve train eagle``
reports while training: drafted tokens a greedy chain accepts per step on the folder's last shard,
from every answer position), for comparing heads on the same data, e.g. a head trained elsewhere on
another folder's held-out shard.

    .venv/bin/python experiments/head_validation.py --data-dir results/feat-shared --head DIR [--head DIR ...]
"""

import argparse

from specserve.drafters.heads.files import read_config
from specserve.models.loader import load_model
from specserve.train import data as tdata
from specserve.train.trainer import Data, TrainConfig, Trainer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--head", action="append", required=True)
    ap.add_argument("--model", default="default")
    args = ap.parse_args()
    target = load_model(args.model)
    meta, shards = tdata.load(args.data_dir)
    for head in args.head:
        c = read_config(head)
        data = Data(meta, shards, tuple(c.feature_layers))
        cfg = TrainConfig(kind=c.kind, layers=tuple(c.feature_layers), parallel=c.parallel, steps=c.parallel or 1,
                          mask_token_id=c.mask_token_id, head_layers=c.num_layers, init=head,
                          intermediate_size=c.intermediate_size)
        val = Trainer(cfg, target, data, "/tmp/head-validation-unused").validate()
        by = " ".join(f"{x:.3f}" for x in val["by_depth"])
        print(f"{head}: {val['accepted']:.3f} accepted per step ({by} by depth; {val['starts']} starts, "
              f"held-out shard of {args.data_dir})")


if __name__ == "__main__":
    main()
