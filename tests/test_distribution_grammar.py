"""Speculative sampling under a grammar and under penalties has exactly plain decoding's law.

A tiny model with 8 tokens, as text pieces ``a b c d ab e f <eos>``, and the regular expression
``[a-d][ab]?c[a-f]*``: the first token may be ``ab``, ``c`` is forced after two letters (one spelling:
a forced draft, beside drawn drafts the grammar forbids), the end of text is allowed once a ``c`` is
written.  The exact law of 4-token continuations (4,096 outcomes; after an end of text nothing) is
enumerated from the target with the grammar's mask at every position, and the engine's samples are
compared with it; penalties likewise, with each position penalised by the tokens before it.

Each test draws 3,000 samples and uses Pearson's chi-square with a p-value threshold of 1e-3: a
false-failure rate of 0.1% per test for a correct sampler (under 1% for the file's 8 such tests).
Seeds are fixed.  ``test_detects_an_unmasked_sampler`` shows the tests have power.
"""

import pytest
import torch

from chisq import chi_square_pvalue
from conftest import tiny_config, tiny_head, tiny_model, tiny_state_dict
from specserve.constrain import GrammarCompiler, GrammarSpec
from specserve.constrain.grammar import allowed, new_bitmask
from specserve.drafters import create
from specserve.engine import Engine, Request
from specserve.sampling import SamplingParams, processed_probs

PIECES = ["a", "b", "c", "d", "ab", "e", "f", "<eos>"]
VOCAB, EOS, PROMPT, STEPS = 8, 7, [1, 5, 2, 6], 4
REGEX = "[a-d][ab]?c[a-f]*"
N = 3000


@pytest.fixture(scope="module")
def setting():
    target = tiny_model(seed=11, vocab=VOCAB, kernels="torch", attention="sdpa", scale=0.8, eos_token_ids=(EOS,))
    cfg = tiny_config(vocab=VOCAB)
    close_sd = {k: v + 0.15 * torch.randn_like(v) for k, v in tiny_state_dict(cfg, 11, 0.8).items()}
    close = tiny_model(seed=12, vocab=VOCAB, kernels="torch", attention="sdpa", sd=close_sd)
    far = tiny_model(seed=99, vocab=VOCAB, kernels="torch", attention="sdpa", scale=0.8)
    grammar = GrammarCompiler.from_vocab(PIECES, [EOS]).compile(GrammarSpec("regex", REGEX))
    return target, close, far, grammar


def exact_law(target, params: SamplingParams, grammar=None) -> torch.Tensor:
    """P(continuation) for all 8^4 token tuples; after an end of text every later token is the end
    of text (with probability 1).  Penalties and the grammar's mask from each position's own prefix."""
    seqs = torch.cartesian_prod(*[torch.arange(VOCAB)] * STEPS)                             # [4096, 4]
    toks = torch.cat([torch.tensor(PROMPT).expand(len(seqs), -1), seqs[:, :-1]], dim=1)
    cache = target.model.new_cache(len(seqs), 16)
    logits = target.model(toks, cache, list(range(len(seqs))), [0] * len(seqs)).logits[:, len(PROMPT) - 1:].float().clone()
    ok = torch.ones(len(seqs), STEPS, VOCAB, dtype=torch.bool)
    ended = torch.zeros(len(seqs), STEPS, dtype=torch.bool)        # an end of text came before position j
    for i, seq in enumerate(seqs.tolist()):
        m = grammar.matcher() if grammar is not None else None
        bm = new_bitmask(1, VOCAB)
        for j, t in enumerate(seq):
            if j and seq[j - 1] == EOS or j and ended[i, j - 1]:
                ended[i, j] = True
                continue
            if m is not None:
                m.fill(bm, 0)
                ok[i, j] = allowed(bm, VOCAB)[0]
                if not ok[i, j, t]:
                    break                                          # probability 0 from here: masks unused
                m.accept(t)
    for j in range(STEPS):                                         # penalties: the tokens before j
        counts = torch.nn.functional.one_hot(seqs[:, :j], VOCAB).sum(1).float() if j else torch.zeros(len(seqs), VOCAB)
        seen = (counts > 0) | torch.isin(torch.arange(VOCAB), torch.tensor(PROMPT))[None]
        row = logits[:, j] - params.presence_penalty * (counts > 0).float() - params.frequency_penalty * counts
        r = params.repetition_penalty
        logits[:, j] = torch.where(seen, torch.where(row > 0, row / r, row * r), row)
    probs = processed_probs(logits.masked_fill(~ok, float("-inf")), params)               # [4096, 4, V]
    p = probs.gather(-1, seqs[..., None]).squeeze(-1)
    p = torch.where(ended, (seqs == EOS).float(), p)
    return p.prod(-1).double()


