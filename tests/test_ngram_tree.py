"""ngram-tree's algorithm by hand, and the greedy replay used to tune it."""

import numpy as np
import pytest

from specserve.bench.replay import accepted_path, replay
from specserve.drafters import DraftProposal, create
from specserve.drafters.ngram import reliability
from specserve.drafters.ngram_tree import find_matches, ngram_tree_propose

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
    prop = ngram_tree_propose(tokens, k=8, max_depth=4, min_score=0.0)
    assert prop.tokens[:4] == [Y, DOT, A, B] and prop.parents[:4] == [-1, 0, 1, 2]
    x = prop.tokens.index(X)
    assert prop.parents[x] == -1 and prop.confidence[x] < prop.confidence[0]
    assert all(c <= prop.confidence[p] for c, p in zip(prop.confidence, prop.parent_list()) if p >= 0)
    assert ngram_tree_propose(tokens, k=1, max_depth=4, min_score=0.0).tokens == [Y]


def test_budget_depth_and_threshold():
    tokens = np.array([A, B, X, DOT, A, B, Y, DOT, A, B, X, Y, A, B])
    for k in range(0, 9):
        for depth in (1, 2, 5):
            prop = ngram_tree_propose(tokens, k=k, max_depth=depth, min_score=0.0)
            prop.check(10)
            assert len(prop) <= k and max(prop.depths(), default=0) <= depth
    strict = ngram_tree_propose(tokens, k=8, max_depth=5, min_score=0.9)
    assert all(c >= 0.9 for c in strict.confidence or [])
    assert ngram_tree_propose(np.array([A, B, X]), k=8, max_depth=5).tokens == []   # nothing to copy


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
