"""Synthetic passage tasks: the target writes short texts, and prompts of the kinds Spec-Bench measures
(QA over a text, summarization, extraction, translation, two-turn follow-ups) are built over them, so
no text taken from elsewhere enters the training prompts.  The recipe, fixed by this file, ``--seed``
and the model:

1. Pairs: every (genre, topic) of ``GENRES`` x topics (``SUBJECTS`` x ``FRAMES``, the place of topic i
   drawn by ``random.Random(f"topic:{i}")``), shuffled by ``random.Random(f"pairs:{seed}")``; row r
   takes pair r mod their number, and ``random.Random(f"passage:{seed}:{r}")`` picks a ``PASSAGE_PROMPTS``
   template and a ``LENGTHS`` range.
2. Passage: the target's answer to that user prompt, sampled (``--temperature`` 0.8, ``--top-p`` 0.95,
   seed ``seed + r``, at most ``--max-tokens`` 640), kept when it ended by itself (finish_reason "stop"),
   has ``--min-words`` 80 to ``--max-words`` 350 words, holds no chat-template marker, does not open like
   an assistant's preamble ("Sure", "Here is", ...), is not repetitive (distinct word trigrams at least 0.8
   of all) and is no duplicate (folded) of a passage kept before.
3. Tasks: ``random.Random(f"tasks:{seed}:{r}")`` draws one or two distinct ``KINDS`` and their templates.
   ``passage_qa``: half the time the target first writes a question about the passage, greedily (a
   ``QUESTION_ASKS`` prompt, at most 64 tokens; kept when it ended by itself and is one line of 4-40
   words ending in "?"), put into a ``QA_WITH_QUESTION`` template, else (or when rejected) a
   ``QA_GENERIC`` one.  ``summarization``, ``extraction``: a template over the passage.
   ``translation``: a template and one of ``LANGUAGES`` over the first 1-3 sentences of the passage's
   first paragraph of 12 words or more.  ``multi_turn``: a first turn of another of those four kinds,
   then one of its ``FOLLOW_UPS``.
4. Records: ``{"id": "synthetic-smollm2-ROW-J", "source": "synthetic-smollm2", "category": KIND,
   "prompt": ...}`` (``"turns": [first, follow-up]`` for ``multi_turn``), J the task's index for its
   passage; dropped when it overlaps a Spec-Bench turn (``experiments/prompt_checks.py``) or duplicates
   (folded) a first turn of the shipped training files or an earlier record.

Passages are sampled without a drafter, so a row's passage depends only on the model, the seed and the
row, whatever the batch (a drafter's draft sizes follow measured timings, and the sampled text would
follow them); ``--drafter`` (default ``ngram-tree``) speeds up the greedy questions, which stay the
target's own token for token.  Resumable: after each batch of ``--batch`` rows its records are appended
and flushed, then ``OUT.progress`` (the next row, the records so far, the kept passages' hashes) is
replaced; a restarted run drops an unfinished batch's records and goes on after the last whole one:

    nohup python experiments/synthetic_tasks.py --out results/synthetic.jsonl --rows 20000 > synth.log 2>&1 &
    python experiments/synthetic_tasks.py --out /tmp/synthetic.jsonl --rows 4        # smoke test
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import random
import re
import sys
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prompt_checks import TRAIN, SpecBench, fold, record_turns  # noqa: E402

SOURCE = "synthetic-smollm2"
KINDS = ("passage_qa", "summarization", "extraction", "translation", "multi_turn")
GENRES = [tuple(g.split(": ", 1)) for g in (      # (genre, a hint asked for with it)
    "news report: Give names, places and dates. | encyclopedia entry: Be factual and specific. | "
    "product description: Mention the price and key features. | "
    "email: Include a greeting, a date and the sender's name. | "
    "set of meeting notes: Include the date, the attendees and the action items. | "
    "short story: Give the characters names. | recipe: List the ingredients, then numbered steps. | "
    "scientific abstract: State the aim, the method, the results and a conclusion. | "
    "travel guide: Name specific places to visit. | biography: Include the birth year and key events. | "
    "FAQ: Write four or five questions, each with its answer. | "
    "dialogue transcript: Label each line with the speaker's name. | "
    "technical documentation page: Describe the settings or steps precisely. | "
    "opinion piece: Argue for one position. | press release: Quote a named spokesperson. | "
    "blog post: Write in the first person. | letter to the editor: Sign it with a name and a town. | "
    "interview: Use a question-and-answer format with named speakers. | customer review: Give a star rating. | "
    "set of lecture notes: Use headings and short points. | "
    "job advertisement: State the duties, the requirements and how to apply. | "
    "museum exhibit label: Give the object's date and origin.").split(" | ")]
SUBJECTS = (
    "urban beekeeping | high-speed rail | coral reef restoration | medieval bookbinding | electric bicycles | "
    "sourdough baking | deep-sea mining | community gardens | quantum computing | vinyl record collecting | "
    "wildfire prevention | public libraries | chess tournaments | 3D-printed houses | migratory birds | "
    "remote work | ancient Roman roads | vaccine development | street food | lighthouse keeping | "
    "rooftop solar panels | marathon running | jazz festivals | water desalination | video game design | "
    "mountain rescue teams | textile recycling | volcano monitoring | local elections | online privacy | "
    "tea cultivation | space telescopes | school lunch programs | offshore wind farms | museum conservation | "
    "folk music | self-driving cars | antibiotic resistance | bamboo architecture | night markets | "
    "container shipping | password security | origami | glacier retreat | small-town newspapers | "
    "robot vacuum cleaners | olive oil production | sleep research | bus timetables | wolf reintroduction | "
    "language learning apps | cheese making | the Silk Road | earthquake-resistant buildings | board game cafes | "
    "hydroponic farming | amateur astronomy | river cleanups | bicycle repair shops").split(" | ")
FRAMES = ["{s}", "the history of {s}", "{s} in {place}", "a new development in {s}",
          "a small business built around {s}", "the debate over {s} in {place}", "the practical side of {s}",
          "a person who has spent decades on {s}"]
PLACES = ("Lisbon | Nairobi | Osaka | Toronto | Valparaiso | Krakow | Hobart | Marrakesh | Reykjavik | Austin | "
          "Hanoi | Edinburgh | Cape Town | Montevideo | Tbilisi | Perth | Bergen | Pune | a small coastal village | "
          "a mountain town | a fast-growing suburb | a university campus").split(" | ")
LENGTHS = [(150, 250), (120, 200), (180, 280)]
PASSAGE_PROMPTS = ["Write a {lo}-{hi} word {genre} about {topic}. {hint}",
                   "Write {a_genre} of {lo} to {hi} words about {topic}. {hint} Reply with the text only.",
                   "Topic: {topic}. Write {a_genre} on it, {lo}-{hi} words long. {hint}"]
QUESTION_ASKS = [
    "Write one question that can be answered from this text. Reply with the question only.\n\n{text}",
    "{text}\n\nWrite a single factual question whose answer is stated in the text above. "
    "Reply with the question only.",
    "Read this {genre} and write one question a reader could answer from it. Only write the question.\n\n{text}",
    "Here is a text:\n\n{text}\n\nWrite one short quiz question about a detail of it. Give only the question.",
    "Write one question about the following text that needs the text to answer. Output only the question.\n\n{text}"]
QA_WITH_QUESTION = [
    "{text}\n\n{question}", "Read the text and answer the question.\n\nText: {text}\n\nQuestion: {question}",
    "Answer the question using the passage below.\n\nQuestion: {question}\n\nPassage:\n{text}",
    "Context:\n{text}\n\nBased on the context above, answer: {question}",
    "{question} Use the following {genre} to answer.\n\n{text}"]
QA_GENERIC = [
    "Read the text and answer: what is the main point?\n\n{text}",
    "{text}\n\nWho is the most important person or group in the text above, and what do they do?",
    "Read the following {genre}. When and where does it take place, according to the text?\n\n{text}",
    "{text}\n\nBased only on the text above, what problem is described and how is it addressed?",
    "Answer using only the passage below: what is the most surprising fact it mentions?\n\n{text}",
    "Read the text and answer: why does this matter, according to the author?\n\n{text}"]
SUMMARIZATION = [
    "Summarize the following text in two sentences:\n\n{text}", "Summarize: {text}",
    "{text}\n\nSummarize the text above in one short paragraph.", "Write a one-sentence summary of this:\n\n{text}",
    "Give the main points of the following text as three bullet points.\n\n{text}",
    "Write a TL;DR of at most 30 words for the following text.\n\n{text}"]
EXTRACTION = [
    "List every person, place and date in this text as JSON:\n\n{text}",
    "Extract all named entities (people, organizations, locations, dates) from the text below. "
    "Return a JSON object with one list per type.\n\n{text}",
    "{text}\n\nFrom the text above, extract every number together with what it refers to, as a Markdown table.",
    "Read the following {genre} and list its key facts as \"key: value\" lines.\n\n{text}",
    "Extract the main topic, the people mentioned and any dates from this text. Answer in YAML.\n\n{text}",
    "Find every organization, product or named thing in the following text and return them as a JSON array "
    "of strings (an empty array if there are none).\n\n{text}"]
TRANSLATION = [
    "Translate the following paragraph into {lang}:\n\n{text}", "Translate English to {lang}: {text}",
    "{text}\n\nTranslate the text above into {lang}.", "How would you say this in {lang}?\n\n\"{text}\"",
    "Please translate into {lang}, keeping the meaning and the tone:\n\n{text}"]
LANGUAGES = ["German", "French", "Spanish", "Chinese", "Italian", "Portuguese", "Japanese", "Dutch", "Russian"]
FOLLOW_UPS = {
    "summarization": ["Now make it shorter.", "Translate your summary into French.", "Now write a headline for it.",
                      "Rewrite your summary for a ten-year-old.", "What did you leave out of the summary, and why?"],
    "extraction": ["Now add a one-line description of each item.", "Convert your answer into a Markdown table.",
                   "Which of these is the most important to the text? Explain.", "Now sort the items alphabetically.",
                   "Did you miss anything? Check the text again and correct your list."],
    "translation": ["Now translate it back into English.", "Explain how you translated the hardest phrase.",
                    "Now make the translation more formal.", "Translate the same text into {lang2} instead.",
                    "Now make it shorter."],
    "passage_qa": ["Explain your answer.", "Quote the sentence from the text that supports your answer.",
                   "Now answer in one sentence.", "What else would you want to know that the text does not say?",
                   "Write a follow-up question about the text and answer it."]}
ASSISTANT_OPENERS = re.compile(r"^(sure|certainly|of course|i'm sorry|as an ai|here is|here's|i can't)\b", re.I)
TEMPLATE_MARKERS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<start_of_turn>", "<end_of_turn>")

# One user prompt for the target; a ``Generate`` answers a list of them with (text, finish_reason) pairs.
Ask = collections.namedtuple("Ask", "prompt max_tokens temperature top_p seed", defaults=(0.0, 1.0, None))
Generate = Callable[[list[Ask]], list[tuple[str, str]]]
# A record to make: its first turn's template and fields, perhaps a question for the target to write first
# (``ask``; ``fallback``: the template when the question is rejected), and a follow-up turn.
Task = collections.namedtuple("Task", "row j category template fields ask fallback followup",
                              defaults=(None, None, None))


def pairs(seed: int) -> list[tuple[tuple[str, str], str]]:
    """Every (genre, topic), shuffled by the seed (module docstring, step 1)."""
    topics = [f.format(s=s, place=random.Random(f"topic:{i}").choice(PLACES))
              for i, (s, f) in enumerate((s, f) for s in SUBJECTS for f in FRAMES)]
    ps = [(g, t) for g in GENRES for t in topics]
    random.Random(f"pairs:{seed}").shuffle(ps)
    return ps


def passage_ask(row: int, args, all_pairs) -> tuple[Ask, str]:
    """The user prompt that asks for row ``row``'s passage, and the passage's genre."""
    (genre, hint), topic = all_pairs[row % len(all_pairs)]
    r = random.Random(f"passage:{args.seed}:{row}")
    lo, hi = r.choice(LENGTHS)
    a_genre = ("an " if genre[0] in "aeiouAEIOU" else "a ") + genre
    text = r.choice(PASSAGE_PROMPTS).format(lo=lo, hi=hi, genre=genre, a_genre=a_genre, topic=topic, hint=hint)
    return Ask(text, args.max_tokens, args.temperature, args.top_p, args.seed + row), genre


def passage_reason(text: str, finish: str, args) -> str | None:
    """Why a generated passage is rejected, or None when it is kept."""
    t = text.strip()
    w = t.casefold().split()
    checks = [(finish != "stop", "passage not finished"),
              (not args.min_words <= len(w) <= args.max_words, "passage length"),
              (any(m in t for m in TEMPLATE_MARKERS), "template marker"),
              (ASSISTANT_OPENERS.match(t) is not None, "assistant preamble"),
              (len(set(zip(w, w[1:], w[2:]))) < 0.8 * (len(w) - 2), "repetitive")]
    return next((why for bad, why in checks if bad), None)


def passage_key(text: str) -> str:
    return hashlib.sha1(fold(text).encode()).hexdigest()[:20]


def opening(text: str, n: int) -> str:
    """The first ``n`` sentences of the first paragraph of at least 12 words (else of the text)."""
    paras = [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]
    para = next((p for p in paras if len(p.split()) >= 12), text.strip())
    out = " ".join(re.split(r"(?<=[.!?])\s+(?=[\"'(A-Z0-9])", " ".join(para.split()))[:n])
    return out.replace('"', "") if out.count('"') % 2 else out               # no quote left open


def first_turn(r: random.Random, kind: str, passage: str, genre: str) -> dict:
    """A first turn of ``kind`` over ``passage``: its template and fields (Task's keywords)."""
    fields = {"text": passage, "genre": genre}
    if kind == "passage_qa":
        fallback = r.choice(QA_GENERIC)
        if r.random() < 0.5:
            return {"fields": fields, "ask": r.choice(QUESTION_ASKS), "template": r.choice(QA_WITH_QUESTION),
                    "fallback": fallback}
        return {"fields": fields, "template": fallback}
    if kind == "translation":
        fields.update(lang=r.choice(LANGUAGES), text=opening(passage, r.randint(1, 3)))
        return {"fields": fields, "template": r.choice(TRANSLATION)}
    return {"fields": fields, "template": r.choice(SUMMARIZATION if kind == "summarization" else EXTRACTION)}


def plan_tasks(row: int, passage: str, genre: str, seed: int) -> list[Task]:
    """One or two tasks of distinct kinds over a kept passage (module docstring, step 3)."""
    r = random.Random(f"tasks:{seed}:{row}")
    kinds = r.sample(KINDS, r.choice([1, 2]))
    tasks = []
    for j, category in enumerate(kinds):
        if category != "multi_turn":
            tasks.append(Task(row, j, category, **first_turn(r, category, passage, genre)))
            continue
        kind = r.choice([k for k in KINDS[:4] if k not in kinds])
        spec = first_turn(r, kind, passage, genre)
        lang2 = r.choice([x for x in LANGUAGES if x != spec["fields"].get("lang")])
        tasks.append(Task(row, j, category, followup=r.choice(FOLLOW_UPS[kind]).format(lang2=lang2), **spec))
    return tasks


def clean_question(text: str, finish: str) -> str | None:
    """The target's question, tidied, or None when it is rejected."""
    t = re.sub(r"^(\*\*)?(question|q)\s*[:.]\s*(\*\*)?\s*", "", text.strip(), flags=re.I).strip().strip('"')
    if finish != "stop" or "\n" in t or not t.endswith("?") or not 4 <= len(t.split()) <= 40:
        return None
    return None if any(m in t for m in TEMPLATE_MARKERS) else t


def render(task: Task, question: str | None) -> dict:
    """A task's record; a question-asking task whose question was rejected takes its fallback template."""
    template = task.fallback if task.ask is not None and question is None else task.template
    first = template.format(**task.fields, question=question)
    rec = {"id": f"{SOURCE}-{task.row}-{task.j}", "source": SOURCE, "category": task.category}
    rec.update({"turns": [first, task.followup]} if task.followup else {"prompt": first})
    return rec


def record_keys(rec: dict) -> set[str]:
    """A record's keys for duplicates: all its turns, and its first turn (folded)."""
    turns = record_turns(rec)
    return {fold("\x1e".join(turns)), fold(turns[0])}


class Output:
    """The output file and ``OUT.progress``: the next row, the records and the kept passages' hashes so far."""

    def __init__(self, path: Path):
        self.path, self.progress = path, path.with_name(path.name + ".progress")
        if not self.progress.exists() and path.exists() and path.stat().st_size:
            raise SystemExit(f"{path} exists without {self.progress.name}: use another --out")
        state = json.loads(self.progress.read_text()) if self.progress.exists() else {}
        self.next_row, self.passages = int(state.get("next_row", 0)), list(state.get("passages", []))
        lines = self.path.read_text().split("\n")[:state.get("records", 0)] if path.exists() else []
        self.records = [json.loads(line) for line in lines]     # those of an unfinished batch are dropped
        if path.exists():
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text("".join(line + "\n" for line in lines))
            os.replace(tmp, self.path)

    def commit(self, recs: list[dict], passages: list[str], next_row: int) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs))
            f.flush()
            os.fsync(f.fileno())
        tmp = self.progress.with_name(self.progress.name + ".tmp")
        self.records += recs
        self.passages += passages
        self.next_row = next_row
        tmp.write_text(json.dumps({"next_row": next_row, "records": len(self.records), "passages": self.passages}))
        os.replace(tmp, self.progress)


