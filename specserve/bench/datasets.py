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
    id: int
    category: str
    group: str
    text: str          # the first user turn


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
        cat = rec.get("category", "custom")
        out.append(Prompt(int(rec.get("question_id", rec.get("id", i))), cat, group_of(cat), str(turn)))
    return out


def spec_bench_sample(per_group: int, groups: tuple[str, ...] = GROUPS) -> list[Prompt]:
    """The first ``per_group`` prompts of each group, in Spec-Bench order (deterministic)."""
    prompts = load_jsonl()
    out = []
    for g in groups:
        out.extend([p for p in prompts if p.group == g][:per_group])
    return out
