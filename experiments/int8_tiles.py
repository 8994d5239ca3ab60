"""Old int8 kernels against new in one process: whole target passes of 1..16 tokens with the int8
path switched between rounds (A B A B), each part's multiply-add rate as a fraction of the
register-only int8 ceiling and of an attainable ceiling measured in the same run.

    .venv/bin/python experiments/int8_tiles.py --models default,/path/to/llama1b.gguf \
        [--paths avx512-vnni,avx512-vnni-tiles] [--tokens 1,2,5,9,16] [--rounds 5] [--json OUT.json]

The first path named is the baseline, the last the one compared with it.  Every path gives the same
bits (tests/test_int8.py), so only time differs.  The ceilings:
- register-only: a chain of the path's integer multiply-adds with no loads (``packed.int8_peak``);
- attainable: the path's own product over a Q4_K weight small enough to stay in the caches
  (1024 x 2048, 1.2 MiB, split over the cores), 16 tokens, repeated; it pays the unpacking, scales
  and the call, not the weight stream from memory.
Speed drifts on shared machines: only figures from one run are compared.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def attainable(path: str, tokens: int = 16, reps: int = 200) -> float:
    """Multiply-adds/s of path's product over a cache-resident Q4_K weight (see the docstring)."""
    from test_native import make_weight

    from specserve.models import native as nt
    from specserve.models.native import packed as pk

    w, _ = make_weight(nt.Q4_K, 1024, 2048)
    p = pk.PackedWeight.pack(w)
    x, out = torch.randn(tokens, 2048), torch.empty(tokens, 1024)
    pk.set_path(path)
    for _ in range(10):
        nt.linear(x, p, out=out)
    s = time.perf_counter()
    for _ in range(reps):
        nt.linear(x, p, out=out)
    return tokens * 1024 * 2048 * reps / (time.perf_counter() - s)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="default")
    ap.add_argument("--paths", default="avx512-vnni,avx512-vnni-tiles")
    ap.add_argument("--tokens", default="1,2,5,9,16")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=3, help="passes per path and round")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--json")
    args = ap.parse_args()
    from specserve.bench.profile import part_macs, profile_pass
    from specserve.host import cpu_info
    from specserve.models import RuntimeOptions
    from specserve.models.loader import load_model
    from specserve.models.native import packed as pk

    paths, tokens = args.paths.split(","), [int(t) for t in args.tokens.split(",")]
    doc = {"cpu": cpu_info().name, "machine": platform.machine(), "paths": paths, "context": args.context,
           "rounds": args.rounds, "reps": args.reps, "models": {}}
    for spec in args.models.split(","):
        lm = load_model(spec, RuntimeOptions(kernels="native"))
        macs = part_macs(lm.config)
        ceilings = {p: {"register_only": 0.0, "attainable": 0.0} for p in paths}

        def measure_ceilings():          # before the passes and after every round: the best reading
            for p in paths:
                pk.set_path(p)
                c = ceilings[p]
                c["register_only"] = max(c["register_only"], pk.int8_peak(0.2))
                c["attainable"] = max(c["attainable"], attainable(p))

        measure_ceilings()
        runs = {(p, t): [] for p in paths for t in tokens}
        for _ in range(args.rounds):
            for t in tokens:
                for p in paths:
                    pk.set_path(p)
                    runs[p, t].append(profile_pass(lm, t, args.context, args.reps))
            measure_ceilings()
        # one register-only ceiling for every path: the highest any path's chain reached in this run
        top = max(c["register_only"] for c in ceilings.values())
        rows = []
        for t in tokens:
            row = {"tokens": t}
            for p in paths:
                r = runs[p, t]
                ms = statistics.median(x["pass_ms"] for x in r)
                parts = {k: statistics.median(x["parts_ms"][k] for x in r) for k in r[0]["parts_ms"]}
                rate = {k: t * macs[k] / (parts[k] / 1e3) for k in macs if parts[k] > 0}
                row[p] = {"pass_ms": ms, "parts_ms": parts, "multiply_adds_per_s": rate,
                          "of_register_ceiling": {k: v / top for k, v in rate.items()},
                          "of_attainable": {k: v / ceilings[p]["attainable"] for k, v in rate.items()}}
            row["new_over_old"] = row[paths[-1]]["pass_ms"] / row[paths[0]]["pass_ms"]
            rows.append(row)
        doc["models"][spec] = {"path": lm.path, "ceilings": ceilings, "register_only_ceiling": top, "passes": rows}
        print(f"\n{spec} ({lm.path}); CPU {doc['cpu']}; context {args.context}")
        print(f"  register-only int8 ceiling (best reading of any path): {top / 1e9:.0f} G/s")
        for p in paths:
            print(f"  {p}: attainable {ceilings[p]['attainable'] / 1e9:.0f} G/s")
        new = paths[-1]
        print("| tokens | " + " | ".join(f"{p} ms" for p in paths) + " | new/old | gate_up % reg / % att (new) "
              "| down % reg (new) | lm_head % reg / % att (new) |")
        print("|---:|" + "---:|" * (len(paths) + 4))
        for row in rows:
            reg, att = row[new]["of_register_ceiling"], row[new]["of_attainable"]
            print(f"| {row['tokens']} | " + " | ".join(f"{row[p]['pass_ms']:.2f}" for p in paths)
                  + f" | {row['new_over_old']:.3f} | {100 * reg.get('gate_up', 0):.0f} / {100 * att.get('gate_up', 0):.0f}"
                  f" | {100 * reg.get('down', 0):.0f} | {100 * reg.get('lm_head', 0):.0f} / {100 * att.get('lm_head', 0):.0f} |",
                  flush=True)
        del lm
    pk.set_path(None)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
