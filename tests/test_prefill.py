"""Chunked prefill and prefix reuse: the budget, the pool, and exactness alone, under load and reused."""

import pytest
import torch

from conftest import tiny_head, tiny_model
from specserve.control import CostModel, PrefillPolicy, prefill_shares
from specserve.drafters import create
from specserve.engine import Engine, Request
from specserve.errors import SpecserveError
from specserve.limits import PREFIX_BLOCK as BLOCK
from specserve.prefix_cache import PrefixCache
from specserve.sampling import SamplingParams

G = torch.Generator().manual_seed(7)
LONG = torch.randint(0, 64, (300,), generator=G).tolist()          # a prompt of ~19 blocks
SHORT = [[1, 2, 3, 4, 5, 1, 2, 3], [7, 7, 7], [10, 20, 30, 40] * 6]


# ------------------------------------------------------------------ the budget (pure)
def linear_cost(per_token: float = 1.0, base: float = 10.0) -> CostModel:
    """A pass of m tokens costs base + m * per_token (no attention term)."""
    return CostModel([1, 1000], [base + per_token, base + 1000 * per_token], 0.0)


def test_shares_without_decoding_take_the_most():
    assert prefill_shares(None, [], [], [(0, 100)], most=64, grain=16, stall=2.0) == [64]
    assert prefill_shares(linear_cost(), [], [], [(0, 100)], most=512, grain=16, stall=2.0) == [100]
    # first come first served; a share that does not end its prompt ends at a multiple of grain
    assert prefill_shares(None, [], [], [(16, 40), (0, 100)], most=64, grain=16, stall=2.0) == [40, 16]
    assert prefill_shares(None, [], [], [(0, 20), (0, 100)], most=50, grain=16, stall=2.0) == [20, 16]


def test_shares_hold_the_step_budget_and_always_advance():
    cost = linear_cost()
    # the reference step: 4 decoding tokens and the prompt's one -> 15 s; stall 2 -> at most 30 s
    # -> 16 prompt tokens beside the 4 decoding ones
    assert prefill_shares(cost, [4], [50], [(0, 100)], most=512, grain=16, stall=2.0) == [16]
    # stall 5 -> 75 s -> 61 more tokens -> 48 (three blocks)
    assert prefill_shares(cost, [4], [50], [(0, 100)], most=512, grain=16, stall=5.0) == [48]
    # stall 1.2 -> 18 s: not even one block fits, yet a prompt always advances by one
    assert prefill_shares(cost, [4], [50], [(0, 100)], most=512, grain=16, stall=1.2) == [16]
    for stall in (2.0, 3.0, 8.0, 20.0):
        sh = prefill_shares(cost, [2, 3], [10, 10], [(0, 90), (32, 500)], most=512, grain=16, stall=stall)
        took = sum(sh)
        assert took >= 16 and (took == 16 or cost.predict([2, 3, *[n for n in sh if n]], [0] * 4) <= stall * 17)
        assert took + 16 > 512 or cost.predict([2, 3, took + 16], [0] * 3) > stall * 17 or sh[0] == 90


# ------------------------------------------------------------------ the pool
def pool(capacity_blocks: int, features=()):
    one = 2 * 2 * 2 * BLOCK * 8 * 4 + len(features) * BLOCK * 4 * 4
    return PrefixCache(2, 2, 8, torch.float32, "cpu", capacity_blocks * one, features, hidden=4)


def row_views(seed: int, positions: int = 128):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, 2, positions, 8, generator=g), torch.randn(2, 2, positions, 8, generator=g)


def test_pool_round_trip_is_exact_and_keyed_by_the_whole_prefix():
    p = pool(8)
    k, v = row_views(0)
    toks = list(range(100, 100 + 3 * BLOCK))
    parent = None
    for i in range(3):
        parent = p.store(parent, toks[i * BLOCK:(i + 1) * BLOCK], k, v, i * BLOCK)
    m = p.match(toks + [1, 2], features=False)
    assert m.tokens == 3 * BLOCK
    k2, v2 = torch.zeros_like(k), torch.zeros_like(v)
    assert p.load(m, k2, v2) == {}
    assert torch.equal(k2[:, :, :3 * BLOCK], k[:, :, :3 * BLOCK]) and torch.equal(v2[:, :, :3 * BLOCK], v[:, :, :3 * BLOCK])
    # the same second block after a different first block is not a hit
    other = [0] * BLOCK + toks[BLOCK:]
    assert p.match(other, features=False).tokens == 0
    # a limit in tokens counts whole blocks only
    assert p.match(toks, features=False, limit=2 * BLOCK + 5).tokens == 2 * BLOCK
    assert p.stats.hit_tokens == 5 * BLOCK and p.stats.lookups == 3


