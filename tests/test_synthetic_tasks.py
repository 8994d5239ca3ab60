"""``experiments/synthetic_tasks.py``: its pure parts (pairs, templates, the passage and question rules, the
record format, dedup) and its resumable loop, with a fake generator in place of the target (no model)."""

from __future__ import annotations

import collections
import json
import random
import string
import sys
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))
import synthetic_tasks as st  # noqa: E402
from prompt_checks import SpecBench  # noqa: E402

WORDS = ["river", "lantern", "market", "copper", "harbor", "winter", "garden", "signal", "valley", "ledger",
         "orchard", "meadow", "canvas", "engine", "pepper", "quarry", "saddle", "timber", "violet", "willow"]
NAMES = ["Mara Quill", "Tomas Brenn", "Ilse Varga", "Oren Pike"]


@lru_cache(maxsize=1)
def spec_bench() -> SpecBench:
    return SpecBench()


def args(*extra: str, out: str = "unused.jsonl", rows: int = 8):
    return st.parser().parse_args(["--out", out, "--rows", str(rows), *extra])


def fake_passage(seed: int, n_sentences: int = 14) -> str:
    r = random.Random(seed)
    sentences = [f"{r.choice(NAMES)} visited the {r.choice(WORDS)} {' '.join(r.sample(WORDS, 6))} on "
                 f"{r.randint(1, 28)} May {r.randint(1900, 2030)}." for _ in range(n_sentences)]
    return "Title Line\n\n" + " ".join(sentences[:7]) + "\n\n" + " ".join(sentences[7:])


class FakeTarget:
    """A deterministic stand-in for the target: a passage from the ask's seed, a question when greedy.
    ``bad``: seeds whose passage is cut short; ``same``: seeds that all write one passage; ``fail_at``:
    raise when asked for that seed's passage (a run stopped mid-way)."""

    def __init__(self, bad=(), same=(), fail_at=None):
        self.bad, self.same, self.fail_at, self.calls = set(bad), set(same), fail_at, []

    def __call__(self, asks):
        self.calls.append(list(asks))
        out = []
        for a in asks:
            if a.temperature == 0:
                out.append((f"Question: Who visited the {WORDS[len(a.prompt) % len(WORDS)]}?", "stop"))
                continue
            if a.seed == self.fail_at:
                raise KeyboardInterrupt("stopped")
            seed = min(self.same) if a.seed in self.same else a.seed
            out.append((fake_passage(seed), "length" if a.seed in self.bad else "stop"))
        return out


def test_pairs_are_many_varied_and_seeded():
    ps = st.pairs(0)
    topics = {t for _, t in ps}
    assert len(st.GENRES) >= 14 and len(topics) >= 300 and len(ps) == len(st.GENRES) * len(topics)
    assert len(set(ps)) == len(ps)
    assert ps == st.pairs(0) and ps != st.pairs(1) and sorted(ps) == sorted(st.pairs(1))
    assert all("{" not in t for t in topics)
    assert {g for (g, _), _ in ps[:200]} == {g for g, _ in st.GENRES}          # genres mixed from the start


def test_passage_ask_fills_the_prompt_and_seeds_by_row():
    a = args("--seed", "100")
    ps = st.pairs(100)
    for row in range(50):
        ask, genre = st.passage_ask(row, a, ps)
        (g, hint), topic = ps[row]
        assert genre == g and topic in ask.prompt and hint in ask.prompt and genre in ask.prompt
        assert "{" not in ask.prompt and "a a" not in ask.prompt and " a e" not in ask.prompt
        assert (ask.temperature, ask.top_p, ask.seed, ask.max_tokens) == (0.8, 0.95, 100 + row, 640)
        assert st.passage_ask(row, a, ps) == (ask, genre)


def test_passage_rules():
    a = args()
    good = " ".join(f"w{i}" for i in range(150))
    assert st.passage_reason(good, "stop", a) is None
    assert st.passage_reason(good, "length", a) == "passage not finished"
    assert st.passage_reason(" ".join(good.split()[:79]), "stop", a) == "passage length"
    assert st.passage_reason(" ".join(good.split()[:80]), "stop", a) is None
    assert st.passage_reason(" ".join(f"w{i}" for i in range(351)), "stop", a) == "passage length"
    assert st.passage_reason(" ".join(f"w{i}" for i in range(350)), "stop", a) is None
    assert st.passage_reason(good + " <|im_end|>", "stop", a) == "template marker"
    assert st.passage_reason("Sure! Here is a news report. " + good, "stop", a) == "assistant preamble"
    assert st.passage_reason("Here's the recipe: " + good, "stop", a) == "assistant preamble"
    assert st.passage_reason("Surely the river " + good, "stop", a) is None
    assert st.passage_key("A  b\nC") == st.passage_key("a b c") != st.passage_key("a b d")


