"""Fault isolation on a tiny random model: a drafter that raises (in begin, propose, feedback or
end) or returns a malformed proposal for one sequence costs that sequence its drafts, never its
answer, and leaves the other sequences exactly as they were; a failing target pass fails only the
sequences of that pass."""

import logging

import pytest

from conftest import tiny_model
from specserve.drafters import DraftProposal, create
from specserve.engine import Engine, Request
from specserve.engine.faults import PassFailed
from specserve.sampling import SamplingParams

BAD = 63                      # a prompt starting with this token is the one the drafter fails for
PROMPTS = [[(3 * i) % 50 + 1, 2, 3, 4, 5, 1, 2, 3, 4] for i in range(15)] + [[BAD, 7, 7, 7, 7, 7]]


class Faulty:
    """The n-gram drafter, raising in ``phase`` for the sequences whose prompt starts with BAD
    (``phase`` None: never).  ``malformed``: propose a token outside the vocabulary instead."""

    def __init__(self, inner, phase: str | None, malformed: bool = False):
        self.inner, self.phase, self.malformed, self.bad, self.ended = inner, phase, malformed, set(), []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def begin(self, seq_id, prompt, *args):
        if prompt[0] == BAD:
            self.bad.add(seq_id)
            if self.phase == "begin":
                raise RuntimeError("begin exploded")
        self.inner.begin(seq_id, prompt, *args)

    def propose(self, requests):
        props = self.inner.propose(requests)
        if any(r.seq_id in self.bad for r in requests) and self.phase == "propose":
            if self.malformed:
                return [DraftProposal([10**6]) if r.seq_id in self.bad else p for r, p in zip(requests, props)]
            raise RuntimeError("propose exploded")
        return props

    def feedback(self, fb):
        if fb.seq_id in self.bad and self.phase == "feedback" and fb.proposal.tokens:
            raise RuntimeError("feedback exploded")
        self.inner.feedback(fb)

    def end(self, seq_id):
        self.ended.append(seq_id)
        if seq_id in self.bad and self.phase == "end":
            raise RuntimeError("end exploded")
        self.inner.end(seq_id)


@pytest.fixture(scope="module")
def target():
    return tiny_model(seed=21, vocab=64, layers=2)


def run(target, phase, malformed=False, sampling=None, max_batch=16):
    drafter = Faulty(create("ngram", target, min_n=1, max_n=3), phase, malformed)
    eng = Engine(target, {"ngram": drafter}, max_batch=max_batch, max_len=128)
    reqs = [Request(p, 30, sampling or SamplingParams(), drafter="ngram", num_draft=4) for p in PROMPTS]
    return eng, drafter, eng.generate(reqs)


@pytest.fixture(scope="module")
def plain(target):
    eng = Engine(target, {"none": create("none", target)}, max_batch=16, max_len=128)
    return [r.tokens for r in eng.generate([Request(p, 30) for p in PROMPTS])]


@pytest.fixture(scope="module")
def clean(target):
    """The same batch with a drafter that never fails: the other sequences' statistics to compare."""
    return run(target, None)[2]


@pytest.mark.parametrize("phase,malformed", [("begin", False), ("propose", False), ("propose", True),
                                             ("feedback", False), ("end", False)])
def test_a_drafter_fault_for_one_of_sixteen_costs_nobody_their_answer(target, plain, clean, phase, malformed):
    eng, drafter, outs = run(target, phase, malformed)
    assert [o.tokens for o in outs] == plain                     # every answer is plain decoding's
    assert eng.snapshot().drafter_faults == {"ngram": 1}
    assert outs[-1].stats.drafter_faults == (0 if phase == "end" else 1)
    for o, c in zip(outs[:-1], clean[:-1]):                      # the other 15: untouched
        assert o.stats.drafter_faults == 0
        assert (o.stats.drafted_per_depth, o.stats.accepted_per_depth) == (c.stats.drafted_per_depth,
                                                                           c.stats.accepted_per_depth)
    if phase in ("begin", "propose") and not malformed:
        assert outs[-1].stats.drafted_tokens == 0                # plain decoding from its first step
    assert sorted(drafter.ended) == sorted(range(len(PROMPTS)))  # every sequence's state was ended once
    assert eng.num_running == 0 and eng.free_capacity == 16


def test_after_a_fault_at_begin_a_sampled_sequence_is_plain_sampling_token_for_token(target):
    """Verification draws from its own seeded stream, so a sequence that never drafts samples exactly
    what plain decoding with the same seed samples."""
    sampling = SamplingParams(temperature=0.9, seed=7)
    eng = Engine(target, {"none": create("none", target)}, max_batch=16, max_len=128)
    ref = eng.generate([Request(PROMPTS[-1], 30, sampling)])[0].tokens
    _, _, outs = run(target, "begin", sampling=sampling)
    assert outs[-1].tokens == ref and outs[-1].stats.drafter_faults == 1


def test_each_fault_is_logged_once_with_the_traceback_the_first_time(target, caplog):
    drafter = Faulty(create("ngram", target, min_n=1, max_n=3), "propose")
    eng = Engine(target, {"ngram": drafter}, max_batch=4, max_len=128)
    with caplog.at_level(logging.ERROR, logger="specserve.engine"):
        eng.generate([Request([BAD, 1, 2, i], 10, drafter="ngram", num_draft=3) for i in range(3)])
    records = [r for r in caplog.records if "continues by plain decoding" in r.getMessage()]
    assert len(records) == 3 and eng.snapshot().drafter_faults == {"ngram": 3}
    assert records[0].exc_info is not None and "propose exploded" in records[0].getMessage()
    assert all(r.exc_info is None for r in records[1:])


class FailingPass:
    """The target model, raising on the pass after ``after`` successful ones."""

    def __init__(self, model, after: int):
        self.model, self.after = model, after

    def __getattr__(self, name):
        return getattr(self.model, name)

    def __call__(self, *args, **kwargs):
        self.after -= 1
        if self.after == -1:
            raise RuntimeError("pass exploded")
        return self.model(*args, **kwargs)


def test_a_failed_pass_drops_its_sequences_and_the_engine_serves_on(target, plain):
    eng = Engine(target, {"ngram": create("ngram", target, min_n=1, max_n=3)}, max_batch=4, max_len=128)
    real = eng.model
    eng.model = FailingPass(real, after=3)
    ids = [eng.admit(Request(p, 30, drafter="ngram", num_draft=4)) for p in PROMPTS[:2]]
    with pytest.raises(PassFailed) as info:
        for _ in range(10):
            eng.step()
    assert sorted(info.value.seq_ids) == sorted(ids)
    assert "target pass failed: RuntimeError: pass exploded" == info.value.message
    assert eng.num_running == 0 and eng.free_capacity == 4 and all(eng.take_result(i) is None for i in ids)
    eng.model = real
    outs = eng.generate([Request(p, 30, drafter="ngram", num_draft=4) for p in PROMPTS[:4]])
    assert [o.tokens for o in outs] == plain[:4]
