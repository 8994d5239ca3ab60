"""``specserve train {data,eagle,medusa}``: self-distillation data and head training."""

from __future__ import annotations

import argparse
import sys
from importlib import resources

from specserve.errors import SpecserveError


def default_prompts() -> list[str]:
    """The shipped training prompts (never Spec-Bench)."""
    d = resources.files("specserve") / "data" / "train"
    return [str(d / "mixed_prompts.jsonl"), str(d / "gsm8k_train_prompts.jsonl")]


def _data_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="default", help="the target: 'default', a Hugging Face directory or a .gguf")
    p.add_argument("--prompts", nargs="+", default=None,
                   help="JSONL files with a 'prompt' per line (default: the shipped training prompts)")
    p.add_argument("--num-prompts", type=int, default=1600, help="prompts the target answers (after shuffling)")
    p.add_argument("--data-dir", default="results/train-data",
                   help="where the target's answers and features are kept (resumed when present)")
    p.add_argument("--max-new-tokens", type=int, default=160, help="answer length cap")
    p.add_argument("--gen-batch", type=int, default=32, help="rows the target answers together")
    p.add_argument("--seed", type=int, default=0, help="shuffles prompts and seeds training")
    p.add_argument("--from-sequences", default=None, metavar="DIR", help="compute the features of regenerated "
                   "sequences (`specserve train regen`) instead of generating answers (--num-prompts: at most "
                   "this many sequences)")
    p.add_argument("--skip-sequences", type=int, default=0, metavar="N", help="with --from-sequences: start after "
                   "the first N sequences (in the folder's order)")


def add_parser(sub) -> None:
    t = sub.add_parser("train", help="train EAGLE or Medusa heads on the target (self-distillation)")
    tsub = t.add_subparsers(dest="what", required=True, parser_class=type(t))
    d = tsub.add_parser("data", help="only make the self-distillation data")
    _data_args(d)
    g = tsub.add_parser("regen", help="the target's greedy answers to training prompts, as token sequences only "
                                      "(resumable; features are recomputed from them)")
    g.add_argument("--model", default="default", help="the target")
    g.add_argument("--prompts", nargs="+", default=None, help="JSONL files with 'prompt' or 'turns' per line "
                   "(default: the shipped training prompts)")
    g.add_argument("--out", required=True, help="folder for the shards (resumed when present)")
    g.add_argument("--max-new-tokens", type=int, default=256, help="answer length cap")
    g.add_argument("--max-prompt-tokens", type=int, default=768, help="longer conversations are skipped")
    g.add_argument("--batch", type=int, default=16, help="sequences the engine runs together")
    g.add_argument("--drafter", default="ngram-tree", help="speculation for speed only: greedy output is the "
                   "target's whatever the drafter")
    g.add_argument("--limit", type=int, default=None, help="answer at most this many records (in file order)")
    for kind in ("eagle", "medusa"):
        h = tsub.add_parser(kind, help=f"train {'an EAGLE head' if kind == 'eagle' else 'Medusa heads'} "
                                       "(makes the data first when --data-dir holds none)")
        _data_args(h)
        h.add_argument("--out", required=True, help="folder for the head, checkpoints and the loss curve")
        h.add_argument("--resume", action="store_true", help="continue from the checkpoint in --out")
        h.add_argument("--also-data", action="append", default=[], metavar="DIR", help="another folder of "
                       "training data (`specserve train data`, the same layers) to train on together with "
                       "--data-dir; its last shard is held out too (repeatable)")
        h.add_argument("--epochs", type=int, default=1)
        h.add_argument("--max-steps", type=int, default=0, help="stop after this many optimiser steps (0: no cap)")
        h.add_argument("--lr", type=float, default=1e-3)
        h.add_argument("--batch-tokens", type=int, default=4096, help="positions per optimiser step")
        h.add_argument("--vocab", type=int, default=8192, help="reduced draft vocabulary (most frequent tokens)")
        h.add_argument("--positions", default="both", choices=["answer", "prompt", "both"],
                       help="train on the target's distributions at answer, prompt or all positions")
        h.add_argument("--checkpoint-every", type=int, default=100, help="optimiser steps between checkpoints")
        h.add_argument("--val-every", type=int, default=0, help="also validate every this many optimiser steps, "
                       "keeping the head of that moment in OUT/at-step-N (0: after each epoch only)")
        if kind == "eagle":
            h.add_argument("--features", default=None, help="'last' (the final normed layer, EAGLE-1/2), "
                           "'fused' (a low, a middle and a high layer, EAGLE-3) or layer numbers, e.g. 2,15,27 "
                           "(default: last; fused with --layout eagle3)")
            h.add_argument("--layout", default="eagle", choices=["eagle", "eagle3"],
                           help="'eagle' (this project's layer, the shipped head's) or 'eagle3' (EAGLE-3's exact "
                           "layout, which `specserve export eagle` writes for vLLM and SGLang)")
            h.add_argument("--ttt-steps", type=int, default=3, help="training-time-test unroll depth")
            h.add_argument("--parallel", type=int, default=0, metavar="K", help="train a parallel-drafting head "
                           "(P-EAGLE): one pass drafts K tokens, positions after the first filled with a learned "
                           "placeholder; the unroll depth is K (0: a head drafting one token per pass)")
            h.add_argument("--intermediate-size", type=int, default=0, help="MLP width (0: the target's)")
            h.add_argument("--head-layers", type=int, default=1, metavar="N", help="the head's decoder layers (the "
                           "layout's first, then plain ones starting as the identity, so --init may name a "
                           "shallower head)")
            h.add_argument("--init", default="", metavar="HEAD", help="start from this head's weights and reduced "
                           "vocabulary ('default': the shipped eagle head); it must have the same layout and layers")
        else:
            h.add_argument("--heads", type=int, default=4, help="Medusa heads (offsets +2 .. +1+heads)")


