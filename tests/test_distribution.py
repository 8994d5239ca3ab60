"""Speculative sampling reproduces the target's distribution exactly.

Two levels:

1. ``rejection_verify`` alone, with hand-made target p and draft q over 6 tokens that are close,
   far, or disjoint: the first emitted token must follow p at the drafted position.
2. The whole engine on a tiny model with 8 tokens: the exact distribution of 3-token
   continuations is enumerated from the target (512 sequences), and speculative generation with a
   draft model (close and far) and with one-hot drafts must match it at temperatures 0.7 and 1.0,
   with top-k and with top-p.

3. Trees: ``tree_rejection_verify_row`` with three siblings (one-hot, drawn with and without
   replacement; 20,000 trials each), and the engine with sampled trees (two schemes, two shapes)
   and n-gram tries, against the same enumerated law; and the learned drafters (EAGLE, Medusa),
   whose q is zero outside their reduced vocabulary.

Each test uses Pearson's chi-square with a p-value threshold of 1e-3, i.e. a false-failure rate
of 0.1% per test for a correct sampler (about 3% for the whole file's 30 such tests).  Seeds are fixed, so
results are reproducible.  ``test_detects_a_wrong_sampler`` shows the test has power: a sampler
that always accepts the draft is rejected.
"""

import pytest
import torch

from chisq import chi_square_pvalue
from conftest import tiny_head, tiny_model, tiny_state_dict, tiny_config
from specserve.drafters import create
from specserve.drafters.draft_model import DraftModelDrafter
from specserve.drafters.ngram import NgramDrafter
from specserve.drafters.none import NoDrafter
from specserve.engine import Engine, Request
from specserve.sampling import SamplingParams, exponential_noise, processed_probs
from specserve.verify import rejection_verify

V = 6
P = torch.tensor([0.35, 0.25, 0.2, 0.1, 0.07, 0.03])
QS = {
    "close": torch.tensor([0.3, 0.3, 0.2, 0.1, 0.05, 0.05]),
    "far": torch.tensor([0.02, 0.03, 0.05, 0.1, 0.3, 0.5]),
    "disjoint": torch.tensor([0.0, 0.0, 0.0, 0.0, 0.6, 0.4]),
}


def first_token_counts(q: torch.Tensor | None, p: torch.Tensor, n: int, seed: int, always_accept=False):
    """Emit n first tokens: draft x ~ q (or one-hot token 4 when q is None), verify against p."""
    g = torch.Generator().manual_seed(seed)
    pp = p.expand(n, 2, V).contiguous()
    if q is None:
        draft, qq = torch.full((n, 1), 4), None
    else:
        draft = torch.multinomial(q.expand(n, V), 1, replacement=True, generator=g)
        qq = q.expand(n, 1, V).contiguous()
    uniform = torch.zeros(n, 1) if always_accept else torch.rand(n, 1, generator=g)
    res = rejection_verify(draft, torch.ones(n, dtype=torch.long), qq, pp, uniform, exponential_noise((n, V), g))
    return torch.bincount(res.tokens[:, 0], minlength=V)


SEEDS = {"close": 11, "far": 12, "disjoint": 13, "one-hot": 14}     # fixed: the same draws in every process


@pytest.mark.parametrize("name", ["close", "far", "disjoint", "one-hot"])
def test_verify_output_follows_target(name):
    """50,000 single-position trials per case (seeds fixed in ``SEEDS``)."""
    counts = first_token_counts(QS.get(name), P, 50000, seed=SEEDS[name])
    assert chi_square_pvalue(counts, P) > 1e-3


def test_detects_a_wrong_sampler():
    """Always accepting the far draft yields q, not p: the chi-square test must fail."""
    counts = first_token_counts(QS["far"], P, 50000, seed=1, always_accept=True)
    assert chi_square_pvalue(counts, P) < 1e-6


# ---------------------------------------------------------------------------- engine level
VOCAB, PROMPT, STEPS = 8, [1, 5, 2, 7], 3


