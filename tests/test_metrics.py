"""/metrics by hand: ``Metrics`` fed known observations (real RequestStats and StepReport, no model),
read back through prometheus_client's own parsers, in both exposition formats; the drafter-fault
counter from a hand-built engine snapshot; the route's content negotiation on a bare app."""

import threading
from types import SimpleNamespace

from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families

from specserve.engine.types import EngineSnapshot, PrefixSnapshot, Result, StepReport
from specserve.server import gauges
from specserve.server.metrics import BATCH_BUCKETS, Metrics, wants_openmetrics
from specserve.server.routes import Service, add_routes
from specserve.stats import RequestStats

TEXT = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"
PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
                     "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")


def samples(m: Metrics, accept: str | None = None) -> dict[tuple, float]:
    """(sample name, sorted labels) -> value, parsed by the library's parser for the format served."""
    body, content_type = m.render(accept)
    openmetrics = content_type.startswith("application/openmetrics-text")
    parse = parse_openmetrics if openmetrics else text_string_to_metric_families
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in parse(body.decode()) for s in family.samples}


def result(prompt=5, generated=3, ttft=0.02, total=0.5, steps=((3, 2, 1),)) -> Result:
    """A finished request; ``steps``: (nodes, depth, accepted) per verification pass."""
    stats = RequestStats(prompt_tokens=prompt, generated_tokens=generated, ttft_s=ttft, total_s=total)
    for nodes, depth, accepted in steps:
        stats.record_step(nodes, depth, accepted)
    return Result(tokens=[1] * generated, finish_reason="stop", stats=stats)


def step(nodes=(2, 0), auto=(True, True), predicted=0.1, measured=0.12, threads=4, prefill=10) -> StepReport:
    return StepReport(sequences=len(nodes), nodes=list(nodes), auto=list(auto), predicted_s=predicted,
                      pass_s=measured, threads=threads, prefill_tokens=prefill)


def test_exact_values_after_known_observations():
    m = Metrics()
    m.observe_result(result(), queue_s=0.01)
    m.observe_result(result(prompt=2, generated=1, ttft=0.1, total=0.1, steps=((4, 3, 3), (1, 1, 0))))
    m.count_outcome("cancelled")
    m.observe_step(step())
    m.observe_step(step(nodes=(5,), auto=(False,), predicted=None, threads=4, prefill=0))
    m.observe_step(step(nodes=(1,), threads=2, prefill=0))
    s = samples(m)
    assert s[("specserve_requests_total", (("outcome", "success"),))] == 2
    assert s[("specserve_requests_total", (("outcome", "cancelled"),))] == 1
    assert s[("specserve_prompt_tokens_total", ())] == 7 and s[("specserve_generation_tokens_total", ())] == 4
    assert [s[("specserve_spec_drafted_steps_total", (("depth", str(d)),))] for d in (1, 2, 3)] == [3, 2, 1]
    assert [s[("specserve_spec_accepted_steps_total", (("depth", str(d)),))] for d in (1, 2, 3)] == [2, 1, 1]
    assert s[("specserve_spec_draft_nodes_total", ())] == 8 and s[("specserve_spec_verify_passes_total", ())] == 3
    assert s[("specserve_spec_mean_accepted_length", ())] == (4 + 3) / 3
    assert s[("specserve_spec_auto_steps_total", ())] == 3 and s[("specserve_spec_auto_off_steps_total", ())] == 1
    assert s[("specserve_compute_threads_steps_total", (("threads", "4"),))] == 2
    assert s[("specserve_compute_threads_steps_total", (("threads", "2"),))] == 1
    assert s[("specserve_prefill_computed_tokens_total", ())] == 10 and s[("specserve_prefill_steps_total", ())] == 1
    # queue time counts in the latencies; the one-token request has no time per output token
    assert s[("specserve_time_to_first_token_seconds_sum", ())] == 0.02 + 0.01 + 0.1
    assert s[("specserve_e2e_request_latency_seconds_sum", ())] == 0.51 + 0.1
    assert s[("specserve_time_per_output_token_seconds_count", ())] == 1
    assert s[("specserve_time_per_output_token_seconds_sum", ())] == (0.5 - 0.02) / 2
    assert s[("specserve_step_time_measured_over_predicted_count", ())] == 2
    assert not any(name.endswith("_created") for name, _ in s)


