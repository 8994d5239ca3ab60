"""Per-request counters, kept on the object that produces them (llama.cpp style)."""

from __future__ import annotations

from dataclasses import dataclass, field

TIMERS = ("draft_s", "size_s", "pass_s", "verify_s", "shape_s", "commit_s")   # a step's timed phases, in order


@dataclass
class Timings:
    """Seconds by phase: of one step (``StepTimes``, ``StepReport``), or of the steps a request took
    part in (``RequestStats``, where steps shared with other sequences count fully for each).  The
    names are ``TIMERS``; every report of where the time goes reads them from here."""
    draft_s: float = 0.0              # drafters' propose calls, nothing else
    size_s: float = 0.0               # the controller: node budgets, keeping the nodes that pay
    pass_s: float = 0.0               # target passes (prompt chunks included)
    verify_s: float = 0.0             # verification of the pass's logits, after the pass
    shape_s: float = 0.0              # grammars and penalties: drafts checked, forced tokens, logits shaped
    commit_s: float = 0.0             # committing tokens, the KV cache's compaction, feedback to drafters

    def total(self) -> float:
        """The phases' seconds summed."""
        return sum(getattr(self, name) for name in TIMERS)

    def asdict(self) -> dict[str, float]:
        """The phases' seconds by name (``TIMERS`` only, whatever else the object holds)."""
        return {name: getattr(self, name) for name in TIMERS}

    def add(self, other: Timings, names: tuple[str, ...] = TIMERS) -> None:
        """Add ``other``'s seconds in the phases ``names`` to these."""
        for name in names:
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass
class RequestStats(Timings):
    drafter: str = "none"
    synthetic: bool = False           # True for the oracle drafter: numbers are a study, not a product
    prompt_tokens: int = 0
    generated_tokens: int = 0
    target_passes: int = 0            # prefill passes (one per prompt chunk) + verification passes
    prefill_passes: int = 0
    cached_tokens: int = 0            # prompt tokens reused from the prefix cache (not computed)
    drafted_per_depth: list[int] = field(default_factory=list)    # [d]: steps whose draft reached depth d+1
    accepted_per_depth: list[int] = field(default_factory=list)   # [d]: steps that accepted >= d+1 tokens
    nodes_per_step: list[int] = field(default_factory=list)       # nodes drafted (chain: tokens), per step
    ttft_s: float = 0.0               # arrival -> first generated token
    forced_tokens: int = 0            # drafted because a grammar forced them (jump-forward)
    forced_accepted: int = 0          # ... of which accepted
    total_s: float = 0.0              # arrival -> last token (the phases' seconds are Timings')
    token_times: list[float] = field(default_factory=list)          # seconds since arrival, per token
    auto: bool = False                # draft sizes chosen by the controller
    drafter_faults: int = 0           # 1 when its drafter raised and it continued by plain decoding
    step_predicted_s: list[float] = field(default_factory=list)     # auto steps: the cost model's prediction
    step_measured_s: list[float] = field(default_factory=list)      # ... and the measured target pass
    share_s: float = 0.0              # its steps' seconds, each shared equally by the sequences it advanced
                                      # (summed over requests: the engine's busy time; a bench's per-prompt cost)

    def record_step(self, nodes: int, depth: int, accepted: int, forced: int = 0, forced_accepted: int = 0) -> None:
        """Count one verification pass over a draft of ``nodes`` nodes reaching ``depth`` (a chain
        of k tokens: k and k), of which ``accepted`` tokens (a path) were accepted; ``forced`` of the
        nodes were a grammar's forced tokens, ``forced_accepted`` of them on the accepted path."""
        self.forced_tokens += forced
        self.forced_accepted += forced_accepted
        while len(self.drafted_per_depth) < depth:
            self.drafted_per_depth.append(0)
            self.accepted_per_depth.append(0)
        for i in range(depth):
            self.drafted_per_depth[i] += 1
        for i in range(accepted):
            self.accepted_per_depth[i] += 1
        self.nodes_per_step.append(nodes)
        self.target_passes += 1

    @property
    def verify_passes(self) -> int:
        """Target passes that decoded or verified (not prompt chunks)."""
        return max(self.target_passes - self.prefill_passes, 0)

    @property
    def drafted_tokens(self) -> int:
        """Nodes drafted over all steps (for chains: drafted tokens)."""
        return sum(self.nodes_per_step)

    @property
    def accepted_tokens(self) -> int:
        """Drafted tokens the target accepted, over all steps."""
        return sum(self.accepted_per_depth)

    @property
    def mean_accepted_length(self) -> float:
        """(accepted tokens + one target token) per verification pass; 1.0 for plain decoding."""
        return (self.accepted_tokens + self.verify_passes) / self.verify_passes if self.verify_passes else 0.0

    @property
    def acceptance_rate(self) -> float:
        """Accepted tokens per drafted node."""
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    @property
    def acceptance_by_depth(self) -> list[float]:
        """[d]: of the steps whose draft reached depth d+1, the share that accepted >= d+1 tokens."""
        return [a / d for a, d in zip(self.accepted_per_depth, self.drafted_per_depth)]

    @property
    def mean_nodes_per_step(self) -> float:
        return self.drafted_tokens / len(self.nodes_per_step) if self.nodes_per_step else 0.0

    @property
    def other_s(self) -> float:
        """The time outside the timed phases (queueing between steps, the scheduler, stop strings)."""
        return max(self.total_s - self.total(), 0.0)

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.total_s if self.total_s > 0 else 0.0

    def to_dict(self) -> dict:
        return {
            "drafter": self.drafter, "synthetic": self.synthetic,
            "prompt_tokens": self.prompt_tokens, "generated_tokens": self.generated_tokens,
            "target_passes": self.target_passes, "verify_passes": self.verify_passes,
            "drafted_tokens": self.drafted_tokens, "accepted_tokens": self.accepted_tokens,
            "drafted_per_depth": list(self.drafted_per_depth),
            "accepted_per_depth": list(self.accepted_per_depth), "acceptance_by_depth": self.acceptance_by_depth,
            "nodes_per_step": list(self.nodes_per_step), "mean_nodes_per_step": self.mean_nodes_per_step,
            "acceptance_rate": self.acceptance_rate, "mean_accepted_length": self.mean_accepted_length,
            "ttft_s": self.ttft_s, **self.asdict(),
            "forced_tokens": self.forced_tokens, "forced_accepted": self.forced_accepted,
            "other_s": self.other_s, "total_s": self.total_s, "tokens_per_second": self.tokens_per_second,
            "token_times_s": list(self.token_times), "auto": self.auto,
            "spec_off_steps": sum(1 for n in self.nodes_per_step if n == 0),
            "step_predicted_s": list(self.step_predicted_s), "step_measured_s": list(self.step_measured_s),
        }
