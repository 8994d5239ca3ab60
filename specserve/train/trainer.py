"""Training a head on self-distillation data: losses, validation acceptance, checkpoints.

The target's distribution p_t at position t (over x_{t+1}) is recomputed from the recorded final
normed feature and the target's LM-head rows of the reduced vocabulary, renormalised over it.
What a head kind trains on is its ``Objective`` (``objectives``: EAGLE's training-time test, for
either EAGLE layout; Medusa's blocks), chosen by the config's ``kind``; the loss is the same for
every kind: sum_j 0.8^j CE(p_{u+ahead_j}, q_j(u)) over the positions that train, output j aligned
as its objective says.

Validation acceptance: on the held-out last shard, the mean number of drafted tokens a greedy
*chain* of the objective's validation depth accepts when the pending token is an answer token
(answers are the target's greedy output, so a drafted token is accepted iff it equals the next
answer token).
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import Tensor

from specserve.drafters.heads import build, save_head
from specserve.errors import SpecserveError
from specserve.train.objectives import OBJECTIVES

STEP_DECAY = 0.8


@dataclass
class TrainConfig:
    kind: str                                # eagle | eagle3 | medusa (``objectives.OBJECTIVES``)
    layers: tuple[int, ...] = ()             # eagle, eagle3: target feature layers fused (medusa: the final layer)
    vocab: int = 8192                        # reduced vocabulary size
    steps: int = 3                           # eagle: training-time-test unroll depth
    parallel: int = 0                        # eagle: positions one pass drafts (P-EAGLE; 0: one per pass)
    mask_token_id: int = 0                   # parallel: the placeholder token
    head_layers: int = 1                     # eagle, eagle3: the head's decoder layers
    init: str = ""                           # start from this head's weights and reduced vocabulary ("": random)
    num_medusa: int = 4
    intermediate_size: int = 0               # eagle, eagle3 MLP width (0: the target's)
    epochs: int = 1
    lr: float = 1e-3
    batch_tokens: int = 4096
    positions: str = "both"                  # which positions' targets train: answer | prompt | both
    max_steps: int = 0                       # stop after this many optimiser steps (0: all epochs)
    val_depth: int = 5
    checkpoint_every: int = 100
    val_every: int = 0                       # also validate (and keep the head) every this many steps (0: epochs only)
    seed: int = 0
    command: str = ""


@dataclass
class Batch:
    tokens: Tensor        # [B, T] int64 (padded with 0)
    answer: Tensor        # [B, T] bool: an answer position
    valid: Tensor         # [B, T] bool: a real (not padding) position
    feats: Tensor         # [B, T, F, hidden] float32: the head's input layers
    final: Tensor         # [B, T, hidden] float32: the final normed layer (targets)


class Data:
    """Sequences of a data directory, batched by length; the last shard is the validation split.
    ``more``: further directories' (meta, shards), of the same layers, trained on together with the
    first; each one's last shard is held out too (the validation split is all the held-out shards)."""

    def __init__(self, meta: dict, shards: list[dict[str, Tensor]], layers: tuple[int, ...],
                 more: list[tuple[dict, list[dict[str, Tensor]]]] = ()):
        have = meta["layers"]
        missing = [l for l in (*layers, meta["num_layers"]) if l not in have]
        if missing:
            raise SpecserveError(f"the training data holds layers {have}, not {missing}; make it again")
        self.cols = [have.index(l) for l in layers]
        self.final_col = have.index(meta["num_layers"])
        folders = [(meta, shards), *more]
        for m, sh in folders:
            if (m["layers"], m["num_layers"]) != (have, meta["num_layers"]):
                raise SpecserveError(f"training data folders hold different layers ({have} and {m['layers']}); "
                                     f"make them with the same target and layers")
            if len(sh) < 2:
                raise SpecserveError("training data needs at least two shards (the last is held out for validation)")
        self.train = [s for _, sh in folders for shard in sh[:-1] for s in self._split(shard)]
        self.val = [s for _, sh in folders for s in self._split(sh[-1])]

    @staticmethod
    def _split(sh: dict[str, Tensor]) -> list[dict[str, Tensor]]:
        st = sh["seq_start"].tolist()
        return [{"tokens": sh["tokens"][a:b].long(), "answer": sh["prompt_mask"][a:b] == 0,
                 "features": sh["features"][a:b]} for a, b in zip(st[:-1], st[1:]) if b - a >= 4]

    def batches(self, seqs: list[dict], batch_tokens: int, rng: random.Random | None) -> list[list[int]]:
        order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]["tokens"]))
        groups, cur = [], []
        for i in order:
            if cur and (len(cur) + 1) * len(seqs[i]["tokens"]) > batch_tokens:
                groups.append(cur)
                cur = []
            cur.append(i)
        if cur:
            groups.append(cur)
        if rng is not None:
            rng.shuffle(groups)
        return groups

    def collate(self, seqs: list[dict], idx: list[int]) -> Batch:
        T = max(len(seqs[i]["tokens"]) for i in idx)
        B = len(idx)
        f0 = seqs[idx[0]]["features"]
        tokens = torch.zeros(B, T, dtype=torch.long)
        answer = torch.zeros(B, T, dtype=torch.bool)
        valid = torch.zeros(B, T, dtype=torch.bool)
        feats = torch.zeros(B, T, len(self.cols), f0.shape[-1])
        final = torch.zeros(B, T, f0.shape[-1])
        for b, i in enumerate(idx):
            s, n = seqs[i], len(seqs[i]["tokens"])
            tokens[b, :n], answer[b, :n], valid[b, :n] = s["tokens"], s["answer"], True
            feats[b, :n] = s["features"][:, self.cols].float()
            final[b, :n] = s["features"][:, self.final_col].float()
        return Batch(tokens, answer, valid, feats, final)


