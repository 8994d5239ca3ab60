"""Benchmark metrics against hand-computed values, and a tiny end-to-end run."""

import json
import math

import pytest

from specserve.bench.metrics import (acceptance_by_depth, inter_token_latencies, mean_accepted_length,
                                     percentile, speedups, tpot)
from specserve.bench.runner import Method


def rec(total, ttft, n, tps=None, drafted=(), accepted=(), passes=0, times=()):
    return {"total_s": total, "ttft_s": ttft, "generated_tokens": n, "tokens_per_second": tps or n / total,
            "drafted_per_depth": list(drafted), "accepted_per_depth": list(accepted), "drafted_tokens": sum(drafted),
            "verify_passes": passes, "accepted_tokens": sum(accepted), "token_times_s": list(times)}


def test_percentile_by_hand():
    xs = [4.0, 1.0, 3.0, 2.0]
    assert percentile(xs, 50) == 2.5
    assert percentile(xs, 0) == 1.0 and percentile(xs, 100) == 4.0
    assert percentile(xs, 90) == pytest.approx(3.7)          # pos 2.7 between 3 and 4
    assert percentile([5.0], 99) == 5.0 and math.isnan(percentile([], 50))


def test_tpot_and_itl():
    r = rec(total=2.0, ttft=0.5, n=4, times=[0.5, 1.0, 1.0, 2.0])
    assert tpot(r) == pytest.approx(0.5)                      # (2.0 - 0.5) / 3
    assert inter_token_latencies(r) == [0.5, 0.0, 1.0]
    assert math.isnan(tpot(rec(total=1.0, ttft=1.0, n=1)))


def test_acceptance_and_mean_accepted_length():
    a = rec(1, 0.1, 10, drafted=[4, 4, 2], accepted=[3, 2, 1], passes=4)
    b = rec(1, 0.1, 10, drafted=[6], accepted=[0], passes=6)
    assert acceptance_by_depth([a, b]) == [0.3, 0.5, 0.5]
    assert mean_accepted_length([a, b]) == pytest.approx((6 + 10) / 10)


def test_speedups_two_definitions():
    base = [rec(2.0, 0.1, 20), rec(1.0, 0.1, 20)]           # 10 and 20 tok/s
    meth = [rec(1.0, 0.1, 20), rec(1.0, 0.1, 20)]           # 20 and 20 tok/s
    s = speedups(meth, base)
    assert s["spec_bench"] == pytest.approx(20 / 15)
    assert s["total_time"] == pytest.approx((3.0 / 40) / (2.0 / 40))


def test_method_parsing():
    m = Method.parse("oracle:alpha=0.8:k=6")
    assert (m.drafter, m.k, m.options) == ("oracle", 6, {"alpha": 0.8})
    assert Method.parse("none").k == 0 and Method.parse("ngram").k == "auto" and Method.parse("ngram:k=auto").k == "auto"
    assert Method.parse("ngram:k=0").k == 0


def test_draft_sizes_by_hand():
    from specserve.bench.metrics import draft_sizes
    recs = [{"nodes_per_step": [0, 2, 2], "step_predicted_s": [0.01, 0.02], "step_measured_s": [0.01, 0.03]},
            {"nodes_per_step": [0, 1]}]
    d = draft_sizes(recs)
    assert d["nodes_histogram"] == {0: 2, 1: 1, 2: 2} and d["off_share"] == pytest.approx(0.4)
    assert d["measured_over_predicted_p50"] == pytest.approx(1.25)


