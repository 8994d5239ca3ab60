"""What a runtime setting changes, on a real model: int8 against fp32 activations (``--compare
activations``, the default) or a bf16 against an fp32 KV cache (``--compare kv``, int8 activations
both): greedy text, next-token agreement and logit differences against transformers' fp32,
perplexity, and greedy agreement with llama.cpp.

    .venv/bin/python experiments/int8_accuracy.py OUT.json [--compare activations|kv] [--model default]
        [--per-group 10] [--max-tokens 64] [--no-llama-cpp]

1. Greedy answers to Spec-Bench prompts (``--per-group`` of each group, chat template unless the
   model has none) under the two settings: how many are identical, and where the first differing
   token falls.
2. Teacher-forced over each prompt and the reference setting's answer: next-token (top-1) agreement
   with transformers' fp32 logits and the largest logit difference, for both settings.
3. Perplexity of the prompts' own text (the tokens after the first) under both and transformers.
4. llama.cpp's greedy answers on the same file (llama-cpp-python, when installed): how many equal
   ours in each setting.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time

import torch


# --compare: (the setting measured, the reference), both values of that RuntimeOptions field
SETTINGS = {"activations": ("int8", "f32"), "kv": ("bf16", "f32")}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--model", default="default")
    ap.add_argument("--compare", choices=sorted(SETTINGS), default="activations")
    ap.add_argument("--no-llama-cpp", action="store_true", help="leave out part 4")
    ap.add_argument("--per-group", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM

    from specserve.bench.datasets import sample
    from specserve.engine import Request
    from specserve.llm import LLM
    from specserve.models import RuntimeOptions

    (new, base), field = SETTINGS[args.compare], args.compare
    llms = {a: LLM(args.model, RuntimeOptions(**{field: a}), max_batch=1, max_len=2048) for a in (new, base)}
    raw = llms[base].tokenizer.hf.chat_template is None           # a base model's file may have no chat template
    prompts, _ = sample(args.per_group)
    ids = [llms[base].encode(p.text, raw=raw) for p in prompts]
    # 1. greedy answers
    answers = {a: [llm.engine.generate([Request(x, args.max_tokens)])[0].tokens for x in ids] for a, llm in llms.items()}
    same = sum(a == b for a, b in zip(answers[new], answers[base]))
    first = [next((i for i, (u, v) in enumerate(zip(a, b)) if u != v), None)
             for a, b in zip(answers[new], answers[base])]
    diverged = [f for f in first if f is not None]
    # 2-3. teacher-forced against transformers
    directory, gguf_file = llms[base].target.tokenizer_source()
    hf = AutoModelForCausalLM.from_pretrained(directory, gguf_file=gguf_file, dtype=torch.float32).eval()
    stats = {a: {"agree": 0, "positions": 0, "max_abs_diff": 0.0, "nll": 0.0, "nll_tokens": 0} for a in (new, base, "hf")}
    for x, ans in zip(ids, answers[base]):
        seq = torch.tensor([x + ans])
        with torch.no_grad():
            ref = hf(seq).logits[0]
        outs = {"hf": ref}
        for a, llm in llms.items():
            m = llm.target.model
            outs[a] = m(seq, m.new_cache(1, seq.shape[1] + 8), [0], [0]).logits[0]
        target = seq[0, 1:len(x)]                                     # the prompt's own next tokens
        for a, lg in outs.items():
            s = stats[a]
            s["agree"] += int((lg.argmax(-1) == ref.argmax(-1)).sum())
            s["positions"] += seq.shape[1]
            s["max_abs_diff"] = max(s["max_abs_diff"], (lg - ref).abs().max().item())
            logp = torch.log_softmax(lg[:len(x) - 1].double(), -1)
            s["nll"] -= logp.gather(1, target[:, None]).sum().item()
            s["nll_tokens"] += len(target)
    # 4. llama.cpp
    llama = {}
    try:
        if args.no_llama_cpp:
            raise ImportError("--no-llama-cpp")
        from specserve.bench.peers import llama_cpp_peer
        run = llama_cpp_peer(llms[base].target.path, 4)["llama.cpp"]
        theirs = [run(x, args.max_tokens)[0] for x in ids]
        llama = {a: sum(t == o for t, o in zip(theirs, answers[a])) for a in answers}
        llama[f"{new}_vs_llama_first_diff"] = [next((i for i, (u, v) in enumerate(zip(a, b)) if u != v), None)
                                              for a, b in zip(answers[new], theirs)]
    except ImportError as e:
        llama = {"skipped": f"llama-cpp-python not installed ({e})"}
    doc = {"command": " ".join(["experiments/int8_accuracy.py", *sys.argv[1:]]), "model": llms[base].target.path,
           "machine": platform.processor() or platform.machine(), "prompts": len(ids), "max_tokens": args.max_tokens,
           "date": time.strftime("%Y-%m-%d"),
           "setting": field, "runs": [new, base],
           f"greedy_identical_{new}_vs_{base}": same, "first_difference_positions": first,
           "median_first_difference": sorted(diverged)[len(diverged) // 2] if diverged else None,
           "teacher_forced": {a: {"top1_agreement_with_transformers": s["agree"] / s["positions"],
                                  "positions": s["positions"], "max_abs_logit_diff": s["max_abs_diff"],
                                  "perplexity_of_prompts": math.exp(s["nll"] / s["nll_tokens"]),
                                  "perplexity_tokens": s["nll_tokens"]} for a, s in stats.items()},
           "llama_cpp_greedy_identical": llama}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(json.dumps({k: v for k, v in doc.items() if k != "first_difference_positions"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
