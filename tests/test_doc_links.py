"""Every relative link in the user's pages (README, BENCHMARKS, docs/, tests/README, the benchmarks'
history) names a file that exists and, for a markdown file, a heading it has (GitHub's anchors)."""

import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = ["README.md", "BENCHMARKS.md", "ARCHITECTURE.md", "tests/README.md", "experiments/README.md",
         *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")),
         *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "benchmarks/history").glob("*.md"))]
LINK = re.compile(r"\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)\)")     # [text](target), text may hold [..]
CODE = re.compile(r"```.*?```", re.S)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, code and link marks dropped, punctuation but - and _
    dropped, spaces as -; ``"## 20. The same goals: ..."`` -> ``20-the-same-goals-...``."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.replace("`", ""))
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    out, count = set(), {}
    for m in re.finditer(r"^#{1,6}\s+(.*)$", CODE.sub("", path.read_text()), re.M):
        s = slug(m.group(1))
        n = count[s] = count.get(s, -1) + 1            # a repeated heading's anchor gets -1, -2, ...
        out.add(f"{s}-{n}" if n else s)
    return frozenset(out)


@pytest.mark.parametrize("page", PAGES)
def test_every_relative_link_resolves(page):
    path = ROOT / page
    broken = []
    for target in LINK.findall(CODE.sub("", path.read_text())):
        if re.match(r"[a-z]+:", target):                   # https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target} (no such heading)")
    assert not broken, f"{page}: " + "; ".join(broken)
