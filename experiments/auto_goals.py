"""Check a bench run against the goals for ``auto`` draft sizes.

    .venv/bin/python experiments/auto_goals.py results/auto-full/results.json [--plain-floor 0.97] [--best-floor 0.95]

For every drafter in the run (its methods grouped by everything but ``k``), prints:
- at each concurrency level: auto's output tokens/s over plain decoding's and over the best fixed k's;
- at concurrency 1: auto's speed-up in every group (Spec-Bench definition), and auto against the
  best fixed k overall (the same definition);
and a last line per goal: how many points meet it, and the worst point.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from specserve.bench.report import family


def fixed_k(label: str) -> bool:
    return any(part.startswith("k=") and part != "k=auto" for part in label.split(":"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("--plain-floor", type=float, default=0.97)
    ap.add_argument("--best-floor", type=float, default=0.95)
    args = ap.parse_args()
    doc = json.loads(args.results.read_text())
    labels = list(doc["summary"])
    base = labels[0]
    fams: dict[str, list[str]] = {}
    for label in labels[1:]:
        fams.setdefault(family(label), []).append(label)
    tput = {(c["method"], c["concurrency"]): c["output_tok_s"] for c in doc["concurrency"]}
    levels = sorted({c["concurrency"] for c in doc["concurrency"]})
    groups = doc["config"]["groups"]
    checks = {"auto >= plain x floor (throughput, every level)": [],
              "auto >= best fixed k x floor (throughput, every level)": [],
              "auto >= plain x floor (concurrency 1, every group)": [],
              "auto >= best fixed k (concurrency 1, overall speed-up)": []}
    for fam, members in fams.items():
        autos = [m for m in members if not fixed_k(m)]
        fixed = [m for m in members if fixed_k(m)]
        if not autos:
            continue
        auto = autos[0]
        print(f"\n## {fam}  (auto = {auto!r}; fixed: {', '.join(fixed) or 'none'})")
        print("| concurrency | plain tok/s | auto tok/s | auto / plain | best fixed | auto / best fixed |")
        print("|---|---|---|---|---|---|")
        for c in levels:
            p, a = tput[(base, c)], tput[(auto, c)]
            best = max(fixed, key=lambda m: tput[(m, c)], default=None)
            rb = a / tput[(best, c)] if best else float("nan")
            print(f"| {c} | {p:.1f} | {a:.1f} | {a / p:.3f} | {best or '-'} {tput[(best, c)] if best else 0:.1f} "
                  f"| {rb:.3f} |")
            checks["auto >= plain x floor (throughput, every level)"].append((a / p, args.plain_floor, f"{fam} c={c}"))
            if best:
                checks["auto >= best fixed k x floor (throughput, every level)"].append(
                    (rb, args.best_floor, f"{fam} c={c}"))
        s = doc["summary"]
        cells = []
        for g in groups:
            sp = s[auto]["groups"].get(g, {}).get("speedup", {}).get("spec_bench")
            if sp is None:
                continue
            cells.append(f"{g} {sp:.3f}")
            checks["auto >= plain x floor (concurrency 1, every group)"].append((sp, args.plain_floor, f"{fam} {g}"))
        print("concurrency 1, auto's speed-up by group: " + ", ".join(cells))
        sp_auto = s[auto]["overall"]["speedup"]["spec_bench"]
        if fixed:
            best = max(fixed, key=lambda m: s[m]["overall"]["speedup"]["spec_bench"])
            sp_best = s[best]["overall"]["speedup"]["spec_bench"]
            print(f"concurrency 1, overall: auto {sp_auto:.3f}x, best fixed {best} {sp_best:.3f}x")
            checks["auto >= best fixed k (concurrency 1, overall speed-up)"].append(
                (sp_auto / sp_best, 1.0, f"{fam}"))
    print("\n## Goals")
    for name, pts in checks.items():
        if not pts:
            continue
        met = [p for p in pts if p[0] >= p[1]]
        worst = min(pts, key=lambda p: p[0] / p[1])
        print(f"- {name.replace('floor', str(pts[0][1]))}: {len(met)}/{len(pts)} points; "
              f"worst {worst[0]:.3f} ({worst[2]})")


if __name__ == "__main__":
    main()