def _progress(what: str):
    def show(done: int, total: int, tokens: int, seconds: float) -> None:
        print(f"\r{what}: {done}/{total} prompts, {tokens} tokens, {tokens / max(seconds, 1e-9):.0f} tok/s, "
              f"{seconds:.0f} s", end="", file=sys.stderr, flush=True)
        if done == total:
            print(file=sys.stderr)
    return show


def make_data(args: argparse.Namespace, layers: tuple[int, ...]):
    from specserve.models.loader import load_model
    from specserve.tokenizer import load_tokenizer
    from specserve.train.data import DataConfig, generate, read_prompts

    target = load_model(args.model)
    if args.from_sequences:
        from specserve.train.data import from_sequences
        from_sequences(target, args.from_sequences, args.data_dir, DataConfig(layers=layers), args.num_prompts,
                       progress=_progress("features"), skip=args.skip_sequences)
        return target
    tok = load_tokenizer(target)
    prompts = read_prompts(args.prompts or default_prompts(), args.num_prompts, args.seed)
    cfg = DataConfig(layers=layers, max_new_tokens=args.max_new_tokens, batch=args.gen_batch)
    encoded = [tok.encode_chat([{"role": "user", "content": p}]) for p in prompts]
    generate(target, encoded, tok.eos_ids, args.data_dir, cfg, progress=_progress("target answers"))
    return target


