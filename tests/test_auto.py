"""``auto``: every part's proposal merged into one tree, each part priced, calibrated and fed back on its own.

Hand-built merges (a path drafted twice appears once, with both parts' confidences; drawn nodes are
never merged and keep their q), the feedback each part gets, the controller's per-part decisions
(calibration, a costly part that adds nothing drafts only to probe, one that adds keeps running),
greedy identity through the engine, and the bounds on what a new request inherits.  The sampling
law of merged trees is tested in ``test_distribution.py``.
"""

import pytest
import torch

from conftest import tiny_head, tiny_model
from specserve.control import AcceptanceModel, Controller, CostModel, SeqView, StepPlan, Traits
from specserve.control.parts import part_key
from specserve.drafters import DraftProposal, DraftRequest, DrafterSpec, Feedback, create
from specserve.drafters.auto import merge
from specserve.drafters.base import Drafter, MergedProposal, draft_s_by_part, parts_of
from specserve.engine import Engine, Request
from specserve.errors import SpecserveError
from specserve.limits import AUTO_SIZE
from specserve.sampling import SamplingParams

MODERATE = CostModel([1, 2, 64], [0.010, 0.011, 0.073], 0.0)
PROMPTS = [[1, 2, 3, 4, 5, 1, 2, 3], [10, 20, 30, 40, 50, 60, 10, 20] * 3, [9, 8, 7, 6, 5, 4]]


@pytest.fixture(scope="module")
def target():
    return tiny_model(seed=21, vocab=64, layers=2)


class Fixed(Drafter):
    """A part that proposes the same tree every step and records the feedback it gets."""
    tree = True
    confidence = True
    max_auto_draft = 8

    def __init__(self, tokens, parents, conf, probs=None):
        self.prop = DraftProposal(tokens, probs, parents, conf)
        self.got: list[Feedback] = []

    def propose(self, requests):
        return [self.prop.truncated(r.k, r.max_depth) for r in requests]

    def feedback(self, fb):
        self.got.append(fb)


# ------------------------------------------------------------------ the merge
def test_a_path_drafted_by_two_parts_appears_once_with_both_confidences():
    a = DraftProposal([5, 6, 7], None, [-1, 0, -1], [0.9, 0.5, 0.2])          # 5 -> 6, and 7
    b = DraftProposal([5, 8], None, [-1, 0], [0.6, 0.4])                      # 5 -> 8
    m = merge({"a": a, "b": b}, 32)
    paths = {tuple(p): o for p, o in zip(m.paths(), m.origins)}
    assert set(paths) == {(5,), (5, 6), (5, 8), (7,)} and m.probs is None
    assert paths[(5,)] == {"a": 0.9, "b": 0.6} and paths[(5, 8)] == {"b": 0.4} and paths[(7,)] == {"a": 0.2}
    assert m.tokens[:2] == [5, 6] and m.parents[1] == 0                      # the best path first, as a chain
    small = merge({"a": a, "b": b}, 2)                                      # the two best nodes: 5, then 6
    assert small.paths() == [(5,), (5, 6)]


def test_drawn_nodes_keep_their_q_and_are_never_merged():
    """A sampled part's nodes follow the trie's as their own subtree, even where a trie node holds the
    same token; the trie's rows of ``probs`` are one-hot."""
    q = torch.full((2, 10), 0.1)
    fixed = DraftProposal([3, 4], None, [-1, 0], [0.8, 0.7])
    drawn = DraftProposal([3, 9], q, [-1, -1], [0.5, 0.4])
    m = merge({"fixed": fixed, "drawn": drawn}, 32)
    assert m.tokens == [3, 4, 3, 9] and m.parents == [-1, 0, -1, -1]
    assert torch.equal(m.probs[0], torch.nn.functional.one_hot(torch.tensor(3), 10).float())
    assert torch.equal(m.probs[2:], q) and m.origins[2] == {"drawn": 0.5}
    assert m.trim_confidence() is None                                       # drawn: trimmed by depth only
    m.check(10)