def sample_counts(target, drafter, name: str, params: SamplingParams, k, grammar=None, stats=None) -> torch.Tensor:
    """Outcome counts of N seeded requests; ``stats``: a dict given the forced tokens drafted."""
    eng = Engine(target, {name: drafter}, max_batch=64, max_len=32)
    reqs = [Request(PROMPT, STEPS, SamplingParams(params.temperature, params.top_k, params.top_p, i,
                                                  params.presence_penalty, params.frequency_penalty,
                                                  params.repetition_penalty),
                    drafter=name, num_draft=k, eos_ids=frozenset({EOS}), grammar=grammar) for i in range(N)]
    index = []
    outs = eng.generate(reqs)
    if stats is not None:
        stats["forced"] = sum(o.stats.forced_tokens for o in outs)
    for o in outs:
        t = o.tokens + [EOS] * (STEPS - len(o.tokens))
        index.append(sum(x * VOCAB ** (STEPS - 1 - j) for j, x in enumerate(t)))
    return torch.bincount(torch.tensor(index), minlength=VOCAB ** STEPS)


T07, T10 = SamplingParams(0.7), SamplingParams(1.0)
PEN = SamplingParams(1.0, presence_penalty=0.5, frequency_penalty=0.3, repetition_penalty=1.4)
PEN_TOPK = SamplingParams(0.8, top_k=3, presence_penalty=-0.4, repetition_penalty=1.6)


def drafter_of(kind: str, setting):
    target, close, far, _ = setting
    if kind in ("close", "far"):
        return create("draft-model", target, model=close if kind == "close" else far)
    if kind == "eagle":
        return create("eagle", target, head=tiny_head("eagle", target), sample_width=2)
    return create(kind, target)


@pytest.mark.parametrize("kind,params,k", [("none", T10, 0), ("far", T07, 3), ("ngram", T10, 3),
                                           ("eagle", T07, 6), ("auto", T07, "auto")])
def test_grammar_sampling_matches_the_masked_law(setting, kind, params, k):
    """3,000 samples per case: plain decoding under the grammar (the mask alone), a draft model whose
    drawn drafts the grammar may forbid (kept, rejected with certainty) beside forced ones, n-gram drafts
    (pruned), EAGLE's drawn trees, ``auto``'s merged trees."""
    target, grammar = setting[0], setting[3]
    stats = {}
    counts = sample_counts(target, drafter_of(kind, setting), kind, params, k, grammar, stats)
    assert chi_square_pvalue(counts, exact_law(target, params, grammar)) > 1e-3
    assert (stats["forced"] > 0) == (kind != "none")        # the forced "c" was drafted (never by plain)


@pytest.mark.parametrize("kind,params,with_grammar", [("close", PEN, False), ("far", PEN_TOPK, True)])
def test_penalised_sampling_matches_the_penalised_law(setting, kind, params, with_grammar):
    """3,000 samples per case: penalties applied at each drafted node from its own path."""
    target, grammar = setting[0], setting[3] if with_grammar else None
    counts = sample_counts(target, drafter_of(kind, setting), kind, params, 3, grammar)
    assert chi_square_pvalue(counts, exact_law(target, params, grammar)) > 1e-3


def test_detects_an_unmasked_sampler(setting):
    """Plain decoding under the grammar is far from the unmasked law, and penalised sampling far from
    the unpenalised one: the chi-square test tells them apart (3,000 samples each)."""
    target, grammar = setting[0], setting[3]
    masked = sample_counts(target, drafter_of("none", setting), "none", T10, 0, grammar)
    assert chi_square_pvalue(masked, exact_law(target, T10)) < 1e-6
    penalised = sample_counts(target, drafter_of("none", setting), "none", PEN, 0)
    assert chi_square_pvalue(penalised, exact_law(target, T10)) < 1e-6