def test_pool_evicts_the_least_recently_used_leaf_and_never_cuts_a_chain():
    p = pool(3)
    k, v = row_views(1)
    a = [list(range(i * BLOCK, (i + 1) * BLOCK)) for i in range(4)]
    b0 = p.store(None, a[0], k, v, 0)
    b1 = p.store(b0, a[1], k, v, BLOCK)
    p.store(None, a[2], k, v, 0)                      # full now: [b0 -> b1], [c0]
    p.match(a[0] + a[1], features=False)             # b0, b1 used after c0
    p.store(b1, a[3], k, v, 2 * BLOCK)               # evicts c0 (the LRU leaf), not b0 (it has a child)
    assert p.stats.evicted_blocks == 1 and p.blocks == 3
    assert p.match(a[2], features=False).tokens == 0
    assert p.match(a[0] + a[1] + a[3], features=False).tokens == 3 * BLOCK
    assert p.used_bytes == 3 * p.block_bytes
    # a chain whose parent was evicted meanwhile stores nothing more
    q = pool(1)
    x0 = q.store(None, a[0], k, v, 0)
    q.store(None, a[1], k, v, 0)                     # evicts x0
    assert q.store(x0, a[2], k, v, BLOCK) is None
    with pytest.raises(ValueError, match="no block"):
        PrefixCache(2, 2, 8, torch.float32, "cpu", 10)


def test_pool_features_only_where_stored():
    p = pool(4, features=(1,))
    k, v = row_views(2)
    toks = list(range(2 * BLOCK))
    f = torch.randn(BLOCK, 4)
    b0 = p.store(None, toks[:BLOCK], k, v, 0, {1: f})
    p.store(b0, toks[BLOCK:], k, v, BLOCK, None)      # e.g. generated text: no features
    assert p.match(toks, features=True).tokens == BLOCK
    m = p.match(toks, features=False)
    assert m.tokens == 2 * BLOCK and p.load(m, torch.zeros_like(k), torch.zeros_like(v)) == {}
    got = p.load(p.match(toks[:BLOCK], features=True), torch.zeros_like(k), torch.zeros_like(v))
    assert torch.equal(got[1], f)


# ------------------------------------------------------------------ the engine
@pytest.fixture(scope="module", params=["native", "native-bf16", "fbgemm"])
def target(request):
    return tiny_model(seed=21, vocab=64, layers=2, kernels=request.param, max_position_embeddings=1024)


def engine(target, drafters=("none",), chunk=16, stall=1.0, mb=0.0, max_batch=4, **opts):
    built = {name: create(name, target, **opts.get(name, {})) for name in drafters}
    return Engine(target, built, max_batch=max_batch, max_len=512, prefill=PrefillPolicy(chunk, stall, mb))


def test_policy_errors_at_construction(target):
    for policy, msg in ((PrefillPolicy(10), "multiple of 16"), (PrefillPolicy(16, 0.5), "stall"),
                        (PrefillPolicy(16, 2.0, -1), "size"), (PrefillPolicy(16, 2.0, 1e-6), "no block")):
        with pytest.raises(SpecserveError, match=msg):
            Engine(target, {"none": create("none", target)}, max_len=512, prefill=policy)


