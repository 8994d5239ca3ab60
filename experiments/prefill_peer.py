"""Prefill against llama.cpp on the same GGUF file, in one process: a prompt of N random tokens
prefilled by specserve's native runtime on each named int8 path (prompt chunks of up to
``--chunk`` tokens, the engine's default 256) and by llama-cpp-python (n_threads 2, n_batch 512),
rotated round by round (A B C A B C), median of the rounds.

    .venv/bin/python experiments/prefill_peer.py MODEL.gguf [--tokens 64,256,512] [--rounds 5]
        [--paths avx512-vnni,avx512-vnni-tiles] [--json OUT.json]

Both sides compute logits for the last position only.  Needs llama-cpp-python.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--tokens", default="64,256,512")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--paths", default="avx512-vnni,avx512-vnni-tiles")
    ap.add_argument("--json")
    args = ap.parse_args()
    import llama_cpp
    from llama_cpp import Llama

    from specserve.host import cpu_info
    from specserve.models import RuntimeOptions
    from specserve.models.loader import load_model
    from specserve.models.native import packed as pk

    sizes, paths = [int(t) for t in args.tokens.split(",")], args.paths.split(",")
    lm = load_model(args.model, RuntimeOptions(kernels="native"))
    peer = Llama(args.model, n_ctx=max(sizes) + 16, n_threads=2, n_batch=512, verbose=False, logits_all=False)
    cache = lm.model.new_cache(1, max(sizes) + 16)
    g = torch.Generator().manual_seed(0)
    prompts = {n: torch.randint(100, min(lm.config.vocab_size, 30000), (1, n), generator=g) for n in sizes}

    @torch.inference_mode()
    def ours(n: int) -> float:
        x = prompts[n]
        s = time.perf_counter()
        for c in range(0, n, args.chunk):
            lm.model(x[:, c:c + args.chunk], cache, [0], [c], last_only=True)
        return time.perf_counter() - s

    def theirs(n: int) -> float:
        peer.reset()
        s = time.perf_counter()
        peer.eval(prompts[n][0].tolist())
        return time.perf_counter() - s

    runs: dict[tuple[str, int], list[float]] = {}
    for r in range(args.rounds + 1):                     # round 0 warms both up and is not kept
        for n in sizes:
            for p in paths:
                pk.set_path(p)
                t = ours(n)
                if r:
                    runs.setdefault((p, n), []).append(t)
            t = theirs(n)
            if r:
                runs.setdefault(("llama.cpp", n), []).append(t)
    pk.set_path(None)
    med = {k: statistics.median(v) for k, v in runs.items()}
    print(f"{args.model}; CPU {cpu_info().name}; llama-cpp-python {llama_cpp.__version__}; {args.rounds} rounds, medians")
    print("| prompt tokens | " + " | ".join(f"{p} ms" for p in paths) + " | llama.cpp ms | "
          + " | ".join(f"llama.cpp / {p}" for p in paths) + " |")
    print("|---:|" + "---:|" * (2 * len(paths) + 1))
    for n in sizes:
        print(f"| {n} | " + " | ".join(f"{1e3 * med[p, n]:.0f}" for p in paths) + f" | {1e3 * med['llama.cpp', n]:.0f} | "
              + " | ".join(f"{med['llama.cpp', n] / med[p, n]:.2f}x" for p in paths) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps({"model": args.model, "cpu": cpu_info().name, "chunk": args.chunk,
                                               "runs_s": {f"{k[0]}@{k[1]}": v for k, v in runs.items()}}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