def test_opening_takes_sentences_of_the_first_real_paragraph():
    text = "**Harbor News**\n\nDear all,\n\nThe harbor opened on 3 May 2021. It was late! \"Finally,\" said Ana " \
           "Ruiz, who runs the ferry and the small cafe beside it.\nThen came rain. More text here."
    assert st.opening(text, 1) == "The harbor opened on 3 May 2021."
    assert st.opening(text, 2) == "The harbor opened on 3 May 2021. It was late!"
    assert st.opening(text, 3).endswith("cafe beside it.")
    assert st.opening("Short one. Two.", 3) == "Short one. Two."
    quoted = '"The tea is light and lacks a rich flavor. I tried other places too." Then the review ends here.'
    assert st.opening(quoted, 1) == "The tea is light and lacks a rich flavor."
    assert st.opening(quoted, 3) == quoted


def test_templates_are_varied_fill_and_stay_clear_of_spec_bench():
    lists = {"qa ask": st.QUESTION_ASKS, "qa with question": st.QA_WITH_QUESTION, "qa generic": st.QA_GENERIC,
             "summarization": st.SUMMARIZATION, "extraction": st.EXTRACTION, "translation": st.TRANSLATION}
    passage = fake_passage(3)
    fields = {"text": passage, "genre": "news report", "lang": "German", "question": "Who visited the harbor?"}
    for name, templates in lists.items():
        assert len(set(templates)) == len(templates) >= 5, name
        for t in templates:
            filled = t.format(**fields)
            assert passage in filled and "{" not in filled, (name, t)
            assert spec_bench().overlap({"prompt": filled}) is None, (name, t)
    for kind, follow in st.FOLLOW_UPS.items():
        assert kind in st.KINDS and len(set(follow)) >= 5
        for t in follow:
            assert spec_bench().overlap({"turns": ["x", t.format(lang2="Dutch")]}) is None, t
    assert all("{question}" in t for t in st.QA_WITH_QUESTION)
    assert all("{lang}" in t for t in st.TRANSLATION)


def test_plan_tasks_seeded_distinct_and_covering_every_kind():
    seen = collections.Counter()
    passage = fake_passage(1)
    for row in range(400):
        tasks = st.plan_tasks(row, passage, "email", seed=0)
        assert tasks == st.plan_tasks(row, passage, "email", seed=0)
        assert 1 <= len(tasks) <= 2 and [t.j for t in tasks] == list(range(len(tasks)))
        cats = [t.category for t in tasks]
        assert len(set(cats)) == len(cats)
        for t in tasks:
            seen[t.category] += 1
            assert (t.followup is not None) == (t.category == "multi_turn")
            if t.ask is not None:
                assert t.template in st.QA_WITH_QUESTION and t.fallback in st.QA_GENERIC
            if t.category == "translation":
                assert t.fields["text"] in passage and t.fields["lang"] in st.LANGUAGES
        if "multi_turn" in cats and len(tasks) == 2:             # its first turn is not the other task's kind
            other = next(t for t in tasks if t.category != "multi_turn")
            mt = next(t for t in tasks if t.category == "multi_turn")
            assert mt.template not in {"passage_qa": st.QA_GENERIC + st.QA_WITH_QUESTION,
                                       "summarization": st.SUMMARIZATION, "extraction": st.EXTRACTION,
                                       "translation": st.TRANSLATION}[other.category]
    assert set(seen) == set(st.KINDS) and min(seen.values()) > 60
    assert [st.plan_tasks(r, passage, "email", 0) for r in range(20)] != \
           [st.plan_tasks(r, passage, "email", 1) for r in range(20)]


def test_clean_question():
    assert st.clean_question("Question: Who opened the harbor?", "stop") == "Who opened the harbor?"
    assert st.clean_question('**Q:** "When did the harbor open?"', "stop") == "When did the harbor open?"
    assert st.clean_question("When did the harbor open?", "length") is None
    assert st.clean_question("Describe the harbor.", "stop") is None
    assert st.clean_question("Who?", "stop") is None
    assert st.clean_question("Who opened it?\nAnswer: Ana.", "stop") is None


