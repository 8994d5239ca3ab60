"""Benchmark metrics as pure functions over per-request records (dicts from RequestStats.to_dict)."""

from __future__ import annotations

import math

from specserve.stats import TIMERS


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default), q in [0, 100]; NaN for no values."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def tpot(rec: dict) -> float:
    """Time per output token after the first: (end-to-end - TTFT) / (tokens - 1); NaN for one token."""
    n = rec["generated_tokens"]
    return (rec["total_s"] - rec["ttft_s"]) / (n - 1) if n > 1 else math.nan


def inter_token_latencies(rec: dict) -> list[float]:
    """Gaps between consecutive tokens; tokens accepted in one pass arrive together (gap 0)."""
    t = rec["token_times_s"]
    return [b - a for a, b in zip(t, t[1:])]


def acceptance_by_depth(recs: list[dict]) -> list[float]:
    """For each depth d (a chain's position): steps that accepted >= d tokens / steps whose draft
    reached depth d, summed over requests."""
    width = max((len(r["drafted_per_depth"]) for r in recs), default=0)
    drafted = [sum(r["drafted_per_depth"][i] for r in recs if i < len(r["drafted_per_depth"])) for i in range(width)]
    accepted = [sum(r["accepted_per_depth"][i] for r in recs if i < len(r["accepted_per_depth"])) for i in range(width)]
    return [a / d if d else math.nan for a, d in zip(accepted, drafted)]


def mean_nodes_per_step(recs: list[dict]) -> float:
    """Draft nodes (chain: tokens) verified per verification pass, over all requests."""
    passes = sum(r["verify_passes"] for r in recs)
    return sum(r["drafted_tokens"] for r in recs) / passes if passes else math.nan


def mean_accepted_length(recs: list[dict]) -> float:
    """(accepted tokens + verification passes) / verification passes, over all requests."""
    passes = sum(r["verify_passes"] for r in recs)
    return (sum(r["accepted_tokens"] for r in recs) + passes) / passes if passes else math.nan


def draft_sizes(recs: list[dict]) -> dict:
    """The draft sizes chosen, over every verification step: a histogram (nodes -> steps), the
    share of steps with no draft (speculation off), and for auto requests the cost model's
    prediction against the measured pass (median and p90 of measured / predicted)."""
    hist: dict[int, int] = {}
    for r in recs:
        for n in r["nodes_per_step"]:
            hist[n] = hist.get(n, 0) + 1
    steps = sum(hist.values())
    ratios = [m / p for r in recs for p, m in zip(r.get("step_predicted_s", []), r.get("step_measured_s", [])) if p > 0]
    return {"nodes_histogram": dict(sorted(hist.items())), "off_share": hist.get(0, 0) / steps if steps else math.nan,
            "measured_over_predicted_p50": percentile(ratios, 50), "measured_over_predicted_p90": percentile(ratios, 90)}


TIME_PARTS = tuple(name.removesuffix("_s") for name in TIMERS) + ("other",)   # summing to total_s


def time_share(recs: list[dict], key: str) -> float:
    """The share of the requests' total time spent in one timer (``draft_s``, ``pass_s``...); NaN when
    no time was measured or a record lacks the timer (results from before it existed)."""
    total = sum(r["total_s"] for r in recs)
    if not total or any(key not in r for r in recs):
        return math.nan
    return sum(r[key] for r in recs) / total


def speedups(method: list[dict], baseline: list[dict]) -> dict[str, float]:
    """Speed-up against the baseline on the same prompts, two ways.

    spec_bench: mean over prompts of tokens/s, divided by the baseline's (Spec-Bench's definition).
    total_time: baseline total seconds per generated token over the method's (wall-clock ratio).
    """
    def mean_tps(rs):
        return sum(r["tokens_per_second"] for r in rs) / len(rs)

    def s_per_tok(rs):
        return sum(r["total_s"] for r in rs) / sum(r["generated_tokens"] for r in rs)

    return {"spec_bench": mean_tps(method) / mean_tps(baseline), "total_time": s_per_tok(baseline) / s_per_tok(method)}


def summarize(recs: list[dict]) -> dict:
    """Aggregate latency, throughput, acceptance and time shares of one method on one prompt set."""
    def dist(xs):
        xs = [x for x in xs if not math.isnan(x)]
        return {"mean": sum(xs) / len(xs) if xs else math.nan, "p50": percentile(xs, 50),
                "p90": percentile(xs, 90), "p99": percentile(xs, 99)}

    total = sum(r["total_s"] for r in recs)
    return {
        "requests": len(recs),
        "generated_tokens": sum(r["generated_tokens"] for r in recs),
        "tokens_per_second_mean": sum(r["tokens_per_second"] for r in recs) / len(recs),
        "tokens_per_second_total": sum(r["generated_tokens"] for r in recs) / total if total else math.nan,
        "ttft_s": dist([r["ttft_s"] for r in recs]),
        "tpot_s": dist([tpot(r) for r in recs]),
        "itl_s": dist([x for r in recs for x in inter_token_latencies(r)]),
        "e2e_s": dist([r["total_s"] for r in recs]),
        "mean_accepted_length": mean_accepted_length(recs),
        "acceptance_by_depth": acceptance_by_depth(recs),
        "mean_nodes_per_step": mean_nodes_per_step(recs),
        "draft_sizes": draft_sizes(recs),
    } | {f"share_{part}": time_share(recs, f"{part}_s") for part in TIME_PARTS}
