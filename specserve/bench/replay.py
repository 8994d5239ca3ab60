"""Replay a drafter against a known greedy continuation, without running the target.

Under greedy decoding the target's output is fixed in advance, so how many drafted tokens each
step accepts depends only on the drafter and that output: a step at position i accepts the longest
drafted path that spells out ``continuation[i:]``.  Replaying a drafter over recorded greedy
outputs therefore gives its exact mean accepted length, acceptance by depth and nodes per step in
milliseconds per prompt, which is how drafter settings are tuned (on training prompts, never on
the evaluation set).  Drafters that need target features cannot be replayed.
"""

from __future__ import annotations

from specserve.drafters.base import DraftRequest, Drafter, Feedback, DraftProposal
from specserve.sampling import SamplingParams
from specserve.stats import RequestStats


def accepted_path(prop: DraftProposal, truth: list[int]) -> list[int]:
    """The longest path of ``prop`` whose tokens are ``truth[0], truth[1], ...``: node indices."""
    parents, ok, best = prop.parent_list(), [], []
    depth = prop.depths()
    for i, (tok, p) in enumerate(zip(prop.tokens, parents)):
        good = (p < 0 or ok[p]) and depth[i] <= len(truth) and tok == truth[depth[i] - 1]
        ok.append(good)
        if good and depth[i] > len(best):
            best = [i]
            while parents[best[0]] >= 0:
                best.insert(0, parents[best[0]])
    return best


def replay(drafter: Drafter, prompt: list[int], continuation: list[int], k: int, seq_id: int = 0) -> RequestStats:
    """Counters of generating ``continuation`` (greedy) after ``prompt`` with ``drafter`` at budget k."""
    if drafter.feature_layers:
        raise ValueError(f"drafter {drafter.name!r} needs target features; it cannot be replayed")
    greedy = SamplingParams()
    stats = RequestStats(drafter=drafter.name, synthetic=drafter.synthetic, prompt_tokens=len(prompt))
    drafter.begin(seq_id, prompt, greedy, len(continuation))
    tokens = list(prompt) + continuation[:1]
    drafter.feedback(Feedback(seq_id, DraftProposal([]), [], continuation[:1]))
    stats.target_passes = stats.prefill_passes = 1
    while len(tokens) - len(prompt) < len(continuation):
        done = len(tokens) - len(prompt)
        depth = len(continuation) - done - 1
        req = DraftRequest(seq_id, list(tokens), k if depth else 0, greedy, depth)
        prop = drafter.propose([req])[0].truncated(req.k, depth)
        path = accepted_path(prop, continuation[done:])
        emitted = continuation[done: done + len(path) + 1]
        stats.record_step(len(prop), prop.depth, len(path))
        drafter.feedback(Feedback(seq_id, prop, path, emitted))
        tokens += emitted
    drafter.end(seq_id)
    stats.generated_tokens = len(continuation)
    return stats
