"""Self-distillation data: the target answers training prompts; its features are the training data.

``generate`` runs the target greedily over chat-formatted prompts, a batch of rows at a time, and
keeps for every position of prompt + answer the token and the target features the heads learn
from (the layers a head config names, plus the final normed layer, from which the target's own
distribution over the head's vocabulary is recomputed at training time).  Greedy answers make the
data the target's own choices: at an answer position the next token *is* the target's argmax.

Shards are written as they fill (``shard-00000.safetensors``; tensors ``tokens`` int32 [N],
``prompt_mask`` uint8 [N] (1: a prompt position), ``seq_start`` int64 [S + 1] (sequence offsets),
``features`` float16 [N, F, hidden] in the order of ``layers`` in ``meta.json``), so a stopped run
resumes after its last whole shard.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from specserve.errors import SpecserveError
from specserve.models.loader import LoadedModel
from specserve.train.regen import prompt_lines


@dataclass
class DataConfig:
    layers: tuple[int, ...]           # feature layers to keep (see ``Decoder.forward``)
    max_prompt_tokens: int = 384      # longer prompts are skipped
    max_new_tokens: int = 160
    batch: int = 16                   # rows decoded together
    shard_sequences: int = 64


def read_prompts(paths: list[str], limit: int | None, seed: int, skip: int = 0) -> list[str]:
    """Prompts from JSONL files (field ``prompt``, or the first of ``turns``), shuffled by ``seed``."""
    prompts: list[str] = []
    for p in paths:
        for _, _, text in prompt_lines(p, "training prompts", lambda r: r["prompt"] if "prompt" in r else r["turns"][0],
                                       "'prompt' (or 'turns')"):
            if isinstance(text, str) and text.strip():
                prompts.append(text)
    random.Random(seed).shuffle(prompts)
    return prompts[skip:skip + limit if limit is not None else None]


@torch.inference_mode()
def answer(target: LoadedModel, prompts: list[list[int]], cfg: DataConfig, eos: frozenset[int]) -> list[dict]:
    """Greedy answers for one batch of tokenised prompts, with features: one dict per prompt."""
    model = target.model
    layers = tuple(sorted(set(cfg.layers)))
    cache = model.new_cache(len(prompts), max(len(p) for p in prompts) + cfg.max_new_tokens + 1)
    seqs = []
    for row, p in enumerate(prompts):
        out = model(torch.tensor([p]), cache, [row], [0], last_only=True, features=layers)
        feats = [torch.stack([out.features[l][0] for l in layers], 1).half()]           # [T, F, hidden]
        seqs.append({"tokens": list(p), "prompt_len": len(p), "feats": feats,
                     "pending": int(out.logits[0, -1].argmax()), "done": False})
    for _ in range(cfg.max_new_tokens):
        live = [i for i, s in enumerate(seqs) if not s["done"]]
        if not live:
            break
        toks = torch.tensor([[seqs[i]["pending"]] for i in live])
        out = model(toks, cache, live, [len(seqs[i]["tokens"]) for i in live], features=layers)
        step = torch.stack([out.features[l][:, 0] for l in layers], 1).half()            # [B, F, hidden]
        for j, i in enumerate(live):
            s = seqs[i]
            s["tokens"].append(s["pending"])
            s["feats"].append(step[j:j + 1])
            s["pending"] = int(out.logits[j, 0].argmax())
            if s["tokens"][-1] in eos:
                s["done"] = True
    return seqs


def generate(target: LoadedModel, prompts: list[list[int]], eos: frozenset[int], out_dir: str, cfg: DataConfig,
             progress=None) -> Path:
    """Write self-distillation shards for tokenised ``prompts`` under ``out_dir`` (stopping at
    ``eos``); resumes after whole shards."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"layers": sorted(set(cfg.layers)), "hidden_size": target.config.hidden_size,
            "vocab_size": target.config.vocab_size, "num_layers": target.config.num_layers,
            "max_new_tokens": cfg.max_new_tokens, "prompts": len(prompts), "shards": []}
    meta_path = out / "meta.json"
    if meta_path.exists():
        old = json.loads(meta_path.read_text())
        if old["layers"] != meta["layers"] or old["hidden_size"] != meta["hidden_size"]:
            raise SpecserveError(f"{out} holds data with other layers or another model; use a new directory")
        meta["shards"] = old["shards"]
    done = sum(s["prompts"] for s in meta["shards"])
    encoded = prompts[done:]
    t0 = time.perf_counter()
    for first in range(0, len(encoded), cfg.shard_sequences):
        chunk = encoded[first:first + cfg.shard_sequences]
        kept = [p for p in chunk if len(p) <= cfg.max_prompt_tokens]
        kept.sort(key=len)                       # similar lengths decode together
        seqs = []
        for b in range(0, len(kept), cfg.batch):
            seqs += answer(target, kept[b:b + cfg.batch], cfg, eos)
        name = f"shard-{len(meta['shards']):05d}.safetensors"
        ntok = _write_shard(out / name, seqs)
        meta["shards"].append({"file": name, "prompts": len(chunk), "sequences": len(seqs), "tokens": ntok})
        meta_path.write_text(json.dumps(meta, indent=1))
        if progress:
            progress(done + first + len(chunk), done + len(encoded), sum(s["tokens"] for s in meta["shards"]),
                     time.perf_counter() - t0)
    return out


