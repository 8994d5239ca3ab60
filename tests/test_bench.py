"""Benchmark metrics against hand-computed values, a tiny end-to-end run, and ``specserve bench``'s
subcommands (soak, interleaved, steps, compare) in process through ``main()`` on a tiny model with the
toy tokenizer."""

import json
import math

import numpy as np
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


def test_turns_cover_every_prompt_and_share_out_the_orders():
    from specserve.bench.datasets import turns
    # 30 prompts at concurrency 4: three chunks of at least 8, each method order once per chunk
    plan = turns(30, 4, 2)
    assert [list(range(30))[p] for p, _ in plan] == [list(range(0, 10)), list(range(10, 20)), list(range(20, 30))]
    assert [o for _, o in plan] == [[0, 1], [1, 0], [0, 1]]
    # one chunk only (30 prompts at 16): every prompt twice, A B then B A
    plan = turns(30, 16, 2)
    assert [(p.start, p.stop) for p, _ in plan] == [(0, 30), (0, 30)] and [o for _, o in plan] == [[0, 1], [1, 0]]
    # a single method runs its prompts once, and so does every method without ``repeat``
    assert [(p.start, p.stop) for p, _ in turns(30, 16, 1)] == [(0, 30)]
    assert [(p.start, p.stop) for p, _ in turns(30, 16, 2, repeat=False)] == [(0, 30)]


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


# ---- the subcommands, in process on a tiny model ---------------------------------------------------

@pytest.fixture(scope="module")
def toy_pair():
    """One tiny model for the module (an engine measures a model's costs once per model object)."""
    from toy_tokenizer import toy_model, toy_tokenizer

    return toy_model(), toy_tokenizer()


@pytest.fixture
def tiny_cli(monkeypatch, tmp_path, toy_pair):
    """``main()`` builds its ``LLM`` on the tiny model with the toy tokenizer (greedy output runs to
    max_tokens: ``toy_model``); the ``--model`` to pass is returned."""
    import specserve.llm

    model, tok = toy_pair
    monkeypatch.setattr(specserve.llm, "load_model", lambda spec, options=None: model)
    monkeypatch.setattr(specserve.llm, "load_tokenizer", lambda target: tok)
    return str(tmp_path / "tiny")


def _prompt_file(tmp_path, n: int, categories=("a", "b")) -> str:
    f = tmp_path / "prompts.jsonl"
    f.write_text("\n".join(json.dumps({"id": f"p{i}", "category": categories[i % len(categories)],
                                       "prompt": f"count {i}: a b c a b c a b"}) for i in range(n)))
    return str(f)


def test_interleaved_prompts_are_strided(tmp_path):
    from specserve.bench.interleaved import strided
    from specserve.errors import SpecserveError

    path = _prompt_file(tmp_path, 9)
    assert strided(4, path) == [f"count {i}: a b c a b c a b" for i in (0, 2, 4, 6)]
    assert len(strided(24, None)) == 24 and strided(1, None) == strided(480, None)[:1]
    with pytest.raises(SpecserveError, match=r"--num-prompts must lie in 1\.\.9"):
        strided(10, path)


