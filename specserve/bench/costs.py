"""What the machine could do at best (roofline card) and what one target pass costs (cost curve)."""

from __future__ import annotations

import time

import torch

from specserve.models.loader import LoadedModel


def memory_bandwidth(size_mb: int = 256, reps: int = 5) -> float:
    """Measured copy bandwidth in bytes/s (read + write of a buffer far larger than the caches)."""
    src = torch.ones(size_mb * 2**20 // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t)
    return 2 * src.numel() * 4 / best


def roofline(lm: LoadedModel) -> dict:
    """What the machine could do at best: the bandwidth ceiling (weights read once per pass) and
    the multiply-add ceilings (one multiply-add per weight per token, on every core): fp32 with
    AVX2+FMA, and int8 on the instruction-set path the int8 kernels use.  The compute ceiling of a
    token is the one of the activations the model runs."""
    from specserve.models.native import fma_peak, unavailable_reason

    bw = memory_bandwidth()
    wb = lm.model.weight_bytes()
    native = unavailable_reason() is None
    macs = fma_peak() if native else float("nan")
    out = {"parameters": lm.config.num_params, "weight_bytes": wb, "bandwidth_bytes_per_s": bw,
           "plain_decoding_ceiling_tok_s": bw / wb, "multiply_adds_per_s": macs, "runtime": vars(lm.options)}
    if native:
        from specserve.models.native import packed
        from specserve.models.native.paths import ATTENTION
        out |= {"int8_multiply_adds_per_s": packed.int8_peak(), "int8_path": packed.current_path(),
                "attention_path": ATTENTION.current()}
    activations = getattr(lm.model, "activations", "f32")
    runs = out["int8_multiply_adds_per_s"] if activations == "int8" else macs
    return out | {"activations": activations,
                  "compute_ceiling_tok_s": runs / lm.config.num_params,
                  "compute_ms_per_token": 1e3 * lm.config.num_params / runs}


def heap_tree(n: int) -> torch.Tensor:
    """Parents of an n-token pass shaped as a binary tree (token i's parent is (i - 1) // 2): the
    pending token with two children, each with two, ...  [1, n]."""
    return torch.tensor([[-1] + [(i - 1) // 2 for i in range(1, n)]])


@torch.inference_mode()
def cost_curve(lm: LoadedModel, tokens: list[int], batches: list[int], context: int = 256, reps: int = 7,
               trees: bool = True) -> list[dict]:
    """Median seconds of one target pass over ``t`` new tokens per row for ``b`` rows at ``context``;
    with ``trees``, also each row's tokens as a binary tree (``heap_tree``) instead of a chain.

    The repetitions are interleaved (rep 1 of every shape, then rep 2, ...) so that a slow spell of
    a shared machine lands on every shape alike instead of on one of them.
    """
    m = lm.model
    cache = m.new_cache(max(batches), context + max(tokens) + 1)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, lm.config.vocab_size, (1, context), generator=g)
    for row in range(max(batches)):
        m(prompt, cache, [row], [0], last_only=True)
    shapes = [(b, t, kind, torch.randint(0, lm.config.vocab_size, (b, t), generator=g))
              for b in batches for t in tokens for kind in (("chain", "tree") if trees and t > 2 else ("chain",))]
    times: dict[tuple, list[float]] = {(b, t, kind): [] for b, t, kind, _ in shapes}
    for rep in range(reps + 1):                                   # rep 0 is the warm-up
        for b, t, kind, x in shapes:
            parents = heap_tree(t).expand(b, t) if kind == "tree" else None
            s = time.perf_counter()
            m(x, cache, list(range(b)), [context] * b, parents=parents)
            if rep:
                times[(b, t, kind)].append(time.perf_counter() - s)
    out = [{"batch": b, "tokens": t, "shape": kind, "seconds": sorted(v)[len(v) // 2], "reps": reps}
           for (b, t, kind), v in times.items()]
    base = {r["batch"]: r["seconds"] for r in out if r["tokens"] == 1}
    chain = {(r["batch"], r["tokens"]): r["seconds"] for r in out if r["shape"] == "chain"}
    for r in out:
        r["relative_to_1_token"] = r["seconds"] / base[r["batch"]] if r["batch"] in base else None
        r["relative_to_chain"] = r["seconds"] / chain[r["batch"], r["tokens"]]
    return out