def data_layers(num_layers: int) -> tuple[int, ...]:
    """Low, middle and high layers (EAGLE-3's fusion) and the final normed output (EAGLE-1/2, Medusa)."""
    return (2, num_layers // 2, num_layers - 3, num_layers)


def regen(args: argparse.Namespace) -> int:
    import shlex

    from specserve.llm import LLM
    from specserve.train.regen import Regenerator, read_records

    if args.max_new_tokens < 1 or args.max_prompt_tokens < 1 or args.batch < 1:
        raise SpecserveError("--max-new-tokens, --max-prompt-tokens and --batch must be >= 1")
    import random
    records = read_records(args.prompts or default_prompts())
    random.Random(0).shuffle(records)             # a partial run covers every source (resumes by id)
    records = records[:args.limit]
    llm = LLM(args.model, drafters=[args.drafter], max_batch=args.batch,
              max_len=args.max_prompt_tokens + args.max_new_tokens)
    command = "specserve " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    Regenerator(llm, args.out, args.max_new_tokens, args.max_prompt_tokens, args.drafter.split(":")[0],
                command).run(records, progress=_progress("regenerated"))
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    if args.what == "regen":
        return regen(args)
    if args.what == "data":
        from specserve.models.loader import load_model
        cfg = load_model(args.model).config
        make_data(args, data_layers(cfg.num_layers))
        return 0
    return train_head(args)


def feature_layers(spec: str, num_layers: int) -> tuple[int, ...]:
    if spec == "last":
        return (num_layers,)
    if spec == "fused":
        return data_layers(num_layers)[:3]
    try:
        layers = tuple(int(x) for x in spec.split(","))
    except ValueError:
        raise SpecserveError(f"--features takes last, fused or layer numbers, got {spec!r}") from None
    if any(not 0 <= l <= num_layers for l in layers):
        raise SpecserveError(f"--features layers must lie in 0..{num_layers}")
    return layers


def head_layers(args: argparse.Namespace, num_layers: int) -> tuple[str, tuple[int, ...]]:
    """The head kind trained (eagle, eagle3 or medusa) and the layers it reads, refused before any data is made."""
    if args.what != "eagle":
        return args.what, (num_layers,)
    if args.layout == "eagle3":
        from specserve.drafters.heads.files import check_eagle3_layers
        layers = feature_layers(args.features or "fused", num_layers)
        check_eagle3_layers(layers, num_layers)
        return "eagle3", layers
    return "eagle", feature_layers(args.features or "last", num_layers)


def train_head(args: argparse.Namespace) -> int:
    import shlex
    from pathlib import Path

    from specserve.models.loader import load_model
    from specserve.train import data as tdata
    from specserve.train.trainer import Data, TrainConfig, Trainer

    for d in args.also_data:
        if not (Path(d) / "meta.json").exists():
            raise SpecserveError(f"--also-data {d}: no training data there (no meta.json); make it with "
                                 f"`specserve train data --data-dir {d}`")
    parallel = getattr(args, "parallel", 0)                  # refused before any data is made
    if parallel < 0 or parallel == 1:
        raise SpecserveError(f"--parallel takes K >= 2 (tokens one pass drafts) or 0, got {parallel}")
    depth = getattr(args, "head_layers", 1)
    if depth < 1:
        raise SpecserveError(f"--head-layers takes N >= 1, got {depth}")
    target = load_model(args.model)
    num_layers = target.config.num_layers
    kind, layers = head_layers(args, num_layers)
    needed = tuple(sorted(set(data_layers(num_layers)) | set(layers)))
    if not (Path(args.data_dir) / "meta.json").exists():
        make_data(args, needed)
    meta, shards = tdata.load(args.data_dir)
    more = [tdata.load(d) for d in args.also_data]
    data = Data(meta, shards, layers, more)
    cfg = TrainConfig(kind=kind, layers=layers, vocab=args.vocab, parallel=parallel, head_layers=depth,
                      steps=parallel or getattr(args, "ttt_steps", 1), num_medusa=getattr(args, "heads", 0),
                      intermediate_size=getattr(args, "intermediate_size", 0), epochs=args.epochs, lr=args.lr,
                      init=init_head(getattr(args, "init", "")),
                      batch_tokens=args.batch_tokens, positions=args.positions, max_steps=args.max_steps,
                      checkpoint_every=args.checkpoint_every, val_every=args.val_every, seed=args.seed,
                      command="specserve " + " ".join(shlex.quote(a) for a in sys.argv[1:]))
    trainer = Trainer(cfg, target, data, args.out)
    if args.resume and trainer.resume():
        print(f"resumed at step {trainer.step}", file=sys.stderr)
    elif (Path(args.out) / "checkpoint.pt").exists():
        raise SpecserveError(f"{args.out} holds a checkpoint; pass --resume to continue it, or use another --out")
    import time
    t0 = time.perf_counter()
    val = trainer.run(progress=_train_progress(kind))
    ntok = sum(len(s["tokens"]) for s in data.train)
    trainer.export(args.out, {"wall_seconds": round(time.perf_counter() - t0, 1),
                              "data": {"dir": args.data_dir, "also": args.also_data,
                                       "prompts": meta["prompts"] + sum(m["prompts"] for m, _ in more),
                                       "train_sequences": len(data.train), "train_positions": ntok,
                                       "val_sequences": len(data.val)}})
    print(f"validation: a greedy chain of {val['depth']} accepts {val['accepted']:.2f} drafted tokens per step "
          f"(by depth {', '.join(f'{x:.2f}' for x in val['by_depth'])}); head written to {args.out}", file=sys.stderr)
    return 0


def init_head(spec: str) -> str:
    """``--init``: '' (none), 'default' (the shipped eagle head) or a head folder."""
    if not spec:
        return ""
    from specserve.drafters.heads.runtime import check_head_path, head_path
    return str(head_path("eagle", check_head_path(spec)))


def _train_progress(kind: str):
    from tqdm import tqdm
    bar = {}

    def show(step: int, total: int, loss: float, tok_s: float, val: dict | None = None) -> None:
        if "bar" not in bar:
            bar["bar"] = tqdm(total=total, initial=step - 1, desc=f"train {kind}", unit="step", file=sys.stderr)
        b = bar["bar"]
        if val is not None:
            b.write(f"epoch done at step {step}: validation accepts {val['accepted']:.2f} drafted tokens per step")
            return
        b.update(step - b.n)
        b.set_postfix(loss=f"{loss:.3f}", tok_s=f"{tok_s:.0f}")
        if step >= total:
            b.close()
    return show
