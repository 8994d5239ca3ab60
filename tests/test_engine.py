"""The speculative loop on tiny random models: greedy identity, stops, limits, refusals."""

import pytest
import torch

from conftest import tiny_model
from specserve.drafters import create
from specserve.engine import Engine, Request
from specserve.errors import SpecserveError
from specserve.sampling import SamplingParams

PROMPTS = [[1, 2, 3, 4, 5, 1, 2, 3], [7, 7, 7], [10, 20, 30, 40, 50, 60, 10, 20] * 3, [5], [9, 8, 7, 6, 5, 4]]


@pytest.fixture(scope="module", params=["native", "fbgemm"])
def target(request):
    """Every engine test runs on both batch-invariant runtimes."""
    return tiny_model(seed=21, vocab=64, layers=2, kernels=request.param)


def drafters_for(target):
    return {
        "none": create("none", target),
        "ngram": create("ngram", target, min_n=1, max_n=3),
        "self": create("draft-model", target, model=target),
        "random": create("draft-model", target, model=tiny_model(seed=5, vocab=64, layers=1)),
        "oracle": create("oracle", target, alpha=0.5),
    }


@pytest.fixture(scope="module")
def plain(target):
    eng = Engine(target, {"none": create("none", target)}, max_batch=1, max_len=128)
    return [eng.generate([Request(p, 40)])[0].tokens for p in PROMPTS]


@pytest.mark.parametrize("k", [1, 4, 8])
@pytest.mark.parametrize("name", ["ngram", "self", "random", "oracle"])
def test_greedy_identity_alone_and_batched(target, plain, name, k):
    drafters = drafters_for(target)
    alone = Engine(target, {name: drafters[name]}, max_batch=1, max_len=128)
    for p, ref in zip(PROMPTS, plain):
        assert alone.generate([Request(p, 40, drafter=name, num_draft=k)])[0].tokens == ref
    batched = Engine(target, {name: drafters_for(target)[name]}, max_batch=3, max_len=128)  # 5 requests, 3 slots
    outs = batched.generate([Request(p, 40, drafter=name, num_draft=k) for p in PROMPTS])
    assert [o.tokens for o in outs] == plain


def test_self_draft_accepts_everything(target, plain):
    eng = Engine(target, {"self": create("draft-model", target, model=target)}, max_batch=2, max_len=128)
    for out in eng.generate([Request(p, 40, drafter="self", num_draft=4) for p in PROMPTS[:2]]):
        assert out.stats.accepted_tokens == out.stats.drafted_tokens > 0


def test_mixed_drafters_and_lengths_in_one_batch(target, plain):
    eng = Engine(target, drafters_for(target), max_batch=5, max_len=128)
    reqs = [Request(p, 40, drafter=d, num_draft=k) for p, (d, k) in
            zip(PROMPTS, [("none", 0), ("ngram", 3), ("self", 5), ("random", 2), ("oracle", 8)])]
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


def test_ngram_propose_by_hand():
    import numpy as np
    from specserve.drafters.ngram import ngram_propose
    t = np.array([1, 2, 3, 4, 1, 2])
    assert ngram_propose(t, 1, 3, 3) == [3, 4, 1]
    assert ngram_propose(t, 1, 3, 1) == [3]
    assert ngram_propose(np.array([5, 6, 7]), 1, 3, 4) == []
    assert ngram_propose(np.array([1, 9, 1, 8, 1]), 1, 1, 2) == [8, 1]   # most recent match wins


def test_abort_frees_the_slot(target):
    eng = Engine(target, {"none": create("none", target)}, max_batch=1, max_len=128)
    sid = eng.admit(Request(PROMPTS[0], 40))
    eng.step()
    eng.abort(sid)
    assert eng.free_capacity == 1 and eng.num_running == 0
    assert eng.progress(sid) is None and eng.take_result(sid) is None        # an aborted sequence leaves nothing
