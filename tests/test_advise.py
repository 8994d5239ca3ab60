"""The advisor's replay: exact acceptance without the target, and predictions calibrated on plain decoding.

A replay over plain decoding's greedy output must accept exactly what the engine accepts for the
same drafts (fixed draft sizes: the controller's choices do not enter), alone and with rows shared;
plain decoding's prediction is its measured wall by construction; a drafter that needs the target's
prediction at rejected nodes is refused in one line.
"""

from types import SimpleNamespace

import pytest

from conftest import tiny_model
from specserve.bench.advise import predict, replay_level, teacher_features
from specserve.cli import main
from specserve.errors import SpecserveError
from specserve.llm import LLM
from specserve.sampling import SamplingParams

PROMPTS = [[1, 2, 3, 4, 5, 1, 2, 3], [10, 20, 30, 40, 50, 60, 10, 20] * 3, [9, 8, 7, 6, 5, 4], [3, 3, 3, 1, 2]]


@pytest.fixture(scope="module")
def llm():
    """An LLM around a tiny random model (no tokenizer: the replay works on token ids alone)."""
    target = tiny_model(seed=21, vocab=64, layers=2)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("specserve.llm.load_tokenizer", lambda _target: SimpleNamespace(eos_ids=(), hf=None))
        return LLM(loaded=target, drafters=["ngram-tree", "suffix", "lookahead"], max_batch=4, max_len=160)


@pytest.mark.parametrize("level", [1, 3])
@pytest.mark.parametrize("label", ["ngram-tree", "suffix"])
def test_a_replay_accepts_what_the_engine_accepts(llm, label, level):
    plain = llm.engine_with(level, ["none"]).generate([llm.request(p, 40, SamplingParams(), "none", 0) for p in PROMPTS])
    conts = [r.tokens for r in plain]
    llm.reset_memory()
    eng = llm.engine_with(level, [label])
    real = eng.generate([llm.request(p, 40, SamplingParams(), label, 4) for p in PROMPTS])
    assert [r.tokens for r in real] == conts
    steps = sum(r.stats.verify_passes for r in real)
    replayed = replay_level(llm, label, 4, PROMPTS, conts, teacher_features(llm, PROMPTS, conts, ()), level, 40)
    assert replayed.seq_steps == steps and replayed.tokens == sum(len(c) - 1 for c in conts)
    assert replayed.mean_accepted_length > 1.0                                # it did accept drafts


def test_plain_decoding_is_predicted_at_its_measured_wall(llm):
    conts = [r.tokens for r in llm.engine_with(2, ["none"]).generate(
        [llm.request(p, 30, SamplingParams(), "none", 0) for p in PROMPTS])]
    preds = predict(llm, [("none", 0), ("ngram-tree", "auto")], PROMPTS, conts, {1: 0.5, 2: 0.3}, 30)
    plain = [p for p in preds if p.method == "none"]
    assert [p.concurrency for p in plain] == [1, 2] and all(p.speedup == pytest.approx(1.0) for p in plain)
    tree = [p for p in preds if p.method == "ngram-tree"]
    assert len(tree) == 2 and all(p.speedup > 0 and p.mean_accepted_length >= 1.0 for p in tree)


def test_a_drafter_that_needs_the_targets_predictions_is_refused(llm):
    with pytest.raises(SpecserveError, match="cannot be replayed"):
        replay_level(llm, "lookahead", 4, PROMPTS[:1], [[1, 2, 3]], [{}], 1, 3)


def test_advise_refuses_bad_arguments_in_one_line(capsys):
    assert main(["advise", "--concurrency", "0"]) == 2
    assert main(["advise", "--methods", "ngram:nope=1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("specserve: error:") for line in err)
