"""Prometheus metrics for ``/metrics``, exposed with ``prometheus_client``.

One ``Metrics`` per app, with its own ``CollectorRegistry`` (no global registry: tests build several
apps in one process).  The registry holds one collector, ``_Scrape``, that builds every family at
scrape time:

- the running totals the scheduler thread and the HTTP handlers add to (requests by outcome, tokens,
  the drafts' depths, steps by compute threads, prefill) are plain numbers under one lock; the
  collector turns them into ``CounterMetricFamily`` / ``GaugeMetricFamily`` (the mean accepted
  length is computed from them then);
- the histograms are ``prometheus_client.Histogram`` objects kept out of any registry and collected
  by ``_Scrape`` under the same lock, so one scrape sees the counters and histograms of the same
  moment (their ``_created`` series are dropped, as before);
- what the server reads from the scheduler and the engine's snapshot (``gauges``, ``counters``,
  ``labelled_counters``: callables that ``app.py`` sets, see ``gauges.py``) is read outside the lock.

Nothing is hand-formatted: ``render`` hands the registry to the library's classic text encoder, or
to its OpenMetrics encoder when the ``Accept`` header asks for ``application/openmetrics-text``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.registry import Collector

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
DRAFT_BUCKETS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 32)
RATIO_BUCKETS = (0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 3.0, 5.0)

OPENMETRICS = "application/openmetrics-text"
# the content types served (spelled here: the library's own names for them differ across versions)
TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"
TEXT_TYPES = ("text/plain", "text/*", "*/*")

Gauges = Callable[[], dict[str, tuple[str, float]]]              # name -> (help, value)
Counters = Callable[[], dict[str, tuple[str, float]]]            # name -> (help, value)
Labelled = Callable[[], dict[str, tuple[str, str, dict[str, float]]]]   # name -> (help, label, values)


def wants_openmetrics(accept: str | None) -> bool:
    """Whether an ``Accept`` header prefers OpenMetrics to the classic text format (by q-value;
    a tie goes to OpenMetrics, as Prometheus lists it first)."""
    om = text = 0.0
    for part in (accept or "").split(","):
        media, *params = (t.strip() for t in part.split(";"))
        q = 1.0
        for p in params:
            key, _, value = p.partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        if media.lower() == OPENMETRICS:
            om = max(om, q)
        elif media.lower() in TEXT_TYPES:
            text = max(text, q)
    return om > 0 and om >= text


def counter(name: str, help_: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, help_, value=value)


def labelled(name: str, help_: str, label: str, values: Iterable[tuple[object, float]]) -> CounterMetricFamily:
    """A counter family with one sample per ``(label value, count)``, in the order given."""
    family = CounterMetricFamily(name, help_, labels=[label])
    for key, value in values:
        family.add_metric([str(key)], value)
    return family


def without_created(families: Iterable[Metric]) -> list[Metric]:
    """The families with their ``_created`` samples dropped (the output carries no timestamps)."""
    out = list(families)
    for f in out:
        f.samples = [s for s in f.samples if s.name != f.name + "_created"]
    return out


class _Scrape(Collector):
    """The registry's one collector: every family of a ``Metrics``, built when scraped."""

    def __init__(self, metrics: Metrics):
        self.metrics = metrics

    def collect(self) -> list[Metric]:
        return self.metrics.families()


