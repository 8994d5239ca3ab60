"""One conformance suite that every registered drafter passes.

A new drafter must be added to ``CONFORMANCE`` (with the options a test needs), or the first test
fails.  Then: its declared options are well-typed and buildable through the registry; its
proposals are well-formed trees within the node budget and the depth limit, and honour its declared
traits (``tree``, ``confidence``, ``max_auto_draft``); under sampling it draws from the generator
``begin`` hands it and from nothing else; the begin / propose / feedback / end lifecycle holds
over more sequences than the engine has rows; and under greedy decoding through the engine (which
rolls back and compacts after every partial acceptance) its output is plain decoding's, alone and
batched.
"""

import pytest
import torch

from conftest import prompt_features, tiny_head, tiny_model
from specserve.drafters import DraftProposal, DraftRequest, Feedback, available, create, drafter_class
from specserve.drafters.base import Option
from specserve.engine import Engine, Request
from specserve.errors import SpecserveError
from specserve.sampling import SamplingParams

VOCAB = 64
PROMPTS = [[1, 2, 3, 4, 5, 1, 2, 3], [7, 7, 7, 7], [10, 20, 30, 10, 20, 30, 10, 20, 31, 10, 20]]


@pytest.fixture(scope="module")
def target():
    return tiny_model(seed=31, vocab=VOCAB, layers=2)


CONFORMANCE = {
    "none": lambda t: {},
    "auto": lambda t: {"parts": {"ngram-tree": create("ngram-tree", t, max_matches=8), "suffix": create("suffix", t),
                                 "eagle": create("eagle", t, head=tiny_head("eagle", t), topk=3, depth=4)}},
    "ngram": lambda t: {"max_n": 3},
    "ngram-tree": lambda t: {"max_matches": 8},
    "suffix": lambda t: {"max_n": 6},
    "lookahead": lambda t: {"window": 3, "ngram": 3},
    "layerskip": lambda t: {"skip": "1"},
    "draft-model": lambda t: {"model": tiny_model(seed=32, vocab=VOCAB, layers=1)},
    "oracle": lambda t: {"alpha": 0.6},
    "eagle": lambda t: {"head": tiny_head("eagle", t), "topk": 3, "depth": 4},
    "eagle-parallel": lambda t: {"head": tiny_head("eagle", t, parallel=4), "topk": 3},
    "medusa": lambda t: {"head": tiny_head("medusa", t), "topk": 3},
}


def test_every_registered_drafter_is_covered():
    assert set(CONFORMANCE) == set(available())


def started(name, target, sampling=SamplingParams(), seed=None):
    """A drafter of ``name`` that has begun every prompt (a generator seeded ``seed`` each) and seen its prefill."""
    d = create(name, target, **CONFORMANCE[name](target))
    d.bind(4, 128)
    for sid, prompt in enumerate(PROMPTS):
        gen = None if seed is None else torch.Generator().manual_seed(seed + sid)
        d.begin(sid, prompt, sampling, 20, generator=gen)
        d.feedback(Feedback(sid, DraftProposal([]), [], [prompt[0]], prompt_features(target, prompt, d.feature_layers)))
    return d


@pytest.mark.parametrize("name", sorted(CONFORMANCE))
def test_declared_options(name, target):
    cls = drafter_class(name)
    for opt in cls.options:
        assert isinstance(opt, Option) and opt.type in (int, float, str) and opt.help
        assert opt.required or isinstance(opt.default, opt.type)
    d = create(name, target, **CONFORMANCE[name](target))
    assert d.name == name
    assert {o.name for o in cls.options} <= set(vars(d.opts))      # the declarations are the options dataclass's


@pytest.mark.parametrize("name", sorted(CONFORMANCE))
def test_declared_traits_are_honoured(name, target):
    """tree=False: only chains; confidence=True: one confidence in [0, 1] per node; asked for its
    ``max_auto_draft`` (what ``auto`` asks a confident drafter for), at most that many nodes."""
    d = started(name, target)
    greedy = SamplingParams()
    budget = d.max_auto_draft
    assert budget >= 0
    proposed = 0
    for k in sorted({1, 3, budget}):
        for prop in d.propose([DraftRequest(sid, p + [p[0]], k, greedy) for sid, p in enumerate(PROMPTS)]):
            proposed += len(prop)
            assert len(prop) <= k
            assert d.tree or prop.is_chain
            if d.confidence and len(prop):
                assert prop.confidence is not None and len(prop.confidence) == len(prop)
                assert all(0.0 <= c <= 1.0 for c in prop.confidence)
    assert proposed > 0 or budget == 0                            # the checks above were not vacuous


