"""The speculative loop on tiny random models: greedy identity, stops, limits, refusals."""

import pytest
import torch

from conftest import tiny_model
from specserve.drafters import DraftProposal, Drafter, create
from specserve.engine import Engine, Request
from specserve.errors import SpecserveError
from specserve.sampling import SamplingParams

PROMPTS = [[1, 2, 3, 4, 5, 1, 2, 3], [7, 7, 7], [10, 20, 30, 40, 50, 60, 10, 20] * 3, [5], [9, 8, 7, 6, 5, 4]]


@pytest.fixture(scope="module", params=["native", "native-int8", "native-int8-bf16", "fbgemm"])
def target(request):
    """Every engine test runs on the batch-invariant runtimes: native with fp32 and with int8
    activations (over Q4_1 / Q8_0 blocks), the latter with a bf16 KV cache too, and fbgemm."""
    return tiny_model(seed=21, vocab=64, layers=2, kernels=request.param)


@pytest.fixture(scope="module")
def random_draft():
    return tiny_model(seed=5, vocab=64, layers=1)


MAKERS = {
    "none": lambda t, r: create("none", t),
    "ngram": lambda t, r: create("ngram", t, min_n=1, max_n=3),
    "self": lambda t, r: create("draft-model", t, model=t),
    "random": lambda t, r: create("draft-model", t, model=r),
    "oracle": lambda t, r: create("oracle", t, alpha=0.5),
    "tree": lambda t, r: create("ngram-tree", t, max_n=3, max_matches=8),
}


def drafter(target, random_draft, name):
    """A fresh drafter of the named kind (each engine gets its own, so no state carries over)."""
    return MAKERS[name](target, random_draft)


def drafters_for(target, random_draft):
    return {name: drafter(target, random_draft, name) for name in MAKERS}


@pytest.fixture(scope="module")
def plain(target):
    eng = Engine(target, {"none": create("none", target)}, max_batch=1, max_len=128)
    return [eng.generate([Request(p, 40)])[0].tokens for p in PROMPTS]


@pytest.mark.parametrize("k", [1, 4, 8])
@pytest.mark.parametrize("name", ["ngram", "self", "random", "oracle", "tree"])
def test_greedy_identity_alone_and_batched(target, random_draft, plain, name, k):
    alone = Engine(target, {name: drafter(target, random_draft, name)}, max_batch=1, max_len=128)
    for p, ref in zip(PROMPTS, plain):
        assert alone.generate([Request(p, 40, drafter=name, num_draft=k)])[0].tokens == ref
    batched = Engine(target, {name: drafter(target, random_draft, name)}, max_batch=3, max_len=128)  # 5 requests, 3 slots
    outs = batched.generate([Request(p, 40, drafter=name, num_draft=k) for p in PROMPTS])
    assert [o.tokens for o in outs] == plain


def test_self_draft_accepts_everything(target, plain):
    eng = Engine(target, {"self": create("draft-model", target, model=target)}, max_batch=2, max_len=128)
    for out in eng.generate([Request(p, 40, drafter="self", num_draft=4) for p in PROMPTS[:2]]):
        assert out.stats.accepted_tokens == out.stats.drafted_tokens > 0


def test_mixed_drafters_and_lengths_in_one_batch(target, random_draft, plain):
    eng = Engine(target, drafters_for(target, random_draft), max_batch=5, max_len=128)
    reqs = [Request(p, 40, drafter=d, num_draft=k) for p, (d, k) in
            zip(PROMPTS, [("none", 0), ("ngram", 3), ("self", 5), ("random", 2), ("oracle", 8)])]
    assert [o.tokens for o in eng.generate(reqs)] == plain
    # trees and chains in one pass
    reqs = [Request(p, 40, drafter=d, num_draft=k) for p, (d, k) in
            zip(PROMPTS, [("tree", 12), ("ngram", 3), ("tree", 1), ("oracle", 8), ("tree", 32)])]
    assert [o.tokens for o in eng.generate(reqs)] == plain