class Metrics:
    """Counters updated by the scheduler thread and the HTTP handlers; rendered on /metrics."""

    def __init__(self):
        self._lock = threading.Lock()
        self.outcomes: dict[str, int] = {}
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.drafted: list[int] = []
        self.accepted: list[int] = []
        self.verify_passes = 0
        self.nodes = 0
        self.ttft = Histogram("specserve_time_to_first_token_seconds", "Time to first token",
                              buckets=LATENCY_BUCKETS, registry=None)
        self.tpot = Histogram("specserve_time_per_output_token_seconds", "Time per output token after the first",
                              buckets=LATENCY_BUCKETS, registry=None)
        self.e2e = Histogram("specserve_e2e_request_latency_seconds", "End-to-end request latency",
                             buckets=LATENCY_BUCKETS, registry=None)
        self.batch = Histogram("specserve_batch_size", "Sequences per engine step", buckets=BATCH_BUCKETS,
                               registry=None)
        self.draft = Histogram("specserve_spec_auto_draft_nodes", "Draft nodes the controller kept per auto "
                               "sequence and step (0: speculation off)", buckets=DRAFT_BUCKETS, registry=None)
        self.step_ratio = Histogram("specserve_step_time_measured_over_predicted",
                                    "Measured target pass time over the cost model's prediction",
                                    buckets=RATIO_BUCKETS, registry=None)
        self.auto_steps = 0
        self.thread_steps: dict[int, int] = {}
        self.auto_off = 0
        self.prefill_tokens = 0
        self.prefill_steps = 0
        self.tool_replies: dict[str, int] = {}      # replies to requests whose tools the model could call, by kind
        self.tool_calls = 0
        # read at render time, set by app.py (see gauges.py): the scheduler's and the engine's
        self.gauges: Gauges = lambda: {}
        self.counters: Counters = lambda: {}
        self.labelled_counters: Labelled = lambda: {}
        self.registry = CollectorRegistry()
        self.registry.register(_Scrape(self))

    def count_outcome(self, outcome: str) -> None:
        with self._lock:
            self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1

    def observe_batch(self, size: int) -> None:
        with self._lock:
            self.batch.observe(size)

    def observe_step(self, report) -> None:
        """An engine ``StepReport``: the controller's choices and its prediction against the pass."""
        with self._lock:
            for nodes, auto in zip(report.nodes, report.auto):
                if auto:
                    self.draft.observe(nodes)
                    self.auto_steps += 1
                    self.auto_off += nodes == 0
            if report.predicted_s:
                self.step_ratio.observe(report.pass_s / report.predicted_s)
            if report.threads:
                self.thread_steps[report.threads] = self.thread_steps.get(report.threads, 0) + 1
            if report.prefill_tokens:
                self.prefill_tokens += report.prefill_tokens
                self.prefill_steps += 1

    def observe_result(self, result, queue_s: float = 0.0) -> None:
        s = result.stats
        with self._lock:
            self.outcomes["success"] = self.outcomes.get("success", 0) + 1
            self.prompt_tokens += s.prompt_tokens
            self.generation_tokens += s.generated_tokens
            self.ttft.observe(s.ttft_s + queue_s)
            self.e2e.observe(s.total_s + queue_s)
            if s.generated_tokens > 1:
                self.tpot.observe((s.total_s - s.ttft_s) / (s.generated_tokens - 1))
            self.nodes += s.drafted_tokens
            for i, (d, a) in enumerate(zip(s.drafted_per_depth, s.accepted_per_depth)):
                while len(self.drafted) <= i:
                    self.drafted.append(0)
                    self.accepted.append(0)
                self.drafted[i] += d
                self.accepted[i] += a
            self.verify_passes += s.verify_passes

    def observe_tools(self, calls: int) -> None:
        """A finished reply to a request that let the model call tools: how many calls it held."""
        with self._lock:
            kind = "calls" if calls else "text"
            self.tool_replies[kind] = self.tool_replies.get(kind, 0) + 1
            self.tool_calls += calls

    def render(self, accept: str | None = None) -> tuple[bytes, str]:
        """(body, content type): OpenMetrics if ``accept`` asks for it, else the classic text format."""
        if wants_openmetrics(accept):
            return openmetrics.generate_latest(self.registry), OPENMETRICS_CONTENT_TYPE
        return generate_latest(self.registry), TEXT_CONTENT_TYPE

    def families(self) -> list[Metric]:
        """Every family, in the order /metrics has always listed them."""
        with self._lock:
            out = self._request_families()
            out += without_created(h.collect()[0] for h in (self.ttft, self.tpot, self.e2e, self.batch,
                                                             self.draft, self.step_ratio))
            out += self._spec_families()
        return out + self._server_families()

    def _request_families(self) -> list[Metric]:
        return [labelled("specserve_requests_total", "Finished requests by outcome", "outcome",
                         sorted(self.outcomes.items())),
                counter("specserve_prompt_tokens_total", "Prompt tokens of finished requests", self.prompt_tokens),
                counter("specserve_generation_tokens_total", "Tokens generated for finished requests",
                        self.generation_tokens),
                labelled("specserve_tool_replies_total", "Replies to requests whose tools the model could call, by "
                         "what they held (calls, or text only)", "kind", sorted(self.tool_replies.items())),
                counter("specserve_tool_calls_total", "Tool calls in those replies", self.tool_calls)]

    def _spec_families(self) -> list[Metric]:
        depths = range(1, len(self.drafted) + 1)
        mal = (sum(self.accepted) + self.verify_passes) / self.verify_passes if self.verify_passes else 0.0
        return [
            counter("specserve_spec_auto_steps_total", "Sequence-steps whose draft size the controller chose",
                    self.auto_steps),
            counter("specserve_spec_auto_off_steps_total", "Of those, the ones with speculation off (0 nodes)",
                    self.auto_off),
            labelled("specserve_compute_threads_steps_total", "Engine steps by the compute threads the governor "
                     "gave the target pass", "threads", sorted(self.thread_steps.items())),
            labelled("specserve_spec_drafted_steps_total", "Verification steps whose draft reached this depth",
                     "depth", zip(depths, self.drafted)),
            labelled("specserve_spec_accepted_steps_total", "Verification steps that accepted at least this many "
                     "tokens", "depth", zip(depths, self.accepted)),
            counter("specserve_spec_draft_nodes_total", "Draft nodes verified (chains: drafted tokens)", self.nodes),
            counter("specserve_spec_verify_passes_total", "Verification passes of finished requests",
                    self.verify_passes),
            GaugeMetricFamily("specserve_spec_mean_accepted_length", "Accepted tokens plus one per verification "
                              "pass", value=mal),
            counter("specserve_prefill_computed_tokens_total", "Prompt tokens computed (not reused) in engine "
                    "steps", self.prefill_tokens),
            counter("specserve_prefill_steps_total", "Engine steps that carried prompt chunks", self.prefill_steps)]

    def _server_families(self) -> list[Metric]:
        """What app.py's callables read from the scheduler and the engine's snapshot (outside the lock)."""
        out: list[Metric] = [counter(name, help_, value) for name, (help_, value) in self.counters().items()]
        out += [labelled(name, help_, label, sorted(values.items()))
                for name, (help_, label, values) in self.labelled_counters().items()]
        out += [GaugeMetricFamily(name, help_, value=value) for name, (help_, value) in self.gauges().items()]
        return out