def test_each_part_gets_its_own_verified_draft_and_accepted_nodes(target):
    a, b = Fixed([5, 6], [-1, 0], [0.9, 0.8]), Fixed([5, 7, 9], [-1, 0, -1], [0.6, 0.3, 0.2])
    auto = create("auto", target, parts={"a": a, "b": b})
    auto.begin(0, [1, 2], SamplingParams(), 10)
    m = auto.propose([DraftRequest(0, [1, 2], 8, SamplingParams())])[0]
    kept = m.subset([i for i, p in enumerate(m.paths()) if p != (9,)])          # the controller drops 9
    path = [i for i, p in enumerate(kept.paths()) if p in {(5,), (5, 7)}]     # 5 then 7 accepted
    auto.feedback(Feedback(0, kept, path, [5, 7, 11], {}, None))
    fa, fb = a.got[-1], b.got[-1]
    assert fa.proposal.tokens == [5, 6] and fa.accepted == [0] and fa.emitted == [5, 7, 11]
    assert fb.proposal.tokens == [5, 7] and fb.accepted == [0, 1]           # 9 was not verified


def test_each_proposal_carries_its_share_of_every_asked_parts_seconds(target):
    """A part's ``propose`` seconds come back with the proposals, shared out over the requests it
    drafted for; a part given no budget for a request gets no share of it."""
    a, b = Fixed([5, 6], [-1, 0], [0.9, 0.8]), Fixed([7], [-1], [0.5])
    auto = create("auto", target, parts={"a": a, "b": b})
    reqs = [DraftRequest(i, [1, 2], 8, SamplingParams(), parts={"a": 2, "b": 1 if i else 0}) for i in range(3)]
    props = auto.propose(reqs)
    assert [sorted(p.part_draft_s) for p in props] == [["a"], ["a", "b"], ["a", "b"]]
    assert props[1].part_draft_s["a"] == props[0].part_draft_s["a"] > 0      # one call, three equal shares
    totals = draft_s_by_part(props)
    assert totals["a"][1] == 3 and totals["b"][1] == 2
    assert totals["a"][0] == pytest.approx(3 * props[0].part_draft_s["a"])
    assert draft_s_by_part([ValueError("a fault"), DraftProposal([1])]) == {}    # faults and other drafters: none
    assert parts_of(auto) == {"a": a, "b": b} and parts_of(a) == {}           # merging is a type, not a method


def test_parts_are_checked_before_anything_is_loaded():
    assert DrafterSpec.parse("auto:parts=ngram-tree+suffix/own=0").options["parts"] == "ngram-tree+suffix/own=0"
    for bad, why in [("auto:parts=ngram-tree+none", "confidences"), ("auto:parts=oracle", "confidences"),
                     ("auto:parts=suffix/own=2", "own"), ("auto:parts=suffix/own", "option=value"),
                     ("auto:parts=ngram+ngram", "twice"), ("auto:parts=nope", "unknown drafter"),
                     ("auto:parts=ngram-tree+auto", "cannot merge 'auto'")]:
        with pytest.raises(SpecserveError, match=why):
            DrafterSpec.parse(bad)


def test_the_default_parts_and_a_head_that_does_not_fit(target):
    auto = create("auto", target)
    assert list(auto.parts()) == ["ngram-tree", "suffix"] and auto.parts()["suffix"].opts.own == 0
    with pytest.raises(SpecserveError, match="auto part 'eagle'"):              # the shipped head is the real model's
        create("auto", target, parts="ngram-tree+eagle")


# ------------------------------------------------------------------ the controller, part by part
def merged_controller(cost=MODERATE):
    traits = {"auto": Traits(32, True, ("cheap", "costly")), "auto/cheap": Traits(16, True),
              "auto/costly": Traits(16, True)}
    return Controller(traits, cost, max_draft=32, thread_choices=(1,))


def test_each_part_is_calibrated_on_its_own_nodes():
    ctl = merged_controller()
    view = SeqView(0, "auto", AUTO_SIZE, 10, 50)
    for _ in range(30):                           # node 0 (cheap, accepted), node 1 (costly, rejected)
        prop = MergedProposal([1, 2], None, [-1, -1], [0.5, 0.5], origins=[{"cheap": 0.5}, {"costly": 0.5}])
        plan = ctl.plan([view])
        ctl.learn(view, prop, [0], plan)
    assert ctl.acceptance.calibration("auto/cheap", 0) > 1.2                    # accepted twice its confidence
    assert ctl.acceptance.calibration("auto/costly", 0) < 0.3


