"""Training-free drafters: suffix decoding across requests (corpus, index, eviction, warm start,
thread safety) and its greedy identity through the engine."""

import collections
import json
import threading

import numpy as np
import pytest

from conftest import tiny_model
from specserve.drafters import DraftRequest, Feedback, create
from specserve.drafters.suffix import SuffixIndex
from specserve.engine import Engine, Request
from specserve.errors import SpecserveError
from specserve.sampling import SamplingParams


def test_an_earlier_request_is_proposed_from():
    d = create("suffix", None)
    greedy = SamplingParams()
    earlier = [1, 2, 3, 4, 50, 51, 52, 53, 54, 55]
    d.begin(0, earlier[:4], greedy, 6)
    d.propose([DraftRequest(0, earlier, 0, greedy, 0)])       # the engine hands over its live token list
    d.end(0)                                                  # the finished text joins the corpus
    assert d.describe()["corpus_tokens"] == 10 and d.describe()["corpus_texts"] == 1
    # a new request whose own text never continued "3 4 50" proposes what the earlier one said next
    prop = d.propose_one(np.array([9, 9, 3, 4, 50]), 8, 8)
    assert prop.tokens[:5] == [51, 52, 53, 54, 55] and prop.is_chain
    assert prop.confidence == sorted(prop.confidence, reverse=True)
    # a plain ngram drafter sees only the current request
    assert create("ngram", None).propose([DraftRequest(1, [9, 9, 3, 4, 50], 8, greedy, 8)])[0].tokens == []


def test_frequency_makes_the_tree_and_match_length_its_size():
    d = create("suffix", None, size_factor=2.0, min_score=0.0)
    for _ in range(3):
        d.index.add([6, 7, 8, 9, 10, 11, 12, 13])
    d.index.add([6, 7, 8, 9, 20, 21, 22, 23])
    prop = d.propose_one(np.array([1, 7, 8, 9]), 16, 4)       # a 3-token match: at most 6 nodes
    assert len(prop) == 6
    first = [t for t, p in zip(prop.tokens, prop.parent_list()) if p == -1]
    assert first == [10, 20]                                  # the frequent continuation first, the other a sibling
    long = d.propose_one(np.array([6, 7, 8, 9]), 16, 4)       # a 4-token match: up to 8 nodes
    assert len(long) == 8
    # corpus matches shorter than 3 tokens are not used (they hit unrelated text everywhere)
    assert len(d.propose_one(np.array([99, 8, 9]), 16, 4)) == 0


def test_the_corpus_is_bounded_oldest_first():
    idx = SuffixIndex(max_tokens=20, per_key=4)
    for i in range(5):
        idx.add([100 + i] * 2 + [1, 2, 3, 200 + i])           # 6 tokens each
    assert idx.tokens <= 20 and len(idx.docs) == 3
    conts = {int(c[0]) for c, m, _ in idx.matches(np.array([1, 2, 3]), 1, 8, 1)}
    assert idx.matches(np.array([2, 3]), 1, 8, 1) == []       # too short for the corpus
    assert conts == {202, 203, 204}                           # the two oldest texts are gone
    # per_key keeps only the most recent positions of a frequent key
    big = SuffixIndex(max_tokens=10_000, per_key=4)
    for i in range(30):
        big.add([5, 6, 7, 300 + i])
    assert len(big.positions((5, 6, 7))) <= 8
    assert {int(c[0]) for c, m, _ in big.matches(np.array([5, 6, 7]), 3, 8, 1)} >= {326, 327, 328, 329}


def test_the_index_is_bounded_with_the_corpus():
    """Evicted texts leave the index too: 2000 random 100-token texts through a 1000-token corpus
    leave only the index entries of the texts still in it (one per position past the anchor)."""
    rng = np.random.default_rng(0)
    idx = SuffixIndex(max_tokens=1000, per_key=256)
    for _ in range(2000):
        idx.add(rng.integers(0, 50_000, 100))
    entries = sum(len(v) for v in idx.long.values())
    assert len(idx.docs) == 10 and entries == sum(len(d) - 3 for d in idx.docs.values())
    assert all(doc in idx.docs for k in list(idx.long) for doc, _ in
               idx.positions((k >> 42, (k >> 21) & (2**21 - 1), k & (2**21 - 1))))
    idx.add([1, 2, 3, 4, 5])                       # and what is left still matches
    assert [int(c[0]) for c, m, _ in idx.matches(np.array([1, 2, 3, 4]), 3, 8, 1)] == [5]