@pytest.mark.parametrize("name", sorted(CONFORMANCE))
def test_sampled_drafts_come_from_the_generator_given(name, target):
    """Under sampling a drafter draws from the generator ``begin`` was given and from nothing else:
    the same seeds give the same proposals (q included), other seeds other draws (for a drafter that
    samples), and torch's global generator is untouched."""
    sp = SamplingParams(temperature=0.8, top_p=0.9, seed=3)
    try:
        drafter_class(name)(target, **CONFORMANCE[name](target)).validate(sp)
    except SpecserveError:
        pytest.skip(f"{name} refuses sampling")
    runs = []
    for seed in (100, 100, 200):
        d = started(name, target, sp, seed=seed)
        before = torch.get_rng_state()
        props = d.propose([DraftRequest(sid, p + [p[0]], 4, sp) for sid, p in enumerate(PROMPTS)])
        assert torch.equal(torch.get_rng_state(), before)
        for prop in props:
            prop.check(VOCAB)
        runs.append([(p.tokens, None if p.probs is None else p.probs.tolist()) for p in props])
    assert runs[0] == runs[1]
    if any(q is not None for _, q in runs[0]):                    # it samples: other seeds, other draws
        assert runs[2] != runs[0]


@pytest.mark.parametrize("name", sorted(CONFORMANCE))
def test_proposals_well_formed_within_budget(name, target):
    d = started(name, target)
    greedy = SamplingParams()
    for k in (0, 1, 3, 8, 32):
        for max_depth in (1, 2, 50):
            reqs = [DraftRequest(sid, p + [p[0]], k, greedy, max_depth) for sid, p in enumerate(PROMPTS)]
            props = d.propose(reqs)
            assert len(props) == len(reqs)
            for prop in props:
                prop.check(VOCAB)                                  # a well-formed tree over the vocabulary
                assert len(prop) <= k
                assert max(prop.depths(), default=0) <= max_depth
    for sid in range(len(PROMPTS)):
        d.end(sid)


@pytest.mark.parametrize("name", sorted(CONFORMANCE))
def test_lifecycle_and_greedy_identity_through_the_engine(name, target):
    """Six requests through two rows (begin/end reuse the drafter's state), k = 1 and 6: each output
    equals plain decoding, so every rollback and compaction kept drafter and cache consistent."""
    plain_eng = Engine(target, {"none": create("none", target)}, max_batch=1, max_len=128)
    prompts = PROMPTS * 2
    plain = [plain_eng.generate([Request(p, 24)])[0].tokens for p in prompts]
    for k in (1, 6):
        d = create(name, target, **CONFORMANCE[name](target))
        eng = Engine(target, {name: d}, max_batch=2, max_len=128)
        outs = eng.generate([Request(p, 24, drafter=name, num_draft=k) for p in prompts])
        assert [o.tokens for o in outs] == plain
        assert eng.free_capacity == 2 and eng.num_running == 0
        if name != "none":
            assert sum(o.stats.drafted_tokens for o in outs) > 0


def test_engine_cuts_an_overlong_proposal(target):
    """A drafter that ignores its budget is cut to k nodes and the depth limit by the engine."""
    d = create("ngram-tree", target)
    original = d.propose

    d.propose = lambda reqs: original([DraftRequest(r.seq_id, r.tokens, 32, r.sampling, 50) for r in reqs])
    eng = Engine(target, {"t": d}, max_batch=1, max_len=128)
    out = eng.generate([Request(PROMPTS[2], 10, drafter="t", num_draft=2)])[0]
    assert max(out.stats.nodes_per_step) <= 2
    assert len(out.stats.drafted_per_depth) <= 8                 # 10 tokens: never deeper than 8 (9 left - 1)
    assert sum(out.stats.nodes_per_step) > 0


@pytest.mark.parametrize("name", sorted(CONFORMANCE))
def test_greedy_identity_under_a_grammar(name, target):
    """Under a JSON schema (tiny vocabulary of JSON pieces, end of text 63), three requests through two
    rows, ``auto`` and k = 6: each output equals plain decoding under the same grammar, and is a
    complete, valid document of the schema (the matcher accepts it and has ended) or stopped by
    max_tokens.  Drafts the grammar forbids are dropped and forced tokens drafted, yet nothing changes."""
    import json

    from conftest import TINY_SCHEMA, grammar_compiler
    from specserve.constrain import GrammarSpec

    comp, pieces = grammar_compiler(VOCAB)
    grammar = comp.compile(GrammarSpec("json_schema", json.dumps(TINY_SCHEMA)))
    eos = frozenset({VOCAB - 1})
    plain_eng = Engine(target, {"none": create("none", target)}, max_batch=1, max_len=128)
    plain = [plain_eng.generate([Request(p, 40, grammar=grammar, eos_ids=eos)])[0] for p in PROMPTS]
    for out in plain:
        m = grammar.matcher()
        assert all(m.accept(t) for t in out.tokens)
        if out.finish_reason == "stop":
            assert m.terminated
            doc = json.loads("".join(pieces[t] for t in out.tokens[:-1]))
            assert set(doc) == {"name", "age", "ok"} and isinstance(doc["ok"], bool)
    assert any(o.finish_reason == "stop" for o in plain)
    for k in ("auto", 6):
        d = create(name, target, **CONFORMANCE[name](target))
        eng = Engine(target, {name: d}, max_batch=2, max_len=128)
        outs = eng.generate([Request(p, 40, drafter=name, num_draft=k, grammar=grammar, eos_ids=eos) for p in PROMPTS])
        assert [o.tokens for o in outs] == [o.tokens for o in plain]
        assert [o.finish_reason for o in outs] == [o.finish_reason for o in plain]
        if name == "none":                     # plain decoding drafts nothing, forced tokens included
            assert sum(o.stats.forced_tokens for o in outs) == 0