def test_histogram_buckets_are_cumulative_with_the_same_bounds():
    m = Metrics()
    for size in (1, 3, 3, 100):
        m.observe_batch(size)
    m.observe_step(step(nodes=(0, 4, 7), auto=(True, True, True)))
    s = samples(m)
    le = {float(dict(labels)["le"]): v for (name, labels), v in s.items() if name == "specserve_batch_size_bucket"}
    assert sorted(le) == sorted(float(b) for b in BATCH_BUCKETS) + [float("inf")]
    assert [le[b] for b in (1, 2, 4, 8, 64, float("inf"))] == [1, 1, 3, 3, 3, 4]
    assert s[("specserve_batch_size_count", ())] == 4 and s[("specserve_batch_size_sum", ())] == 107
    draft = {float(dict(labels)["le"]): v for (name, labels), v in s.items()
             if name == "specserve_spec_auto_draft_nodes_bucket"}
    assert [draft[b] for b in (0, 1, 4, 6, 8, 32)] == [1, 1, 2, 2, 3, 3]
    ratio = {float(dict(labels)["le"]): v for (name, labels), v in s.items()
             if name == "specserve_step_time_measured_over_predicted_bucket"}
    assert ratio[1.1] == 0 and ratio[1.25] == 1       # 0.12 s measured over 0.1 s predicted


def test_empty_metrics_render_every_family():
    body, content_type = Metrics().render(None)
    assert content_type == TEXT
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    assert families["specserve_requests"].type == "counter" and not families["specserve_requests"].samples
    assert families["specserve_spec_mean_accepted_length"].samples[0].value == 0.0
    assert families["specserve_spec_mean_accepted_length"].type == "gauge"
    assert families["specserve_time_to_first_token_seconds"].type == "histogram"
    assert "# HELP specserve_requests_total Finished requests by outcome\n" in body.decode()


def test_openmetrics_on_request():
    m = Metrics()
    m.observe_result(result())
    body, content_type = m.render(PROMETHEUS_ACCEPT)
    assert content_type == OPENMETRICS and body.endswith(b"# EOF\n")
    assert b"# TYPE specserve_requests counter\n" in body
    assert samples(m, PROMETHEUS_ACCEPT) == samples(m)      # the same series and values in both formats
    assert not m.render("text/plain")[0].rstrip().endswith(b"# EOF")


def test_accept_negotiation():
    assert not wants_openmetrics(None) and not wants_openmetrics("") and not wants_openmetrics("*/*")
    assert not wants_openmetrics("text/plain;version=0.0.4")
    assert wants_openmetrics("application/openmetrics-text") and wants_openmetrics(PROMETHEUS_ACCEPT)
    assert wants_openmetrics("Application/OpenMetrics-Text; version=0.0.1")
    assert not wants_openmetrics("text/plain, application/openmetrics-text;q=0.5")
    assert not wants_openmetrics("application/openmetrics-text;q=0")
    assert not wants_openmetrics("application/openmetrics-text;q=oops")


def test_render_time_counters_gauges_and_escaped_labels():
    m = Metrics()
    names = ['ngram:n="3"', "eagle\\tree", "medusa\nheads", "plain"]
    m.counters = lambda: {"specserve_prefix_cache_hit_tokens_total": ("Prompt tokens copied from the prefix cache", 7)}
    m.gauges = lambda: {"specserve_kv_rows_free": ("KV cache rows free", 3)}
    m.labelled_counters = lambda: {"specserve_drafter_faults_total": ("Drafter faults", "drafter",
                                                                      {n: i + 1 for i, n in enumerate(names)})}
    body, _ = m.render(None)
    assert b'specserve_drafter_faults_total{drafter="ngram:n=\\"3\\""} 1.0\n' in body
    assert b'{drafter="eagle\\\\tree"} 2.0\n' in body and b'{drafter="medusa\\nheads"} 3.0\n' in body
    for accept in (None, "application/openmetrics-text"):
        s = samples(m, accept)
        assert {n: s[("specserve_drafter_faults_total", (("drafter", n),))] for n in names} == \
               {n: i + 1 for i, n in enumerate(names)}
        assert s[("specserve_prefix_cache_hit_tokens_total", ())] == 7 and s[("specserve_kv_rows_free", ())] == 3