def test_warm_file_and_its_errors(tmp_path):
    good = tmp_path / "warm.jsonl"
    good.write_text(json.dumps({"tokens": [4, 5, 6, 7, 8]}) + "\n\n" + json.dumps({"tokens": [4, 5, 6, 9]}) + "\n")
    d = create("suffix", None, warm=str(good))
    assert d.describe()["corpus_texts"] == 2
    assert set(d.propose_one(np.array([4, 5, 6]), 4, 1).tokens) == {7, 9}
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"tokens": [1, 2]}\nnot json\n')
    with pytest.raises(SpecserveError, match="line 2: not JSON"):
        create("suffix", None, warm=str(bad))
    bad.write_text('{"other": 1}\n')
    with pytest.raises(SpecserveError, match="needs 'text', 'prompt' or 'tokens'"):
        create("suffix", None, warm=str(bad))
    with pytest.raises(SpecserveError, match="warm file"):
        create("suffix", None, warm=str(tmp_path / "missing.jsonl"))
    bad.write_text('{"text": "hello there"}\n')
    with pytest.raises(SpecserveError, match="tokenizer"):
        create("suffix", None, warm=str(bad))


def test_concurrent_adds_and_lookups_stay_consistent():
    idx = SuffixIndex(max_tokens=5_000, per_key=16)
    errors = []

    def writer(seed):
        rng = np.random.default_rng(seed)
        for _ in range(200):
            idx.add(rng.integers(0, 20, size=12))

    def reader(seed):
        rng = np.random.default_rng(seed)
        try:
            for _ in range(400):
                for cont, m, doc in idx.matches(rng.integers(0, 20, size=6), 1, 6, 4):
                    assert 1 <= m <= 6 and len(cont) <= 4
        except Exception as e:    # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(2)] + \
              [threading.Thread(target=reader, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and idx.tokens == sum(len(a) for a in idx.docs.values()) <= 5_000


@pytest.mark.parametrize("kernels", ["native", "fbgemm"])
def test_suffix_greedy_identity_across_requests(kernels):
    """The same drafter object serves request after request (its corpus growing), alone and
    batched: always plain decoding's tokens, and later requests draft from earlier ones."""
    target = tiny_model(seed=21, vocab=64, layers=2, kernels=kernels)
    prompts = [[1, 2, 3, 4, 5, 6], [9, 1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6, 7], [8, 8, 1, 2, 3]]
    plain = Engine(target, {"none": create("none", target)}, max_batch=1, max_len=128)
    ref = [plain.generate([Request(p, 30)])[0].tokens for p in prompts]
    d = create("suffix", target)
    alone = Engine(target, {"suffix": d}, max_batch=1, max_len=128)
    outs = [alone.generate([Request(p, 30, drafter="suffix", num_draft=8)])[0] for p in prompts]
    assert [o.tokens for o in outs] == ref
    assert outs[1].stats.accepted_tokens > 0                  # the second request copies the first's output
    batched = Engine(target, {"suffix": d}, max_batch=3, max_len=128)
    assert [o.tokens for o in batched.generate([Request(p, 30, drafter="suffix", num_draft="auto")
                                                for p in prompts])] == ref


# ------------------------------------------------------------------ layerskip
@pytest.mark.parametrize("kernels", ["native", "fbgemm"])
def test_a_layer_subset_shares_the_weights_and_all_layers_are_the_model(kernels):
    import torch
    target = tiny_model(seed=8, vocab=64, layers=4, kernels=kernels)
    m = target.model
    full = m.layer_subset([0, 1, 2, 3])
    part = m.layer_subset([0, 3])
    assert part.config.num_layers == 2 and m.config.num_layers == 4
    x = torch.randint(0, 64, (1, 20), generator=torch.Generator().manual_seed(0))
    ref = m(x, m.new_cache(1, 64), [0], [0]).logits
    assert torch.equal(full(x, full.new_cache(1, 64), [0], [0]).logits, ref)
    assert not torch.equal(part(x, part.new_cache(1, 64), [0], [0]).logits, ref)
    if kernels == "native":
        assert part.layers[1].qkv.data.data_ptr() == m.layers[3].qkv.data.data_ptr()
    else:
        assert part.layers[1] is m.layers[3]


def test_layerskip_calibrates_reports_and_stays_exact():
    target = tiny_model(seed=21, vocab=64, layers=6)
    d = create("layerskip", target, calib_tokens=16)
    info = d.describe()
    assert info["skipped_layers"] and 0 not in info["skipped_layers"] and 5 not in info["skipped_layers"]
    assert info["kept_layers"] == 6 - len(info["skipped_layers"])
    assert 0 <= info["agreement"] <= 1 and info["draft_cost"] == info["kept_layers"] / 6 and info["estimate"] > 0
    assert info["drafts_under_auto"] == (info["estimate"] >= 1.0)
    prompts = [[1, 2, 3, 4, 5, 6], [9, 1, 2, 3], [7, 7, 7, 7, 7]]
    plain = Engine(target, {"none": create("none", target)}, max_batch=1, max_len=128)
    ref = [plain.generate([Request(p, 24)])[0].tokens for p in prompts]
    eng = Engine(target, {"layerskip": d}, max_batch=2, max_len=128)
    for k in (1, 3, "auto"):
        outs = eng.generate([Request(p, 24, drafter="layerskip", num_draft=k) for p in prompts])
        assert [o.tokens for o in outs] == ref
        drafted = sum(o.stats.drafted_tokens for o in outs)
        if k != "auto":
            assert drafted > 0
        elif not info["drafts_under_auto"]:     # declared max_auto_draft 0: nothing under auto
            assert drafted == 0
        # (where it may draft under auto, whether it pays is the controller's timing-based choice)


def test_layerskip_option_errors():
    small = tiny_model(seed=21, vocab=64, layers=2)
    for opts, msg in (({"skip": "2"}, "indices in"), ({"skip": "0,1"}, "leaving at least one"),
                      ({"skip": "x"}, "'auto' or layer indices"), ({"calib_tokens": 4, "skip": "1"}, "calib_tokens"),
                      ({}, "at least 4 layers")):
        with pytest.raises(SpecserveError, match=msg):
            create("layerskip", small, **opts)


# ---------------------------------------------------------------------------------------- lookahead
def window_nodes(prop, sources_of):
    """{(path): parent path} of a proposal's nodes, for comparing trees by token paths."""
    paths = prop.paths()
    return {p: (paths[q] if q >= 0 else ()) for p, q in zip(paths, prop.parent_list())}


def test_lookahead_window_is_the_lookahead_mask_as_a_tree():
    """W=3, N=3, two levels: level 0 a chain over the columns, level 1 of column j below level 0's
    column j.  A node at (level l, column j) sees the pending token, level 0 up to column j and its
    own column's lower levels: the paper's lookahead attention mask."""
    d = create("lookahead", None, window=3, ngram=3, guesses=2, own_nodes=0)
    greedy = SamplingParams()
    d.begin(0, [5, 6, 7], greedy, 50)
    d.states[0].levels = [[10, 11, 12], [20, 21, 22]]
    prop = d.propose([DraftRequest(0, [5, 6, 7, 9], 32, greedy, 50)])[0]
    tree = window_nodes(prop, None)
    assert tree == {(10,): (), (10, 11): (10,), (10, 11, 12): (10, 11),           # level 0: a chain
                    (10, 20): (10,), (10, 11, 21): (10, 11), (10, 11, 12, 22): (10, 11, 12)}   # level 1
    assert prop.future_gain == [d.window_value.value] * 6 and all(0 < c < 1 for c in prop.confidence)
    # depth limit: node (l, j) lies at depth j + 1 + l; deeper nodes (and the columns above them) are left out
    shallow = d.propose([DraftRequest(0, [5, 6, 7, 9], 32, greedy, 2)])[0]
    assert set(window_nodes(shallow, None)) == {(10,), (10, 11), (10, 20)}


def test_lookahead_jacobi_step_fills_the_pool_and_slides_the_window():
    d = create("lookahead", None, window=3, ngram=3, guesses=2, own_nodes=0)
    greedy = SamplingParams()
    d.begin(0, [5, 6, 7], greedy, 50)
    st = d.states[0]
    st.levels = [[10, 11, 12], [20, 21, 22]]
    prop = d.propose([DraftRequest(0, [5, 6, 7, 9], 32, greedy, 50)])[0]
    # the target's argmax after each row: the pending token, then every node (made up; -1 unused here)
    paths = prop.paths()
    after = {(10, 20): 30, (10, 11, 21): 31, (10, 11, 12, 22): 32}
    predicted = [40] + [after.get(p, 41) for p in paths]
    d.feedback(Feedback(0, prop, [], [40], {}, predicted))
    # the n-grams are the columns (level 0, level 1, prediction); the predictions are the new top level
    assert {k: list(v) for k, v in st.pool.items()} == {10: [(20, 30)], 11: [(21, 31)], 12: [(22, 32)]}
    assert st.levels == [[20, 21, 22], [30, 31, 32]]
    # next step, pending token 11: the pool's n-gram "11 21 31" is proposed (verification branch)
    nxt = d.propose([DraftRequest(0, [5, 6, 7, 9, 11], 32, greedy, 50)])[0]
    assert (21, 31) in window_nodes(nxt, None)
    # a window that was not run (trimmed away) learns nothing and does not move
    d.feedback(Feedback(0, nxt.subset([0]), [], [3], {}, [1, 2]))
    assert st.levels == [[20, 21, 22], [30, 31, 32]]


def test_lookahead_budget_takes_own_text_then_pool_then_window():
    d = create("lookahead", None, window=3, ngram=2, guesses=2, own_nodes=4)
    greedy = SamplingParams()
    text = [1, 2, 3, 4, 1, 2]                       # own text: "1 2" was followed by "3 4"
    d.begin(0, text, greedy, 50)
    d.states[0].pool[2] = collections.OrderedDict({(8,): None})
    full = d.propose([DraftRequest(0, text, 32, greedy, 50)])[0]
    assert full.tokens[:5] == [3, 4, 1, 2, 8]        # own text first (4 nodes), then the pool's guess
    assert full.parent_list()[4] == -1 and full.confidence[:4] == sorted(full.confidence[:4], reverse=True)
    assert d.propose([DraftRequest(0, text, 3, greedy, 50)])[0].tokens == [3, 4, 1]
    assert create("lookahead", None).max_auto_draft == 8 + (4 + 4) * 2


def test_lookahead_option_errors():
    for bad in ({"window": 0}, {"ngram": 1}, {"guesses": 0}, {"own_nodes": -1}, {"window_prior": -1.0}):
        with pytest.raises(SpecserveError, match=f"lookahead option {next(iter(bad))} must be >= "):
            create("lookahead", None, **bad)


@pytest.mark.parametrize("k", [4, 24, "auto"])
def test_lookahead_greedy_identity_alone_and_batched(k):
    """Repetitive tiny-model text, where the window converges and the pool is used: plain decoding's
    tokens, alone and two at a time, and the pool's n-grams are accepted at a fixed budget."""
    target = tiny_model(seed=31, vocab=64, layers=2, scale=2.0)
    prompts = [[1, 2, 3, 4, 5, 1, 2, 3], [7, 7, 7, 7], [10, 20, 30, 10, 20, 30, 10, 20, 31, 10, 20]]
    plain = Engine(target, {"none": create("none", target)}, max_batch=1).generate([Request(p, 48) for p in prompts])
    for batch in (1, 2):
        d = create("lookahead", target, own_nodes=0)
        eng = Engine(target, {"lookahead": d}, max_batch=batch)
        outs = eng.generate([Request(p, 48, drafter="lookahead", num_draft=k) for p in prompts])
        assert [o.tokens for o in outs] == [r.tokens for r in plain]
        if k == 24:
            assert sum(o.stats.accepted_tokens for o in outs) > 0
        if k == "auto":           # the controller's predictions stay step times beside the target's argmax
            assert all(isinstance(x, float) for o in outs for x in o.stats.step_predicted_s)


def test_suffix_calibrates_each_source_so_a_misleading_corpus_gives_way():
    """The corpus continues "3 4 5" with "6 7 8"; the current text's own match ("4 5", shorter) says
    "9".  The corpus trie wins at first; after its proposals were rejected a few times its calibrated
    estimates fall below the current text's, whose proposal then wins (and accepted proposals keep
    a source's weight up)."""
    d = create("suffix", None, min_score=0.0)
    greedy = SamplingParams()
    for _ in range(2):
        d.index.add([3, 4, 5, 6, 7, 8, 1])
    text = [1, 4, 5, 9, 2, 3, 4, 5]
    d.begin(0, text, greedy, 50)
    first = d.propose([DraftRequest(0, text, 8, greedy, 8)])[0]
    assert first.tokens[0] == 6
    for _ in range(6):
        prop = d.propose([DraftRequest(0, text, 8, greedy, 8)])[0]
        if prop.tokens[0] != 6:
            break
        d.feedback(Feedback(0, prop, [], [0]))                 # nothing accepted
    assert prop.tokens[0] == 9 and d.calib[0]["corpus"].value < 1.0 == d.calib[0]["own"].value
    # the drafter's history carries the lesson to the next sequence
    d.begin(1, text, greedy, 50)
    assert d.propose([DraftRequest(1, text, 8, greedy, 8)])[0].tokens[0] == 9