@torch.inference_mode()
def teacher_forced(target: LoadedModel, rows: list[dict], layers: tuple[int, ...]) -> list[dict]:
    """The features of regenerated sequences (``specserve.train.regen``: ``prompt_ids`` +
    ``answer_ids``), by one pass over each whole sequence: the same data ``answer`` keeps, without
    generating again."""
    model, layers = target.model, tuple(sorted(set(layers)))
    longest = max(len(r["prompt_ids"]) + len(r["answer_ids"]) for r in rows)
    cache = model.new_cache(1, longest + 1)
    seqs = []
    for r in rows:
        tokens = list(r["prompt_ids"]) + list(r["answer_ids"])
        out = model(torch.tensor([tokens]), cache, [0], [0], last_only=True, features=layers)
        feats = torch.stack([out.features[l][0] for l in layers], 1).half()                # [T, F, hidden]
        seqs.append({"tokens": tokens, "prompt_len": len(r["prompt_ids"]), "feats": [feats]})
    return seqs


def from_sequences(target: LoadedModel, sequences_dir: str, out_dir: str, cfg: DataConfig, limit: int | None = None,
                   progress=None, skip: int = 0) -> Path:
    """Training shards (as ``generate`` writes them) from a directory of regenerated sequences (after
    the first ``skip``, at most ``limit``); resumes after whole shards."""
    from specserve.train.regen import read_sequences
    rows = read_sequences(sequences_dir)[skip:skip + limit if limit is not None else None]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"layers": sorted(set(cfg.layers)), "hidden_size": target.config.hidden_size,
            "vocab_size": target.config.vocab_size, "num_layers": target.config.num_layers,
            "max_new_tokens": cfg.max_new_tokens, "prompts": len(rows), "sequences_from": str(sequences_dir),
            "sequences_skipped": skip, "shards": []}
    meta_path = out / "meta.json"
    if meta_path.exists():
        old = json.loads(meta_path.read_text())
        if (old["layers"] != meta["layers"] or old.get("sequences_from") != meta["sequences_from"]
                or old.get("sequences_skipped", 0) != skip):
            raise SpecserveError(f"{out} holds data with other layers or other sequences; use a new directory")
        meta["shards"] = old["shards"]
    done, t0 = sum(s["prompts"] for s in meta["shards"]), time.perf_counter()
    for first in range(done, len(rows), cfg.shard_sequences):
        chunk = rows[first:first + cfg.shard_sequences]
        name = f"shard-{len(meta['shards']):05d}.safetensors"
        ntok = _write_shard(out / name, teacher_forced(target, chunk, cfg.layers))
        meta["shards"].append({"file": name, "prompts": len(chunk), "sequences": len(chunk), "tokens": ntok})
        meta_path.write_text(json.dumps(meta, indent=1))
        if progress:
            progress(first + len(chunk), len(rows), sum(s["tokens"] for s in meta["shards"]), time.perf_counter() - t0)
    return out


def _write_shard(path: Path, seqs: list[dict]) -> int:
    toks = torch.tensor([t for s in seqs for t in s["tokens"]], dtype=torch.int32)
    mask = torch.tensor([int(i < s["prompt_len"]) for s in seqs for i in range(len(s["tokens"]))], dtype=torch.uint8)
    starts = torch.tensor([0] + [len(s["tokens"]) for s in seqs], dtype=torch.int64).cumsum(0)
    feats = torch.cat([f for s in seqs for f in s["feats"]])
    tmp = path.with_suffix(".tmp")
    save_file({"tokens": toks, "prompt_mask": mask, "seq_start": starts, "features": feats}, str(tmp))
    tmp.rename(path)
    return int(toks.numel())


def load(data_dir: str) -> tuple[dict, list[dict[str, torch.Tensor]]]:
    """``meta`` and the shards of a data directory."""
    d = Path(data_dir)
    if not (d / "meta.json").exists():
        raise SpecserveError(f"{d} holds no training data (no meta.json); make it with `specserve train data`")
    meta = json.loads((d / "meta.json").read_text())
    return meta, [load_file(str(d / s["file"])) for s in meta["shards"]]
