"""Regenerated answers as token sequences (``specserve train regen``) on the real default model:
the answers are the target's plain greedy answers whatever the drafter, a second turn follows the
target's own first answer, and a stopped run resumes by id without redoing a record."""

import json

import pytest

from specserve.engine import Request
from specserve.errors import SpecserveError
from specserve.llm import LLM
from specserve.train.regen import Record, Regenerator, read_records, read_sequences

pytestmark = pytest.mark.slow
RECORDS = [Record("a", "test", "chat", ("Name three colours.",)),
           Record("b", "test", "chat", ("What is 2 + 3?", "And times 4?")),
           Record("c", "test", "code", ("Write a Python function that adds two numbers.",))]


@pytest.fixture(scope="module")
def llm(default_target):
    return LLM(loaded=default_target, drafters=["ngram-tree"], max_batch=4, max_len=512)


def test_answers_are_plain_greedy_and_second_turns_follow_the_first(llm, tmp_path):
    Regenerator(llm, str(tmp_path), 12, 400, "ngram-tree", "test", shard_records=2).run(RECORDS)
    rows = read_sequences(str(tmp_path))
    assert [(r["id"], r["turn"]) for r in rows] == [("a", 0), ("b", 0), ("b", 1), ("c", 0)]
    for r in rows:                      # each answer is what plain greedy decoding gives for its prompt
        plain = llm.engine.generate([Request(r["prompt_ids"], 12, eos_ids=llm.tokenizer.eos_ids)])[0].tokens
        assert r["answer_ids"] == plain
    first, second = rows[1], rows[2]
    answer = [t for t in first["answer_ids"] if t not in llm.tokenizer.eos_ids]
    conversation = [{"role": "user", "content": "What is 2 + 3?"},
                    {"role": "assistant", "content": llm.tokenizer.decode(answer)},
                    {"role": "user", "content": "And times 4?"}]
    assert second["prompt_ids"] == llm.encode(conversation)


def test_a_stopped_run_resumes_by_id(llm, tmp_path):
    Regenerator(llm, str(tmp_path), 6, 400, "ngram-tree", "test", shard_records=2).run(RECORDS[:2])
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert [s["ids"] for s in meta["shards"]] == [["a", "b"]]
    again = Regenerator(llm, str(tmp_path), 6, 400, "ngram-tree", "test", shard_records=2)
    again.run(RECORDS)                                       # only "c" is new
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert [s["ids"] for s in meta["shards"]] == [["a", "b"], ["c"]]
    assert [r["id"] for r in read_sequences(str(tmp_path))] == ["a", "b", "b", "c"]
    with pytest.raises(SpecserveError, match="other settings"):
        Regenerator(llm, str(tmp_path), 7, 400, "ngram-tree", "test")


def test_records_from_files_and_their_errors(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"id": "x", "prompt": "hi"}) + "\n" + json.dumps({"turns": ["a", "b"]}) + "\n")
    recs = read_records([str(f)])
    assert recs[0] == Record("x", "p", "", ("hi",)) and recs[1].turns == ("a", "b") and recs[1].id == "p:2"
    f.write_text('{"turns": []}\n')
    with pytest.raises(SpecserveError, match="empty prompt"):
        read_records([str(f)])
