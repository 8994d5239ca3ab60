"""The sizing study of the statistical tests: how many samples each case needs for its power.

For every case of tests/test_distribution.py and tests/test_distribution_grammar.py this computes
two sample sizes, each the smallest n whose chi-square test (alpha ``chisq.ALPHA``) fails with
probability ``chisq.POWER`` for a known-wrong sampler (``chisq.sample_size``):

* ``hot``: the same sampling at a temperature 25% too high, an exact law (by the tests' own
  enumeration); the floor of every engine-level case;
* ``residual_is_p``: the engine with ``tests/wrong_samplers.py``'s ``residual_is_p`` put in (a rejected
  draft replaced by a draw from p, not from the residual), whose law has no closed form: it is
  estimated without bias from ``--draws`` generations (request seeds 0 .. draws - 1; five times as
  many trials for the tree-verify cases, which run no engine); "none seen": no effect measurable
  in 10 million samples.

The recommended n is the larger of the two plus 10%, rounded up to 100; ``residual_is_p`` is left
out of an engine-level case's n where it needs more than ``--cap`` (3,000) samples, and the table
says so.  The verify-only
cases are vectorised and sized against subtler laws (their docstrings say which); their exact
figures are printed too.  ``--check`` exits 1 if a case's n in the test files is below the
recommended one.

    .venv/bin/python scripts/size_stat_tests.py                   # every case, about 10 minutes on 2 cores
    .venv/bin/python scripts/size_stat_tests.py --only engine_tree --draws 2000 --check
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import torch  # noqa: E402

import chisq  # noqa: E402
import test_distribution as td  # noqa: E402
import test_distribution_grammar as tg  # noqa: E402
from specserve.drafters import create  # noqa: E402
from specserve.drafters.none import NoDrafter  # noqa: E402
from specserve.sampling import SamplingParams  # noqa: E402
from wrong_samplers import tree_residual_is_p, wrong_verifier  # noqa: E402


def hotter(params: SamplingParams) -> SamplingParams:
    """``params`` at a temperature 25% too high."""
    return dataclasses.replace(params, temperature=params.temperature * 1.25)


def cases_of(fn) -> list[tuple]:
    """The parametrised values of test function ``fn`` (its sample size n last)."""
    mark = next(m for m in fn.pytestmark if m.name == "parametrize")
    return [tuple(p.values) for p in mark.args[1]]


def engine_cases():
    """(id, current n, counts(n, first_seed), law, hot law) for every engine-level case."""
    models = td.make_models()
    target = models[0]
    law = {p: td.exact_distribution(target, td.PARAMS[p]) for p in td.PARAMS}
    hot = {p: td.exact_distribution(target, hotter(td.PARAMS[p])) for p in td.PARAMS}

    def engine(make, name, pname, k):
        return lambda n, seed: td.run_engine(target, make(), name, td.PARAMS[pname], n, k, seed)

    for d, p, n in cases_of(td.test_engine_sampling_matches_target):
        yield (f"engine {d} {p}", n, engine(lambda d=d: td.chain_drafter(models, d), d, p, 2), law[p], hot[p])
    for d, p, k, w, n in cases_of(td.test_engine_sampling_with_learned_heads_matches_target):
        yield (f"heads {d} {p} k={k} w={w}", n, engine(lambda d=d, w=w: td.head_drafter(models, d, w), d, p, k),
               law[p], hot[p])
    for p, k, n in cases_of(td.test_engine_sampling_with_merged_trees_matches_target):
        yield f"merged {p} k={k}", n, engine(lambda: td.merged_drafter(models), "auto", p, k), law[p], hot[p]
    for d, w, dep, p, n in cases_of(td.test_engine_tree_sampling_matches_target):
        yield (f"engine_tree {d} w={w} d={dep} {p}", n,
               engine(lambda d=d, w=w, dep=dep: td.tree_drafter(models, d, w, dep), d, p, 6), law[p], hot[p])
    yield ("layerskip t0.7", td.LAYERSKIP_N, engine(lambda: create("layerskip", target, skip="1"), "layerskip",
                                                    "t0.7", 2), law["t0.7"], hot["t0.7"])
    yield "plain t1.0", td.PLAIN_N, engine(NoDrafter, "none", "t1.0", 0), law["t1.0"], hot["t1.0"]


def grammar_cases():
    setting = tg.make_setting()
    target, grammar = setting[0], setting[3]

    def counts(kind, params, k, g):
        return lambda n, seed: tg.sample_counts(target, tg.drafter_of(kind, setting), kind, params, k, n, g,
                                                first_seed=seed)

    for kind, params, k, n in cases_of(tg.test_grammar_sampling_matches_the_masked_law):
        yield (f"grammar {kind}", n, counts(kind, params, k, grammar), tg.exact_law(target, params, grammar),
               tg.exact_law(target, hotter(params), grammar))
    for kind, params, with_grammar, n in cases_of(tg.test_penalised_sampling_matches_the_penalised_law):
        g = grammar if with_grammar else None
        yield (f"penalised {kind}{' grammar' if g else ''}", n, counts(kind, params, 3, g),
               tg.exact_law(target, params, g), tg.exact_law(target, hotter(params), g))


def tree_verify_cases():
    hot = td.P ** (1 / 1.25) / (td.P ** (1 / 1.25)).sum()
    for case in td.TREE_CASES:
        q, replacement = td.tree_case(case)
        yield (f"tree_verify {case}", td.TREE_N[case],
               lambda n, seed, q=q, r=replacement: td.first_token_counts_tree(q, td.P, n, seed, 3, r,
                                                                              verify=tree_residual_is_p),
               td.P, hot)


def shown(resid: int | None) -> str:
    return "-" if resid is None else "none seen" if resid >= 10 ** 7 else str(resid)


def rounded(n: int) -> int:
    return int(math.ceil(n * 1.1 / 100) * 100)


def study(cases, draws: int, cap: int, engine_level: bool) -> list[tuple]:
    rows = []
    for name, current, counts, law, hot in cases:
        t0 = time.perf_counter()
        floor = chisq.sample_size(law, hot)
        if name.startswith("plain"):
            resid = None                                   # nothing is drafted: nothing to reject
        elif engine_level:
            with wrong_verifier("residual_is_p"):
                c = counts(draws, 0)
            resid = chisq.sample_size(law, c.double(), draws=draws)
        else:                                              # a Python loop, but 5x cheaper than the engine
            resid = chisq.sample_size(law, counts(5 * draws, 0).double(), draws=5 * draws)
        need = max(floor, resid if resid is not None and (resid <= cap or not engine_level) else 0)
        rows.append((name, current, floor, resid, rounded(need), time.perf_counter() - t0))
        print(f"{name:44s} n={current:6d}  hot needs {floor:6d}  residual_is_p needs "
              f"{shown(resid):>9}  recommended {rounded(need):6d}  "
              f"({rows[-1][-1]:.0f} s)", flush=True)
    return rows


def verify_alone() -> None:
    """The vectorised verify-only cases: exact laws, printed."""
    for name in ["close", "far", "disjoint", "one-hot"]:
        q = td.QS.get(name)
        if q is None:                           # the draft is token 4 with q one-hot
            q = torch.nn.functional.one_hot(torch.tensor(4), td.V).double()
        m = torch.minimum(td.P.double(), q.double())
        resid = m + (1 - m.sum()) * td.P.double()        # residual_is_p's law of the first token
        print(f"verify {name:10s} n={td.VERIFY_N}  5% too hot needs {chisq.sample_size(td.P, td.HOT)}  "
              f"residual_is_p needs {chisq.sample_size(td.P, resid)}  always accepting needs "
              f"{chisq.sample_size(td.P, q.double())}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--draws", type=int, default=4000, help="generations of residual_is_p per case (default 4000)")
    ap.add_argument("--cap", type=int, default=3000, help="residual_is_p left out of n above this (default 3000)")
    ap.add_argument("--only", action="append", help="cases whose name starts with this (repeatable)")
    ap.add_argument("--check", action="store_true", help="exit 1 if a case's n is below the recommended one")
    args = ap.parse_args()
    torch.set_num_threads(1)
    verify_alone()
    rows = []
    for cases, engine_level in [(engine_cases(), True), (grammar_cases(), True), (tree_verify_cases(), False)]:
        chosen = (c for c in cases if not args.only or any(c[0].startswith(o) for o in args.only))
        rows += study(chosen, args.draws, args.cap, engine_level)
    short = [r for r in rows if r[1] < r[4]]
    for name, current, *_, rec, _s in short:
        print(f"below the recommended n: {name} ({current} < {rec})")
    sys.exit(1 if args.check and short else 0)


if __name__ == "__main__":
    main()
