"""What grammar masking costs plain decoding, measured on the same number of tokens.

For each prompt of the schema workload, plain decoding under the prompt's grammar gives n tokens;
plain decoding of the same prompt without the grammar is then asked for n tokens too, so both runs
decode the same number of positions from the same prompt (the texts differ: the grammar changes
them).  Decoding time is a request's time after its first token (prefill excluded: a grammar does not
touch it).  The two are interleaved prompt by prompt, in alternating order, for ``--rounds`` rounds;
the cost is 1 - (decoding tok/s under the grammar) / (decoding tok/s without), per round and in all.
The shaping share (``shape_s``: masks and forced-token bookkeeping) of the grammar's runs is printed
beside it.

    .venv/bin/python experiments/grammar_cost.py --prompts 16 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

from specserve.bench.runner import cpu_name
from specserve.constrain.grammar import from_response_format
from specserve.llm import LLM
from specserve.sampling import SamplingParams

WORKLOAD = Path(__file__).resolve().parents[1] / "specserve" / "data" / "bench" / "structured.jsonl"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=256)
    args = ap.parse_args()
    rows = [json.loads(line) for line in WORKLOAD.read_text().splitlines()][:args.prompts]
    llm = LLM("default", drafters=["none"])
    greedy = SamplingParams()
    ids = [llm.encode(r["prompt"]) for r in rows]
    grammars = [llm.grammar(from_response_format(r["response_format"])) for r in rows]
    run = (lambda pid, n, g: llm.engine.generate([llm.request(pid, n, greedy, "none", 0, grammar=g)])[0])
    lengths = [len(run(pid, args.max_tokens, g).tokens) for pid, g in zip(ids, grammars)]     # and a warm-up
    for pid in ids[:2]:
        run(pid, 16, None)
    totals = {"on": [0, 0.0, 0.0], "off": [0, 0.0, 0.0]}         # tokens after the first, seconds, shape seconds
    print(f"{cpu_name()}, {platform.platform()}; {len(rows)} prompts, {sum(lengths)} tokens under the grammar")
    print("| round | decoding tok/s under the grammar | without | cost | shaping share under the grammar |")
    print("|---|---|---|---|---|")
    for r in range(args.rounds):
        part = {"on": [0, 0.0, 0.0], "off": [0, 0.0, 0.0]}
        for i, (pid, g, n) in enumerate(zip(ids, grammars, lengths)):
            for key in (("on", "off") if (i + r) % 2 == 0 else ("off", "on")):
                res = run(pid, n, g if key == "on" else None)
                st = res.stats
                for acc in (part[key], totals[key]):
                    acc[0] += max(len(res.tokens) - 1, 0)
                    acc[1] += st.total_s - st.ttft_s
                    acc[2] += st.shape_s
        on, off = part["on"][0] / part["on"][1], part["off"][0] / part["off"][1]
        print(f"| {r + 1} | {on:.1f} | {off:.1f} | {1 - on / off:.1%} | {part['on'][2] / part['on'][1]:.1%} |")
    on, off = totals["on"][0] / totals["on"][1], totals["off"][0] / totals["off"][1]
    print(f"| all | {on:.1f} | {off:.1f} | {1 - on / off:.1%} | {totals['on'][2] / totals['on'][1]:.1%} |")
    print(f"(tokens decoded after the first: {totals['on'][0]} under the grammar, {totals['off'][0]} without)")


if __name__ == "__main__":
    main()