def test_bench_interleaved_rounds_in_rotated_order(tiny_cli, tmp_path, capsys):
    from specserve.cli import main

    out = tmp_path / "runs.json"
    assert main(["bench", "interleaved", "--model", tiny_cli, "--methods", "ngram:k=3,ngram-tree:k=4",
                 "--concurrency", "2", "--num-prompts", "4", "--rounds", "2", "--max-tokens", "8",
                 "--prompts", _prompt_file(tmp_path, 8), "--json", str(out)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    doc = json.loads(out.read_text())
    order = [(r["round"], r["method"]) for r in doc["runs"]]
    assert order == [(0, "none"), (0, "ngram:k=3"), (0, "ngram-tree:k=4"),
                     (1, "ngram:k=3"), (1, "ngram-tree:k=4"), (1, "none")]
    assert all(r["tokens"] == 4 * 8 and r["seconds"] > 0 for r in doc["runs"])     # 4 prompts run to max_tokens
    assert [ln.split()[0] for ln in lines[:6]] == [m for _, m in order]
    for label, s in doc["summary"].items():
        secs = sum(r["seconds"] for r in doc["runs"] if r["method"] == label)
        assert s["seconds"] == pytest.approx(secs) and s["identical"] == 4       # greedy: plain's tokens
        assert s["speedup"] == pytest.approx(doc["summary"]["none"]["seconds"] / secs)
    s = doc["summary"]
    assert all(len(r["shares"]) == 4 and all(x > 0 for x in r["shares"]) for r in doc["runs"])
    assert s["none"]["interval"] == [1.0, 1.0]                  # plain against itself: the same draws
    iv = {k: "{:.3f}-{:.3f}".format(*s[k]["interval"]) for k in s}
    assert lines[-1] == (f"c=2 prompts=4 rounds=2: ngram:k=3 {s['ngram:k=3']['speedup']:.3f}x [90%: "
                         f"{iv['ngram:k=3']}] (4/4 identical), ngram-tree:k=4 "
                         f"{s['ngram-tree:k=4']['speedup']:.3f}x [90%: {iv['ngram-tree:k=4']}] (4/4 identical)")


def test_bootstrap_ratio_by_hand():
    """A method at exactly half plain decoding's cost in every cell: the interval is the point, 2x.
    Prompts whose costs differ widely, each in the same ratio: still exact (the same draw on both
    sides).  Rounds where the ratio is 0.5x and 2x: the interval spans both.  Noise of 10% per cell
    over 3 rounds x 48 prompts around a true 1.2x: the 90% interval holds 1.2 and is under 0.1 wide
    (seeded, so the bounds are fixed numbers; shapes that disagree are refused)."""
    from specserve.bench.interleaved import bootstrap_ratio

    plain = np.arange(1.0, 13.0).reshape(3, 4)
    assert bootstrap_ratio(plain, plain / 2) == pytest.approx((2.0, 2.0))
    lo, hi = bootstrap_ratio(np.array([[1.0] * 4, [1.0] * 4]), np.array([[2.0] * 4, [0.5] * 4]))
    assert lo == pytest.approx(0.5) and hi == pytest.approx(2.0)
    rng = np.random.default_rng(3)
    method = rng.uniform(1, 3, size=(3, 48))
    noisy = 1.2 * method * rng.uniform(0.9, 1.1, size=(3, 48))
    lo, hi = bootstrap_ratio(noisy, method)
    assert lo < 1.2 < hi and hi - lo < 0.1
    assert bootstrap_ratio(noisy, method) == (lo, hi)
    with pytest.raises(ValueError, match="rounds, prompts"):
        bootstrap_ratio(plain, plain[:, :3])
    # rates: a method twice as fast that wrote half the tokens in the same seconds is level
    ones = np.ones((2, 5))
    assert bootstrap_ratio(ones, ones, 2 * ones, ones) == pytest.approx((0.5, 0.5))
    assert bootstrap_ratio(ones, ones / 2, 2 * ones, ones) == pytest.approx((1.0, 1.0))


def test_bench_interleaved_sampled_reports_rates_without_identity(tiny_cli, tmp_path, capsys):
    from specserve.cli import main

    out = tmp_path / "runs.json"
    assert main(["bench", "interleaved", "--model", tiny_cli, "--methods", "ngram:k=3", "--concurrency", "2",
                 "--num-prompts", "3", "--rounds", "1", "--max-tokens", "6", "--temperature", "0.8",
                 "--prompts", _prompt_file(tmp_path, 6), "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    s = doc["summary"]["ngram:k=3"]
    assert s["identical"] is None and all(len(r["counts"]) == 3 for r in doc["runs"])
    rates = {r["method"]: r["tokens"] / r["seconds"] for r in doc["runs"]}
    assert s["speedup"] == pytest.approx(rates["ngram:k=3"] / rates["none"])
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("c=2 prompts=3 rounds=1 temperature=0.8: ngram:k=3 ") and "identical" not in line


def test_bench_steps_counts_decoding_steps_by_phase(tiny_cli, tmp_path, capsys):
    from specserve.cli import main
    from specserve.stats import TIMERS

    out = tmp_path / "steps.json"
    assert main(["bench", "steps", "--model", tiny_cli, "--methods", "none,ngram:k=3", "--per-group", "1",
                 "--max-tokens", "8", "--prompts", _prompt_file(tmp_path, 4), "--json", str(out)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    doc = json.loads(out.read_text())
    assert doc["prompts"] == 2 and doc["config"]["groups"] == ["a", "b"]
    assert list(doc["methods"]) == ["none", "ngram:k=3"]
    plain, ngram = doc["methods"]["none"], doc["methods"]["ngram:k=3"]
    assert plain["tokens"] == ngram["tokens"] == 2 * 8
    # the prompt's pass gives each request its first token; plain decoding then commits one per step
    assert plain["steps"] == 2 * 7 and 2 <= ngram["steps"] <= 2 * 7
    for m in (plain, ngram):
        assert set(m["times"]) == set(TIMERS) and min(m["times"].values()) >= 0 and m["times"]["pass_s"] > 0
        assert sum(m["times"].values()) <= m["wall_s"]
        # decoding steps alone (no prompt chunk); their time outside the pass is part of the wall time
        assert 0 < m["decode_steps"] <= m["steps"] and 0 < m["outside_s"] < m["wall_s"] - m["times"]["pass_s"]
    assert plain["decode_steps"] == 2 * 7
    assert lines[0].startswith("none ") and " 14 steps  1.14 tok/step  outside the pass " in lines[0]
    assert " ms | ms per step: draft " in lines[0]
    assert lines[1].startswith("ngram:k=3 ") and f" {ngram['steps']} steps " in lines[1] and " rest " in lines[1]


def _results(path, records: dict) -> str:
    path.mkdir()
    (path / "results.json").write_text(json.dumps({"records": records}))
    return str(path)


def test_bench_compare_counts_identical_prompts(tmp_path, capsys):
    from specserve.cli import main

    def recs(*tokens, group="qa"):
        return [{"prompt_id": i, "group": group, "tokens": t} for i, t in enumerate(tokens)]

    before = _results(tmp_path / "before", {"none": recs([1, 2], [3]), "ngram": recs([1], [2], [3]), "old": recs([1])})
    after = _results(tmp_path / "after", {"ngram": recs([1], [9], group="rag"), "none": recs([1, 2], [3], [4]),
                                          "new": recs([5])})
    assert main(["bench", "compare", before, after + "/results.json"]) == 0
    assert capsys.readouterr().out.splitlines() == ["ngram: 1/2 prompts with identical tokens (rag)",
                                                    "none: 2/2 prompts with identical tokens (qa)"]
    assert main(["bench", "compare", before, after, "--methods", "none"]) == 0
    assert capsys.readouterr().out.splitlines() == ["none: 2/2 prompts with identical tokens (qa)"]
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "other.json").write_text(json.dumps({"summary": {}}))
    for argv, msg in ((["--methods", "none,new"], "method 'new' is not in both runs; both ran: ngram, none"),
                      (["--methods", "old"], "method 'old' is not in both runs")):
        assert main(["bench", "compare", before, after, *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("specserve: error: ") and msg in err
    for path, msg in ((tmp_path / "bad.json", "is not JSON"), (tmp_path / "other.json", "has no per-method records"),
                      (tmp_path / "missing.json", "cannot read")):
        assert main(["bench", "compare", before, str(path)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and msg in err and "Traceback" not in err


def test_bench_soak_of_a_tiny_server(tiny_cli, tmp_path, capsys):
    """A short soak in process: 20 load requests from 2 clients, then (the load done) the warm-up
    census of 1 + 2 requests per kind; the server and the engine judged as in the real soak."""
    from specserve.cli import main

    out = tmp_path / "soak.json"
    assert main(["bench", "soak", "--model", tiny_cli, "--minutes", "1", "--concurrency", "2", "--max-requests", "20",
                 "--gc-batch", "2", "--max-batch", "2", "--drafters", "ngram:k=4,suffix:k=4", "--out", str(out)]) == 0
    stdout = capsys.readouterr().out
    report = json.loads(out.read_text())
    totals, engine = report["totals"], report["engine_end"]
    assert stdout.rstrip().endswith("OK") and report["ok"] and report["failures"] == [] and totals["problems"] == {}
    assert totals["requests"] == 20 + 5 * 3 and set(totals["by_type"]) == {"greedy", "sampled", "stream",
                                                                             "disconnect", "malformed"}
    assert totals["4xx"] >= totals["by_type"]["malformed"] > 0 and totals["5xx"] == 0
    assert engine["empty"] and engine["free_kv_rows"] == engine["max_batch"] == 2 and engine["drained"]
    assert {"ngram", "suffix"} <= set(report["config"]["drafters_loaded"]) and report["config"]["model"] == tiny_cli
    assert report["pools"]["end"]["suffix_corpus_tokens"] > report["pools"]["start"].get("suffix_corpus_tokens", 0)


def _agent_workload(tmp_path) -> str:
    """Two conversations over tools whose names and calls the toy vocabulary can spell."""
    city = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"],
            "additionalProperties": False}
    tools = {n: {"type": "function", "function": {"name": n, "description": f"the {n}", "parameters": city}}
             for n in ("weather", "time")}
    convs = [{"id": f"c{i}", "system": "use tools.", "tools": ["weather", "time"],
              "turns": [{"user": "weather in oslo?", "tool_choice": "required"},
                        {"user": "and the time?", "tool_choice": "time"}]} for i in range(2)]
    path = tmp_path / "agent.json"
    path.write_text(json.dumps({"tools": tools, "conversations": convs}))
    return str(path)


def test_bench_agent_loops_with_tool_calls(tiny_cli, tmp_path, capsys):
    """Every constrained turn's call parses and validates, its stream adds up to it, speculation
    changes no token; each forced call's result goes back as a tool turn before an ``auto`` turn
    (the toy model then writes text to the token limit)."""
    from specserve.cli import main

    out = tmp_path / "agent-out.json"
    assert main(["bench", "agent", "--model", tiny_cli, "--methods", "ngram:k=3,ngram-tree:k=4", "--workload",
                 _agent_workload(tmp_path), "--tool-parser", "llama3_json", "--max-tokens", "64",
                 "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert "| ngram-tree:k=4 |" in capsys.readouterr().out
    assert list(doc["summary"]) == ["none", "ngram:k=3", "ngram-tree:k=4"]
    for label, s in doc["summary"].items():
        assert s["generations"] == 8 and s["forced"] == 4 == s["forced_parsed"] == s["forced_valid"]
        assert s["streamed_equal"] == 8 and s["divergent"] == 0
    recs = doc["records"]["none"]
    assert [r["tool_choice"] for r in recs[:4]] == ["required", "auto", "time", "auto"]
    assert [r["calls"] for r in recs[:4]] == [1, 0, 1, 0]
    assert json.loads(recs[2]["text"])["name"] == "time"


def test_bench_agent_refuses_bad_input(tiny_cli, tmp_path):
    from specserve.bench.agent import load_workload, summarise, tool_result
    from specserve.cli import main

    good = _agent_workload(tmp_path)
    for argv in (["--max-tokens", "0"], ["--conversations", "0"], ["--tool-parser", "xml"],
                 ["--workload", str(tmp_path / "missing.json")], ["--methods", "bogus"]):
        assert main(["bench", "agent", "--model", tiny_cli, "--workload", good, *argv]) == 2
    doc = json.loads(open(good).read())
    doc["conversations"][0]["turns"][0]["tool_choice"] = "fly"
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(Exception, match="tool_choice 'fly'"):
        load_workload(str(tmp_path / "bad.json"))
    assert tool_result("get_weather", {"city": "Oslo"}) == tool_result("get_weather", {"city": "Oslo"})
    assert tool_result("get_weather", {"city": "Oslo"}) != tool_result("get_weather", {"city": "Rome"})
    plain = [{"wall_s": 2.0, "tokens": [1, 2], "verify_passes": 2, "accepted_tokens": 0, "tool_choice": "required",
              "calls": 1, "valid_calls": 1, "streamed_equal": True}]
    fast = [dict(plain[0], wall_s=1.0, verify_passes=1, accepted_tokens=1)]
    s = summarise(fast, plain)
    assert s["speedup"] == 2.0 and s["mean_accepted_length"] == 2.0 and s["divergent"] == 0
    assert summarise([dict(fast[0], tokens=[1, 3])], plain)["divergent"] == 1
