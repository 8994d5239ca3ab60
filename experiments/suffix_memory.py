"""Memory and speed of the suffix index at its default bound: Zipf-distributed texts of 40-300 tokens
added until the corpus holds 490,000 tokens, then 300 more (evictions); tracemalloc's traced bytes,
and 2,000 lookups."""
import time
import tracemalloc

import numpy as np

from specserve.drafters.suffix import SuffixIndex
rng = np.random.default_rng(0)
# Zipf-like token stream: text-like trigram diversity
def doc(n): return (rng.zipf(1.3, n) % 49152).tolist()
tracemalloc.start()
idx = SuffixIndex(500_000, 256)
t=time.perf_counter()
while idx.tokens < 490_000:
    idx.add(doc(int(rng.integers(40, 300))))
for _ in range(300):                      # past the bound: evictions
    idx.add(doc(int(rng.integers(40, 300))))
cur, peak = tracemalloc.get_traced_memory()
print(f"tokens {idx.tokens} texts {len(idx.docs)} keys {len(idx.long)} entries {sum(map(len, idx.long.values()))} "
      f"traced {cur/2**20:.1f} MiB, add time {time.perf_counter()-t:.1f} s")
t=time.perf_counter()
for _ in range(2000):
    idx.matches(np.array(doc(20)), 1, 16, 8)
print(f"2000 matches {time.perf_counter()-t:.2f} s")
