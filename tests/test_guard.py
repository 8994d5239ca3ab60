"""The guard (specserve.control.guard): hand-built step yields, the controller's plans under each
arm, and an engine whose drafting never pays turning it off without changing a token."""

from __future__ import annotations

import time

import pytest

from conftest import tiny_model
from specserve.control import Controller, CostModel, SeqView, Traits
from specserve.control.guard import DRAFT, MAX_GAP, MIN_GAP, PLAIN, WARMUP, Guard, level
from specserve.drafters import create
from specserve.drafters.base import DraftProposal, Drafter
from specserve.engine import Engine, Request
from specserve.limits import AUTO_SIZE

FLAT = CostModel([1, 2, 64], [0.010, 0.0101, 0.011], 0.0)


def run(guard: Guard, steps: int, rates: dict[str, float], sequences: int = 1) -> list[str]:
    """``steps`` steps at ``sequences`` sequences, each arm yielding ``rates[arm]`` tokens per second
    (one second per step); the arms taken, in order."""
    arms = []
    for _ in range(steps):
        arm = guard.arm(sequences)
        guard.observe(sequences, arm, round(rates[arm] * 100), 100.0)
        arms.append(arm)
    return arms


def test_levels_are_powers_of_two():
    assert [level(n) for n in (1, 2, 3, 4, 7, 8, 15, 16, 31, 32)] == [1, 2, 2, 3, 3, 4, 4, 5, 5, 6]


def test_warmup_tries_each_arm_drafting_first():
    arms = run(Guard(), 2 * WARMUP, {DRAFT: 2.0, PLAIN: 1.0})
    assert arms == [DRAFT] * WARMUP + [PLAIN] * WARMUP


@pytest.mark.parametrize("winner", [DRAFT, PLAIN])
def test_the_faster_arm_leads_and_the_other_is_tried_ever_more_rarely(winner):
    """After the warm-up the faster arm takes every step but the trials; the trials' gaps double
    from MIN_GAP to MAX_GAP while they confirm the leader, so over 1,000 steps the trailing arm
    costs about one step in MAX_GAP."""
    loser = PLAIN if winner == DRAFT else DRAFT
    guard = Guard()
    arms = run(guard, 1000, {winner: 1.5, loser: 1.0})
    after = arms[2 * WARMUP:]
    trials = [i for i, a in enumerate(after) if a == loser]
    gaps = [b - a - 1 for a, b in zip(trials, trials[1:])]
    assert gaps[:4] == [MIN_GAP * 2, MIN_GAP * 4, MIN_GAP * 8, MAX_GAP][:len(gaps[:4])]
    assert max(gaps) == MAX_GAP
    assert len(trials) <= 1000 / MAX_GAP + 4
    assert guard.leaders() == {1: winner}


def test_a_change_of_leader_is_found_within_bounded_steps():
    """Drafting stops paying (the text changed): the next trial of plain decoding finds it, within
    MAX_GAP + a few steps, and the gap restarts at MIN_GAP; then drafting pays again and is found."""
    guard = Guard()
    run(guard, 600, {DRAFT: 2.0, PLAIN: 1.0})
    arms = run(guard, 3 * MAX_GAP, {DRAFT: 0.5, PLAIN: 1.0})
    first_plain = arms.index(PLAIN)
    assert first_plain <= MAX_GAP
    assert guard.leaders() == {1: PLAIN}
    assert arms[-MIN_GAP:].count(DRAFT) <= 1                        # drafting is now the trial
    arms = run(guard, 3 * MAX_GAP, {DRAFT: 2.0, PLAIN: 1.0})
    assert guard.leaders() == {1: DRAFT}


def test_a_new_request_drafts_once_where_plain_steps_lead():
    """Plain steps lead: a step holding a request new to the guard drafts (its text may draft well),
    whatever the gap; the next step, the request no longer new, is plain again.  Where drafting
    leads, a new request changes nothing."""
    guard = Guard()
    run(guard, 200, {DRAFT: 0.5, PLAIN: 1.0})
    assert guard.leaders() == {1: PLAIN} and guard.arm(1) == PLAIN
    assert guard.arm(1, fresh=True) == DRAFT
    guard.observe(1, DRAFT, 50, 100.0)
    assert guard.arm(1) == PLAIN
    other = Guard()
    run(other, 200, {DRAFT: 2.0, PLAIN: 1.0})
    assert other.arm(1) == DRAFT and other.arm(1, fresh=True) == DRAFT