def test_server_callables_from_an_engine_snapshot():
    prefix = PrefixSnapshot(used_bytes=100, capacity_bytes=400, blocks=2, hit_tokens=32, miss_tokens=16,
                            stored_blocks=3, evicted_blocks=1)
    snap = EngineSnapshot(rows=4, free_rows=3, running=1, prefilling=0, prefix=prefix,
                          drafter_faults={"eagle": 2, 'ngram:"x"\\': 1})
    scheduler = SimpleNamespace(snapshot=snap, num_running=1, num_waiting=5)
    m = Metrics()
    m.gauges = lambda: gauges.gauges(scheduler)
    m.counters = lambda: gauges.counters(scheduler)
    m.labelled_counters = lambda: gauges.labelled_counters(scheduler)
    body, _ = m.render(None)
    assert (b"# HELP specserve_drafter_faults_total Drafter exceptions; the sequence continued by plain decoding\n"
            b"# TYPE specserve_drafter_faults_total counter\n") in body
    s = samples(m)
    assert s[("specserve_drafter_faults_total", (("drafter", "eagle"),))] == 2
    assert s[("specserve_drafter_faults_total", (("drafter", 'ngram:"x"\\'),))] == 1
    assert s[("specserve_requests_waiting", ())] == 5 and s[("specserve_kv_rows_free", ())] == 3
    assert s[("specserve_prefix_cache_hit_tokens_total", ())] == 32
    assert s[("specserve_prefix_cache_capacity_bytes", ())] == 400
    scheduler.snapshot = EngineSnapshot(rows=4, free_rows=4, running=0, prefilling=0)    # no pool, no faults
    s = samples(m)
    assert not any(name.startswith(("specserve_prefix_cache", "specserve_drafter_faults")) for name, _ in s)
    assert "# TYPE specserve_drafter_faults_total counter" in m.render(None)[0].decode()


def test_instances_share_nothing():
    a, b = Metrics(), Metrics()
    a.observe_result(result())
    a.observe_batch(8)
    a.count_outcome("timeout")
    sa, sb = samples(a), samples(b)
    assert sa[("specserve_requests_total", (("outcome", "success"),))] == 1
    assert not any(name == "specserve_requests_total" for name, _ in sb)
    assert sb[("specserve_batch_size_count", ())] == 0 and sb[("specserve_prompt_tokens_total", ())] == 0
    assert a.registry is not b.registry and b.outcomes == {}


def test_a_scrape_sees_one_moment_while_the_scheduler_updates():
    m = Metrics()
    stop = threading.Event()

    def scheduler():
        while not stop.is_set():
            m.observe_batch(2)
            m.observe_result(result())

    t = threading.Thread(target=scheduler)
    t.start()
    try:
        for _ in range(30):
            s = samples(m)
            done = s.get(("specserve_requests_total", (("outcome", "success"),)), 0)
            assert s[("specserve_e2e_request_latency_seconds_count", ())] == done
            assert s[("specserve_prompt_tokens_total", ())] == 5 * done
            assert s.get(("specserve_spec_drafted_steps_total", (("depth", "1"),)), 0) == done
    finally:
        stop.set()
        t.join()


def test_route_negotiates_the_format():
    m = Metrics()
    m.count_outcome("rejected")
    app = FastAPI()
    add_routes(app, Service(llm=None, scheduler=None, metrics=m, model_name="test"))
    client = TestClient(app)
    plain = client.get("/metrics")
    assert plain.status_code == 200 and plain.headers["content-type"] == TEXT
    assert 'specserve_requests_total{outcome="rejected"} 1.0' in plain.text
    om = client.get("/metrics", headers={"Accept": PROMETHEUS_ACCEPT})
    assert om.headers["content-type"] == OPENMETRICS and om.text.endswith("# EOF\n")