class Trainer:
    def __init__(self, cfg: TrainConfig, target, data: Data, out_dir: str):
        if cfg.kind not in OBJECTIVES:
            raise SpecserveError(f"no head kind {cfg.kind!r} to train; choose from {', '.join(OBJECTIVES)}")
        self.cfg, self.target, self.data, self.out = cfg, target, data, Path(out_dir)
        if cfg.parallel and cfg.steps != cfg.parallel:
            raise SpecserveError(f"a parallel head unrolls its K = {cfg.parallel} positions in training; got steps {cfg.steps}")
        self.objective = OBJECTIVES[cfg.kind]
        tcfg = target.config
        torch.manual_seed(cfg.seed)
        self.vocab_ids, self.coverage = choose_vocab(data, cfg.vocab, tcfg.vocab_size)
        start = self._start_from(cfg.init) if cfg.init else None
        if start is not None:
            self.vocab_ids = start[1]
        self.rows = target.model.weight_rows("lm_head", self.vocab_ids).cpu()                # [Vr, hidden]
        self.embed = target.model.weight_rows("embed", torch.arange(tcfg.vocab_size)).cpu()  # [V, hidden]
        self.to_sub = torch.full((tcfg.vocab_size,), -1, dtype=torch.long)
        self.to_sub[self.vocab_ids] = torch.arange(len(self.vocab_ids))
        self.head_cfg = self.objective.head_config(cfg, target)
        self.module = build(self.head_cfg)
        if start is not None:
            self.module.load_state_dict(start[0], strict=False)   # what the start lacks stays new (a
                                                                  # placeholder, deeper layers at identity)
        self.opt = torch.optim.AdamW(self.module.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
        self.step, self.epoch, self.pos_in_epoch = 0, 0, 0
        self.history: dict = {"step": [], "loss": [], "epoch_val": [], "step_val": [], "positions": 0}

    def _start_from(self, path: str) -> tuple[dict, Tensor]:
        """The weights and reduced vocabulary of the head at ``path``, refused unless this run trains the
        same layout on the same feature layers."""
        from specserve.drafters.heads import load_head
        head, module, vocab_ids = load_head(path)
        if head.kind != self.cfg.kind or tuple(head.feature_layers) != tuple(self.cfg.layers):
            raise SpecserveError(f"--init {path}: a {head.kind} head on layers {head.feature_layers}; this run "
                                 f"trains {self.cfg.kind} on layers {list(self.cfg.layers)}")
        if len(vocab_ids) != self.cfg.vocab or head.intermediate_size != (self.cfg.intermediate_size or
                                                                             self.target.config.intermediate_size):
            raise SpecserveError(f"--init {path}: its reduced vocabulary ({len(vocab_ids)}) or MLP width "
                                 f"({head.intermediate_size}) differs from this run's; give the same --vocab and "
                                 f"--intermediate-size")
        if head.num_layers > self.cfg.head_layers:
            raise SpecserveError(f"--init {path}: a head of {head.num_layers} layers; this run trains "
                                 f"{self.cfg.head_layers} (give --head-layers {head.num_layers} or more)")
        keep_hold = bool(head.parallel and self.cfg.parallel)      # a parallel head's placeholder carries over
        state = {k: v for k, v in module.state_dict().items() if k != "mask_hidden" or keep_hold}
        return state, vocab_ids

    # -- targets and losses ------------------------------------------------------------------------
    def _target_probs(self, final: Tensor) -> Tensor:
        """final [B, T, hidden] -> p over the reduced vocabulary [B, T, Vr]."""
        with torch.no_grad():
            return (final @ self.rows.T).softmax(-1)


    def _positions(self, b: Batch) -> Tensor:
        """[B, T] bool: positions t whose target p_t trains (by the ``positions`` setting)."""
        pick = {"answer": b.answer, "prompt": ~b.answer, "both": torch.ones_like(b.answer)}[self.cfg.positions]
        return pick & b.valid

    def outputs(self, b: Batch, steps: int) -> list[Tensor]:
        """Output j's reduced-vocabulary logits [B, T, Vr], aligned as the objective says."""
        return [h @ self.rows.T for h in self.objective.outputs(self.module, b, steps, self.embed)]

    def loss(self, b: Batch) -> Tensor:
        p = self._target_probs(b.final)                                           # [B, T, Vr]
        pick = self._positions(b)
        outs = self.outputs(b, self.cfg.steps)
        total, weight = 0.0, 0.0
        for j, logits in enumerate(outs):
            ahead, first = self.objective.alignment(j)          # output j at u >= first trains on p_{u+ahead}
            T = logits.shape[1]
            if T <= ahead + first:
                continue
            tgt = p[:, ahead:]
            lg = logits[:, first:T - ahead]
            tgt = tgt[:, first:]
            ok = pick[:, ahead + first:]
            ce = -(tgt * lg.log_softmax(-1)).sum(-1)                               # [B, T']
            total = total + STEP_DECAY ** j * (ce * ok).sum() / ok.sum().clamp_min(1)
            weight += STEP_DECAY ** j
        return total / max(weight, 1e-9)

    # -- validation ----------------------------------------------------------------------------------
    @torch.no_grad()
    def validate(self) -> dict:
        """Mean drafted tokens a greedy chain of ``val_depth`` accepts (module docstring), and per depth."""
        self.module.eval()
        depth = self.objective.val_depth(self.cfg)
        hits = torch.zeros(depth)
        starts = 0
        for idx in self.data.batches(self.data.val, self.cfg.batch_tokens, None):
            b = self.data.collate(self.data.val, idx)
            outs = self.outputs(b, depth)
            preds = [self.vocab_ids[o.argmax(-1)] for o in outs]                 # [B, T] token ids
            T = b.tokens.shape[1]
            n = T - depth - 1                                                    # chain starts u0 = 0 .. n-1
            if n <= 0:
                continue
            alive = b.answer[:, 1:n + 1] & b.valid[:, depth + 1:depth + 1 + n]   # pending x_{u0+1} is an answer token
            starts += int(alive.sum())
            for j in range(depth):
                # chain depth j+1 from u0 (predicting x_{u0+2+j}): output j at u0 + first
                at = self.objective.alignment(j)[1]
                ok = preds[j][:, at:at + n] == b.tokens[:, 2 + j:2 + j + n]
                alive = alive & ok
                hits[j] += int(alive.sum())
        self.module.train()
        per = (hits / max(starts, 1)).tolist()
        return {"accepted": sum(per), "by_depth": per, "starts": starts, "depth": depth}

    # -- the loop --------------------------------------------------------------------------------------
    def total_steps(self) -> int:
        per_epoch = len(self.data.batches(self.data.train, self.cfg.batch_tokens, None))
        n = per_epoch * self.cfg.epochs
        return min(n, self.cfg.max_steps) if self.cfg.max_steps else n

    def lr_at(self, step: int, total: int) -> float:
        warm = min(50, max(total // 10, 1))
        if step < warm:
            return self.cfg.lr * (step + 1) / warm
        frac = (step - warm) / max(total - warm, 1)
        return self.cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))

    def save_checkpoint(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        tmp = self.out / "checkpoint.tmp"
        torch.save({"module": self.module.state_dict(), "opt": self.opt.state_dict(), "step": self.step,
                    "epoch": self.epoch, "pos": self.pos_in_epoch, "history": self.history,
                    "config": asdict(self.cfg), "torch_rng": torch.get_rng_state()}, tmp)
        tmp.rename(self.out / "checkpoint.pt")

    def resume(self) -> bool:
        path = self.out / "checkpoint.pt"
        if not path.exists():
            return False
        ck = torch.load(path, weights_only=False)
        mine = {k: v for k, v in asdict(self.cfg).items()
                if k not in ("command", "max_steps", "checkpoint_every", "val_every")}
        theirs = {k: v for k, v in ck["config"].items() if k in mine}
        if {k: (list(v) if isinstance(v, tuple) else v) for k, v in mine.items()} != \
                {k: (list(v) if isinstance(v, tuple) else v) for k, v in theirs.items()}:
            raise SpecserveError(f"the checkpoint in {self.out} was made with other settings; use another --out")
        self.module.load_state_dict(ck["module"])
        self.opt.load_state_dict(ck["opt"])
        self.step, self.epoch, self.pos_in_epoch, self.history = ck["step"], ck["epoch"], ck["pos"], ck["history"]
        self.history.setdefault("step_val", [])
        self.history.setdefault("positions", 0)
        torch.set_rng_state(ck["torch_rng"])
        return True

    def run(self, progress=None) -> dict:
        total = self.total_steps()
        t0, tokens = time.perf_counter(), 0
        ema = None
        while self.step < total:
            order = self.data.batches(self.data.train, self.cfg.batch_tokens, random.Random(self.cfg.seed + self.epoch))
            for bi in range(self.pos_in_epoch, len(order)):
                if self.step >= total:
                    break
                b = self.data.collate(self.data.train, order[bi])
                for g in self.opt.param_groups:
                    g["lr"] = self.lr_at(self.step, total)
                loss = self.loss(b)
                self.opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(self.module.parameters(), 1.0)
                self.opt.step()
                self.step += 1
                self.pos_in_epoch = bi + 1
                n = int(b.valid.sum())
                tokens += n
                self.history["positions"] += n
                lv = float(loss.detach())
                ema = lv if ema is None else 0.95 * ema + 0.05 * lv
                self.history["step"].append(self.step)
                self.history["loss"].append(lv)
                if progress:
                    progress(self.step, total, ema, tokens / (time.perf_counter() - t0))
                if self.cfg.val_every and self.step % self.cfg.val_every == 0 and self.step < total:
                    self._validate_along()
                if self.step % self.cfg.checkpoint_every == 0:
                    self.save_checkpoint()
            if self.pos_in_epoch >= len(order):
                val = self.validate()
                self.history["epoch_val"].append({"epoch": self.epoch + 1, "step": self.step, **val})
                if progress:
                    progress(self.step, total, ema, tokens / max(time.perf_counter() - t0, 1e-9), val)
                self.epoch += 1
                self.pos_in_epoch = 0
                self.save_checkpoint()
        if not self.history["epoch_val"] or self.history["epoch_val"][-1]["step"] != self.step:
            val = self.validate()
            self.history["epoch_val"].append({"epoch": self.epoch + (self.pos_in_epoch > 0), "step": self.step, **val})
        self.save_checkpoint()
        return self.history["epoch_val"][-1]

    def _validate_along(self) -> None:
        """Validation within an epoch (``val_every``), with the training positions seen so far; the
        head as it is now is kept in ``out/at-step-N`` (for measuring it elsewhere)."""
        val = self.validate()
        self.history["step_val"].append({"step": self.step, "positions": self.history["positions"], **val})
        save_head(self.out / f"at-step-{self.step}", self.head_cfg, self.module, self.vocab_ids)

    def export(self, directory: str, extra: dict) -> None:
        """The head (module + reduced vocabulary + config with the training record) and its loss curve."""
        self.head_cfg.training = {"command": self.cfg.command, "settings": asdict(self.cfg),
                                  "validation": self.history["epoch_val"][-1], "vocab_coverage": self.coverage,
                                  "epochs": [{k: v for k, v in e.items() if k != "by_depth"} | {"by_depth": [
                                      round(x, 4) for x in e["by_depth"]]} for e in self.history["epoch_val"]],
                                  "along": [{"step": e["step"], "positions": e["positions"],
                                             "accepted": round(e["accepted"], 4)} for e in self.history["step_val"]],
                                  "positions_seen": self.history["positions"],
                                  **extra}
        save_head(directory, self.head_cfg, self.module, self.vocab_ids)
        plot_history(self.history, Path(directory) / "loss.png", self.cfg.kind)


def choose_vocab(data: Data, size: int, vocab_size: int) -> tuple[Tensor, dict]:
    """The ``size`` most frequent tokens of the training sequences (FR-Spec), and the share of the
    validation split's answer tokens each of a few sizes would cover."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for s in data.train:
        counts += torch.bincount(s["tokens"], minlength=vocab_size)
    order = counts.argsort(descending=True, stable=True)
    val = torch.cat([s["tokens"][s["answer"]] for s in data.val]) if data.val else torch.zeros(0, dtype=torch.long)
    rank = torch.empty(vocab_size, dtype=torch.long)
    rank[order] = torch.arange(vocab_size)
    coverage = {str(n): round(float((rank[val] < n).float().mean()), 4) if len(val) else 0.0
                for n in (1024, 2048, 4096, 8192, 16384, 32768) if n <= vocab_size}
    size = min(size, vocab_size)
    return order[:size].sort().values, coverage


def plot_history(history: dict, path: Path, kind: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(10, 3.6))
    loss = torch.tensor(history["loss"])
    if len(loss):
        w = max(1, len(loss) // 50)
        smooth = loss.unfold(0, w, 1).mean(-1) if len(loss) >= w else loss
        ax[0].plot(history["step"][:len(smooth)], smooth.tolist())
    ax[0].set_xlabel("optimiser step")
    ax[0].set_ylabel("training loss (smoothed)")
    ax[0].set_title(f"{kind}: loss")
    ev = history["epoch_val"]
    ax[1].plot([e["step"] for e in ev], [e["accepted"] for e in ev], "o-")
    ax[1].set_xlabel("optimiser step")
    ax[1].set_ylabel("accepted drafted tokens / step")
    ax[1].set_title(f"{kind}: validation (greedy chain)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
