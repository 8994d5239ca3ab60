"""Time one engine step (draft, pass, verify, commit) for fixed chain and tree drafts of equal size.

A drafter that always proposes the same shape isolates what the step around the target pass adds
for a tree.  The drafted tokens are arbitrary, so nearly nothing is accepted and every step has
the same shape.  Output: median ms per step over ``--steps`` steps, alternating shapes ``--reps``
times.

    .venv/bin/python experiments/step_cost.py --rows 1,4 --nodes 2,4
"""

from __future__ import annotations

import argparse
import time

from specserve.drafters.base import DraftProposal, Drafter
from specserve.engine import Engine, Request
from specserve.llm import LLM


class Fixed(Drafter):
    tree = True

    def __init__(self, parents: list[int]):
        chain = parents == list(range(-1, len(parents) - 1))
        self.parents = None if chain else parents

    def propose(self, requests):
        n = len(self.parents) if self.parents is not None else self.n
        return [DraftProposal([100 + i for i in range(n)], None, self.parents) for _ in requests]


def shapes(n: int) -> dict[str, list[int]]:
    """A chain of n nodes, and a tree of n nodes with two children under the pending token."""
    tree = [-1, -1] + [i - 2 for i in range(2, n)]
    return {f"chain{n}": list(range(-1, n - 1)), f"tree{n}": tree[:n]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,4")
    ap.add_argument("--nodes", default="2,4")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--context", type=int, default=256)
    args = ap.parse_args()
    rows = [int(x) for x in args.rows.split(",")]
    llm = LLM("default", max_batch=max(rows), max_len=2048)
    results: dict[tuple[int, str], list[float]] = {}
    for _ in range(args.reps):
        for b in rows:
            for n in (int(x) for x in args.nodes.split(",")):
                for name, parents in shapes(n).items():
                    drafter = Fixed(parents)
                    drafter.n = n
                    eng = Engine(llm.target, {"f": drafter}, max_batch=b, max_len=2048)
                    ids = [eng.admit(Request([1000 + 7 * r + i for i in range(args.context)], 1000, drafter="f",
                                             num_draft=n)) for r in range(b)]
                    times = []
                    for _ in range(args.steps):
                        t = time.perf_counter()
                        eng.step()
                        times.append(time.perf_counter() - t)
                    for i in ids:
                        eng.abort(i)
                    results.setdefault((b, name), []).append(sorted(times)[len(times) // 2] * 1e3)
    print("| rows | draft | median ms per step (each repetition) |\n|---|---|---|")
    for (b, name), ms in results.items():
        print(f"| {b} | {name} | {' / '.join(f'{x:.2f}' for x in ms)} |")


if __name__ == "__main__":
    main()
