"""Greedy tokens of 60 Spec-Bench prompts (every 8th), 128 tokens, 16 at a time, plain decoding and each
named drafter, from whichever specserve is first on sys.path; written to argv[1] as JSON
{method: [[tokens]...]}, each method's identity with plain decoding printed.  Two commits compared:

    git worktree add /tmp/old REV && PYTHONPATH=/tmp/old .venv/bin/python experiments/identity_dump.py /tmp/old.json none
    .venv/bin/python experiments/identity_dump.py /tmp/new.json auto,ngram,ngram-tree,suffix,lookahead,layerskip,eagle,eagle-parallel,medusa
"""
import json, sys
from specserve.bench.interleaved import methods_of, strided
from specserve.bench.runner import encode_all, load_llm
from specserve.sampling import SamplingParams
specs = sys.argv[2].split(",") if len(sys.argv) > 2 else ["none"]
methods = methods_of(specs, plain_first=True)
llm = load_llm("default", None, methods, 16, 2048)
ids = encode_all(llm, strided(60, None))
out = {}
for m in methods:
    llm.reset_memory()
    res = llm.engine.generate([llm.request(p, 128, SamplingParams(), m.label, m.k) for p in ids])
    out[m.label] = [r.tokens for r in res]
    same = sum(a == b for a, b in zip(out[m.label], out[methods[0].label]))
    print(m.label, f"{same}/{len(ids)} identical to plain", flush=True)
json.dump(out, open(sys.argv[1], "w"))
