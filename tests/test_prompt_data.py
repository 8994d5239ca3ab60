"""The shipped training prompts (``specserve/data/train/``): format, uniqueness, provenance, and no
Spec-Bench prompt among them.  Reads the files only (a second or so)."""

from __future__ import annotations

import collections
import json
from functools import lru_cache
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "specserve" / "data"
TRAIN = DATA / "train"
MAX_FILE_BYTES = 8_000_000


def fold(text: str) -> str:
    return " ".join(text.casefold().split())


def turns_of(rec: dict) -> list[str]:
    return [rec["prompt"]] if "prompt" in rec else list(rec["turns"])


@lru_cache(maxsize=1)
def records() -> dict[str, list[dict]]:
    out = {}
    for path in sorted(TRAIN.glob("*.jsonl")):
        out[path.name] = [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]
    return out


def all_records() -> list[dict]:
    return [r for recs in records().values() for r in recs]


def test_files_parse_with_the_training_format():
    assert records(), "no training prompt files"
    for name, recs in records().items():
        assert recs, f"{name} is empty"
        for rec in recs:
            assert {"id", "source", "category"} <= rec.keys(), (name, rec.get("id"))
            assert ("prompt" in rec) != ("turns" in rec), (name, rec["id"])
            assert set(rec) <= {"id", "source", "category", "prompt", "turns"}, (name, rec["id"])
            assert all(isinstance(rec[k], str) and rec[k] for k in ("id", "source", "category")), (name, rec["id"])
            if "turns" in rec:
                assert isinstance(rec["turns"], list) and len(rec["turns"]) >= 2, (name, rec["id"])
            assert all(isinstance(t, str) and t.strip() for t in turns_of(rec)), (name, rec["id"])


def test_files_are_reasonably_sized():
    for path in TRAIN.glob("*.jsonl"):
        assert path.stat().st_size < MAX_FILE_BYTES, path.name


def test_ids_unique_across_files():
    ids = collections.Counter(r["id"] for r in all_records())
    dup = [i for i, n in ids.items() if n > 1]
    assert not dup, dup[:10]


def test_no_duplicate_records_across_files():
    seen: dict[str, str] = {}
    for rec in all_records():
        key = "\x1e".join(fold(t) for t in turns_of(rec))
        assert key not in seen, (rec["id"], seen.get(key))
        seen[key] = rec["id"]


def test_no_spec_bench_turn_in_training_prompts():
    spec = [json.loads(line) for line in (DATA / "spec_bench" / "question.jsonl").read_text().split("\n") if line.strip()]
    spec_turns = {fold(t) for q in spec for t in q["turns"]}
    assert len(spec_turns) > 400
    hits = [r["id"] for r in all_records() if any(fold(t) in spec_turns for t in turns_of(r))]
    assert not hits, hits[:10]