class Maker:
    """Turns batches of rows into records through ``generate`` (the target, or a fake in tests)."""

    def __init__(self, args, generate: Generate, out: Output, spec, seen: set[str]):
        self.args, self.generate, self.out, self.spec = args, generate, out, spec
        self.seen = set(seen).union(*(record_keys(r) for r in out.records))
        self.passages, self.pairs = set(out.passages), pairs(args.seed)
        self.rejected: collections.Counter = collections.Counter()
        self.kept_passages = 0

    def passages_for(self, rows: list[int]) -> dict[int, tuple[str, str]]:
        """Row -> (passage, genre) for the rows whose passage is kept."""
        asks = [passage_ask(r, self.args, self.pairs) for r in rows]
        kept = {}
        for r, (_, genre), (text, finish) in zip(rows, asks, self.generate([a for a, _ in asks])):
            text = text.strip()
            why = passage_reason(text, finish, self.args)
            why = why or ("duplicate passage" if passage_key(text) in self.passages else None)
            if why:
                self.rejected[why] += 1
                continue
            self.passages.add(passage_key(text))
            kept[r] = (text, genre)
        return kept

    def batch(self, rows: list[int]) -> tuple[list[dict], list[str]]:
        """The records of ``rows`` and the hashes of their kept passages."""
        kept = self.passages_for(rows)
        tasks = [t for r, (p, g) in kept.items() for t in plan_tasks(r, p, g, self.args.seed)]
        asking = [t for t in tasks if t.ask is not None]
        answers = self.generate([Ask(t.ask.format(**t.fields), 64) for t in asking]) if asking else []
        questions = {(t.row, t.j): clean_question(text, finish) for t, (text, finish) in zip(asking, answers)}
        self.rejected["question rejected (fallback template)"] += sum(q is None for q in questions.values())
        recs = []
        for t in tasks:
            rec = render(t, questions.get((t.row, t.j)))
            hit, keys = self.spec.overlap(rec), record_keys(rec)
            if hit or not keys.isdisjoint(self.seen):
                self.rejected[f"spec-bench {hit}" if hit else "duplicate record"] += 1
                continue
            self.seen |= keys
            recs.append(rec)
        self.kept_passages += len(kept)
        return recs, [passage_key(p) for p, _ in kept.values()]

    def run(self, log=print) -> None:
        row, t0, a = self.out.next_row, time.time(), self.args
        while row < a.rows:
            rows = list(range(row, min(row + a.batch, a.rows)))
            recs, keys = self.batch(rows)
            row = rows[-1] + 1
            self.out.commit(recs, keys, row)
            log(f"rows {row}/{a.rows}  records {len(self.out.records)}  rejected {dict(+self.rejected)}  "
                f"{time.time() - t0:.0f}s")


