"""The adaptive controller: its pure pieces by hand, and its decisions through the engine on tiny models."""

import math

import pytest
import torch

from conftest import tiny_model
from specserve.control import (DEFAULTS, AcceptanceModel, Candidate, Controller, CostModel, ProbeState, SeqView,
                               StepPlan, Traits, calibrate, choose)
from specserve.drafters import create
from specserve.drafters.base import DraftProposal
from specserve.engine import Engine, Request
from specserve.limits import AUTO_SIZE

FLAT = CostModel([1, 64], [0.010, 0.0101], 0.0)            # extra tokens nearly free
STEEP = CostModel([1, 2, 64], [0.010, 0.020, 0.640], 0.0)   # every extra token costs a whole pass
MODERATE = CostModel([1, 2, 64], [0.010, 0.011, 0.073], 0.0)  # each extra token costs a tenth of a pass


def test_cost_model_interpolates_extrapolates_and_learns_contention():
    cm = CostModel([1, 2, 4], [0.010, 0.012, 0.016], 1e-6, context=64)
    assert cm.predict([1], [10]) == pytest.approx(0.010)
    assert cm.predict([2, 1], [10, 10]) == pytest.approx(0.014)                    # 3 tokens: between 2 and 4
    assert cm.predict([6], [0]) == pytest.approx(0.020)                            # slope of the last segment
    assert cm.predict([1], [1064]) == pytest.approx(0.010 + 1e-6 * 1001)           # attention beyond the context
    for _ in range(30):
        cm.observe([1], [10], 0.030)                                               # the machine became 3x slower
    assert cm.scale == pytest.approx(3.0, rel=1e-3) and cm.predict([1], [10]) == pytest.approx(0.030, rel=1e-3)


def test_choose_by_hand():
    # flat cost: everything with a positive gain is worth keeping
    keep, _ = choose([Candidate(0, 10, [0.9, 0.5, 0.1], [-1, 0, 1]), Candidate(1, 10, [0.2], [-1])], FLAT)
    assert keep == {0: [0, 1, 2], 1: [0]}
    # steep cost: a node pays only if it is nearly certain
    keep, predicted = choose([Candidate(0, 10, [0.9, 0.5], [-1, 0]), Candidate(1, 10, [0.3], [-1])], STEEP)
    assert keep == {0: [], 1: []} and predicted == pytest.approx(0.020)
    # a child never enters without its parent, even when its own gain is higher
    keep, _ = choose([Candidate(0, 10, [0.1, 0.9], [-1, 0])], CostModel([1, 2, 3], [0.01, 0.0102, 0.0104], 0.0))
    assert keep[0] in ([], [0, 1])
    # ... and where one node pays and two do not, the one kept is the parent (ranked by the capped gain)
    keep, _ = choose([Candidate(0, 10, [0.1, 0.9], [-1, 0])], CostModel([1, 2, 3], [0.01, 0.0102, 0.02], 0.0))
    assert keep[0] == [0]
    # fixed drafts are kept whole; probes keep their first node whatever it pays
    keep, _ = choose([Candidate(0, 10, [0.0, 0.0], [-1, 0], fixed=True), Candidate(1, 10, [0.0, 0.0], [-1, 0], probe=True)],
                     STEEP)
    assert keep == {0: [0, 1], 1: [0]}


def test_choose_charges_the_drafting_cost():
    """On FLAT passes a 0.9 + 0.5 draft adds 1.4 tokens for 0.1 ms: kept when drafting costs 2 ms
    (2.4 tokens / 12.1 ms beats 1 / 10 ms), dropped when it costs 20 ms (2.4 / 30.1 ms)."""
    c = lambda d: [Candidate(0, 10, [0.9, 0.5], [-1, 0], draft_s=d)]
    assert choose(c(0.002), FLAT)[0] == {0: [0, 1]}
    assert choose(c(0.020), FLAT)[0] == {0: []}
    probe = [Candidate(0, 10, [0.9, 0.5], [-1, 0], probe=True, draft_s=0.020)]
    assert choose(probe, FLAT)[0][0][:1] == [0]                    # a probe keeps its first node anyway


