"""Spec-Bench prompts, shipped inside the package (see specserve/data/spec_bench/PROVENANCE.md)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources

from specserve.errors import SpecserveError

MT_BENCH = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
GROUPS = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")


@dataclass(frozen=True)
class Prompt:
    id: int | str
    category: str
    group: str
    text: str          # the first user turn
    response_format: dict | None = None    # OpenAI's, for a structured output (None: free text)


def group_of(category: str) -> str:
    return "mt_bench" if category in MT_BENCH else category


def load_jsonl(path: str | None = None) -> list[Prompt]:
    """Spec-Bench's 480 prompts, or any JSONL with ``turns`` (or ``prompt``) per line."""
    try:
        if path is None:
            text = resources.files("specserve").joinpath("data/spec_bench/question.jsonl").read_text()
        else:
            with open(path) as f:
                text = f.read()
    except OSError as e:
        raise SpecserveError(f"cannot read prompts: {e}") from None
    out = []
    for i, line in enumerate(text.splitlines()):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            turn = rec["turns"][0] if "turns" in rec else rec["prompt"]
        except (json.JSONDecodeError, KeyError, IndexError, TypeError):
            raise SpecserveError(f"{path or 'spec_bench'} line {i + 1}: need a JSON object with 'turns' or 'prompt'") from None
        cat = str(rec.get("category", "custom"))
        rf = rec.get("response_format")
        if rf is not None and not isinstance(rf, dict):
            raise SpecserveError(f"{path} line {i + 1}: response_format must be an object")
        pid = rec.get("question_id", rec.get("id", i))
        out.append(Prompt(pid if isinstance(pid, (int, str)) else i, cat,
                          group_of(cat) if path is None else cat, str(turn), rf))
    return out


def sample(per_group: int, groups: list[str] | None = None, path: str | None = None) -> tuple[list[Prompt], list[str]]:
    """The first ``per_group`` prompts of each group, in file order, and the groups (Spec-Bench's six
    by default; a prompt file's own categories, in order of first appearance, when ``path`` is given).
    ``groups`` None means all of them; an unknown group is refused, naming the ones there are."""
    prompts = load_jsonl(path)
    present = list(dict.fromkeys(p.group for p in prompts)) if path else list(GROUPS)
    chosen = present if groups is None else groups
    bad = [g for g in chosen if g not in present]
    if bad:
        raise SpecserveError(f"unknown group {bad[0]!r}; choose from all, {', '.join(present)}")
    out = [p for g in chosen for p in [q for q in prompts if q.group == g][:per_group]]
    return out, chosen


def rotation(k: int, i: int) -> list[int]:
    """The order in which k methods take turn i: 0..k-1 rotated to start at i mod k, so that a slow
    spell of a shared machine falls on every method alike over the turns."""
    return [*range(i % k, k), *range(i % k)]


def turns(n: int, level: int, k: int, repeat: bool = True) -> list[tuple[slice, list[int]]]:
    """Prompts 0..n-1 cut into chunks of at least 2 x ``level`` (so a closed loop at that
    concurrency fills up), each with the order its k methods run in (``rotation``).  Prompts that
    make only one chunk run twice with ``repeat``, the second time in the next order (two methods:
    A B B A), so a slow spell of the machine does not fall on one method alone (the caller empties
    drafters' memory across requests before a repeated turn, or the second run would recall the
    first's text)."""
    chunks = n // (2 * level)
    if chunks < 2 and repeat:
        return [(slice(0, n), rotation(k, c)) for c in range(2 if k > 1 else 1)]
    chunks = max(chunks, 1)
    size = -(-n // chunks)
    return [(slice(c * size, (c + 1) * size), rotation(k, c)) for c in range(chunks)]
