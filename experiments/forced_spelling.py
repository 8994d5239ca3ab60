"""How often the target spells forced text the way xgrammar's jump-forward does.

For the first ``--prompts`` requests of the schema workload, plain greedy decoding under each
request's grammar; then, along each output, at every position where the grammar forces a text, is
the target's token the first of xgrammar's jump-forward tokens?  How many of those positions does a
spelling memory learnt from the earlier positions and requests (``specserve.constrain.spelling``, as
the engine keeps one) guess right, and the memory with xgrammar's token where it has no entry (what
the engine drafts)?  Prints the counts and the first mismatches with xgrammar.

    .venv/bin/python experiments/forced_spelling.py --prompts 32
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specserve.constrain.grammar import from_response_format
from specserve.constrain.spelling import Spelling
from specserve.llm import LLM

WORKLOAD = Path(__file__).resolve().parents[1] / "specserve" / "data" / "bench" / "structured.jsonl"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--show", type=int, default=12)
    args = ap.parse_args()
    rows = [json.loads(line) for line in WORKLOAD.read_text().splitlines()]
    by = {c: [r for r in rows if r["category"] == c] for c in ("tool_call", "extraction")}
    rows = [r for pair in zip(by["tool_call"], by["extraction"]) for r in pair][:args.prompts]
    llm = LLM("default", drafters=["none"])
    dec = llm.tokenizer.decode
    memory = Spelling()
    forced = xgr_hits = memory_hits = both_hits = tokens = 0
    shown = []
    for r in rows:
        spec = from_response_format(r["response_format"])
        ids = llm.encode(r["prompt"])
        out = llm.generate([r["prompt"]], max_tokens=256, drafter="none", grammar=spec)[0]
        m = llm.grammar(spec).matcher()
        prev = ids[-1]
        for t in out.token_ids:
            if m.terminated:
                break
            tokens += 1
            text = m.forced_text()
            if text:
                forced += 1
                jump = m.forced()
                xgr_hits += bool(jump) and jump[0] == t
                guess = memory.guess(prev, text)
                memory_hits += guess == t
                both_hits += (guess if guess is not None else (jump[0] if jump else None)) == t
                if (not jump or jump[0] != t) and len(shown) < args.show:
                    shown.append(f"  forced {text!r}: xgrammar {[dec([x]) for x in jump[:3]]}, target {dec([t])!r}")
                memory.learn(prev, text, t)
            m.accept(t)
            prev = t
    print(f"{len(rows)} requests, {tokens} tokens, {forced} at positions where the grammar forces a text")
    print(f"xgrammar's first jump-forward token is the target's at {xgr_hits} of {forced}")
    print(f"the spelling memory (learnt from earlier positions and requests) guesses {memory_hits} of {forced}")
    print(f"the memory, else xgrammar's token (what the engine drafts): {both_hits} of {forced}")
    print("\n".join(shown))


if __name__ == "__main__":
    main()