def test_render_gives_the_training_format(tmp_path):
    from specserve.train.regen import read_records
    passage = fake_passage(2)
    one = st.Task(7, 0, "summarization", "Summarize: {text}", {"text": passage, "genre": "email"})
    qa = st.Task(7, 1, "passage_qa", "{text}\n\n{question}", {"text": passage, "genre": "email"},
                 ask=st.QUESTION_ASKS[0], fallback=st.QA_GENERIC[0])
    mt = st.Task(9, 0, "multi_turn", "Summarize: {text}", {"text": passage, "genre": "email"},
                 followup="Now make it shorter.")
    assert st.render(one, None) == {"id": "synthetic-smollm2-7-0", "source": "synthetic-smollm2",
                                    "category": "summarization", "prompt": "Summarize: " + passage}
    assert st.render(qa, "Who visited?")["prompt"] == passage + "\n\nWho visited?"
    assert st.render(qa, None)["prompt"] == st.QA_GENERIC[0].format(text=passage)
    assert st.render(mt, None)["turns"] == ["Summarize: " + passage, "Now make it shorter."]
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(st.render(t, "Who?")) + "\n" for t in (one, qa, mt)))
    recs = read_records([str(path)])
    assert [(r.id, r.source, r.category, len(r.turns)) for r in recs] == [
        ("synthetic-smollm2-7-0", "synthetic-smollm2", "summarization", 1),
        ("synthetic-smollm2-7-1", "synthetic-smollm2", "passage_qa", 1),
        ("synthetic-smollm2-9-0", "synthetic-smollm2", "multi_turn", 2)]


class NoSpec:
    def overlap(self, rec):
        return "ngram" if "SPEC" in st.record_turns(rec)[0] else None


def test_maker_rejects_and_dedups(tmp_path):
    target = FakeTarget(bad={1}, same={2, 3})
    out = st.Output(tmp_path / "o.jsonl")
    m = st.Maker(args(rows=6), target, out, NoSpec(), seen=set())
    recs, keys = m.batch(list(range(6)))
    assert m.rejected["passage not finished"] == 1 and m.rejected["duplicate passage"] == 1
    assert m.kept_passages == len(keys) == 4 and len(set(keys)) == 4
    assert {int(r["id"].rsplit("-", 2)[1]) for r in recs} <= {0, 2, 4, 5}
    assert len({json.dumps(st.record_turns(r)) for r in recs}) == len(recs)
    # a record seen before (a shipped first turn) or overlapping Spec-Bench is dropped
    first = st.record_turns(recs[0])[0]
    m2 = st.Maker(args(rows=6), FakeTarget(bad={1}, same={2, 3}), st.Output(tmp_path / "p.jsonl"), NoSpec(),
                  seen={st.fold(first)})
    recs2, _ = m2.batch(list(range(6)))
    assert recs2 == [r for r in recs if st.record_turns(r)[0] != first] and m2.rejected["duplicate record"] >= 1
    spec = type("Spec", (), {"overlap": lambda self, rec: "exact" if st.record_turns(rec)[0] == first else None})()
    m3 = st.Maker(args(rows=6), FakeTarget(bad={1}, same={2, 3}), st.Output(tmp_path / "q.jsonl"), spec, set())
    assert m3.batch(list(range(6)))[0] == recs2 and m3.rejected["spec-bench exact"] >= 1


def test_questions_are_asked_greedily_and_used(tmp_path):
    target = FakeTarget()
    m = st.Maker(args(rows=40), target, st.Output(tmp_path / "o.jsonl"), NoSpec(), set())
    recs, _ = m.batch(list(range(40)))
    greedy = [a for call in target.calls for a in call if a.temperature == 0]
    assert greedy and all(a.max_tokens == 64 and a.seed is None for a in greedy)
    assert len(target.calls) == 2                                     # one call for passages, one for questions
    asked = [r for r in recs if r["category"] == "passage_qa" and "Who visited the" in r["prompt"]]
    assert asked and not any("Question: Question:" in r["prompt"] for r in asked)
    assert not any("{" in t for r in recs for t in st.record_turns(r))


def run_main(out: Path, target, rows: int, batch: int = 4) -> None:
    st.main(["--out", str(out), "--rows", str(rows), "--batch", str(batch)], generate=target)