def exact_distribution(target, params: SamplingParams) -> torch.Tensor:
    """P(x1, x2, x3 | prompt) for all 8^3 continuations, by enumeration with the target."""
    seqs = torch.cartesian_prod(*[torch.arange(VOCAB)] * STEPS)                    # [512, 3]
    toks = torch.cat([torch.tensor(PROMPT).expand(len(seqs), -1), seqs[:, :-1]], dim=1)
    cache = target.model.new_cache(len(seqs), 16)
    logits = target.model(toks, cache, list(range(len(seqs))), [0] * len(seqs)).logits   # [512, 6, V]
    probs = processed_probs(logits[:, len(PROMPT) - 1:], params)                          # [512, 3, V]
    return probs.gather(-1, seqs[..., None]).squeeze(-1).prod(-1).double()


def run_engine(target, drafter, name: str, params: SamplingParams, n: int, k: int) -> torch.Tensor:
    eng = Engine(target, {name: drafter}, max_batch=64, max_len=32)
    reqs = [Request(PROMPT, STEPS, SamplingParams(params.temperature, params.top_k, params.top_p, seed=i),
                    drafter=name, num_draft=k) for i in range(n)]
    outs = eng.generate(reqs)
    index = torch.tensor([o.tokens[0] * 64 + o.tokens[1] * 8 + o.tokens[2] for o in outs])
    return torch.bincount(index, minlength=VOCAB ** STEPS)


PARAMS = {"t0.7": SamplingParams(0.7), "t1.0": SamplingParams(1.0), "topk3": SamplingParams(1.0, top_k=3),
          "topp0.8": SamplingParams(0.8, top_p=0.8)}


@pytest.fixture(scope="module")
def models():
    # kernels=torch: these tests are about sampling, not batch invariance
    target = tiny_model(seed=11, vocab=VOCAB, kernels="torch", attention="sdpa", scale=0.8)
    cfg = tiny_config(vocab=VOCAB)
    close_sd = {k: v + 0.15 * torch.randn_like(v) for k, v in tiny_state_dict(cfg, 11, 0.8).items()}
    close = tiny_model(seed=12, vocab=VOCAB, kernels="torch", attention="sdpa", sd=close_sd)
    far = tiny_model(seed=99, vocab=VOCAB, kernels="torch", attention="sdpa", scale=0.8)
    return target, close, far


def tiered(cases, fast):
    """``cases`` for parametrize, those not in ``fast`` marked ``slow``: the fast tier keeps one case
    per drafter family, the full tier runs them all (same sample sizes, same seeds)."""
    return [c if c in fast else pytest.param(*(c if isinstance(c, tuple) else (c,)), marks=pytest.mark.slow)
            for c in cases]


@pytest.mark.parametrize("dname,pname", tiered([(d, p) for d in ["close", "far", "ngram"] for p in PARAMS],
                                              fast={("far", "topk3"), ("ngram", "t0.7")}))
def test_engine_sampling_matches_target(models, dname, pname):
    """3,000 generations of 3 tokens (k=2) per case, against the enumerated 512-outcome law."""
    target, close, far = models
    params = PARAMS[pname]
    drafter = NgramDrafter(min_n=1, max_n=2) if dname == "ngram" else \
        DraftModelDrafter(target, model=close if dname == "close" else far)
    counts = run_engine(target, drafter, dname, params, 3000, k=2)
    assert chi_square_pvalue(counts, exact_distribution(target, params)) > 1e-3


@pytest.mark.parametrize("dname,pname,k,width", tiered([("eagle", "t0.7", 2, 1), ("medusa", "topp0.8", 2, 1),
                                                        ("eagle", "t0.7", 6, 2), ("eagle", "topk3", 6, 3),
                                                        ("medusa", "topp0.8", 6, 2),
                                                        ("eagle", "t1.0", "auto", 2), ("medusa", "t0.7", "auto", 2)],
                                                       fast={("eagle", "t0.7", 6, 2), ("medusa", "topp0.8", 2, 1)}))
def test_engine_sampling_with_learned_heads_matches_target(models, dname, pname, k, width):
    """3,000 generations of 3 tokens per case: a head's q is zero outside its reduced vocabulary (6
    of the 8 tokens here), so rejection sampling must restore the other two.  Width 1: chains;
    wider: trees of siblings drawn without replacement, verified by recursive rejection; ``auto``:
    the controller trims each drawn tree by its depths, never by its draws."""
    target = models[0]
    drafter = create(dname, target, head=tiny_head(dname, target), sample_width=width)
    counts = run_engine(target, drafter, dname, PARAMS[pname], 3000, k=k)
    assert chi_square_pvalue(counts, exact_distribution(target, PARAMS[pname])) > 1e-3