def model_generator(llm, drafter: str) -> Generate:
    """``generate`` through the target's engine (chat-formatted user prompts, batched); ``drafter`` serves
    the greedy asks only (module docstring)."""
    from specserve.sampling import SamplingParams
    tok = llm.tokenizer

    def generate(asks: list[Ask]) -> list[tuple[str, str]]:
        reqs = [llm.request(llm.encode(a.prompt), a.max_tokens,
                            SamplingParams(temperature=a.temperature, top_p=a.top_p, seed=a.seed),
                            drafter=drafter if a.temperature == 0 else "none")
                for a in asks]
        return [(tok.decode([t for t in res.tokens if t not in tok.eos_ids]).strip(), res.finish_reason)
                for res in llm.engine.generate(reqs)]
    return generate


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="output JSONL (appended; OUT.progress beside it)")
    ap.add_argument("--rows", type=int, required=True, help="rows to try in all (a row is one sampled passage)")
    ap.add_argument("--model", default="default")
    ap.add_argument("--drafter", default="ngram-tree", help="speeds up the greedy questions ('none': no drafter)")
    ap.add_argument("--batch", type=int, default=16, help="rows generated together")
    ap.add_argument("--seed", type=int, default=0, help="row r's passage samples with seed SEED + r")
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--max-tokens", type=int, default=640, help="tokens for a passage")
    ap.add_argument("--min-words", type=int, default=80)
    ap.add_argument("--max-words", type=int, default=350)
    return ap


