"""Magpie prompts: the target writes the users' questions itself (Xu et al., arXiv 2406.08464).

The target is given only the start of a conversation up to its chat template's user header (for
the default SmolLM2 model: the system turn, then ``<|im_start|>user\\n``) and samples what
follows, which is a plausible user request, until its end-of-turn token.  With ``--turns 2`` the
target then answers that request greedily (as ``specserve.train.regen`` will, so the second
question follows the very answer the training data will hold) and writes a second user turn after
it the same way.

Sampling: temperature 1, top-p 0.95, seed ``--seed`` + row (every row is reproducible, whatever
the batch).  A generated question is kept when it is plausible: the turn ended by itself (not cut
by ``--max-tokens``), its length is within ``--min-chars``..``--max-chars`` and at least
``--min-words`` words, it holds no chat-template marker, it does not read like an assistant's reply
("Sure, ...", "As an AI ..."), it is not a duplicate (case and whitespace folded) of an earlier kept
record, of a first turn in the shipped training files, or of a Spec-Bench turn (nor shares a run of
12 words with one: ``experiments/prompt_checks.py``).

Output: JSONL in the training-prompt format, ``{"id": "magpie-smollm2-ROW", "source":
"magpie-smollm2", "category": "open_chat", "prompt": ...}`` (``"turns"`` and category
``multi_turn`` with ``--turns 2``).  Resumable: after each batch the kept records are appended and
flushed, then ``OUT.progress`` (the next row) is replaced; a restarted run drops any records of an
unfinished batch and goes on from there, so a background job can be stopped at any time:

    nohup python experiments/magpie_prompts.py --out results/magpie.jsonl --rows 20000 > magpie.log 2>&1 &
    python experiments/magpie_prompts.py --out results/magpie.jsonl --rows 3        # smoke test

Row r's first turn depends only on the model, ``--seed`` and r: a second run into another file
(``--turns 2`` after a single-turn run, say) should use another ``--seed`` (e.g. 10_000_000).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prompt_checks import TRAIN, SpecBench, fold, record_turns  # noqa: E402

SOURCE = "magpie-smollm2"
SENTINEL = "\ue000MAGPIE\ue000"          # a private-use marker: never in real text
ASSISTANT_OPENERS = re.compile(r"^(sure|certainly|of course|absolutely|great question|i'm sorry|i am sorry|"
                               r"as an ai|i'm an ai|i am an ai|here is|here's|hello! how can i|hi! how can i|"
                               r"how can i (help|assist))\b", re.I)
TEMPLATE_MARKERS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "assistant\n", "<start_of_turn>", "<end_of_turn>")


def user_prefix(tokenizer, history: list[dict]) -> str:
    """The chat template's text up to (not including) the content of a new user turn after ``history``."""
    text = tokenizer.hf.apply_chat_template(history + [{"role": "user", "content": SENTINEL}], tokenize=False,
                                            add_generation_prompt=False)
    cut = text.find(SENTINEL)
    if cut < 0:
        raise SystemExit("the chat template does not show the user's content verbatim")
    return text[:cut]


def plausible(text: str, finish: str, args) -> str | None:
    """The reason a generated user turn is rejected, or None when it is kept."""
    if finish != "stop":
        return "not finished"
    t = text.strip()
    if not args.min_chars <= len(t) <= args.max_chars or len(t.split()) < args.min_words:
        return "length"
    if any(m in t for m in TEMPLATE_MARKERS):
        return "template marker"
    if ASSISTANT_OPENERS.match(t):
        return "assistant-like"
    return None