@pytest.mark.parametrize("pname,k", tiered([("t0.7", 6), ("topk3", "auto"), ("t1.0", 12)], fast={("t0.7", 6)}))
def test_engine_sampling_with_merged_trees_matches_target(models, pname, k):
    """3,000 generations of 3 tokens per case with ``auto``: a trie of one-hot nodes (n-gram lookup
    over the prompt and the corpus of earlier requests) followed by a head's drawn subtree (siblings
    drawn without replacement, q zero outside its reduced vocabulary), verified by recursive
    rejection in that sibling order; ``auto``: the controller trims the merged tree by depth."""
    target = models[0]
    parts = {"ngram-tree": create("ngram-tree", target, min_n=1), "suffix": create("suffix", target, min_n=1),
             "eagle": create("eagle", target, head=tiny_head("eagle", target), sample_width=2)}
    counts = run_engine(target, create("auto", target, parts=parts), "auto", PARAMS[pname], 3000, k=k)
    assert chi_square_pvalue(counts, exact_distribution(target, PARAMS[pname])) > 1e-3


def test_engine_sampling_with_layer_skipping_matches_target(models):
    """3,000 generations of 3 tokens (k=2): the target drafting with its second layer skipped."""
    target = models[0]
    drafter = create("layerskip", target, skip="1")
    counts = run_engine(target, drafter, "layerskip", PARAMS["t0.7"], 3000, k=2)
    assert chi_square_pvalue(counts, exact_distribution(target, PARAMS["t0.7"])) > 1e-3


def test_engine_plain_sampling_matches_target(models):
    target = models[0]
    counts = run_engine(target, NoDrafter(), "none", PARAMS["t1.0"], 3000, k=0)
    assert chi_square_pvalue(counts, exact_distribution(target, PARAMS["t1.0"])) > 1e-3


def test_seeded_sampling_is_deterministic(models):
    target, close, _ = models
    a = run_engine(target, DraftModelDrafter(target, model=close), "d", PARAMS["t1.0"], 50, k=2)
    b = run_engine(target, DraftModelDrafter(target, model=close), "d", PARAMS["t1.0"], 50, k=2)
    assert torch.equal(a, b)


# ---------------------------------------------------------------------------------------------- trees
from specserve.drafters.base import DraftProposal, Drafter  # noqa: E402
from specserve.drafters.ngram_tree import NgramTreeDrafter  # noqa: E402
from specserve.sampling import race  # noqa: E402
from specserve.verify import tree_rejection_verify_row  # noqa: E402


def draw_siblings(q: torch.Tensor, width: int, replacement: bool, g: torch.Generator,
                  claim_replacement: bool | None = None) -> tuple[list[int], list[torch.Tensor]]:
    """``width`` sibling tokens drawn from q, and the q each was drawn from (renormalised over the
    tokens not yet drawn when drawing without replacement).  ``claim_replacement`` reports the
    q of the other scheme: a wrong tree sampler, for the power tests."""
    claim = replacement if claim_replacement is None else claim_replacement
    tokens, qs, left = [], [], q.clone()
    for _ in range(width):
        if not replacement and left.sum() <= 0:          # q's support is exhausted: no more siblings
            break
        dist = q if replacement else left / left.sum()
        tokens.append(int(race(dist, exponential_noise(tuple(dist.shape), g))))
        qs.append(q if claim else left / left.sum())
        left[tokens[-1]] = 0
    return tokens, qs


