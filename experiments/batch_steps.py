"""Where a decoding step's time goes at concurrency C (default 16): C requests admitted at once into one
engine, each method twice (methods given comma-separated, e.g. none,auto,ngram-tree), per decoding step
(steps that carried prompt chunks left out) its milliseconds, those outside the pass, nodes verified and
each phase.

    .venv/bin/python experiments/batch_steps.py none,auto,ngram-tree [C]
"""
import sys, time
from specserve.bench.datasets import sample
from specserve.bench.interleaved import methods_of
from specserve.bench.runner import encode_all, load_llm
from specserve.sampling import SamplingParams
from specserve.stats import Timings
methods = methods_of(sys.argv[1].split(","), plain_first=False)
conc = int(sys.argv[2]) if len(sys.argv) > 2 else 16
prompts, _ = sample(max(3, -(-conc // 13)), None, None)
llm = load_llm("default", None, methods, conc, 4096)
ids = encode_all(llm, [p.text for p in prompts])[:conc]
for m in methods:
    llm.engine.generate([llm.request(ids[0][:32], 8, SamplingParams(), m.label, m.k)])
for rnd in range(2):
  for m in methods:
    llm.reset_memory()
    eng = llm.engine
    sids = [eng.admit(llm.request(i, 128, SamplingParams(), m.label, m.k)) for i in ids]
    t = Timings(); n = 0; wall = 0.0; outside = 0.0; nodes = 0; toks = 0; t0 = time.perf_counter(); allwall=0
    while eng.num_running:
        s0 = time.perf_counter(); eng.step(); w = time.perf_counter() - s0
        r = eng.last_step
        if r.sequences and not r.prefill_tokens:
            t.add(r); n += 1; wall += w; outside += w - r.pass_s; nodes += sum(r.nodes)
    total = time.perf_counter() - t0
    toks = sum(len(eng.take_result(s).tokens) for s in sids)
    d = t.asdict()
    print(f"{m.label:12s} tok/s {toks/total:6.1f} decode steps {n} ms/step {wall/n*1e3:6.2f} outside {outside/n*1e3:5.2f} nodes/step {nodes/n:5.2f} | " +
          " ".join(f"{k[:-2]} {v/n*1e3:.2f}" for k, v in d.items()), flush=True)