def test_time_shares_and_records_from_before_the_timers():
    """Shares of total time per timer; a record without a timer (an older results.json) makes that
    share absent (NaN), never an error, and the report renders it as "-"."""
    from specserve.bench.metrics import TIME_PARTS, summarize, time_share
    from specserve.bench.report import render_report

    timers = {"draft_s": 0.1, "size_s": 0.05, "pass_s": 0.6, "verify_s": 0.1, "shape_s": 0.0, "commit_s": 0.05,
              "other_s": 0.1}
    new = [rec(1.0, 0.1, 10, drafted=[4], accepted=[2], passes=4, times=[0.1, 0.5, 1.0]) | timers,
           rec(3.0, 0.2, 10, drafted=[4], accepted=[2], passes=4, times=[0.2, 3.0]) | {k: 3 * v for k, v in timers.items()}]
    assert time_share(new, "pass_s") == pytest.approx(0.6) and time_share(new, "size_s") == pytest.approx(0.05)
    assert sum(time_share(new, f"{p}_s") for p in TIME_PARTS) == pytest.approx(1.0)
    old = [rec(r["total_s"], 0.1, 10, times=[0.1, 0.2]) | {"draft_s": r["draft_s"], "verify_s": r["verify_s"],
                                                           "nodes_per_step": []} for r in new]
    s = summarize(old)
    assert s["share_draft"] == pytest.approx(0.1) and math.isnan(s["share_pass"]) and math.isnan(s["share_commit"])
    overall = {k: v for k, v in s.items() if not k.startswith("share_") or k in ("share_draft", "share_verify")}
    overall |= {"speedup": {"spec_bench": 1.0, "total_time": 1.0}, "divergent_prompts": 0}
    doc = {"config": {"command": "specserve bench", "model_path": "/m/model.gguf", "runtime": {}, "max_tokens": 8,
                      "groups": []},
           "machine": {"cpus": 2, "platform": "linux"},
           "roofline": {"parameters": 1e6, "weight_bytes": 2**20, "bandwidth_bytes_per_s": 1e9,
                        "plain_decoding_ceiling_tok_s": 100.0},
           "summary": {"none": {"synthetic": False, "overall": overall, "groups": {}}}}
    row = next(line for line in render_report(doc).splitlines() if line.startswith("| none |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[-8:] == ["10", "-", "-", "10", "-", "-", "-", "0/2"]    # draft, size, pass, verify, shape, commit, other


def test_prompt_file_categories_are_the_groups(tmp_path):
    from specserve.bench.datasets import sample
    from specserve.errors import SpecserveError
    f = tmp_path / "p.jsonl"
    f.write_text("\n".join(json.dumps({"id": f"x-{i}", "category": c, "prompt": f"p{i}"})
                           for i, c in enumerate(["code", "chat", "code", "code", "chat"])))
    prompts, groups = sample(2, None, str(f))
    assert groups == ["code", "chat"] and [p.id for p in prompts] == ["x-0", "x-2", "x-1", "x-4"]
    with pytest.raises(SpecserveError, match="choose from all, code, chat"):
        sample(2, ["qa"], str(f))


@pytest.mark.slow
def test_tiny_end_to_end(tmp_path):
    from specserve.bench.runner import BenchConfig, run_bench

    cfg = BenchConfig(["none", "ngram:k=3", "oracle:alpha=0.8:k=3"], ["qa", "translation"], per_group=1,
                      max_tokens=8, out=str(tmp_path), concurrency=[1, 2], cost_tokens=[1, 2], cost_batches=[1, 2])
    doc = run_bench(cfg)
    saved = json.loads((tmp_path / "results.json").read_text())
    report = (tmp_path / "report.md").read_text()
    for section in ("## Roofline", "## Per group", "## Concurrency", "## Cost of one target pass", "## Plots"):
        assert section in report
    for png in ("speedup_by_group.png", "acceptance_by_depth.png", "concurrency.png", "cost_curve.png"):
        assert (tmp_path / png).stat().st_size > 1000
    assert {(c["method"], c["concurrency"]) for c in saved["concurrency"]} == \
        {(m, c) for m in saved["summary"] for c in (1, 2)}
    assert len(saved["cost_curve"]) == 4 and saved["roofline"]["weight_bytes"] > 0
    assert set(saved["summary"]) == {"none", "ngram:k=3", "oracle:alpha=0.8:k=3"}
    for label, s in saved["summary"].items():
        assert s["overall"]["divergent_prompts"] == 0
        assert set(s["groups"]) == {"qa", "translation"}
        assert len(saved["records"][label]) == 2
    assert saved["summary"]["oracle:alpha=0.8:k=3"]["synthetic"] is True
    assert doc["summary"]["none"]["overall"]["speedup"]["total_time"] == pytest.approx(1.0)