class Output:
    """The output file and its progress marker (module docstring)."""

    def __init__(self, path: Path):
        self.path, self.progress = path, path.with_name(path.name + ".progress")
        self.next_row = int(json.loads(self.progress.read_text())["next_row"]) if self.progress.exists() else 0
        self.records: list[dict] = []
        if self.path.exists():
            for line in self.path.read_text().split("\n"):
                if line.strip():
                    rec = json.loads(line)
                    if int(rec["id"].rsplit("-", 1)[1]) < self.next_row:
                        self.records.append(rec)
            # rewrite without the records of a batch that never finished
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in self.records))
            os.replace(tmp, self.path)

    def commit(self, recs: list[dict], next_row: int) -> None:
        path = self.path
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as f:
            for r in recs:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
        tmp = self.progress.with_name(self.progress.name + ".tmp")
        tmp.write_text(json.dumps({"next_row": next_row}))
        os.replace(tmp, self.progress)
        self.records.extend(recs)
        self.next_row = next_row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="output JSONL (appended; OUT.progress beside it)")
    ap.add_argument("--rows", type=int, required=True, help="rows to try in all (a row is one sampled conversation)")
    ap.add_argument("--model", default="default")
    ap.add_argument("--turns", type=int, choices=[1, 2], default=1)
    ap.add_argument("--batch", type=int, default=16, help="rows generated together")
    ap.add_argument("--seed", type=int, default=0, help="row r samples with seed SEED + r")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--max-tokens", type=int, default=256, help="tokens for a user turn")
    ap.add_argument("--answer-tokens", type=int, default=512, help="--turns 2: tokens for the greedy first answer")
    ap.add_argument("--min-chars", type=int, default=15)
    ap.add_argument("--max-chars", type=int, default=2000)
    ap.add_argument("--min-words", type=int, default=3)
    ap.add_argument("--drafter", default="none", help="a drafter to speed up the greedy answers (--turns 2)")
    args = ap.parse_args(argv)

    from specserve.llm import LLM
    from specserve.sampling import SamplingParams

    out = Output(Path(args.out))
    spec = SpecBench()
    seen = {fold(record_turns(json.loads(line))[0]) for p in sorted(TRAIN.glob("*.jsonl"))
            for line in p.read_text().split("\n") if line.strip()}          # first turns of the shipped files
    for r in out.records:
        seen |= {fold("\x1e".join(record_turns(r))), fold(record_turns(r)[0])}
    if out.next_row >= args.rows:
        print(f"{args.out}: all {args.rows} rows done ({len(out.records)} kept)", flush=True)
        return 0

    llm = LLM(args.model, drafters=[args.drafter] if args.drafter != "none" else None, max_batch=args.batch)
    tok = llm.tokenizer
    first_prefix = llm.encode(user_prefix(tok, []), raw=True)
    rejected: dict[str, int] = {}
    t0 = time.time()

    def sample_turns(prefixes: list[list[int]], rows: list[int]) -> list[tuple[str, str]]:
        reqs = [llm.request(p, args.max_tokens, SamplingParams(temperature=args.temperature, top_p=args.top_p,
                                                               seed=args.seed + r))
                for p, r in zip(prefixes, rows)]
        return [(tok.decode(res.tokens).strip(), res.finish_reason) for res in llm.engine.generate(reqs)]

    def reject(reason: str) -> None:
        rejected[reason] = rejected.get(reason, 0) + 1

    row = out.next_row
    while row < args.rows:
        rows = list(range(row, min(row + args.batch, args.rows)))
        firsts = sample_turns([first_prefix] * len(rows), rows)
        convs: dict[int, list[str]] = {}
        for r, (text, finish) in zip(rows, firsts):
            why = plausible(text, finish, args) or ("duplicate" if fold(text) in seen else None)
            if why:
                reject(why)
            else:
                convs[r] = [text]
        if args.turns == 2 and convs:
            live = sorted(convs)
            answers = llm.generate([convs[r][0] for r in live], max_tokens=args.answer_tokens,
                                   sampling=SamplingParams(), drafter=args.drafter)
            prefixes = []
            for r, a in zip(live, answers):
                history = [{"role": "user", "content": convs[r][0]}, {"role": "assistant", "content": a.text}]
                prefixes.append(llm.encode(user_prefix(tok, history), raw=True))
            for r, (text, finish) in zip(live, sample_turns(prefixes, [r + 1_000_000_007 for r in live])):
                why = plausible(text, finish, args)
                if why:
                    reject("second turn: " + why)
                    del convs[r]
                else:
                    convs[r].append(text)
        kept = []
        for r in sorted(convs):
            rec = {"id": f"{SOURCE}-{r}", "source": SOURCE, "category": "open_chat" if args.turns == 1 else "multi_turn"}
            if args.turns == 1:
                rec["prompt"] = convs[r][0]
            else:
                rec["turns"] = convs[r]
            key = fold("\x1e".join(convs[r]))
            hit = spec.overlap(rec)
            if hit:
                reject(f"spec-bench {hit}")
                continue
            if key in seen or fold(convs[r][0]) in seen:
                reject("duplicate")
                continue
            seen.add(key)
            seen.add(fold(convs[r][0]))
            kept.append(rec)
        out.commit(kept, rows[-1] + 1)
        row = rows[-1] + 1
        print(f"rows {row}/{args.rows}  kept {len(out.records)}  rejected {rejected}  {time.time() - t0:.0f}s",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
