"""The goals table of BENCHMARKS.md section 17 from the runs of experiments/auto_bench.sh:
    python experiments/auto_summary.py benchmarks/auto-merged
Per run: auto against the best single drafter in every group at concurrency 1 (Spec-Bench's
speed-up definition), overall (both definitions), auto against plain at every level, divergent
prompts, and the advisor's predicted against measured speed-ups."""
import json, sys
from pathlib import Path

root = Path(sys.argv[1])
SINGLE = ("ngram-tree", "suffix", "eagle")
for run in ("order-a", "order-b", "repetitive"):
    f = root / run / "results.json"
    if not f.exists():
        continue
    d = json.loads(f.read_text())
    S = d["summary"]
    singles = [m for m in SINGLE if m in S]
    print(f"\n{run}: groups in order {', '.join(d['config']['groups'])}")
    cells = []
    for g in d["config"]["groups"]:
        best = max(singles, key=lambda m: S[m]["groups"][g]["speedup"]["spec_bench"])
        a, b = S["auto"]["groups"][g]["speedup"]["spec_bench"], S[best]["groups"][g]["speedup"]["spec_bench"]
        cells.append(f"{g} {a:.2f}x vs {best} {b:.2f}x = {a / b:.3f}")
    print("  c=1 per group, auto / best single:", "; ".join(cells))
    for key in ("spec_bench", "total_time"):
        best = max(singles, key=lambda m: S[m]["overall"]["speedup"][key])
        a, b = S["auto"]["overall"]["speedup"][key], S[best]["overall"]["speedup"][key]
        print(f"  c=1 overall ({key}): auto {a:.3f}x, best single {best} {b:.3f}x, ratio {a / b:.3f}")
    print("  divergent prompts:", {m: s["overall"]["divergent_prompts"] for m, s in S.items()})
    plain = {c["concurrency"]: c["output_tok_s"] for c in d["concurrency"] if c["method"] == "none"}
    for c in d["concurrency"]:
        if c["method"] != "none":
            pred = c.get("predicted_vs_plain")
            vs = c["output_tok_s"] / plain[c["concurrency"]]
            print(f"  c={c['concurrency']:>2} {c['method']:<42} measured {vs:.3f}x"
                  + (f" predicted {pred:.3f}x (error {(pred - vs) / vs * 100:+.0f}%)" if pred else ""))
for name in ("advise-specbench", "advise-repetitive"):
    f = root / f"{name}.json"
    if f.exists():
        d = json.loads(f.read_text())
        print(f"\n{name}: {d['prompts']} prompts")
        for p in d["predictions"]:
            if "measured_speedup" in p and p["method"] != "none":
                m = p["measured_speedup"]
                print(f"  c={p['concurrency']} {p['method']:<12} predicted {p['speedup']:.3f}x measured {m:.3f}x "
                      f"error {(p['speedup'] - m) / m * 100:+.1f}%")

# Both orders pooled: per group and overall, total time of plain over total time of each method (both
# runs' records summed), and mean accepted length (accepted tokens are the same in any order: greedy)
runs = [json.loads((root / r / "results.json").read_text()) for r in ("order-a", "order-b")
        if (root / r / "results.json").exists()]
if len(runs) == 2:
    groups = runs[0]["config"]["groups"]
    methods = [m for m in runs[0]["summary"] if m != "none"]
    print("\nboth orders pooled (total time; mean accepted length):")
    for g in groups + ["overall"]:
        def tot(m):
            return sum(r["total_s"] for d in runs for r in d["records"][m] if g == "overall" or r["group"] == g)
        def mal(m):
            recs = [r for d in runs for r in d["records"][m] if g == "overall" or r["group"] == g]
            return sum(r["generated_tokens"] - 1 for r in recs) / max(1, sum(r["verify_passes"] for r in recs))
        sp = {m: tot("none") / tot(m) for m in methods}
        best = max((m for m in methods if m in SINGLE), key=sp.get)
        print(f"  {g:<15} " + "  ".join(f"{m.split(':')[0] + ('+eagle' if 'eagle' in m and m.startswith('auto') else '')} {sp[m]:.3f}x/{mal(m):.2f}" for m in methods)
              + f"  | auto / best single ({best}) {sp['auto'] / sp[best]:.3f}")
