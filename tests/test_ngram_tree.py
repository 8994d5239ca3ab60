"""The trie drafters' shared algorithm and ngram lookup by hand, and the greedy replay used to tune them."""

import numpy as np
import pytest

from specserve.errors import SpecserveError

from specserve.bench.replay import accepted_path, replay
from specserve.drafters import DraftProposal, DraftRequest, create
from specserve.drafters.ngram_tree import ngram_tree_propose
from specserve.drafters.trie import TrieOptions, find_matches, reliability
from specserve.sampling import SamplingParams

A, B, X, Y, DOT = 1, 2, 3, 4, 5


def test_find_matches_by_hand():
    ends, lengths = find_matches(np.array([A, B, X, A, B]), 1, 4)
    assert dict(zip(ends.tolist(), lengths.tolist())) == {2: 2}          # [a b] at 0..1, continuation at 2
    ends, lengths = find_matches(np.array([A, B, X, A, B]), 3, 4)
    assert len(ends) == 0                                                 # no match of 3 tokens
    ends, lengths = find_matches(np.array([7, 7, 7]), 1, 4)
    assert dict(zip(ends.tolist(), lengths.tolist())) == {1: 1, 2: 2}


def test_docstring_example_two_branches_recent_first():
    """The y branch follows the longer match (". a b", 3 tokens) and comes first, its path deep; the x
    branch (a 2-token match) is a sibling scored lower, kept once the budget allows."""
    tokens = np.array([A, B, X, DOT, A, B, Y, DOT, A, B])
    prop = ngram_tree_propose(tokens, 8, 4, TrieOptions(min_score=0.0))
    assert prop.tokens[:4] == [Y, DOT, A, B] and prop.parents[:4] == [-1, 0, 1, 2]
    x = prop.tokens.index(X)
    assert prop.parents[x] == -1 and prop.confidence[x] < prop.confidence[0]
    assert all(c <= prop.confidence[p] for c, p in zip(prop.confidence, prop.parent_list()) if p >= 0)
    assert ngram_tree_propose(tokens, 1, 4, TrieOptions(min_score=0.0)).tokens == [Y]


def test_budget_depth_and_threshold():
    tokens = np.array([A, B, X, DOT, A, B, Y, DOT, A, B, X, Y, A, B])
    for k in range(0, 9):
        for depth in (1, 2, 5):
            prop = ngram_tree_propose(tokens, k, depth, TrieOptions(min_score=0.0))
            prop.check(10)
            assert len(prop) <= k and max(prop.depths(), default=0) <= depth
    strict = ngram_tree_propose(tokens, 8, 5, TrieOptions(min_score=0.9))
    assert all(c >= 0.9 for c in strict.confidence or [])
    assert ngram_tree_propose(np.array([A, B, X]), 8, 5).tokens == []   # nothing to copy


def test_ngram_drafter_by_hand():
    """The most recent match of the longest suffix, its continuation cut to the budget and the depth."""
    def tokens(seq, k, max_depth=50, **opts):
        d = create("ngram", None, **opts)
        return d.propose([DraftRequest(0, seq, k, SamplingParams(), max_depth)])[0].tokens
    assert tokens([1, 2, 3, 4, 1, 2], 3, max_n=3) == [3, 4, 1]
    assert tokens([1, 2, 3, 4, 1, 2], 1, max_n=3) == [3]
    assert tokens([1, 2, 3, 4, 1, 2], 3, max_depth=2, max_n=3) == [3, 4]
    assert tokens([5, 6, 7], 4, max_n=3) == []
    assert tokens([1, 9, 1, 8, 1], 2, max_n=1) == [8, 1]           # most recent match wins
    assert tokens([1, 2, 3, 4, 1, 2], 0) == []
    conf = create("ngram", None).propose([DraftRequest(0, [1, 2, 3, 4, 1, 2], 3, SamplingParams())])[0].confidence
    assert conf == sorted(conf, reverse=True) and all(0 < c < 1 for c in conf)


def test_trie_options_are_refused_with_the_drafter_named():
    with pytest.raises(SpecserveError, match="ngram-tree needs 1 <= min_n"):
        create("ngram-tree", None, min_n=3, max_n=2)
    with pytest.raises(SpecserveError, match="suffix needs 0 < base"):
        create("suffix", None, base=0.0)
    with pytest.raises(SpecserveError, match="suffix needs size_factor"):
        create("suffix", None, size_factor=0.0)


def test_reliability_rises_with_match_length():
    r = reliability(np.arange(1, 9), 0.3, 0.8)
    assert r[0] == pytest.approx(0.3) and all(np.diff(r) > 0) and r[-1] < 1


def test_accepted_path_longest_matching_path():
    prop = DraftProposal([A, B, X, Y], parents=[-1, -1, 0, 1])
    assert accepted_path(prop, [B, Y, DOT]) == [1, 3]
    assert accepted_path(prop, [A, DOT]) == [0]
    assert accepted_path(prop, [DOT]) == []
    assert accepted_path(DraftProposal([A, B, X]), [A, B, DOT]) == [0, 1]      # a chain


def test_replay_counts_match_the_engine():
    """Replaying a drafter over a known greedy output gives exactly the engine's counters."""
    from conftest import tiny_model
    from specserve.engine import Engine, Request

    target = tiny_model(seed=21, vocab=64)
    prompt = [10, 20, 30, 40, 50, 60, 10, 20] * 3
    eng = Engine(target, {"tree": create("ngram-tree", target, min_score=0.0)}, max_batch=1, max_len=128)
    out = eng.generate([Request(prompt, 30, drafter="tree", num_draft=5)])[0]
    rep = replay(create("ngram-tree", target, min_score=0.0), prompt, out.tokens, 5)
    assert rep.nodes_per_step == out.stats.nodes_per_step
    assert rep.accepted_per_depth == out.stats.accepted_per_depth
    assert rep.mean_accepted_length == out.stats.mean_accepted_length