def first_token_counts_tree(q, p, n, seed, width, replacement, claim=None):
    """Emit n first tokens from a tree of ``width`` siblings under the pending token."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.zeros(V, dtype=torch.long)
    pp = p.expand(width + 1, V)
    for _ in range(n):
        if q is None:                                    # deterministic distinct siblings, one-hot q
            tokens, probs = [4, 5, 0][:width], None
        else:
            tokens, qs = draw_siblings(q, width, replacement, g, claim)
            probs = torch.stack(qs)
        _, out = tree_rejection_verify_row(tokens, [-1] * width, probs, pp, torch.rand(width, generator=g),
                                           exponential_noise((V,), g))
        counts[out[0]] += 1
    return counts


@pytest.mark.parametrize("case", ["one-hot siblings", "far with replacement", "far without replacement",
                                  "close without replacement"])
def test_tree_verify_output_follows_target(case):
    """20,000 trials of 3 siblings per case: the first emitted token follows p."""
    q = None if case.startswith("one-hot") else QS[case.split()[0]]
    counts = first_token_counts_tree(q, P, 20000, seed=len(case), width=3, replacement="without" not in case)
    assert chi_square_pvalue(counts, P) > 1e-3


def test_tree_verify_detects_a_wrong_sibling_law():
    """Siblings drawn without replacement but verified as if drawn with replacement (q not
    renormalised): the output is no longer p, and the chi-square test must say so."""
    counts = first_token_counts_tree(QS["far"], P, 20000, seed=5, width=3, replacement=False, claim=True)
    assert chi_square_pvalue(counts, P) < 1e-6


class SampledTreeDrafter(Drafter):
    """Test drafter: a tree of ``depth`` levels, ``width`` children per node drawn from a draft
    model's q (with or without replacement), the draft model run on each path from scratch."""

    tree = True

    def __init__(self, draft, width: int, replacement: bool, depth: int = 2):
        self.draft, self.width, self.replacement, self.depth = draft, width, replacement, depth
        self.gen: dict[int, torch.Generator] = {}

    def begin(self, seq_id, prompt, sampling, max_new_tokens, generator=None):
        self.gen[seq_id] = generator

    def _q(self, tokens, sampling):
        m = self.draft.model
        logits = m(torch.tensor([tokens]), m.new_cache(1, len(tokens) + 1), [0], [0]).logits[0, -1]
        return processed_probs(logits, sampling)

    def propose(self, requests):
        out = []
        for r in requests:
            g, toks, pars, qs = self.gen[r.seq_id], [], [], []
            frontier = [(-1, [])]
            for _depth in range(min(self.depth, r.max_depth)):
                nxt = []
                for parent, path in frontier:
                    kids, kq = draw_siblings(self._q(r.tokens + path, r.sampling), self.width, self.replacement, g)
                    for t, q in zip(kids, kq):
                        pars.append(parent)
                        toks.append(t)
                        qs.append(q)
                        nxt.append((len(toks) - 1, path + [t]))
                frontier = nxt
            out.append(DraftProposal(toks, torch.stack(qs) if qs else None, pars).truncated(r.k, r.max_depth))
        return out


@pytest.mark.parametrize("dname,width,depth,pname", tiered(
    [("far/with", 2, 2, "topk3"), ("close/without", 2, 2, "topp0.8"), ("far/without", 3, 1, "t1.0"),
     ("ngram-tree", 0, 2, "t0.7"), ("suffix", 0, 2, "topk3"), ("lookahead", 0, 2, "t0.7")],
    fast={("far/with", 2, 2, "topk3"), ("ngram-tree", 0, 2, "t0.7")}))
def test_engine_tree_sampling_matches_target(models, dname, width, depth, pname):
    """3,000 generations of 3 tokens per case with trees (sampled: ``width`` siblings per node,
    ``depth`` levels; n-gram, suffix and lookahead tries of up to 6 nodes), against the enumerated
    512-outcome law."""
    target, close, far = models
    if dname == "ngram-tree":
        drafter = NgramTreeDrafter(min_n=1, max_n=2, max_matches=4, max_depth=depth, min_score=0.0)
    elif dname == "suffix":     # its corpus grows with every finished generation: trees by frequency
        drafter = create("suffix", target, max_n=2, max_depth=depth, min_score=0.0, max_tokens=2000)
    elif dname == "lookahead":  # window, pool and own-text nodes in one trie (each generation: 3 steps)
        drafter = create("lookahead", target, window=2, ngram=2, guesses=2, own_nodes=2)
    else:
        which, scheme = dname.split("/")
        drafter = SampledTreeDrafter(close if which == "close" else far, width, scheme == "with", depth)
    counts = run_engine(target, drafter, dname, PARAMS[pname], 3000, k=6)
    assert chi_square_pvalue(counts, exact_distribution(target, PARAMS[pname])) > 1e-3
