"""Mask time per token of xgrammar and llguidance on the default model's tokenizer (49,152 tokens).

For each grammar, a valid text is tokenized and the matcher walks it: the time of computing the
next-token bitmask at each position (the work a decoding step adds), warm (each walk run 3 times,
the best walk kept).  Run: .venv/bin/python experiments/grammar_backends.py
"""
import json
import platform
import statistics
import time

from specserve.models.loader import load_model
from specserve.tokenizer import load_tokenizer

TOOL = {"type": "object", "properties": {
    "name": {"type": "string"}, "arguments": {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}, "days": {"type": "integer"}},
        "required": ["city", "unit", "days"], "additionalProperties": False}},
    "required": ["name", "arguments"], "additionalProperties": False}
PERSON = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer"}, "email": {"type": "string"},
    "skills": {"type": "array", "items": {"type": "string"}}, "summary": {"type": "string"}},
    "required": ["name", "age", "email", "skills", "summary"], "additionalProperties": False}
CASES = [
    ("tool call", TOOL, {"name": "get_weather", "arguments": {"city": "Paris, France", "unit": "celsius", "days": 3}}),
    ("extraction", PERSON, {"name": "Ada Lovelace", "age": 36, "email": "ada@example.com",
                            "skills": ["mathematics", "poetry", "analytical engines"],
                            "summary": "An English mathematician who wrote the first published algorithm "
                                       "intended for a machine, and saw that it could do more than arithmetic."}),
    ("any JSON", None, {"title": "Notes", "items": [{"id": 1, "text": "buy milk"}, {"id": 2, "text": "call home"}],
                        "done": False, "score": 3.5}),
]


def walk(fill, consume, ids):
    times = []
    for t in ids:
        a = time.perf_counter()
        fill()
        times.append(time.perf_counter() - a)
        assert consume(t)
    return times


def main():
    m = load_model("default")
    hf = load_tokenizer(m).hf
    vocab = m.config.vocab_size
    import llguidance
    import llguidance.hf
    import llguidance.torch as lt
    import xgrammar as xgr
    lltok = llguidance.hf.from_tokenizer(hf, n_vocab=vocab)
    info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab)
    comp = xgr.GrammarCompiler(info)
    print(f"CPU: {platform.processor() or platform.machine()}; vocabulary {vocab}")
    print(f"{'grammar':<12} {'tokens':>6} {'xgrammar mean/median us':>24} {'llguidance mean/median us':>26}")
    for label, schema, value in CASES:
        text = json.dumps(value, separators=(",", ":"))
        ids = hf(text, add_special_tokens=False)["input_ids"]
        best = {}
        for _ in range(3):
            cg = comp.compile_json_schema(json.dumps(schema), any_whitespace=False, separators=(",", ":")) \
                if schema else comp.compile_builtin_json_grammar()
            mx = xgr.GrammarMatcher(cg)
            bm = xgr.allocate_token_bitmask(1, vocab)
            tx = walk(lambda: mx.fill_next_token_bitmask(bm, 0), mx.accept_token, ids)
            g = llguidance.LLMatcher.grammar_from_json_schema(
                json.dumps(schema if schema else {}), defaults={"whitespace_flexible": False})
            ml = llguidance.LLMatcher(lltok, g)
            bl = lt.allocate_token_bitmask(1, vocab)
            tl = walk(lambda: lt.fill_next_token_bitmask(ml, bl, 0), ml.consume_token, ids)
            for name, ts in (("x", tx), ("l", tl)):
                if name not in best or sum(ts) < sum(best[name]):
                    best[name] = ts
        fx, fl = best["x"], best["l"]
        print(f"{label:<12} {len(ids):>6} {statistics.mean(fx)*1e6:>14.1f} / {statistics.median(fx)*1e6:>6.1f}"
              f" {statistics.mean(fl)*1e6:>16.1f} / {statistics.median(fl)*1e6:>6.1f}")


if __name__ == "__main__":
    main()
