"""The replay target: the engine's own step over recorded greedy texts says them again, token for token.

Hand-checked against the real target (a tiny random model): every drafter, chains, trees and the
merged ``auto``, alone and with rows shared, regenerates plain decoding's greedy continuations and,
at a fixed draft size, takes exactly the verification passes the real engine takes; a grammar
applies in the replay as in the engine (its forced text is drafted and accepted); a pass is priced
by the frozen cost model, which no pass corrects.
"""

import dataclasses

import pytest
import torch

from conftest import grammar_compiler, tiny_model
from specserve.bench.replay_target import FrozenCost, ReplayTarget
from specserve.constrain import GrammarSpec
from specserve.control import CostModel
from specserve.drafters import create
from specserve.engine import Engine, Request

VOCAB = 64
EOS = VOCAB - 1
PROMPTS = [[1, 2, 3, 4, 5, 1, 2, 3], [10, 20, 30, 40, 50, 60, 10, 20] * 3, [9, 8, 7, 6, 5, 4], [3, 3, 3, 1, 2]]
COST = CostModel([1, 2, 64], [0.010, 0.011, 0.073], 1e-7)


@pytest.fixture(scope="module")
def target():
    return tiny_model(seed=21, vocab=VOCAB, layers=2)


def engines(target, name: str, level: int, texts: list[list[int]], **opts):
    """The real engine and the replay's, each with its own ``name`` drafter, ``level`` rows."""
    replay = ReplayTarget(target.config, target.model.invariant_tokens, texts, [{} for _ in texts],
                          FrozenCost.of(COST), EOS)
    real = Engine(target, {name: create(name, target, **opts)}, max_batch=level, max_len=160, cost=COST.fresh())
    again = Engine(dataclasses.replace(target, model=replay), {name: create(name, target, **opts)},
                   max_batch=level, max_len=160, cost=replay.cost, guard=False)       # as the advisor's replay
    return real, again, replay


def plain(target, reqs: list[dict]):
    eng = Engine(target, {"none": create("none", target)}, max_batch=2, max_len=160, cost=COST.fresh())
    return eng.generate([Request(**r) for r in reqs])


@pytest.mark.parametrize("level", [1, 3])
@pytest.mark.parametrize("name, k", [("ngram", 3), ("ngram-tree", 6), ("suffix", 6), ("auto", 6), ("auto", "auto")])
def test_the_replay_says_the_texts_again_with_the_engines_passes(target, name, k, level):
    reqs = [dict(prompt=p, max_tokens=40, eos_ids=frozenset({EOS})) for p in PROMPTS]
    conts = [r.tokens for r in plain(target, reqs)]
    real, again, replay = engines(target, name, level, [p + c for p, c in zip(PROMPTS, conts)])
    ours = again.generate([Request(**r, drafter=name, num_draft=k) for r in reqs])
    assert [r.tokens for r in ours] == conts
    if k != "auto":                              # the controller's choices do not enter: the same drafts
        theirs = real.generate([Request(**r, drafter=name, num_draft=k) for r in reqs])
        assert [r.stats.verify_passes for r in ours] == [r.stats.verify_passes for r in theirs]
    assert sum(r.stats.verify_passes for r in ours) < sum(len(c) - 1 for c in conts)   # drafts were accepted
    assert replay.pass_s > 0


def test_a_grammar_applies_in_the_replay(target):
    """The grammar forces "qrstuvw" then the end of text: the replay regenerates it and, as the engine
    does, drafts the forced tokens itself and has them accepted."""
    comp, pieces = grammar_compiler(VOCAB)
    g = comp.compile(GrammarSpec("regex", "qrstuvw"))
    req = dict(prompt=[5, 6, 7], max_tokens=20, grammar=g, eos_ids=frozenset({EOS}))
    (cont,) = [r.tokens for r in plain(target, [req])]
    _, again, _ = engines(target, "ngram", 1, [[5, 6, 7] + cont])
    (out,) = again.generate([Request(**req, drafter="ngram", num_draft=4)])
    assert out.tokens == cont and "".join(pieces[t] for t in cont[:-1]) == "qrstuvw"
    assert out.stats.forced_accepted == out.stats.forced_tokens >= 6 and out.stats.target_passes <= 3


def test_a_pass_is_priced_by_the_frozen_cost_model(target):
    frozen = FrozenCost.of(dataclasses.replace(COST, scale=1.5))
    frozen.observe([1], [10], 99.0)                                         # no pass corrects it
    assert frozen.scale == 1.5 and frozen.predict([3, 1], [10, 20]) == 1.5 * COST.raw([3, 1], [10, 20])
    replay = ReplayTarget(target.config, target.model.invariant_tokens, [PROMPTS[0] + [7, 7]], [{}], frozen, EOS)
    cache = replay.new_cache(2, 32)
    out = replay(torch.tensor(PROMPTS[0]), cache, [1], [0], lengths=[len(PROMPTS[0])], logits_for=[7])
    assert out.logits.shape == (1, VOCAB) and int(out.logits[0].argmax()) == 7    # the text's next token
    assert cache.k[0][1, 0, :8, 0].tolist() == [float(t) for t in PROMPTS[0]]   # the row holds its tokens
    assert replay.pass_s == frozen.predict([8], [0])
