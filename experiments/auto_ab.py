"""`auto` against plain decoding with and without the crowded-step rules, in one process, runs
rotated round by round (a slow spell of a shared machine falls on every configuration alike): the
interleaved benchmark's closed loop (every (480 / N)-th Spec-Bench prompt through an engine of C
rows, 128 tokens, greedy).  ``auto-before`` puts back the rules as they were: no crowded steps (every
cheap part drafts its whole budget in every step), a probe of the merged drafter as a whole (its
best node kept whatever it pays, every few idle steps), and a part's probe counted a success when its
node was kept (by force) rather than accepted; ``auto-uncrowded`` keeps the new probe rules but no
crowded steps.

    .venv/bin/python experiments/auto_ab.py --concurrency 32 --num-prompts 64 --rounds 5 --json benchmarks/crowded/ab-c32.json
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace

import specserve.control.controller as C
import specserve.control.parts as P
from specserve.bench.datasets import rotation
from specserve.bench.interleaved import methods_of, strided
from specserve.bench.runner import encode_all, load_llm
from specserve.sampling import SamplingParams

NEW = {"plan": C.Controller.plan, "learn": P.PartPricing.learn}


def plan_before(self, views):
    p = NEW["plan"](self, views)
    p.probed |= {s.seq_id for s in views if s.auto_size and self.due(s, s.drafter, self.probe(s))}
    return p


def learn_before(self, s, prop, path, plan):
    origins = getattr(prop, "origins", None) or []
    for part in self.parts(s):
        key = P.part_key(s.drafter, part)
        nodes = [n for n, o in enumerate(origins) if part in o]
        won = sum(1 for n in path if part in origins[n])
        if nodes:
            self.ctl.acceptance.observe(key, s.seq_id, 0, won, sum(origins[n][part] for n in nodes))
        paid = self.history.kept.get((s.seq_id, key), 0) if nodes else 0
        probed = (s.seq_id, part) in plan.part_probes
        self.history.record(s.seq_id, key, max(len(nodes), 1) if probed else paid, paid, probed)


def configure(llm, before: bool | str) -> None:
    """True: every rule as before; "probes": only the crowded steps as before; False: as now."""
    llm.engine.controller.config = replace(C.DEFAULTS, crowded=float("inf") if before else C.DEFAULTS.crowded)
    C.Controller.plan = plan_before if before is True else NEW["plan"]
    P.PartPricing.learn = learn_before if before is True else NEW["learn"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args()
    methods = methods_of(["auto"], plain_first=True)
    llm = load_llm("default", None, methods, args.concurrency, 2048)
    ids = encode_all(llm, strided(args.num_prompts, None))
    configs = [("none", methods[0], False), ("auto", methods[1], False), ("auto-before", methods[1], True),
               ("auto-uncrowded", methods[1], "probes")]
    for _, m, before in configs:                                    # warm-up
        configure(llm, before)
        llm.engine.generate([llm.request(i, 16, SamplingParams(), m.label, m.k) for i in ids[:2]])
    runs, first = [], {}
    for r in range(args.rounds):
        for name, m, before in (configs[j] for j in rotation(len(configs), r)):
            configure(llm, before)
            llm.reset_memory()
            t = time.perf_counter()
            out = [x.tokens for x in llm.engine.generate([llm.request(i, 128, SamplingParams(), m.label, m.k) for i in ids])]
            dt = time.perf_counter() - t
            first.setdefault(name, out)
            runs.append({"round": r, "config": name, "seconds": dt, "tokens": sum(map(len, out))})
            print(f"r{r} {name:12s} {dt:6.2f} s", flush=True)
    total = {n: sum(x["seconds"] for x in runs if x["config"] == n) for n, _, _ in configs}
    summary = {n: {"seconds": total[n], "speedup": total["none"] / total[n],
                   "identical": sum(a == b for a, b in zip(first[n], first["none"]))} for n in total}
    for n, s in summary.items():
        print(f"{n}: {s['speedup']:.3f}x plain ({s['identical']}/{len(ids)} identical)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": vars(args), "runs": runs, "summary": summary}, f, indent=1)


if __name__ == "__main__":
    main()
