"""Logits processing: temperature, top-k, top-p, and the exponential race."""

import pytest
import torch

from chisq import chi_square_pvalue
from specserve.errors import SpecserveError
from specserve.sampling import SamplingParams, exponential_noise, processed_probs, race


def test_temperature_top_k_top_p_by_hand():
    logits = torch.log(torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05]))
    p = processed_probs(logits, SamplingParams(temperature=1.0))
    assert torch.allclose(p, torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05]), atol=1e-6)
    p = processed_probs(logits, SamplingParams(temperature=1.0, top_k=2))
    assert torch.allclose(p, torch.tensor([0.5, 0.2, 0, 0, 0]) / 0.7, atol=1e-6)
    # top_p 0.7: tokens until the mass before them reaches 0.7 -> {0.5, 0.2}
    p = processed_probs(logits, SamplingParams(temperature=1.0, top_p=0.7))
    assert torch.allclose(p, torch.tensor([0.5, 0.2, 0, 0, 0]) / 0.7, atol=1e-6)
    p = processed_probs(logits, SamplingParams(temperature=1.0, top_p=0.71))
    assert torch.allclose(p, torch.tensor([0.5, 0.2, 0.15, 0, 0]) / 0.85, atol=1e-6)
    # temperature 0.5 squares the probabilities (then renormalises)
    p = processed_probs(logits, SamplingParams(temperature=0.5))
    sq = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05]) ** 2
    assert torch.allclose(p, sq / sq.sum(), atol=1e-6)
    # greedy: one-hot argmax
    assert processed_probs(logits, SamplingParams()).tolist() == [1, 0, 0, 0, 0]


def test_top_p_keeps_the_top_token_even_when_tiny():
    p = processed_probs(torch.tensor([3.0, 1.0, 0.0]), SamplingParams(temperature=1.0, top_p=1e-6))
    assert p.tolist() == [1.0, 0.0, 0.0]


@pytest.mark.parametrize("kw", [dict(temperature=-0.1), dict(top_p=0.0), dict(top_p=1.5), dict(top_k=-1),
                                dict(temperature=float("nan")), dict(seed=1.5)])
def test_bad_params_refused(kw):
    with pytest.raises(SpecserveError):
        SamplingParams(**kw)


def test_exponential_race_samples_the_distribution():
    """40,000 draws over 5 outcomes; chi-square p-value > 1e-3 (false-failure rate 0.1%)."""
    probs = torch.tensor([0.4, 0.3, 0.2, 0.07, 0.03])
    g = torch.Generator().manual_seed(0)
    noise = exponential_noise((40000, 5), g)
    draws = race(probs.expand(40000, 5) * 3.0, noise)       # unnormalised input is fine
    assert chi_square_pvalue(torch.bincount(draws, minlength=5), probs) > 1e-3


@pytest.mark.parametrize("vocab", [7, 300, 49152])
def test_top_p_without_a_full_sort_is_the_sorted_reference(vocab):
    """The nucleus found among the likeliest candidates (grown while they hold less than top_p) is
    the full sort's, on peaked and on flat rows (nuclei from 1 token to most of the vocabulary, so
    the candidates grow past their first 256), temperatures and thresholds; a difference is allowed
    only between tokens of equal logit (which of two tied tokens a sort puts first is arbitrary)."""
    from specserve.sampling import top_p_filtered, top_p_sorted
    g = torch.Generator().manual_seed(vocab)
    for trial in range(24):
        logits = torch.randn(3, vocab, generator=g) * [0.3, 1.0, 3.0, 8.0][trial % 4]
        if trial % 3 == 0:
            logits[:, :5] += 15                                          # a few tokens hold nearly everything
        for p in (1e-6, 0.3, 0.9, 0.99):
            fast, ref = top_p_filtered(logits, p), top_p_sorted(logits, p)
            kept_f, kept_r = ~torch.isinf(fast), ~torch.isinf(ref)
            assert torch.equal(kept_f.sum(-1), kept_r.sum(-1))
            for r, i in (kept_f != kept_r).nonzero().tolist():
                assert int((logits[r] == logits[r, i]).sum()) > 1
            same = kept_f & kept_r
            assert torch.equal(fast[same], logits[same])