def main(argv: list[str] | None = None, generate: Generate | None = None) -> int:
    """Run the recipe; ``generate`` replaces the target (tests)."""
    args = parser().parse_args(argv)
    out = Output(Path(args.out))
    if out.next_row >= args.rows:
        print(f"{args.out}: all {args.rows} rows done ({len(out.records)} records)", flush=True)
        return 0
    if generate is None:
        from specserve.llm import LLM
        llm = LLM(args.model, drafters=[args.drafter] if args.drafter != "none" else None, max_batch=args.batch)
        generate = model_generator(llm, args.drafter)
    shipped = {fold(record_turns(json.loads(line))[0]) for p in sorted(TRAIN.glob("*.jsonl"))
               for line in p.read_text().split("\n") if line.strip()}          # first turns of the shipped files
    maker = Maker(args, generate, out, SpecBench(), shipped)
    t0, first = time.time(), out.next_row
    maker.run(log=lambda s: print(s, flush=True))
    minutes = max(time.time() - t0, 1e-6) / 60
    print(f"rows {first}-{args.rows - 1} in {minutes:.2f} min: {maker.kept_passages} passages kept "
          f"({(args.rows - first) / minutes:.1f} rows/min, {maker.kept_passages / minutes:.1f} kept passages/min)")
    print("records per category:", dict(sorted(collections.Counter(r["category"] for r in out.records).items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