def test_chunked_prefill_leaves_the_cache_bits_of_a_whole_prefill(target):
    """Chunks of 16 against the largest the runtime allows (native: the whole prompt in one pass;
    fbgemm: its 64-token invariant run), and on native against chunking turned off."""
    big = engine(target, chunk=512)
    small = engine(target, chunk=16)
    refs = [big] + ([engine(target, chunk=None)] if target.model.kernel == "native" else [])
    n = len(LONG) + 11
    got = small.generate([Request(LONG, 12)])[0]
    assert got.stats.prefill_passes == -(-len(LONG) // 16)
    for ref_engine in refs:
        ref = ref_engine.generate([Request(LONG, 12)])[0]
        assert got.tokens == ref.tokens and got.stats.verify_passes == ref.stats.verify_passes
        assert torch.equal(ref_engine.rows.cache.k_all[:, 0, :, :n], small.rows.cache.k_all[:, 0, :, :n])
        assert torch.equal(ref_engine.rows.cache.v_all[:, 0, :, :n], small.rows.cache.v_all[:, 0, :, :n])
    assert big.generate([Request(LONG, 1)])[0].stats.prefill_passes == -(-len(LONG) // big.prompt_tokens_max)


@pytest.mark.parametrize("drafter,sampling", [("none", SamplingParams()), ("ngram", SamplingParams()),
                                              ("tree", SamplingParams()),
                                              ("ngram", SamplingParams(temperature=0.8, seed=3))])
def test_a_request_alone_and_under_load_is_identical(target, drafter, sampling):
    names = ("none", "ngram", "tree") if drafter != "none" else ("none",)
    opts = {"ngram": {"min_n": 1, "max_n": 3}}
    kind = {"tree": "ngram-tree"}
    built = {n: create(kind.get(n, n), target, **opts.get(n, {})) for n in names}
    alone = Engine(target, built, max_batch=1, max_len=512, prefill=PrefillPolicy(512))
    req = lambda p: Request(p, 24, sampling, drafter=drafter, num_draft=4)       # noqa: E731
    ref = alone.generate([req(LONG)])[0].tokens
    built = {n: create(kind.get(n, n), target, **opts.get(n, {})) for n in names}
    busy = Engine(target, built, max_batch=4, max_len=512, prefill=PrefillPolicy(16, 1.0))
    ids = [busy.admit(Request(p, 60)) for p in SHORT]
    for _ in range(3):
        busy.step()
    sid = busy.admit(req(LONG))
    running = {i: len(busy.progress(i)) for i in ids}
    steps = 0
    while busy.progress(sid) == []:
        busy.step()
        steps += 1
        for i in ids:          # the running streams advance on every step the prompt is prefilled in
            now = busy.progress(i)
            assert now is None or len(now) > running[i]
            running[i] = len(now) if now is not None else running[i]
    assert steps > 3
    while busy.progress(sid) is not None:
        busy.step()
    assert busy.take_result(sid).tokens == ref


def test_prefix_reuse_is_exact_and_counts(target):
    cold = engine(target, chunk=64)
    warm = engine(target, chunk=64, mb=4)
    pre = LONG[:200]
    a, b = pre + [1, 2, 3, 4, 5], pre + [9, 9, 9]
    ra = warm.generate([Request(a, 16)])[0]
    rb = warm.generate([Request(b, 16)])[0]
    assert rb.stats.cached_tokens == 192 and ra.stats.cached_tokens == 0
    assert rb.stats.prefill_passes == 1
    assert ra.tokens == cold.generate([Request(a, 16)])[0].tokens
    assert rb.tokens == cold.generate([Request(b, 16)])[0].tokens
    # the same prompt again reuses all of it but its last block (its last token is always computed)
    rc = warm.generate([Request(a, 16)])[0]
    assert rc.stats.cached_tokens == (len(a) - 1) // BLOCK * BLOCK and rc.tokens == ra.tokens
    # a follow-up turn: prompt + what was generated + more reuses the generated blocks too
    turn = a + ra.tokens + [4, 4, 4]
    rd = warm.generate([Request(turn, 8)])[0]
    assert rd.stats.cached_tokens == (len(a) + len(ra.tokens) - 1) // BLOCK * BLOCK > len(a) - 1 - BLOCK
    assert rd.tokens == cold.generate([Request(turn, 8)])[0].tokens
    st = warm.prefixes.pool.stats
    assert st.hit_tokens == 192 + rc.stats.cached_tokens + rd.stats.cached_tokens


def test_prefix_reuse_with_features_is_exact_for_eagle(target):
    head = tiny_head("eagle", target)
    cold = engine(target, drafters=("eagle",), chunk=32, eagle={"head": head})
    warm = engine(target, drafters=("eagle",), chunk=32, mb=8, eagle={"head": head})
    pre = LONG[:160]
    for p in (pre + [3, 1], pre + [7, 7, 7], pre + [3, 1]):
        want = cold.generate([Request(p, 20, drafter="eagle", num_draft=6)])[0]
        got = warm.generate([Request(p, 20, drafter="eagle", num_draft=6)])[0]
        assert got.tokens == want.tokens
        # the head drafted from the same features: the same drafts, hence the same acceptance
        assert got.stats.accepted_per_depth == want.stats.accepted_per_depth
    assert got.stats.cached_tokens == 160


def test_abort_and_a_one_token_request_while_prefilling(target):
    eng = engine(target, chunk=16, max_batch=2)
    sid = eng.admit(Request(LONG, 5))
    eng.step()
    assert eng.progress(sid) == [] and eng.free_capacity == 1
    eng.abort(sid)
    assert eng.free_capacity == 2 and eng.num_running == 0
    one = eng.generate([Request(LONG[:40], 1)])[0]
    assert len(one.tokens) == 1 and one.finish_reason == "length" and one.stats.prefill_passes == 3


def test_a_short_prompt_does_not_wait_behind_a_long_one(target):
    eng = engine(target, chunk=64, stall=3.0, max_batch=3)
    eng.controller.cost = linear_cost()     # deterministic budgets: the decoding step 13 s, the budget 39 s
    running = eng.admit(Request(SHORT[0], 200))
    eng.step()
    long_id = eng.admit(Request(LONG, 4))
    short_id = eng.admit(Request(SHORT[2], 4))
    eng.step()
    assert eng.progress(short_id) != [] and eng.progress(long_id) == []
    while eng.progress(long_id) == []:            # the long prompt still advances every step
        before = eng._find(long_id).prefilled
        eng.step()
        if eng.progress(long_id) == []:
            assert eng._find(long_id).prefilled > before
    eng.abort(running)


def test_chunking_off_prefills_a_prompt_whole_beside_running_streams(target):
    """With chunking off, a prompt is one step's chunk even when the cost model exists (as in a
    server that calibrated at start) and others are decoding."""
    eng = engine(target, chunk=None, max_batch=2)
    eng.controller.cost = linear_cost()
    running = eng.admit(Request(SHORT[0], 50))
    eng.step()
    sid = eng.admit(Request(LONG, 4))
    eng.step()
    assert eng.progress(sid) != [] and eng.last_step.prefill_tokens == len(LONG)
    eng.abort(running)
