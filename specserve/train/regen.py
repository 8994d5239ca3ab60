"""Regenerated answers as token sequences: the target answers training prompts, and only the tokens
are kept (a few bytes per position), so the features (gigabytes) can be recomputed on any machine
by one teacher-forced pass instead of being regenerated.

The target answers greedily through the engine, with continuous batching and speculation: greedy
speculative output is token for token the target's greedy output, so the drafter only changes the
wall time.  A record with several user turns is answered turn by turn, each later turn after the
target's own earlier answers (a second turn of a conversation).

Output, under ``out_dir``: ``seqs-00000.jsonl.gz``... (gzipped, one JSON object per answered turn: ``id``,
``source``, ``category``, ``turn``, ``prompt_ids`` (the chat-formatted conversation up to this
turn's assistant header), ``answer_ids``, ``finish_reason``), written whole and renamed into place,
and ``meta.json`` (the model file, the command, the settings, and per shard its records, turns,
tokens and seconds), so a stopped run resumes after its last whole shard and skips the ids done.
"""

from __future__ import annotations

import gzip
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

from specserve.errors import SpecserveError

T = TypeVar("T")


@dataclass(frozen=True)
class Record:
    """A training prompt: one or more user turns, where it came from."""
    id: str
    source: str
    category: str
    turns: tuple[str, ...]


def prompt_lines(path: str, what: str, parse: Callable[[Any], T], needs: str) -> Iterator[tuple[int, Any, T]]:
    """(line number, JSON value, ``parse`` of it) for every non-blank line of a JSONL file of prompts,
    its lines split on newlines alone (not splitlines: prompts may hold U+2028).  Refused: a file that
    cannot be read (``cannot read {what} ...``), a line that is not JSON or that ``parse`` fails on
    (``... a line needs a JSON object with {needs}``)."""
    try:
        lines = Path(path).read_text().split("\n")
    except OSError as e:
        raise SpecserveError(f"cannot read {what} {path}: {e.strerror}") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            value = parse(rec)
        except (ValueError, KeyError, IndexError, TypeError):
            raise SpecserveError(f"{path}:{n}: a line needs a JSON object with {needs}") from None
        yield n, rec, value


def read_records(paths: list[str]) -> list[Record]:
    """Records from JSONL files (``prompt``, or ``turns``: a list of user turns), in file order; an
    ``id`` is made from the file and line when a record has none."""
    out: list[Record] = []
    for p in paths:
        for n, rec, turns in prompt_lines(p, "prompts", lambda r: [r["prompt"]] if "prompt" in r else list(r["turns"]),
                                          "'prompt' or 'turns'"):
            if not turns or not all(isinstance(t, str) and t.strip() for t in turns):
                raise SpecserveError(f"{p}:{n}: empty prompt")
            out.append(Record(str(rec.get("id", f"{Path(p).stem}:{n}")), str(rec.get("source", Path(p).stem)),
                              str(rec.get("category", "")), tuple(turns)))
    return out


