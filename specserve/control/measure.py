"""The one part of the controller that runs a model: measuring the cost model's table.

``calibrate`` times passes of the target on scratch caches (a few seconds on the default model);
``cost_model`` is what an engine calls, once, at construction: the table from memory (the same
model object in this process), else from disk (the same model file, runtime options, CPU and
library versions measured before on this machine: ``$SPECSERVE_CACHE/costs/<key>.json``), else
measured now and saved.  Nothing here is ever called from inside a step or a request.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import weakref
from pathlib import Path

import numpy as np
import torch

from specserve.control.cost import LONG_RUN, CostModel
from specserve.host import cache_root, cpu_info
from specserve.models.timing import median_seconds

VERSION = 1          # of the measurement procedure: a change re-measures
_MEASURED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


CALIBRATION_TOKENS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32, 48, 64, 96, 128)


@torch.inference_mode()
def calibrate(model, max_tokens: int = 128, context: int = 64, long_context: int = 1024,
              reps: int = 3, seed: int = 0) -> CostModel:
    """Measure pass times of ``model`` (a Decoder) on a scratch cache: total tokens 1 .. max_tokens
    split into rows of at most 8, at ``context`` cached positions, and a 1-token pass at
    ``long_context`` for the attention term.  A few seconds on the default model; cached per model."""
    cached = _MEASURED.get(model)
    if cached is not None and cached.tokens[-1] >= _table_top(max_tokens):
        return cached.fresh()           # a copy: its online correction is the caller's
    sizes = [m for m in CALIBRATION_TOKENS if m <= max(max_tokens, 2)]
    rows = -(-sizes[-1] // 8)
    long_context = max(min(long_context, model.config.max_position_embeddings - 16), context + 1)
    short = model.new_cache(rows, context + 4 * LONG_RUN + 16)
    long = model.new_cache(1, long_context + 16)
    g = torch.Generator().manual_seed(seed)
    vocab, dev = model.config.vocab_size, model.device
    for r in range(rows):
        model(torch.randint(0, vocab, (1, context), generator=g).to(dev), short, [r], [0], last_only=True)
    model(torch.randint(0, vocab, (1, long_context), generator=g).to(dev), long, [0], [0], last_only=True)

    def timed(cache, lengths: list[int], start: int) -> float:
        x = torch.randint(0, vocab, (sum(lengths),), generator=g).to(dev)
        return median_seconds(lambda: model(x, cache, list(range(len(lengths))), [start] * len(lengths),
                                            lengths=lengths), reps, dev)

    seconds = [timed(short, [8] * (m // 8) + ([m % 8] if m % 8 else []), context) for m in sizes]
    near = timed(short, [1], context)
    far = timed(long, [1], long_context)
    per_key = max(far - near, 0.0) / max(long_context - context, 1)
    run = 4 * LONG_RUN                                             # a prompt chunk's run, near and far
    near_run = timed(short, [run], context)
    far_run = timed(long, [run], long_context - run)
    per_key_run = max(far_run - near_run, 0.0) / (run * max(long_context - run - context, 1))
    seconds = list(np.maximum.accumulate(seconds))                 # a bigger pass never costs less
    cost = CostModel(sizes, seconds, per_key, context, per_key_run=per_key_run)
    _MEASURED[model] = cost
    return cost.fresh()


def _table_top(max_tokens: int) -> int:
    return [m for m in CALIBRATION_TOKENS if m <= max(max_tokens, 2)][-1]


def cache_dir() -> Path:
    return cache_root() / "costs"


def _cpu() -> str:
    """The CPU's model name and feature flags (a different machine measures again)."""
    cpu = cpu_info()
    return f"{cpu.name}|{' '.join(cpu.flags)}|{cpu.cores}"


def _kernels(model) -> str:
    """The native kernel library's build key for a model on the native kernels, else ''."""
    if getattr(model, "kernel", None) != "native":
        return ""
    from specserve.models.native.build import build_key
    return build_key()


def identity(path: str, options, model) -> str | None:
    """The disk key of a target: its weights file (path, size, modification time), runtime options,
    compute threads, CPU, library versions and, on the native kernels, the sources they were built
    from; None when the weights are not a file or folder on disk (a model built in memory is measured
    afresh)."""
    p = Path(path)
    if not p.exists():
        return None
    st = p.stat()
    parts = [VERSION, str(p.resolve()), st.st_size, st.st_mtime_ns, repr(options),
             repr(getattr(model, "thread_choices", lambda: ())()), _cpu(), torch.__version__, platform.python_version(),
             _kernels(model)]
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:24]


def cost_model(model, max_tokens: int, key: str | None) -> CostModel:
    """The cost model of ``model`` with a table up to ``max_tokens`` tokens: from memory, from disk
    under ``key``, or measured now (and saved under ``key``)."""
    top = _table_top(max_tokens)
    cached = _MEASURED.get(model)
    if cached is not None and cached.tokens[-1] >= top:
        return cached.fresh()
    file = cache_dir() / f"{key}.json" if key else None
    if file is not None and file.exists():
        try:
            cost = CostModel.from_json(json.loads(file.read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            cost = None                # a damaged file: measure again and overwrite it
        if cost is not None and cost.tokens[-1] >= top:
            _MEASURED[model] = cost
            return cost.fresh()
    cost = calibrate(model, max_tokens=max_tokens)
    if file is not None:
        try:
            file.parent.mkdir(parents=True, exist_ok=True)
            tmp = file.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(cost.to_json()))
            tmp.replace(file)          # atomic: a concurrent reader sees the old file or the new one
        except OSError:
            pass                       # a read-only cache: measure again next time
    return cost


def target_cost(target, max_tokens: int) -> CostModel:
    """``cost_model`` of a loaded target (``LoadedModel``), kept on disk under its ``identity``."""
    return cost_model(target.model, max_tokens, identity(target.path, target.options, target.model))