def test_the_controller_tells_the_guard_of_new_requests_once():
    ctl = Controller({"d": Traits(8, True)}, FLAT, max_draft=32, thread_choices=(1,))
    seen = []
    ctl.guard.arm = lambda sequences, fresh=False: seen.append(fresh) or PLAIN
    a, b = SeqView(0, "d", AUTO_SIZE, 10, 50), SeqView(1, "d", AUTO_SIZE, 10, 50)
    for views in ([a], [a], [a, b], [a, b]):
        ctl.plan(views)
    ctl.forget(0)
    ctl.plan([SeqView(0, "d", AUTO_SIZE, 10, 50)])          # the id again, after it ended: a new request
    assert seen == [True, False, True, False, True]


def test_levels_are_measured_apart():
    """Drafting pays alone and not in a batch of 16: each level keeps its own leader."""
    guard = Guard()
    run(guard, 200, {DRAFT: 2.0, PLAIN: 1.0}, sequences=1)
    run(guard, 200, {DRAFT: 0.9, PLAIN: 1.0}, sequences=16)
    assert guard.leaders() == {1: DRAFT, 16: PLAIN}


def test_a_switched_off_guard_always_drafts():
    guard = Guard(enabled=False)
    assert set(run(guard, 100, {DRAFT: 0.1, PLAIN: 1.0})) == {DRAFT}
    assert guard.levels == {}


def test_plans_under_each_arm():
    """A plain step gives every auto sequence a budget of 0 and probes nothing; a fixed draft size is
    kept; a step with no auto sequence asks the guard nothing (its arm is None)."""
    ctl = Controller({"d": Traits(8, True)}, FLAT, max_draft=32, thread_choices=(1,))
    auto, fixed = SeqView(0, "d", AUTO_SIZE, 10, 50), SeqView(1, "d", 3, 10, 50)
    arms = []
    for _ in range(2 * WARMUP):
        plan = ctl.plan([auto, fixed])
        arms.append(plan.arm)
        assert plan.budgets == ({0: 8, 1: 3} if plan.arm == DRAFT else {0: 0, 1: 3})
        assert not plan.probed or plan.arm == DRAFT
        ctl.observe_step(plan, 2, 2, 0.01)
    assert arms == [DRAFT] * WARMUP + [PLAIN] * WARMUP
    plan = ctl.plan([fixed])
    assert plan.arm is None and plan.budgets == {1: 3}
    steps = {k: (lv.draft.steps, lv.plain.steps) for k, lv in ctl.guard.levels.items()}
    ctl.observe_step(plan, 1, 1, 0.01)
    assert {k: (lv.draft.steps, lv.plain.steps) for k, lv in ctl.guard.levels.items()} == steps


