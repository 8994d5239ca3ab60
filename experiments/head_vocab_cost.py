"""What a head's reduced vocabulary costs per draft depth: the reduced LM head (on the target's own
kernels), log-softmax and top-8 over 1 or 8 rows (8: a tree expanding 8 nodes a depth), at 8,192,
16,384 and 32,768 tokens; the median of 200 calls, in the calling thread's CPU time (run it with
OMP_NUM_THREADS=1 so the products run on that thread and other jobs do not inflate the figure).
Read it with the share of answer tokens each size covers (a head's ``training.vocab_coverage``).

    OMP_NUM_THREADS=1 .venv/bin/python experiments/head_vocab_cost.py
"""

import statistics
import time

import torch

from specserve.llm import LLM


def main() -> None:
    llm = LLM("default", max_batch=1, max_len=256)
    m = llm.target.model
    rows = m.weight_rows("lm_head", torch.arange(32768)).cpu()
    for v in (8192, 16384, 32768):
        lm = m.matmul(rows[:v].contiguous())
        for n in (1, 8):
            x = torch.randn(n, rows.shape[1])
            ts = []
            for _ in range(200):
                t = time.thread_time()
                lm(x).log_softmax(-1).topk(8)
                ts.append(time.thread_time() - t)
            print(f"vocabulary {v}, {n} rows: {statistics.median(ts) * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