class Regenerator:
    """Answers records through an ``LLM``'s engine and writes the shards (module docstring)."""

    def __init__(self, llm, out_dir: str, max_new_tokens: int, max_prompt_tokens: int, drafter: str,
                 command: str, shard_records: int = 256):
        self.llm, self.out = llm, Path(out_dir)
        self.max_new_tokens, self.max_prompt_tokens, self.drafter = max_new_tokens, max_prompt_tokens, drafter
        self.shard_records = shard_records
        self.out.mkdir(parents=True, exist_ok=True)
        self.meta_path = self.out / "meta.json"
        settings = {"model": str(llm.target.path), "model_bytes": os.path.getsize(llm.target.path),
                    "max_new_tokens": max_new_tokens, "max_prompt_tokens": max_prompt_tokens, "greedy": True}
        self.meta = {"settings": settings, "command": command, "shards": []}
        if self.meta_path.exists():
            old = json.loads(self.meta_path.read_text())
            if old["settings"] != settings:
                raise SpecserveError(f"{self.out} holds sequences made with other settings {old['settings']}; "
                                     "use another directory")
            self.meta["shards"] = old["shards"]

    def done_ids(self) -> set[str]:
        ids: set[str] = set()
        for shard in self.meta["shards"]:
            ids |= set(shard["ids"])
        return ids

    def run(self, records: list[Record], progress=None) -> None:
        """Answer every record not yet done, ``shard_records`` at a time."""
        done = self.done_ids()
        todo = [r for r in records if r.id not in done]
        for first in range(0, len(todo), self.shard_records):
            chunk = todo[first:first + self.shard_records]
            t0 = time.perf_counter()
            rows = self.answer(chunk)
            self.write(chunk, rows, time.perf_counter() - t0)
            if progress:
                progress(len(done) + first + len(chunk), len(done) + len(todo), self.tokens(),
                         sum(s["seconds"] for s in self.meta["shards"]))

    def answer(self, records: list[Record]) -> list[dict]:
        """Every turn of ``records``, turn by turn (a later turn after the target's own answers)."""
        from specserve.engine import Request
        from specserve.sampling import SamplingParams
        convs = {r.id: [] for r in records}
        rows: list[dict] = []
        for turn in range(max(len(r.turns) for r in records)):
            live = [r for r in records if turn < len(r.turns) and convs[r.id] is not None]
            prompts = []
            for r in live:
                convs[r.id].append({"role": "user", "content": r.turns[turn]})
                ids = self.llm.encode(convs[r.id])
                if len(ids) > self.max_prompt_tokens:
                    convs[r.id] = None               # too long: this record's later turns are skipped too
                    continue
                prompts.append((r, ids))
            reqs = [Request(ids, self.max_new_tokens, SamplingParams(temperature=0.0), drafter=self.drafter,
                            num_draft="auto", eos_ids=self.llm.tokenizer.eos_ids) for _, ids in prompts]
            for (r, ids), res in zip(prompts, self.llm.engine.generate(reqs) if reqs else []):
                rows.append({"id": r.id, "source": r.source, "category": r.category, "turn": turn,
                             "prompt_ids": ids, "answer_ids": res.tokens, "finish_reason": res.finish_reason})
                answer = [t for t in res.tokens if t not in self.llm.tokenizer.eos_ids]
                convs[r.id].append({"role": "assistant", "content": self.llm.tokenizer.decode(answer)})
        return rows

    def write(self, records: list[Record], rows: list[dict], seconds: float) -> None:
        name = f"seqs-{len(self.meta['shards']):05d}.jsonl.gz"
        tmp = self.out / (name + ".tmp")
        with gzip.open(tmp, "wt") as f:
            f.write("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows))
        tmp.rename(self.out / name)
        tokens = sum(len(r["prompt_ids"]) + len(r["answer_ids"]) for r in rows)
        self.meta["shards"].append({"file": name, "ids": [r.id for r in records], "turns": len(rows),
                                    "tokens": tokens, "answer_tokens": sum(len(r["answer_ids"]) for r in rows),
                                    "seconds": round(seconds, 1)})
        tmp_meta = self.meta_path.with_suffix(".tmp")
        tmp_meta.write_text(json.dumps(self.meta, indent=1))
        tmp_meta.rename(self.meta_path)

    def tokens(self) -> int:
        return sum(s["tokens"] for s in self.meta["shards"])


def read_sequences(out_dir: str) -> list[dict]:
    """Every row of a regenerated directory's shards, in order."""
    d = Path(out_dir)
    if not (d / "meta.json").exists():
        raise SpecserveError(f"{d} holds no regenerated sequences (no meta.json)")
    meta = json.loads((d / "meta.json").read_text())
    rows = []
    for s in meta["shards"]:
        with gzip.open(d / s["file"], "rt") as f:
            rows += [json.loads(line) for line in f if line.strip()]
    return rows
