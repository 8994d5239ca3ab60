"""Where the time goes when requests arrive as others finish: the interleaved benchmark's closed loop
(``num_prompts`` Spec-Bench prompts through an engine of ``concurrency`` rows, 128 tokens, greedy),
each method in turn for two rounds, its steps split into those that carried prompt chunks and pure
decoding steps: per kind the steps, seconds, tokens committed, nodes verified, and outside-pass time.

    .venv/bin/python experiments/mixed_steps.py none,auto 32 64
"""
import sys, time
from specserve.bench.datasets import rotation
from specserve.bench.interleaved import methods_of, strided
from specserve.bench.runner import encode_all, load_llm
from specserve.sampling import SamplingParams
from specserve.stats import Timings

methods = methods_of(sys.argv[1].split(","), plain_first=False)
conc, nump = int(sys.argv[2]), int(sys.argv[3])
rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 2
llm = load_llm("default", None, methods, conc, 2048)
ids = encode_all(llm, strided(nump, None))
for m in methods:
    llm.engine.generate([llm.request(i, 16, SamplingParams(), m.label, m.k) for i in ids[:2]])
for rnd in range(rounds):
    for m in (methods[j] for j in rotation(len(methods), rnd)):
        llm.reset_memory()
        eng = llm.engine
        waiting = [llm.request(i, 128, SamplingParams(), m.label, m.k) for i in ids]
        acc = {k: [0, 0.0, 0, 0, 0.0, 0.0] for k in ("mixed", "decode")}   # steps, s, seqs, nodes, outside, pass
        phases = Timings()
        sids, t0 = [], time.perf_counter()
        while waiting or eng.num_running:
            while waiting and eng.has_capacity:
                sids.append(eng.admit(waiting.pop(0)))
            s0 = time.perf_counter(); eng.step(); w = time.perf_counter() - s0
            r = eng.last_step
            a = acc["mixed" if r.prefill_tokens else "decode"]
            if not r.prefill_tokens:
                phases.add(r)
            a[0] += 1; a[1] += w; a[2] += r.sequences; a[3] += sum(r.nodes); a[4] += w - r.pass_s; a[5] += r.pass_s
        total = time.perf_counter() - t0
        toks = sum(len(eng.take_result(s).tokens) for s in sids)
        print(f"r{rnd} {m.label:10s} {total:6.2f} s {toks/total:6.1f} tok/s | " + " | ".join(
            f"{k}: {a[0]} steps {a[1]:.2f} s seqs/step {a[2]/max(a[0],1):.1f} nodes/step {a[3]/max(a[0],1):.2f} "
            f"ms/step {a[1]/max(a[0],1)*1e3:.1f} outside {a[4]/max(a[0],1)*1e3:.2f}" for k, a in acc.items())
          + " | decode ms/step: " + " ".join(f"{k[:-2]} {v / acc['decode'][0] * 1e3:.2f}" for k, v in phases.asdict().items()
                                              if k != "pass_s"), flush=True)