class FakeClock:
    """``time.perf_counter`` for an engine test: each reading advances 1 ms, and ``spend`` adds more,
    so the steps' measured seconds do not depend on the machine's load."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 0.001
        return self.now

    def spend(self, seconds: float) -> None:
        self.now += seconds


class SlowOracle(Drafter):
    """Drafts the next tokens of a known text (always accepted), and then spends 200 ms of the fake
    clock in ``feedback`` after each step it drafted in: a cost the controller's clock on drafting
    does not see (the cost model prices drafting and the pass, not what a drafter does with its
    feedback)."""
    name = "slow-oracle"
    max_auto_draft = 4
    confidence = True

    def __init__(self, text: list[int], clock: FakeClock | None = None):
        self.text, self.clock = text, clock

    def propose(self, reqs):
        out = []
        for r in reqs:
            nxt = self.text[len(r.tokens):len(r.tokens) + min(r.k, 4)]
            out.append(DraftProposal(list(nxt), confidence=[0.99] * len(nxt)))
        return out

    def feedback(self, fb):
        if len(fb.proposal) and self.clock is not None:
            self.clock.spend(0.2)


@pytest.fixture(scope="module")
def target():
    return tiny_model(seed=21, vocab=64, layers=2)


def drafted_steps(eng: Engine, req: Request) -> tuple[list[int], list[bool]]:
    """Run one request; its tokens, and for each decoding step whether it verified drafted nodes."""
    seq_id = eng.admit(req)
    drafted = []
    while eng.num_running:
        eng.step()
        if eng.last_step is not None and not eng.last_step.prefill_tokens:
            drafted.append(sum(eng.last_step.nodes) > 0)
    return eng.take_result(seq_id).tokens, drafted


def test_an_engine_stops_drafting_that_does_not_pay_and_keeps_every_token(target, monkeypatch):
    """auto over a drafter that is always right but costs 200 ms a step (of a fake clock) where the controller cannot see
    it: with the guard off nearly every step drafts (the cost model finds the drafts cheap and certain);
    with it on, plain steps lead after the warm-up and at most one step in MIN_GAP drafts.  The
    tokens are plain decoding's either way."""
    prompt = [5, 6, 7, 8]
    plain = Engine(target, {"none": create("none", target)}).generate([Request(prompt, 48)])[0].tokens
    text = prompt + plain
    req = Request(prompt, 48, drafter="o", num_draft=AUTO_SIZE)
    clock = FakeClock()
    off_eng, eng = (Engine(target, {"o": SlowOracle(text, clock)}, cost=FLAT.fresh(), guard=g) for g in (False, True))
    monkeypatch.setattr(time, "perf_counter", clock)
    off_tokens, off = drafted_steps(off_eng, req)
    on_tokens, on = drafted_steps(eng, req)
    assert off_tokens == on_tokens == plain
    assert sum(off) >= 0.75 * len(off)
    assert eng.controller.guard.leaders() == {1: PLAIN}
    later = on[2 * WARMUP:]
    assert sum(later) <= len(later) / MIN_GAP + 1


def test_request_shares_add_up_to_the_engines_step_seconds(target):
    """Each step's seconds are shared equally by the sequences it advanced (decoding or a prompt
    chunk): over a batch of three requests of different lengths, the shares sum to the steps'
    seconds, and the longer request carries more."""
    eng = Engine(target, {"none": create("none", target)}, max_batch=3)
    ids = [eng.admit(Request([3, 4, 5, 6 + i], n)) for i, n in enumerate((4, 12, 30))]
    total = 0.0
    while eng.num_running:
        eng.step()
        total += sum(eng.last_step.asdict().values())
    shares = [eng.take_result(i).stats.share_s for i in ids]
    assert sum(shares) == pytest.approx(total, rel=1e-9)
    assert shares[0] < shares[1] < shares[2]


class Counting(Drafter):
    """Proposes nothing, counting the calls it gets."""
    name = "counting"
    confidence = True

    def __init__(self):
        self.calls = 0

    def propose(self, reqs):
        self.calls += 1
        return [DraftProposal([]) for _ in reqs]


def test_a_plain_step_rests_auto_sized_sequences_entirely(target, monkeypatch):
    """Under the guard's plain arm an auto-sized sequence's drafter is not asked, keep has nothing to
    weigh (no prediction), and learn records nothing (its probe state does not age); a sequence with
    a fixed draft size in the same steps is asked as before."""
    eng = Engine(target, {"c": Counting(), "f": Counting()}, cost=FLAT.fresh())
    monkeypatch.setattr(eng.controller.guard, "arm", lambda sequences, fresh=False: PLAIN)
    ids = [eng.admit(Request([3, 4, 5], 12, drafter="c", num_draft=AUTO_SIZE)),
           eng.admit(Request([3, 4, 6], 12, drafter="f", num_draft=2))]
    while eng.num_running:
        eng.step()
        assert not any(key[0] == ids[0] for key in eng.controller.history.probes)
    assert eng.drafters["c"].calls == 0 and eng.drafters["f"].calls > 0
    stats = [eng.take_result(i).stats for i in ids]
    assert stats[0].step_predicted_s == [] and len(stats[0].nodes_per_step) == 11
