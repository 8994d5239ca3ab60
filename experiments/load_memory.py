"""Time to load a GGUF file and the memory it then holds, ours against llama.cpp's, each in a fresh
process (so neither finds the other's pages): seconds from the call to a model ready for a pass, and
the process's resident memory after loading and after one short greedy generation.  The file is read
once first, so both load it from the page cache (a first read from disk would time the disk).

    .venv/bin/python experiments/load_memory.py [--rows R] [--context C] FILE.gguf [FILE.gguf ...]

(default one row of context 2048; ours allocates R rows of C tokens of KV cache, llama.cpp a context of
R * C tokens.)
"""
import json
import subprocess
import sys

CHILD = r'''
import json, resource, sys, time
path, which, rows, ctx = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
def rss_mib():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmRSS")) / 1024
t = time.perf_counter()
if which == "ours":
    from specserve.llm import LLM
    from specserve.sampling import SamplingParams
    llm = LLM(path, drafters={"none": {"drafter": "none"}}, max_batch=rows, max_len=ctx)
    load = time.perf_counter() - t; after_load = rss_mib()
    llm.engine.generate([llm.request(llm.encode("The quick brown fox", raw=True), 16, SamplingParams(), "none", 0)])
else:
    from llama_cpp import Llama
    m = Llama(path, n_ctx=rows * ctx, n_threads=2, verbose=False)
    load = time.perf_counter() - t; after_load = rss_mib()
    toks = m.tokenize(b"The quick brown fox", add_bos=False)
    for i, _ in enumerate(m.generate(toks, temp=0.0)):
        if i == 15: break
print(json.dumps({"which": which, "load_s": load, "rss_after_load_mib": after_load, "rss_after_generate_mib": rss_mib(),
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
'''

import argparse
import os

ap = argparse.ArgumentParser()
ap.add_argument("--rows", type=int, default=1)
ap.add_argument("--context", type=int, default=2048)
ap.add_argument("files", nargs="+")
args = ap.parse_args()
for path in args.files:
    size = os.path.getsize(path) / 2**20
    with open(path, "rb") as f:           # into the page cache, for both
        while f.read(1 << 24):
            pass
    for which in ("ours", "llama.cpp"):
        out = subprocess.run([sys.executable, "-c", CHILD, path, which, str(args.rows), str(args.context)], capture_output=True, text=True)
        if out.returncode:
            print(f"{path} {which}: failed: {out.stderr.strip().splitlines()[-1:]}")
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{os.path.basename(path)} ({size:.0f} MiB) {which:10s} load {r['load_s']:6.1f} s  RSS after load "
              f"{r['rss_after_load_mib']:6.0f} MiB, after 16 tokens {r['rss_after_generate_mib']:6.0f} MiB, peak {r['peak_rss_mib']:6.0f} MiB")
