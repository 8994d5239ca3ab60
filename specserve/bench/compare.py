"""``specserve bench compare``: the tokens of two ``specserve bench`` runs (two commits, two
machines), method by method, on the prompts both ran."""

from __future__ import annotations

import json

from specserve.errors import SpecserveError


def load_results(path: str) -> dict[str, dict]:
    """A bench run's records from its results.json (or the folder holding it): method label ->
    prompt id -> (tokens, group).  A file that is not such a document is refused in one line."""
    from pathlib import Path

    p = Path(path)
    p = p / "results.json" if p.is_dir() else p
    try:
        doc = json.loads(p.read_text())
    except OSError as e:
        raise SpecserveError(f"cannot read {p}: {e.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise SpecserveError(f"{p} is not JSON") from None
    records = doc.get("records") if isinstance(doc, dict) else None
    if not isinstance(records, dict):
        raise SpecserveError(f"{p} has no per-method records (is it a `specserve bench` results.json?)")
    try:
        return {label: {r["prompt_id"]: (r["tokens"], r["group"]) for r in recs} for label, recs in records.items()}
    except (KeyError, TypeError):
        raise SpecserveError(f"{p}: a record without prompt_id, tokens or group") from None


def compare_tokens(before: dict[str, dict], after: dict[str, dict], labels: list[str] | None = None) -> list[dict]:
    """Per method (``labels``, default every method both ran, in ``after``'s order): the prompts
    both ran, how many of them have identical tokens, and their groups."""
    both = [label for label in after if label in before]
    missing = [label for label in labels or () if label not in both]
    if missing:
        raise SpecserveError(f"method {missing[0]!r} is not in both runs; both ran: {', '.join(both) or 'none'}")
    rows = []
    for label in labels or both:
        b, a = before[label], after[label]
        common = sorted(set(a) & set(b), key=str)
        rows.append({"method": label, "prompts": len(common), "identical": sum(a[i][0] == b[i][0] for i in common),
                     "groups": sorted({a[i][1] for i in common})})
    return rows


def render_comparison(rows: list[dict]) -> list[str]:
    return [f"{r['method']}: {r['identical']}/{r['prompts']} prompts with identical tokens ({', '.join(r['groups'])})"
            for r in rows]