def test_acceptance_model_learns_and_shares_a_prior():
    am = AcceptanceModel()
    assert am.chain_gains("d", 1, 2) == pytest.approx([0.5, 0.25])                # the uninformed start
    for _ in range(40):
        am.observe("d", 1, reached=3, accepted=3, predicted=None)
    assert am.chain_gains("d", 1, 3)[-1] > 0.9
    assert am.chain_gains("d", 2, 1)[0] > 0.8                                      # a new sequence, same drafter
    for _ in range(40):
        am.observe("d", 1, reached=3, accepted=0, predicted=None)
    assert am.chain_gains("d", 1, 1)[0] < 0.1
    for _ in range(40):                                                            # confidences twice too high
        am.observe("t", 5, reached=2, accepted=1, predicted=2.0)
    assert am.calibration("t", 5) == pytest.approx(0.5, abs=0.05)
    assert am.node_gains("t", 5, [1, 2], [0.8, 0.4]) == pytest.approx([0.4, 0.2], abs=0.05)


def test_probe_backoff():
    p = ProbeState()
    for _ in range(8):
        p.update(kept=0, accepted=0, probed=False)
    assert p.due()
    p.update(kept=1, accepted=0, probed=True)                                      # a failed probe: wait longer
    assert p.gap == 16 and not p.due()
    p.update(kept=1, accepted=1, probed=True)
    assert p.gap == 8


def test_a_new_sequence_inherits_its_drafters_probe_gap_up_to_a_bound(target):
    """After a drafter's probes failed on one request, the next request of that drafter waits as long
    before its first probe, but never longer than ``ControllerConfig.inherited_gap`` (so one kind of prompt cannot
    switch the drafter off for the next kind); a successful probe gives the short gap back.  (The
    guard off: it would find plain steps faster and rest the drafter, so no probe would run.)"""
    eng = Engine(target, {"o": create("oracle", target, alpha=0.0)}, max_batch=1, max_len=160, guard=False)
    eng.controller.cost = MODERATE.fresh()
    eng.generate([Request(PROMPTS[1], 60, drafter="o", num_draft=AUTO_SIZE)])
    gap = eng.controller.history.gaps["o"]
    assert gap >= 16                                                               # probes failed and backed off
    eng.generate([Request(PROMPTS[1], 130, drafter="o", num_draft=AUTO_SIZE)])
    assert eng.controller.history.gaps["o"] > DEFAULTS.inherited_gap                        # backed off further
    s = SeqView(99, "o", AUTO_SIZE, 10, 50)
    assert eng.controller.probe(s).gap == DEFAULTS.inherited_gap
    assert eng.controller.probe(SeqView(98, "other", AUTO_SIZE, 10, 50)).gap == DEFAULTS.probe_gap
    eng.controller.learn(s, DraftProposal([5]), [0], StepPlan({99: 1}, {99}))   # an accepted probe
    assert eng.controller.history.gaps["o"] == DEFAULTS.probe_gap


@pytest.fixture(scope="module")
def target():
    return tiny_model(seed=21, vocab=64, layers=2)


PROMPTS = [[1, 2, 3, 4, 5, 1, 2, 3], [10, 20, 30, 40, 50, 60, 10, 20] * 3, [9, 8, 7, 6, 5, 4]]


@pytest.fixture(scope="module")
def plain(target):
    eng = Engine(target, {"none": create("none", target)}, max_batch=1, max_len=160)
    return [eng.generate([Request(p, 60)])[0].tokens for p in PROMPTS]


def run(target, name, drafter, cost, prompts, n=60, batch=1):
    eng = Engine(target, {name: drafter}, max_batch=batch, max_len=160)
    eng.controller.cost = cost.fresh()        # a copy: the engine corrects its own, never the shared one
    return eng.generate([Request(p, n, drafter=name, num_draft=AUTO_SIZE) for p in prompts])


def test_auto_picks_zero_when_nothing_is_accepted(target, plain):
    """An oracle that is always wrong: after the first rejections only probes draft, and rarely."""
    outs = run(target, "o", create("oracle", target, alpha=0.0), MODERATE, PROMPTS[:1])
    nodes = outs[0].stats.nodes_per_step
    assert outs[0].tokens == plain[0]
    assert sum(n > 0 for n in nodes[10:]) <= len(nodes[10:]) // 6 + 1            # probes only


