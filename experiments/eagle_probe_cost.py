"""What one `eagle` probe costs: a k=2 draft after 8 positions committed without drafts (the catch-up
window's case), median of 30, on the default model with the shipped head (BENCHMARKS.md, section 16).

    python experiments/eagle_probe_cost.py
"""
import json
import time

import torch

from specserve.drafters import DraftProposal, DraftRequest, Feedback, create
from specserve.llm import LLM
from specserve.sampling import SamplingParams

llm = LLM("default", max_batch=1, max_len=2048)
target = llm.target
d = create("eagle", target)
qs = [json.loads(line) for line in open("specserve/data/spec_bench/question.jsonl")]
prompt = llm.encode([{"role": "user", "content": qs[0]["turns"][0]}])
cache = target.model.new_cache(1, len(prompt) + 300)
out = target.model(torch.tensor([prompt]), cache, [0], [0], features=d.feature_layers)
feats = {layer: f[0] for layer, f in out.features.items()}
greedy = SamplingParams()
n = len(prompt) - 8
times = []
for rep in range(30):
    d.begin(rep, prompt[:n], greedy, 64)
    d.feedback(Feedback(rep, DraftProposal([]), [], [prompt[n - 1]], {l: f[:n] for l, f in feats.items()}))
    d.propose([DraftRequest(rep, prompt[:n + 1], 2, greedy)])                  # drafted once, then 8 steps without
    d.feedback(Feedback(rep, DraftProposal([]), [], prompt[n + 1:], {l: f[n:] for l, f in feats.items()}))
    t0 = time.perf_counter()
    d.propose([DraftRequest(rep, prompt + [5], 2, greedy)])
    times.append(time.perf_counter() - t0)
    d.end(rep)
print(f"k=2 probe after 8 positions: median {sorted(times)[15] * 1e3:.2f} ms")