def test_eos_inside_accepted_run_stops_exactly(target, plain):
    ref = plain[0]
    eos = ref[9]                                       # a token that first appears at index j <= 9
    j = ref.index(eos)
    eng = Engine(target, {"oracle": create("oracle", target, alpha=1.0)}, max_batch=1, max_len=128)
    out = eng.generate([Request(PROMPTS[0], 40, drafter="oracle", num_draft=8, eos_ids=frozenset({eos}))])[0]
    assert out.tokens == ref[: j + 1] and out.finish_reason == "stop"


def test_stop_function_and_max_tokens(target, plain):
    eng = Engine(target, {"oracle": create("oracle", target, alpha=1.0)}, max_batch=1, max_len=128)
    out = eng.generate([Request(PROMPTS[0], 40, drafter="oracle", num_draft=8,
                                stop_fn=lambda gen: len(gen) >= 2 and gen[-2:] == plain[0][5:7])])[0]
    assert out.tokens == plain[0][:7]
    for n in (1, 2, 3, 7, 13):
        out = eng.generate([Request(PROMPTS[0], n, drafter="oracle", num_draft=8)])[0]
        assert out.tokens == plain[0][:n] and out.finish_reason == "length"


def test_statistics_are_consistent(target):
    eng = Engine(target, {"oracle": create("oracle", target, alpha=0.5)}, max_batch=1, max_len=128)
    s = eng.generate([Request(PROMPTS[2], 40, drafter="oracle", num_draft=4)])[0].stats
    assert s.generated_tokens == 40 == len(s.token_times)
    assert s.accepted_tokens + s.verify_passes + 1 == s.generated_tokens     # +1: the prefill token
    assert all(a <= d for a, d in zip(s.accepted_per_depth, s.drafted_per_depth))
    assert s.mean_accepted_length == pytest.approx((s.accepted_tokens + s.verify_passes) / s.verify_passes)
    assert s.synthetic and 0 < s.ttft_s <= s.total_s


@pytest.mark.parametrize("req,msg,param", [
    (Request([], 5), "empty prompt", "prompt"),
    (Request([1], 0), "max_tokens", "max_tokens"),
    (Request([1] * 120, 20), "exceeds the context length", "max_tokens"),
    (Request([1], 5, drafter="nope"), "not loaded", "drafter"),
    (Request([1], 5, drafter="oracle", num_draft=-1), "num_draft", "num_draft"),
    (Request([1], 5, drafter="oracle", sampling=SamplingParams(0.7)), "greedy decoding only", "temperature"),
    (Request([999], 5), "token ids", "prompt"),
])
def test_bad_requests_refused(target, req, msg, param):
    """Each refusal says why and names the offending field (the server reports it as ``param``)."""
    eng = Engine(target, {"none": create("none", target), "oracle": create("oracle", target)}, max_batch=1, max_len=128)
    with pytest.raises(SpecserveError, match=msg) as info:
        eng.admit(req)
    assert info.value.param == param
    assert eng.free_capacity == 1 and eng.num_running == 0                    # nothing leaked


def test_registry_refusals(target):
    with pytest.raises(SpecserveError, match="unknown drafter"):
        create("medusa-typo", target)
    with pytest.raises(SpecserveError, match="takes no option"):
        create("ngram", target, alpha=3)
    with pytest.raises(SpecserveError, match="min_n"):
        create("ngram", target, min_n=3, max_n=2)
    with pytest.raises(SpecserveError, match="alpha"):
        create("oracle", target, alpha=1.5)
    with pytest.raises(SpecserveError, match="vocabulary size"):
        create("draft-model", target, model=tiny_model(seed=1, vocab=32))


def test_abort_frees_the_slot(target):
    eng = Engine(target, {"none": create("none", target)}, max_batch=1, max_len=128)
    sid = eng.admit(Request(PROMPTS[0], 40))
    eng.step()
    eng.abort(sid)
    assert eng.free_capacity == 1 and eng.num_running == 0
    assert eng.progress(sid) is None and eng.take_result(sid) is None        # an aborted sequence leaves nothing