def test_auto_picks_the_longest_draft_when_everything_is_accepted_and_cheap(target, plain):
    outs = run(target, "o", create("oracle", target, alpha=1.0), FLAT, PROMPTS[:1])
    s = outs[0].stats
    assert outs[0].tokens == plain[0]
    top = create("oracle", target).max_auto_draft
    assert max(s.nodes_per_step) == top and sorted(s.nodes_per_step)[len(s.nodes_per_step) // 2] == top


def test_auto_picks_zero_when_passes_are_expensive(target, plain):
    outs = run(target, "o", create("oracle", target, alpha=0.8), STEEP, PROMPTS[:1])
    assert outs[0].tokens == plain[0]
    nodes = outs[0].stats.nodes_per_step
    assert sum(n > 0 for n in nodes) <= len(nodes) // 6 + 1


@pytest.mark.parametrize("name,opts", [("ngram", {}), ("ngram-tree", {}), ("draft-model", None), ("oracle", {"alpha": 0.5})])
def test_auto_never_changes_greedy_output(target, plain, name, opts):
    """auto on a calibrated cost model, alone and batched: the output is plain decoding's."""
    opts = {"model": tiny_model(seed=5, vocab=64, layers=1)} if opts is None else opts
    cost = calibrate(target.model, max_tokens=32)
    outs = run(target, name, create(name, target, **opts), cost, PROMPTS, batch=2)
    assert [o.tokens for o in outs] == plain


def test_thread_governor_follows_the_machine():
    """Simulated pass-time ratios: alone 2 threads are faster (1.0 vs 1.7); beside a busy program
    2 threads crawl (3.5): the governor moves to 1 thread, and back once the machine is free, and
    alone it spends few steps trying the slower count.  The first pass after every change of thread
    count costs twice as much (threads are woken or parked), which must not keep it from coming back."""
    from specserve.control import ThreadGovernor
    gov = ThreadGovernor((2, 1))
    machine = {2: 1.0, 1: 1.7}
    last = [2]

    def run(steps):
        used = []
        for _ in range(steps):
            n = gov.next()
            gov.observe(n, machine[n] * (2.0 if n != last[0] else 1.0))
            last[0] = n
            used.append(n)
        return used
    used = run(400)
    assert gov.current == 2 and used.count(1) <= 2 * (400 // 90 + 2)        # alone: rare looks (2 passes each)
    machine[2] = 3.5                                                          # a busy program appears
    used = run(200)
    assert gov.current == 1 and used[-100:].count(2) <= 2 * (100 // 20)      # on 1 thread, looking back now and then
    machine[2] = 1.0                                                          # ... and goes away
    used = run(60)
    assert gov.current == 2 and used[-10:] == [2] * 10


def test_future_gain_counts_toward_keeping_a_node_but_not_toward_calibration(target):
    """Two sibling nodes with no chance of acceptance now; the second is worth 0.5 tokens in later
    steps (lookahead's window): under a moderate cost only that one is kept, and what it predicted
    for calibration is its confidence alone (0), so accepting nothing does not lower the drafter's
    calibration."""
    eng = Engine(target, {"x": create("ngram-tree", target)}, max_batch=1, max_len=160)
    eng.controller.cost = MODERATE.fresh()
    prop = DraftProposal([3, 4], None, [-1, -1], [0.0, 0.0], [0.0, 0.5])
    proposals = {0: prop}
    view, plan = SeqView(0, "x", AUTO_SIZE, 10, 50), StepPlan({0: 2})
    eng.controller.keep([view], proposals, plan)
    assert proposals[0].tokens == [4] and proposals[0].future_gain == [0.5]
    before = eng.controller.acceptance.calibration("x", 0)
    eng.controller.learn(view, proposals[0], [], plan)
    assert eng.controller.acceptance.calibration("x", 0) == before
    proposals = {0: DraftProposal([3, 4], None, [-1, -1], [0.0, 0.0])}                 # no future gain: nothing kept
    eng.controller.keep([view], proposals, plan)
    assert proposals[0].tokens == []


def test_thread_governor_survives_the_other_count_measured_first():
    """Steps that carry prompt chunks are not observed, so a look at the other thread count can be
    the first measurement: the governor keeps its current count until that one is measured too."""
    from specserve.control import ThreadGovernor
    gov = ThreadGovernor((2, 1))
    gov.observe(1, 0.5)
    assert gov.current == 2
    gov.observe(2, 1.0)
    assert gov.current == 1                                    # both measured: the faster wins


# ------------------------------------------------------------------ the controller alone (no engine, no model)
def controller(cost=MODERATE, **traits):
    t = {"chain": Traits(8, False), "conf": Traits(12, True)} | traits
    return Controller(t, cost, max_draft=32, thread_choices=(1,))


def test_plan_budgets_by_hand():
    """A fixed draft size is given as asked; nothing is drafted at the last token; a drafter whose
    nodes carry confidences gets its largest draft (the rate rule trims it later); a chain drafter
    the length the rate rule picks: on FLAT passes with a certain drafter, its largest."""
    ctl = controller(cost=FLAT)
    for _ in range(20):
        ctl.acceptance.observe("chain", 0, reached=8, accepted=8, predicted=None)
    views = [SeqView(0, "chain", AUTO_SIZE, 10, 50), SeqView(1, "conf", AUTO_SIZE, 10, 50), SeqView(2, "chain", 3, 10, 50),
             SeqView(3, "conf", AUTO_SIZE, 10, 0)]
    plan = ctl.plan(views)
    assert plan.budgets == {0: 8, 1: 12, 2: 3, 3: 0} and plan.probed == set()
    assert controller(cost=STEEP).plan(views[:1]).budgets == {0: 0}              # every extra token a whole pass


def test_chain_budget_charges_the_drafting_cost():
    """The chain length follows the same rate rule as the kept nodes: drafting that costs more than
    its tokens save gets no draft (FLAT passes, a drafter accepted 60% of the time per token)."""
    ctl = controller(cost=FLAT)
    for _ in range(30):
        ctl.acceptance.observe("chain", 0, reached=4, accepted=2, predicted=None)
    view = SeqView(0, "chain", AUTO_SIZE, 10, 50)
    assert ctl.plan([view]).budgets[0] > 0
    ctl.observe_draft("chain", 0.050, 1)                                           # 50 ms a proposal
    assert ctl.plan([view]).budgets[0] == 0


def test_a_costly_unkept_drafter_drafts_only_to_probe():
    ctl = controller()
    ctl.observe_draft("conf", 0.005, 1)                                            # half a 10 ms pass: costly
    view = SeqView(0, "conf", AUTO_SIZE, 10, 50)
    ctl.history.kept[(0, "conf")] = 0                                              # its last draft was not kept
    wait = math.ceil(0.005 / (DEFAULTS.probe_share * 0.010))                       # 25 steps: a probe costs at
    assert wait > DEFAULTS.probe_gap                                               # most probe_share of them
    for _ in range(wait):
        plan = ctl.plan([view])
        assert plan.budgets[0] == 0 and not plan.probed
        ctl.learn(view, DraftProposal([]), [], plan)
    plan = ctl.plan([view])
    assert plan.probed == {0} and plan.budgets[0] == 2                             # due: a small probe
    ctl.history.kept[(0, "conf")] = 3
    assert ctl.plan([view]).budgets[0] == 8                                        # near what was kept: 2 * 3 + 2
    new = SeqView(1, "conf", AUTO_SIZE, 10, 50)
    assert ctl.plan([new]).budgets[1] == 2                                         # a new sequence: a small look
    assert controller().plan([new]).budgets[1] == 12                               # not costly: the largest draft


def test_forget_drops_a_sequences_state():
    ctl = controller()
    view = SeqView(7, "chain", AUTO_SIZE, 10, 50)
    plan = ctl.plan([view])
    ctl.learn(view, DraftProposal([1, 2]), [0], plan)
    ctl.history.kept[(7, "chain")] = 1
    ctl.forget(7)
    assert not ctl.history.probes and not ctl.history.kept and not ctl.acceptance.by_seq
    assert "chain" in ctl.acceptance.by_drafter                                    # the drafter's history stays


# ------------------------------------------------------------------ measurement, and its cache on disk
def test_cost_model_is_measured_once_then_read_from_disk(tmp_path, monkeypatch):
    """A second process (here: a new model object of the same file and options) reads the table
    from disk instead of measuring; other options, or a damaged file, measure again."""
    from specserve.control import measure
    monkeypatch.setenv("SPECSERVE_CACHE", str(tmp_path))
    calls = []
    real = measure.calibrate
    monkeypatch.setattr(measure, "calibrate", lambda model, max_tokens: calls.append(max_tokens) or real(model, max_tokens=max_tokens))
    weights = tmp_path / "weights.bin"
    weights.write_bytes(b"x" * 10)
    a, b = tiny_model(seed=3, vocab=64, layers=1), tiny_model(seed=3, vocab=64, layers=1)
    key = measure.identity(str(weights), a.options, a.model)
    first = measure.cost_model(a.model, 16, key)
    assert calls == [16] and len(list((tmp_path / "costs").glob("*.json"))) == 1
    again = measure.cost_model(b.model, 16, key)                                   # another model object
    assert calls == [16] and again.tokens == first.tokens and again.seconds == first.seconds
    assert again.scale == 1.0 and again.observed == 0                              # no correction carried over
    assert measure.cost_model(b.model, 64, key).tokens[-1] == 64 and calls == [16, 64]   # a bigger table
    other = measure.identity(str(weights), "other options", a.model)
    assert other != key
    (tmp_path / "costs" / f"{key}.json").write_text("{not json")
    measure.cost_model(tiny_model(seed=3, vocab=64, layers=1).model, 16, key)
    assert calls == [16, 64, 16]                                                   # damaged: measured again
    assert measure.identity(str(tmp_path / "missing.gguf"), a.options, a.model) is None
    if a.model.kernel == "native":                     # new kernel sources: new timings, measured again
        from specserve.models.native import build
        monkeypatch.setattr(build, "build_key", lambda: "other sources")
        assert measure.identity(str(weights), a.options, a.model) != key


def test_an_engine_measures_at_construction_never_in_a_step(target, monkeypatch):
    """Requests, auto ones included, and prompt chunks beside decoding never start a measurement."""
    from specserve.control import measure
    eng = Engine(target, {"o": create("oracle", target, alpha=0.8), "none": create("none", target)}, max_batch=2,
                 max_len=160)
    monkeypatch.setattr(measure, "calibrate", lambda *a, **k: pytest.fail("measured inside a request"))
    outs = eng.generate([Request(PROMPTS[0], 20, drafter="o", num_draft=AUTO_SIZE), Request(PROMPTS[1] * 3, 20)])
    assert all(len(o.tokens) == 20 for o in outs)


def test_drawn_nodes_are_trimmed_by_their_depths_never_by_their_own_draws():
    """A drawn node kept only when its own q is high is no longer distributed as q, and the output
    is biased (q = (0.9, 0.1), p = (0.5, 0.5), the node kept only when it drew the first token: the
    first token comes out with probability 0.55).  So two drawn proposals of one shape, one with
    likely draws and one with unlikely ones, keep the same nodes; the same proposals without q rows
    (deterministic nodes, which verification accepts exactly however chosen) are trimmed by their
    confidences."""
    c = controller()
    view, plan = SeqView(0, "conf", AUTO_SIZE, 10, 50), StepPlan({0: 2})
    q = torch.full((2, 8), 1 / 8)

    def kept(probs, conf):
        props = {0: DraftProposal([3, 4], probs, None, conf)}
        c.keep([view], props, plan)
        return props[0].tokens
    assert kept(q, [0.95, 0.9]) == kept(q, [0.01, 0.005])
    assert kept(None, [0.95, 0.9]) == [3, 4] and kept(None, [0.01, 0.005]) == []


def test_cost_interpolation_is_numpys():
    """The cost table's plain-Python interpolation gives numpy.interp's bits: 20000 seeded points,
    integers (on and between the table's sizes) and fractions, inside and past both ends."""
    import random

    import numpy as np

    from specserve.control.cost import interp
    rng = random.Random(0)
    xs = [1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32, 48, 64]
    ys = sorted(rng.random() * 0.05 for _ in xs)
    for _ in range(20000):
        x = rng.randint(-2, 70) if rng.random() < 0.5 else rng.uniform(-2, 70)
        assert interp(x, xs, ys) == float(np.interp(x, xs, ys)), x