def test_resume_after_a_stop_gives_the_same_file(tmp_path, capsys):
    whole = tmp_path / "whole.jsonl"
    run_main(whole, FakeTarget(bad={5}), rows=11)
    text = whole.read_text()
    recs = [json.loads(line) for line in text.splitlines()]
    assert recs and all(r["source"] == "synthetic-smollm2" and r["category"] in st.KINDS for r in recs)
    assert json.loads((tmp_path / "whole.jsonl.progress").read_text())["next_row"] == 11
    report = capsys.readouterr().out
    assert "records per category:" in report and "kept passages/min" in report

    part = tmp_path / "part.jsonl"
    with pytest.raises(KeyboardInterrupt):
        run_main(part, FakeTarget(bad={5}, fail_at=9), rows=11)          # stops in the third batch (rows 8-10)
    state = json.loads((tmp_path / "part.jsonl.progress").read_text())
    assert state["next_row"] == 8 and len(state["passages"]) == 7
    assert state["records"] == len(part.read_text().splitlines()) > 0
    with open(part, "a") as f:                                           # an unfinished batch's leftovers
        f.write(json.dumps({"id": "synthetic-smollm2-8-0", "source": "x", "category": "x", "prompt": "p"}) + "\n")
        f.write('{"id": "synthetic-smollm2-9-0", "sou')
    target = FakeTarget(bad={5})
    run_main(part, target, rows=11)
    assert {a.seed for call in target.calls for a in call if a.seed is not None} == {8, 9, 10}
    assert part.read_text() == text
    assert (tmp_path / "part.jsonl.progress").read_text() == (tmp_path / "whole.jsonl.progress").read_text()
    capsys.readouterr()
    run_main(part, FakeTarget(fail_at=0), rows=11)                        # all done: nothing generated
    assert "all 11 rows done" in capsys.readouterr().out


def test_output_refuses_a_file_without_progress(tmp_path):
    (tmp_path / "x.jsonl").write_text('{"id": "other-1", "prompt": "p"}\n')
    with pytest.raises(SystemExit, match="without x.jsonl.progress"):
        st.Output(tmp_path / "x.jsonl")
    assert st.Output(tmp_path / "new.jsonl").records == []                # a new file is fine


def test_repetitive_passages_are_rejected():
    loop = "The gardens are beautiful. " * 30
    assert st.passage_reason(loop, "stop", args()) == "repetitive"
    twice = fake_passage(0, n_sentences=6) + "\n\n" + fake_passage(0, n_sentences=6)
    assert 80 <= len(twice.split()) <= 350 and st.passage_reason(twice, "stop", args()) == "repetitive"


def test_model_generator_samples_without_the_drafter():
    class Tok:
        eos_ids = frozenset({0})

        def decode(self, ids):
            return " ".join(map(str, ids))

    class Engine:
        def generate(self, reqs):
            self.reqs = reqs
            return [type("R", (), {"tokens": [5, 6, 0], "finish_reason": "stop"})() for _ in reqs]

    class LLM:
        tokenizer, engine = Tok(), Engine()

        def encode(self, prompt):
            return [len(prompt)]

        def request(self, ids, max_tokens, sampling, drafter):
            return (ids, max_tokens, sampling, drafter)

    llm = LLM()
    gen = st.model_generator(llm, "ngram-tree")
    assert gen([st.Ask("abc", 640, 0.8, 0.95, 7), st.Ask("question?", 64)]) == [("5 6", "stop"), ("5 6", "stop")]
    (_, n1, s1, d1), (_, n2, s2, d2) = llm.engine.reqs
    assert (n1, s1.temperature, s1.top_p, s1.seed, d1) == (640, 0.8, 0.95, 7, "none")
    assert (n2, s2.temperature, d2) == (64, 0.0, "ngram-tree")


def test_restart_keeps_dedup_state(tmp_path):
    out = tmp_path / "o.jsonl"
    run_main(out, FakeTarget(), rows=4)
    o = st.Output(out)
    m = st.Maker(args(rows=8), FakeTarget(same={0, 4}), o, NoSpec(), set())
    m.batch([4])                                                          # row 4 writes row 0's passage again
    assert m.rejected["duplicate passage"] == 1 and m.kept_passages == 0
    assert all(st.record_keys(r) <= m.seen for r in o.records)


def test_fake_passages_pass_the_rules():
    for seed in range(20):
        p = fake_passage(seed)
        assert st.passage_reason(p, "stop", args()) is None
        assert set(p) <= set(string.printable)