def test_a_costly_part_that_adds_nothing_drafts_only_to_probe_and_one_that_adds_keeps_running():
    ctl = merged_controller()
    ctl.observe_draft("auto/costly", 0.004, 1)                                 # 40% of a pass: costly
    view = SeqView(0, "auto", AUTO_SIZE, 10, 50)
    plan = ctl.plan([view])
    assert plan.parts[0] == {"cheap": 16, "costly": 2}                         # a new sequence: a small look
    same = [{"cheap": 0.9, "costly": 0.9}, {"cheap": 0.8, "costly": 0.8}]      # it drafts what cheap drafts
    props = {0: MergedProposal([1, 2], None, None, [0.9, 0.8], origins=same)}
    ctl.keep([view], props, plan)
    assert ctl.parts.history.kept[(0, "auto/costly")] == 0 and ctl.plan([view]).parts[0]["costly"] == 0
    ctl2 = merged_controller()
    ctl2.observe_draft("auto/costly", 0.004, 1)
    plan = ctl2.plan([view])
    own = [{"costly": 0.9}, {"costly": 0.9}]                                  # tokens only it drafts
    props = {0: MergedProposal([1, 2], None, None, [0.9, 0.9], origins=own)}
    ctl2.keep([view], props, plan)
    assert ctl2.parts.history.kept[(0, "auto/costly")] == 2 and ctl2.plan([view]).parts[0]["costly"] == 6   # 2 * 2 + 2


def test_a_probed_part_keeps_its_best_root_and_backs_off_when_it_does_not_pay():
    ctl = merged_controller()
    ctl.observe_draft("auto/costly", 0.001, 1)
    view = SeqView(0, "auto", AUTO_SIZE, 10, 50)
    ctl.parts.history.kept[(0, "auto/costly")] = 0
    gap = ctl.parts.history.probe(0, "auto/costly").gap
    for _ in range(gap):
        plan = ctl.plan([view])
        assert plan.parts[0]["costly"] == 0
        ctl.learn(view, DraftProposal([]), [], plan)
    plan = ctl.plan([view])
    assert (0, "costly") in plan.part_probes and plan.parts[0]["costly"] == 2
    origins = [{"cheap": 0.01}, {"costly": 0.01}]                              # worthless: kept only as a probe
    props = {0: MergedProposal([1, 2], None, [-1, -1], [0.01, 0.01], origins=origins)}
    ctl.keep([view], props, plan)
    assert props[0].tokens == [2]                                              # the costly part's root
    ctl.learn(view, props[0], [], plan)
    assert ctl.parts.history.probe(0, "auto/costly").gap == 2 * gap        # it did not pay: a longer wait


CROWDED_COST = CostModel([1, 2, 64], [0.010, 0.020, 0.640], 0.0)   # one more token costs a whole row


def test_a_step_is_crowded_where_one_more_token_costs_most_of_a_row():
    views = [SeqView(i, "auto", AUTO_SIZE, 10, 50) for i in range(4)]
    assert merged_controller().crowding(views) == pytest.approx(0.001 / (0.013 / 4), rel=1e-6)   # base(5) - base(4) over base(4) / 4
    assert merged_controller(CROWDED_COST).crowding(views) == pytest.approx(1.0)
    ctl = merged_controller()
    ctl.plan(views)
    assert not ctl.crowded
    ctl = merged_controller(CROWDED_COST)
    ctl.plan(views)
    assert ctl.crowded


def test_in_a_crowded_step_a_cheap_part_drafts_only_where_its_drafts_are_kept():
    view = SeqView(0, "auto", AUTO_SIZE, 10, 50)
    calm, crowded = merged_controller(), merged_controller(CROWDED_COST)
    for ctl in (calm, crowded):                        # cheap to draft: 1% of a pass
        ctl.observe_draft("auto/cheap", 0.0001, 1)
        ctl.parts.history.kept[(0, "auto/cheap")] = 0                # its last draft was not kept
    assert calm.plan([view]).parts[0]["cheap"] == 16   # calm: the whole budget, kept or not
    assert crowded.plan([view]).parts[0]["cheap"] == 0
    crowded.parts.history.kept[(0, "auto/cheap")] = 2
    assert crowded.plan([view]).parts[0]["cheap"] == 6                          # near what was kept: 2 * 2 + 2
    fresh = SeqView(1, "auto", AUTO_SIZE, 10, 50)
    assert crowded.plan([fresh]).parts[1]["cheap"] == 2                         # a new sequence: a small look
    plan = crowded.plan([fresh])
    origins = [{"cheap": 0.3}, {"cheap": 0.3}]         # worth less than the row each node costs
    props = {1: MergedProposal([1, 2], None, None, [0.3, 0.3], origins=origins)}
    crowded.keep([fresh], props, plan)
    assert props[1].tokens == [] and crowded.plan([fresh]).parts[1]["cheap"] == 0


