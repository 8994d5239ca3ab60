"""Prometheus metrics in the text exposition format (no client library needed)."""

from __future__ import annotations

import threading

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
DRAFT_BUCKETS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 32)
RATIO_BUCKETS = (0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 3.0, 5.0)


class Histogram:
    def __init__(self, name: str, help_: str, buckets: tuple):
        self.name, self.help, self.buckets = name, help_, buckets
        self.counts = [0] * len(buckets)
        self.total, self.n = 0.0, 0

    def observe(self, x: float) -> None:
        for i, b in enumerate(self.buckets):
            if x <= b:
                self.counts[i] += 1
        self.total += x
        self.n += 1

    def render(self) -> list[str]:
        out = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        out += [f'{self.name}_bucket{{le="{b}"}} {c}' for b, c in zip(self.buckets, self.counts)]
        out += [f'{self.name}_bucket{{le="+Inf"}} {self.n}', f"{self.name}_sum {self.total}", f"{self.name}_count {self.n}"]
        return out


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
        self.ttft = Histogram("specserve_time_to_first_token_seconds", "Time to first token", LATENCY_BUCKETS)
        self.tpot = Histogram("specserve_time_per_output_token_seconds", "Time per output token after the first",
                              LATENCY_BUCKETS)
        self.e2e = Histogram("specserve_e2e_request_latency_seconds", "End-to-end request latency", LATENCY_BUCKETS)
        self.batch = Histogram("specserve_batch_size", "Sequences per engine step", BATCH_BUCKETS)
        self.draft = Histogram("specserve_spec_auto_draft_nodes", "Draft nodes the controller kept per auto "
                               "sequence and step (0: speculation off)", DRAFT_BUCKETS)
        self.step_ratio = Histogram("specserve_step_time_measured_over_predicted",
                                    "Measured target pass time over the cost model's prediction", RATIO_BUCKETS)
        self.auto_steps = 0
        self.thread_steps: dict[int, int] = {}
        self.auto_off = 0
        self.prefill_tokens = 0
        self.prefill_steps = 0
        self.gauges = lambda: {}
        self.counters = lambda: {}     # name -> (help, value), read at render time (the prefix cache's)

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

    def render(self) -> str:
        with self._lock:
            lines = ["# HELP specserve_requests_total Finished requests by outcome", "# TYPE specserve_requests_total counter"]
            for outcome, n in sorted(self.outcomes.items()):
                lines.append(f'specserve_requests_total{{outcome="{outcome}"}} {n}')
            lines += ["# TYPE specserve_prompt_tokens_total counter", f"specserve_prompt_tokens_total {self.prompt_tokens}",
                      "# TYPE specserve_generation_tokens_total counter",
                      f"specserve_generation_tokens_total {self.generation_tokens}"]
            for h in (self.ttft, self.tpot, self.e2e, self.batch, self.draft, self.step_ratio):
                lines += h.render()
            lines += ["# HELP specserve_spec_auto_steps_total Sequence-steps whose draft size the controller chose",
                      "# TYPE specserve_spec_auto_steps_total counter", f"specserve_spec_auto_steps_total {self.auto_steps}",
                      "# HELP specserve_spec_auto_off_steps_total Of those, the ones with speculation off (0 nodes)",
                      "# TYPE specserve_spec_auto_off_steps_total counter",
                      f"specserve_spec_auto_off_steps_total {self.auto_off}"]
            lines += ["# HELP specserve_compute_threads_steps_total Engine steps by the compute threads the "
                      "governor gave the target pass", "# TYPE specserve_compute_threads_steps_total counter"]
            lines += [f'specserve_compute_threads_steps_total{{threads="{n}"}} {c}'
                      for n, c in sorted(self.thread_steps.items())]
            lines += ["# HELP specserve_spec_drafted_steps_total Verification steps whose draft reached this depth",
                      "# TYPE specserve_spec_drafted_steps_total counter"]
            lines += [f'specserve_spec_drafted_steps_total{{depth="{i + 1}"}} {d}' for i, d in enumerate(self.drafted)]
            lines += ["# HELP specserve_spec_accepted_steps_total Verification steps that accepted at least this many tokens",
                      "# TYPE specserve_spec_accepted_steps_total counter"]
            lines += [f'specserve_spec_accepted_steps_total{{depth="{i + 1}"}} {a}' for i, a in enumerate(self.accepted)]
            lines += ["# HELP specserve_spec_draft_nodes_total Draft nodes verified (chains: drafted tokens)",
                      "# TYPE specserve_spec_draft_nodes_total counter", f"specserve_spec_draft_nodes_total {self.nodes}",
                      "# TYPE specserve_spec_verify_passes_total counter",
                      f"specserve_spec_verify_passes_total {self.verify_passes}"]
            mal = (sum(self.accepted) + self.verify_passes) / self.verify_passes if self.verify_passes else 0.0
            lines += ["# HELP specserve_spec_mean_accepted_length Accepted tokens plus one per verification pass",
                      "# TYPE specserve_spec_mean_accepted_length gauge", f"specserve_spec_mean_accepted_length {mal}"]
            lines += ["# HELP specserve_prefill_computed_tokens_total Prompt tokens computed (not reused) in engine steps",
                      "# TYPE specserve_prefill_computed_tokens_total counter",
                      f"specserve_prefill_computed_tokens_total {self.prefill_tokens}",
                      "# HELP specserve_prefill_steps_total Engine steps that carried prompt chunks",
                      "# TYPE specserve_prefill_steps_total counter", f"specserve_prefill_steps_total {self.prefill_steps}"]
        for name, (help_, value) in self.counters().items():
            lines += [f"# HELP {name} {help_}", f"# TYPE {name} counter", f"{name} {value}"]
        for name, value in self.gauges().items():
            lines += [f"# TYPE {name} gauge", f"{name} {value}"]
        return "\n".join(lines) + "\n"