def test_tree_drafter_accepts_more_than_its_first_branch(target, plain):
    """On a repetitive prompt the tree's extra branches get accepted: some step accepts a path that
    does not start with the tree's first node (node 0)."""
    eng = Engine(target, {"tree": create("ngram-tree", target, max_matches=8)}, max_batch=1, max_len=128)
    seen = []
    drafter = eng.drafters["tree"]
    original = drafter.feedback
    drafter.feedback = lambda fb: (seen.append(fb.accepted), original(fb))
    out = eng.generate([Request(PROMPTS[2], 40, drafter="tree", num_draft=16)])[0]
    assert out.tokens == plain[2]
    assert any(path and path[0] != 0 for path in seen)
    assert out.stats.mean_nodes_per_step > 1 and len(out.stats.nodes_per_step) == out.stats.verify_passes


@pytest.mark.parametrize("name,k", [("self", 4), ("tree", 8), ("ngram", 4)])
def test_seeded_sampling_is_the_same_alone_and_batched(target, random_draft, name, k):
    """Each sampled row draws from its own generator in amounts fixed by its own proposal, and the
    runtime is batch-invariant: a seeded request samples the same tokens alone and in a batch."""
    params = [SamplingParams(0.9, seed=s) for s in range(4)]
    alone = Engine(target, {name: drafter(target, random_draft, name)}, max_batch=1, max_len=128)
    solo = [alone.generate([Request(p, 24, sampling=sp, drafter=name, num_draft=k)])[0].tokens
            for p, sp in zip(PROMPTS, params)]
    batched = Engine(target, {name: drafter(target, random_draft, name)}, max_batch=4, max_len=128)
    outs = batched.generate([Request(p, 24, sampling=sp, drafter=name, num_draft=k) for p, sp in zip(PROMPTS, params)])
    assert [o.tokens for o in outs] == solo


class FeatureProbe(Drafter):
    """Declares target layers and records every feature it is handed."""

    def __init__(self, layers):
        self.feature_layers = layers
        self.got: dict[int, list] = {}

    def propose(self, requests):
        return [DraftProposal([1, 2, 3], parents=[-1, -1, 0]) for _ in requests]

    def feedback(self, fb):
        self.got.setdefault(fb.seq_id, []).append(fb)


def test_drafters_get_features_of_committed_positions(target, plain):
    """Features arrive for the prompt after the prefill, then for the pending token and the
    accepted nodes of every step: together exactly the features of a chain pass over the final
    sequence (bit for bit on these runtimes), one row per committed position."""
    last = target.config.num_layers
    probe = FeatureProbe((1, last))
    eng = Engine(target, {"probe": probe}, max_batch=1, max_len=128)
    out = eng.generate([Request(PROMPTS[0], 20, drafter="probe", num_draft=3)])[0]
    fbs = next(iter(probe.got.values()))
    seq = PROMPTS[0] + out.tokens
    m = target.model
    ref = m(torch.tensor([seq]), m.new_cache(1, 64), [0], [0], features=(1, last)).features
    for layer in (1, last):
        got = torch.cat([fb.features[layer] for fb in fbs])
        n = got.shape[0]                       # positions the cache committed (the last token is pending)
        assert n == len(seq) - 1 or out.finish_reason == "length"
        assert torch.equal(got, ref[layer][0, :n])
    assert [len(fb.emitted) for fb in fbs[1:]] == [len(fb.accepted) + 1 for fb in fbs[1:]]


def test_no_features_when_none_declared(target):
    seen = []
    drafter = create("ngram", target)
    drafter.feedback = seen.append
    Engine(target, {"ngram": drafter}, max_batch=1, max_len=128).generate([Request(PROMPTS[0], 10, drafter="ngram",
                                                                                  num_draft=3)])
    assert seen and all(fb.features == {} for fb in seen)


def test_making_the_kv_budget_resident_changes_no_output(target, plain):
    from specserve.control import PrefillPolicy
    eng = Engine(target, {"ngram": create("ngram", target, min_n=1, max_n=3)}, max_batch=2, max_len=128,
                 prefill=PrefillPolicy(16, 5.0, 1))
    c, pool = eng.rows.cache, eng.prefixes.pool
    expect = sum(t.numel() * t.element_size() for t in (c.k_all, c.v_all, pool.k, pool.v))
    assert eng.make_resident() == expect and not c.k_all.any() and not pool.v.any()
    assert [o.tokens for o in eng.generate([Request(p, 40, drafter="ngram", num_draft=4) for p in PROMPTS])] == plain
