"""Checks shared by the prompt generators: the key for duplicates, and overlap with Spec-Bench
(evaluation only: no training prompt may overlap one of its turns)."""

from __future__ import annotations

import collections
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ROOT / "specserve" / "data" / "train"
SPEC_BENCH = ROOT / "specserve" / "data" / "spec_bench" / "question.jsonl"
SHINGLE = 12                         # words in a run shared with Spec-Bench that counts as overlap


def fold(text: str) -> str:
    """Case and whitespace folded: the key for duplicates and for Spec-Bench overlap."""
    return " ".join(text.casefold().split())


def record_turns(rec: dict) -> list[str]:
    return [rec["prompt"]] if "prompt" in rec else list(rec["turns"])


def shingles(text: str, n: int = SHINGLE) -> set[tuple[str, ...]]:
    w = re.findall(r"\w+", text.casefold())
    return {tuple(w[i:i + n]) for i in range(len(w) - n + 1)}


class SpecBench:
    """Spec-Bench's turns: a record overlaps one when a turn equals it (folded), contains a run of
    ``SHINGLE`` of its words, or, for a turn of 5 to ``SHINGLE - 1`` words, contains all its words in a row."""

    def __init__(self, path: Path = SPEC_BENCH):
        turns = [t for line in path.read_text().split("\n") if line.strip() for t in json.loads(line)["turns"]]
        self.exact = {fold(t) for t in turns}
        self.grams: set = set()
        self.short: dict[int, set] = collections.defaultdict(set)
        for t in turns:
            self.grams |= shingles(t)
            w = tuple(re.findall(r"\w+", t.casefold()))
            if 5 <= len(w) < SHINGLE:
                self.short[len(w)].add(w)

    def overlap(self, rec: dict) -> str | None:
        """'exact' or 'ngram' when the record overlaps a Spec-Bench turn, else None."""
        ts = record_turns(rec)
        if any(fold(t) in self.exact for t in ts):
            return "exact"
        for t in ts:
            if not self.grams.isdisjoint(shingles(t)):
                return "ngram"
            w = re.findall(r"\w+", t.casefold())
            for n, grams in self.short.items():
                if any(tuple(w[i:i + n]) in grams for i in range(len(w) - n + 1)):
                    return "ngram"
        return None
