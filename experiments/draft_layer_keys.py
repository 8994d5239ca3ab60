"""One head call of 4 entries after n real entries (64 to 4,000), the shipped `eagle-parallel` head's
layer in the runtime's one native call against op by op, on the default model: the median of 100
calls each (after 10), the two paths called in turn so that drift falls on both.  Shows that the one
call's attention, which reads every real entry's key and value, keeps its lead at long contexts.

    .venv/bin/python experiments/draft_layer_keys.py
"""
import statistics
import time

import torch

from specserve.drafters import create
from specserve.drafters.eagle import _Seq
from specserve.llm import LLM


def main() -> None:
    llm = LLM("default", max_batch=1, max_len=4096)
    d = create("eagle-parallel", llm.target)
    c = d.cfg
    d.rope.reserve(4200)
    m = 4
    print("real entries | one call ms | op by op ms")
    for keys in (64, 512, 2048, 4000):
        s = _Seq(keys + 16, c.hidden_size, c.num_kv_heads, c.head_dim, None, c.num_layers)
        s.k.normal_()
        s.v.normal_()
        s.n_real = keys
        g, tokens, pos = torch.randn(m, c.hidden_size), torch.randint(0, 1000, (m,)), torch.arange(keys, keys + m)
        times: dict[bool, list[float]] = {True: [], False: []}
        keep, _ = d.layer, d.ops                                 # the op-by-op products converted before timing
        with torch.inference_mode():
            for i in range(220):                                 # the two paths call by call, in turn
                one_call = i % 2 == 0
                d.layer = keep if one_call else None
                t = time.perf_counter()
                d._entries([(s, keys, m, None)], g, tokens, pos)
                times[one_call].append(time.perf_counter() - t)
        d.layer = keep
        row = [1000 * statistics.median(times[k][10:]) for k in (True, False)]
        print(f"{keys} | {row[0]:.3f} | {row[1]:.3f}")


if __name__ == "__main__":
    main()
