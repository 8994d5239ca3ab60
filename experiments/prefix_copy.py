"""What the prefix cache's copies cost on the default model: storing 64 blocks (1,024 positions) from a
cache row into the pool, and copying the chain back into another row.
    python experiments/prefix_copy.py
"""
import time, torch
from specserve.models.loader import load_model
from specserve.prefix_cache import PrefixCache, BLOCK
m = load_model("default").model
c = m.new_cache(2, 2048)
cfg = m.config
p = PrefixCache(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, torch.float32, "cpu", 256 * 2**20)
k, v = c.k_all[:, 0], c.v_all[:, 0]
k.normal_(); v.normal_()
toks = list(range(1024))
t = time.perf_counter(); parent = None
for i in range(64):
    parent = p.store(parent, toks[i*BLOCK:(i+1)*BLOCK], k, v, i*BLOCK)
t_store = time.perf_counter() - t
mt = p.match(toks + [1], features=False)
k2, v2 = c.k_all[:, 1], c.v_all[:, 1]
p.load(mt, k2, v2)
t = time.perf_counter(); 
for _ in range(3): p.load(mt, k2, v2)
t_load = (time.perf_counter() - t) / 3
print(f"block {p.block_bytes/1024:.0f} KiB; store 64 blocks {t_store*1e3:.1f} ms; load 64 blocks (1024 tokens) {t_load*1e3:.1f} ms")
