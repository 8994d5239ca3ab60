"""Peer engines on the same prompts: transformers ``generate`` and llama.cpp (llama-cpp-python).

Optional: neither is needed for the core install or the tests.  Each peer reports tokens per second
and whether its greedy text equals ours.  transformers runs the same GGUF dequantized to fp32;
llama.cpp runs the GGUF as stored (4-bit), so its greedy text may legitimately differ.
"""

from __future__ import annotations

import time
from typing import Callable

import torch


def transformers_peer(model_path: str, k: int, assistant: str | None = None) -> dict[str, Callable]:
    """Callables prompt_ids, max_tokens -> (token ids, seconds) for plain, prompt lookup, assistant."""
    from pathlib import Path

    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()

    def load(path):
        p = Path(path)
        if p.is_file():
            return AutoModelForCausalLM.from_pretrained(str(p.parent), gguf_file=p.name, dtype=torch.float32).eval()
        return AutoModelForCausalLM.from_pretrained(str(p), dtype=torch.float32).eval()

    model = load(model_path)
    assistant_model = load(assistant) if assistant else None

    def run(extra: dict) -> Callable:
        def go(ids: list[int], max_tokens: int):
            x = torch.tensor([ids])
            t = time.perf_counter()
            with torch.inference_mode():
                out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_tokens,
                                     do_sample=False, pad_token_id=model.config.eos_token_id, **extra)
            return out[0, len(ids):].tolist(), time.perf_counter() - t
        return go

    peers = {"transformers": run({}), f"transformers-prompt-lookup:k={k}": run({"prompt_lookup_num_tokens": k})}
    if assistant_model is not None:
        peers[f"transformers-assistant:k={k}"] = run({"assistant_model": assistant_model, "num_assistant_tokens": k})
    return peers


def llama_cpp_peer(model_path: str, k: int, n_ctx: int = 4096) -> dict[str, Callable]:
    """llama.cpp plain greedy decoding and its prompt-lookup drafter, 2 threads."""
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    plain = Llama(model_path, n_ctx=n_ctx, n_threads=2, verbose=False, logits_all=False)
    # logits_all=True explicitly: llama-cpp-python 0.3.36 sizes its score buffer from the argument, not
    # from the draft model's need for all logits, and fails on prompts longer than n_batch otherwise
    lookup = Llama(model_path, n_ctx=n_ctx, n_threads=2, verbose=False, logits_all=True,
                   draft_model=LlamaPromptLookupDecoding(num_pred_tokens=k))

    def run(llm) -> Callable:
        def go(ids: list[int], max_tokens: int):
            llm.reset()
            out = []
            t = time.perf_counter()
            for tok in llm.generate(ids, top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0, reset=True):
                if tok == llm.token_eos():
                    break
                out.append(int(tok))
                if len(out) >= max_tokens:
                    break
            return out, time.perf_counter() - t
        return go

    return {"llama.cpp": run(plain), f"llama.cpp-prompt-lookup:k={k}": run(lookup)}