def test_a_part_probe_succeeds_only_when_the_target_takes_its_node():
    """A probe's node is kept by force; the probe counts as a success (the wait back to its shortest)
    only when the target accepted it, else the wait doubles."""
    ctl = merged_controller(CROWDED_COST)
    ctl.observe_draft("auto/cheap", 0.0001, 1)
    view = SeqView(0, "auto", AUTO_SIZE, 10, 50)
    ctl.parts.history.kept[(0, "auto/cheap")] = 0
    gaps = []
    for accepted in ([], [], [0]):
        while (0, "cheap") not in (plan := ctl.plan([view])).part_probes:
            assert plan.parts[0]["cheap"] == 0
            ctl.learn(view, DraftProposal([]), [], plan)
        props = {0: MergedProposal([7, 8], None, None, [0.01, 0.01], origins=[{"cheap": 0.01}] * 2)}
        ctl.keep([view], props, plan)
        assert props[0].tokens == [7]                                           # the probe: its best root
        ctl.learn(view, props[0], accepted, plan)
        gaps.append(ctl.parts.history.probe(0, "auto/cheap").gap)
        ctl.parts.history.kept[(0, "auto/cheap")] = 0
    assert gaps == [16, 32, 8]


def test_a_merging_drafter_is_probed_part_by_part_never_as_a_whole():
    """An idle auto sequence gets no probe of the merged drafter as a whole (which would force a node
    of whichever part drafted into every pass): only each part's own probe keeps a node."""
    ctl = merged_controller(CROWDED_COST)
    view = SeqView(0, "auto", AUTO_SIZE, 10, 50)
    for _ in range(40):
        plan = ctl.plan([view])
        assert not plan.probed
        ctl.keep([view], {0: DraftProposal([])}, plan)
        ctl.learn(view, DraftProposal([]), [], plan)


def test_a_new_request_inherits_a_floored_calibration():
    """However badly a part did on earlier requests, a new request starts from at least the floor."""
    acc = AcceptanceModel()
    for seq in range(50):
        acc.observe("d", seq, 0, 0, 5.0)
    assert acc.calibration("d", 999) >= acc.prior_floor * 0.99


def test_a_part_that_drafted_nothing_still_counts_towards_its_probe(target):
    """Empty merged proposals still advance each part's idle count (else a switched-off part would
    never be probed again)."""
    ctl = merged_controller()
    ctl.observe_draft("auto/costly", 0.004, 1)
    view = SeqView(0, "auto", AUTO_SIZE, 10, 50)
    ctl.parts.history.kept[(0, "auto/costly")] = 0
    for _ in range(3):
        plan = ctl.plan([view])
        ctl.keep([view], {0: DraftProposal([])}, plan)
        ctl.learn(view, DraftProposal([]), [], plan)
    assert ctl.parts.history.probe(0, "auto/costly").idle == 3


# ------------------------------------------------------------------ through the engine
@pytest.mark.parametrize("k", [AUTO_SIZE, 8, 3])
def test_auto_greedy_is_plain_decoding_alone_and_batched(target, k):
    parts = {"ngram-tree": create("ngram-tree", target), "suffix": create("suffix", target, own=0),
             "eagle": create("eagle", target, head=tiny_head("eagle", target), topk=3, depth=4)}
    eng = Engine(target, {"none": create("none", target), "auto": create("auto", target, parts=parts)},
                 max_batch=3, max_len=200)
    eng.controller.cost = MODERATE.fresh()
    plain = eng.generate([Request(p, 50) for p in PROMPTS])
    for batch in (PROMPTS[:1], PROMPTS):
        out = eng.generate([Request(p, 50, drafter="auto", num_draft=k) for p in batch])
        assert [o.tokens for o in out] == [o.tokens for o in plain[:len(batch)]]
        assert all(o.stats.drafter_faults == 0 for o in out)
    if k != AUTO_SIZE:
        assert sum(o.stats.to_dict()["mean_accepted_length"] for o in out) > 3    # it did draft and accept
    assert part_key("auto", "eagle") in eng.controller.draft_s                 # each part's cost is measured


def test_reset_memory_empties_the_corpus_of_every_part(target):
    auto = create("auto", target, parts="ngram-tree+suffix/own=0")
    suffix = auto.parts()["suffix"]
    auto.begin(0, [1, 2, 3, 4, 5, 6], SamplingParams(), 10)
    auto.end(0)
    assert suffix.index.tokens == 6
    assert auto.reset_memory() and suffix.index.tokens == 0
    assert not create("ngram-tree", target).reset_memory()                     # nothing across requests
