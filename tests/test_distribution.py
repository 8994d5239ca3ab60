"""Speculative sampling reproduces the target's distribution exactly.

Three levels:

1. ``rejection_verify`` alone, with hand-made target p and draft q over 6 tokens that are close,
   far, or disjoint: the first emitted token must follow p at the drafted position.
2. The whole engine on a tiny model with 8 tokens: the exact distribution of 3-token
   continuations is enumerated from the target (512 sequences), and speculative generation with a
   draft model (close and far) and with one-hot drafts must match it at temperatures 0.7 and 1.0,
   with top-k and with top-p.
3. Trees: ``tree_rejection_verify_row`` with three siblings (one-hot, drawn with and without
   replacement), and the engine with sampled trees (two schemes, two shapes) and n-gram tries,
   against the same enumerated law; and the learned drafters (EAGLE, Medusa), whose q is zero
   outside their reduced vocabulary.

Every check is Pearson's chi-square (``tests/chisq.py``), failing at a p-value of ``ALPHA`` = 1e-3:
a false-failure rate of 0.1% per test for a correct sampler.  Seeds are fixed (``SEEDS``; engine
request i is seeded i; the close draft model's noise comes from a seeded generator), so each run
draws the same samples in every process and the seeded run passes deterministically; alpha is the
chance that other seeds (or a change in the order of the engine's draws) make a correct sampler fail.

Sample sizes are set by power, the chance that the test fails for a known-wrong sampler
(``tests/wrong_samplers.py``; ``chisq.power``: the noncentral chi-square, with the test's pooling).
Each case's n is the smallest (plus 10%, rounded up to 100) with power >= 0.99 against both

* ``residual_is_p``: on rejection, draw from p instead of normalise(max(0, p - q)), the classic
  mistake.  Its law has no closed form in the engine, so its distance from p was estimated without
  bias from 4,000 generations of the engine with the bug put in (seeds 0..3,999).  It is quiet where
  q is close to p (few rejections), far from it (the residual is nearly p), or where p is nearly
  one-hot (top-p 0.8 here; ``auto`` trims the untrained heads' drafts to little): where it would
  take more than 3,000 samples (the size every case had before) the case is not sized for it, and
  the table says how many it would take;
* a temperature 25% too high (T * 1.25), exact by enumeration: the floor for every case, which
  needs 456, 484, 796 and 2,416 samples at T = 0.7, T = 1.0, top-k 3 and top-p 0.8 (whose
  nucleus barely moves with T).

The tables beside each test give n, the n ``residual_is_p`` needs, and the tier: the fast tier
(``-m "not slow"``) runs one case per drafter family, the full tier every case.  The
``test_*_detects_*`` tests run the wrong samplers through the same checks at the same n (engine
seeds from 10**6, apart from those the sizing used) and assert that they fail: the power is shown,
not only computed.  The tables come from ``.venv/bin/python scripts/size_stat_tests.py`` (about 6
minutes on 2 cores; ``--check`` fails if a case's n is below what it recommends): rerun it when a
case, a drafter or the sampling changes.
"""

import functools

import pytest
import torch

from chisq import ALPHA, chi_square_pvalue
from conftest import tiny_head, tiny_model, tiny_state_dict, tiny_config
from specserve.drafters import create
from specserve.drafters.base import DraftProposal, Drafter
from specserve.drafters.draft_model import DraftModelDrafter
from specserve.drafters.ngram import NgramDrafter
from specserve.drafters.ngram_tree import NgramTreeDrafter
from specserve.drafters.none import NoDrafter
from specserve.engine import Engine, Request
from specserve.sampling import SamplingParams, exponential_noise, processed_probs, race
from specserve.verify import rejection_verify, tree_rejection_verify_row
from wrong_samplers import chain_residual_is_p, tree_residual_is_p, wrong_verifier

SEEDS = {"close": 11, "far": 12, "disjoint": 13, "one-hot": 14,     # fixed: the same draws in every process
         "one-hot siblings": 21, "far with replacement": 22, "far without replacement": 23,
         "close without replacement": 24}
WRONG_SEEDS = 10 ** 6       # engine seeds of the wrong samplers' runs: apart from the sizing study's 0..3,999


def case(*values, n: int, fast: bool = False):
    """A parametrised case: ``values``, then its sample size n; full tier only unless ``fast``."""
    return pytest.param(*values, n, marks=() if fast else pytest.mark.slow, id="-".join(map(str, values)))


# ------------------------------------------------------------------------------------ verify alone
V = 6
P = torch.tensor([0.35, 0.25, 0.2, 0.1, 0.07, 0.03])
QS = {
    "close": torch.tensor([0.3, 0.3, 0.2, 0.1, 0.05, 0.05]),
    "far": torch.tensor([0.02, 0.03, 0.05, 0.1, 0.3, 0.5]),
    "disjoint": torch.tensor([0.0, 0.0, 0.0, 0.0, 0.6, 0.4]),
}
HOT = P ** (1 / 1.05) / (P ** (1 / 1.05)).sum()     # p at a temperature 5% too high


def first_token_counts(q: torch.Tensor | None, p: torch.Tensor, n: int, seed: int, always_accept=False,
                       verify=rejection_verify):
    """Emit n first tokens: draft x ~ q (or one-hot token 4 when q is None), verify against p."""
    g = torch.Generator().manual_seed(seed)
    pp = p.expand(n, 2, V).contiguous()
    if q is None:
        draft, qq = torch.full((n, 1), 4), None
    else:
        draft = torch.multinomial(q.expand(n, V), 1, replacement=True, generator=g)
        qq = q.expand(n, 1, V).contiguous()
    uniform = torch.zeros(n, 1) if always_accept else torch.rand(n, 1, generator=g)
    res = verify(draft, torch.ones(n, dtype=torch.long), qq, pp, uniform, exponential_noise((n, V), g))
    return torch.bincount(res.tokens[:, 0], minlength=V)


# Vectorised (milliseconds), so sized against a subtler wrong law than the engine's: p at a
# temperature 5% too high needs 50,688 (power 0.99); ``residual_is_p`` (exact law) needs 5,312
# (close), 332 (far), 468 (disjoint), 648 (one-hot); always accepting, 1,168 (close), 25 or fewer.
VERIFY_N = 51000


@pytest.mark.parametrize("name", ["close", "far", "disjoint", "one-hot"])
def test_verify_output_follows_target(name):
    """VERIFY_N single-position trials per case; fast tier (all four)."""
    counts = first_token_counts(QS.get(name), P, VERIFY_N, seed=SEEDS[name])
    assert chi_square_pvalue(counts, P) > ALPHA


@pytest.mark.parametrize("name", ["close", "far", "disjoint", "one-hot"])
def test_verify_detects_a_wrong_sampler(name):
    """The same check at the same n fails for each named wrong sampler: the replacement of a rejected
    draft drawn from p (not the residual), the draft always accepted (the output follows q), and a
    verifier handed a target 5% too hot."""
    for wrong in [dict(verify=chain_residual_is_p), dict(always_accept=True)]:
        counts = first_token_counts(QS.get(name), P, VERIFY_N, seed=SEEDS[name], **wrong)
        assert chi_square_pvalue(counts, P) <= ALPHA, wrong
    counts = first_token_counts(QS.get(name), HOT, VERIFY_N, seed=SEEDS[name])
    assert chi_square_pvalue(counts, P) <= ALPHA


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


def run_engine(target, drafter, name: str, params: SamplingParams, n: int, k, first_seed: int = 0) -> torch.Tensor:
    eng = Engine(target, {name: drafter}, max_batch=64, max_len=32)
    reqs = [Request(PROMPT, STEPS, SamplingParams(params.temperature, params.top_k, params.top_p, seed=first_seed + i),
                    drafter=name, num_draft=k) for i in range(n)]
    outs = eng.generate(reqs)
    index = torch.tensor([o.tokens[0] * 64 + o.tokens[1] * 8 + o.tokens[2] for o in outs])
    return torch.bincount(index, minlength=VOCAB ** STEPS)


PARAMS = {"t0.7": SamplingParams(0.7), "t1.0": SamplingParams(1.0), "topk3": SamplingParams(1.0, top_k=3),
          "topp0.8": SamplingParams(0.8, top_p=0.8)}


@functools.cache
def make_models():
    """(target, close, far); kernels=torch: these tests are about sampling, not batch invariance.
    ``close`` is the target's weights plus noise from a seeded generator (the global one's state
    would depend on which tests ran before)."""
    target = tiny_model(seed=11, vocab=VOCAB, kernels="torch", attention="sdpa", scale=0.8)
    cfg = tiny_config(vocab=VOCAB)
    g = torch.Generator().manual_seed(12)
    close_sd = {k: v + 0.15 * torch.randn(v.shape, generator=g) for k, v in tiny_state_dict(cfg, 11, 0.8).items()}
    close = tiny_model(seed=12, vocab=VOCAB, kernels="torch", attention="sdpa", sd=close_sd)
    far = tiny_model(seed=99, vocab=VOCAB, kernels="torch", attention="sdpa", scale=0.8)
    return target, close, far


@pytest.fixture(scope="module")
def models():
    return make_models()


def check_engine(models, drafter, name: str, pname: str, n: int, k, first_seed: int = 0) -> float:
    """The p-value of n seeded generations against the enumerated law."""
    target = models[0]
    counts = run_engine(target, drafter, name, PARAMS[pname], n, k, first_seed)
    return chi_square_pvalue(counts, exact_distribution(target, PARAMS[pname]))


def chain_drafter(models, dname: str):
    if dname == "ngram":
        return NgramDrafter(min_n=1, max_n=2)
    target, close, far = models
    return DraftModelDrafter(target, model=close if dname == "close" else far)


# case            n      residual_is_p needs   tier
# close  t0.7     1,600  1,416                 full
# close  t1.0     1,300  1,144                 fast
# close  topk3    1,300  1,128                 full
# close  topp0.8  2,700  808                   full
# far    t0.7     600    6,112                 full
# far    t1.0     3,000  2,656                 full
# far    topk3    900    16,384                full
# far    topp0.8  2,700  none seen             full
# ngram  t0.7     2,700  2,416                 full
# ngram  t1.0     1,000  888                   fast
# ngram  topk3    1,100  992                   full
# ngram  topp0.8  2,700  none seen             full
@pytest.mark.parametrize("dname,pname,n", [
    case("close", "t0.7", n=1600), case("close", "t1.0", n=1300, fast=True), case("close", "topk3", n=1300),
    case("close", "topp0.8", n=2700),
    case("far", "t0.7", n=600), case("far", "t1.0", n=3000), case("far", "topk3", n=900),
    case("far", "topp0.8", n=2700),
    case("ngram", "t0.7", n=2700), case("ngram", "t1.0", n=1000, fast=True), case("ngram", "topk3", n=1100),
    case("ngram", "topp0.8", n=2700)])
def test_engine_sampling_matches_target(models, dname, pname, n):
    """n generations of 3 tokens (k=2) per case, against the enumerated 512-outcome law."""
    assert check_engine(models, chain_drafter(models, dname), dname, pname, n, k=2) > ALPHA


def head_drafter(models, dname: str, width: int):
    target = models[0]
    return create(dname, target, head=tiny_head(dname, target), sample_width=width)


# case                       n      residual_is_p needs   tier
# eagle  t0.7     k=2 w=1    600    18,944                full
# medusa topp0.8  k=2 w=1    2,700  808                   full
# eagle  t0.7     k=6 w=2    1,300  1,152                 fast
# eagle  topk3    k=6 w=3    900    348                   full
# medusa topp0.8  k=6 w=2    2,700  808                   full
# eagle  t1.0     auto w=2   600    none seen             full
# medusa t0.7     auto w=2   600    610,304               full
@pytest.mark.parametrize("dname,pname,k,width,n", [
    case("eagle", "t0.7", 2, 1, n=600), case("medusa", "topp0.8", 2, 1, n=2700),
    case("eagle", "t0.7", 6, 2, n=1300, fast=True), case("eagle", "topk3", 6, 3, n=900),
    case("medusa", "topp0.8", 6, 2, n=2700),
    case("eagle", "t1.0", "auto", 2, n=600), case("medusa", "t0.7", "auto", 2, n=600)])
def test_engine_sampling_with_learned_heads_matches_target(models, dname, pname, k, width, n):
    """n generations of 3 tokens per case: a head's q is zero outside its reduced vocabulary (6
    of the 8 tokens here), so rejection sampling must restore the other two.  Width 1: chains;
    wider: trees of siblings drawn without replacement, verified by recursive rejection; ``auto``:
    the controller trims each drawn tree by its depths, never by its draws."""
    assert check_engine(models, head_drafter(models, dname, width), dname, pname, n, k) > ALPHA


def merged_drafter(models):
    target = models[0]
    parts = {"ngram-tree": create("ngram-tree", target, min_n=1), "suffix": create("suffix", target, min_n=1),
             "eagle": create("eagle", target, head=tiny_head("eagle", target), sample_width=2)}
    return create("auto", target, parts=parts)


# case            n      residual_is_p needs   tier
# t0.7   k=6      800    708                   fast
# topk3  auto     900    none seen             full
# t1.0   k=12     600    412                   full
@pytest.mark.parametrize("pname,k,n", [case("t0.7", 6, n=800, fast=True), case("topk3", "auto", n=900),
                                       case("t1.0", 12, n=600)])
def test_engine_sampling_with_merged_trees_matches_target(models, pname, k, n):
    """n generations of 3 tokens per case with ``auto``: a trie of one-hot nodes (n-gram lookup
    over the prompt and the corpus of earlier requests) followed by a head's drawn subtree (siblings
    drawn without replacement, q zero outside its reduced vocabulary), verified by recursive
    rejection in that sibling order; ``auto``: the controller trims the merged tree by depth."""
    assert check_engine(models, merged_drafter(models), "auto", pname, n, k) > ALPHA


LAYERSKIP_N = 2300      # residual_is_p needs 2,064
PLAIN_N = 600           # nothing is rejected: the temperature 25% too high needs 484


def test_engine_sampling_with_layer_skipping_matches_target(models):
    """LAYERSKIP_N generations of 3 tokens (k=2): the target drafting with its second layer skipped
    (fast tier)."""
    drafter = create("layerskip", models[0], skip="1")
    assert check_engine(models, drafter, "layerskip", "t0.7", LAYERSKIP_N, k=2) > ALPHA


def test_engine_plain_sampling_matches_target(models):
    """PLAIN_N generations without drafts (fast tier)."""
    assert check_engine(models, NoDrafter(), "none", "t1.0", PLAIN_N, k=0) > ALPHA


def test_seeded_sampling_is_deterministic(models):
    target, close, _ = models
    a = run_engine(target, DraftModelDrafter(target, model=close), "d", PARAMS["t1.0"], 50, k=2)
    b = run_engine(target, DraftModelDrafter(target, model=close), "d", PARAMS["t1.0"], 50, k=2)
    assert torch.equal(a, b)


# ---------------------------------------------------------------------------------------------- trees
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


def first_token_counts_tree(q, p, n, seed, width, replacement, claim=None, verify=tree_rejection_verify_row):
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
        _, out = verify(tokens, [-1] * width, probs, pp, torch.rand(width, generator=g), exponential_noise((V,), g))
        counts[out[0]] += 1
    return counts


TREE_CASES = ["one-hot siblings", "far with replacement", "far without replacement", "close without replacement"]


def tree_case(case: str) -> tuple:
    """(q, replacement) of a ``TREE_CASES`` entry."""
    return (None if case.startswith("one-hot") else QS[case.split()[0]]), "without" not in case


# A Python loop per trial (about 0.3 ms each): sized like the engine's cases, against ``residual_is_p``
# (estimated from 20,000 trials of it) and p at a temperature 25% too high (2,496: the floor).
# case                        n       residual_is_p needs   tier
# one-hot siblings            2,800   204                   fast
# far with replacement        2,800   67                    fast
# far without replacement     2,800   128                   fast
# close without replacement   7,700   6,720                 full
TREE_N = {"one-hot siblings": 2800, "far with replacement": 2800, "far without replacement": 2800,
          "close without replacement": 7700}
WRONG_SIBLING_N = 900       # that wrong law needs 776 (estimated from 20,000 trials)


def tree_cases(fast: set[str]) -> list:
    return [c if c in fast else pytest.param(c, marks=pytest.mark.slow) for c in TREE_CASES]


@pytest.mark.parametrize("case", tree_cases(fast={"one-hot siblings", "far with replacement",
                                                  "far without replacement"}))
def test_tree_verify_output_follows_target(case):
    """TREE_N[case] trials of 3 siblings per case: the first emitted token follows p."""
    q, replacement = tree_case(case)
    counts = first_token_counts_tree(q, P, TREE_N[case], seed=SEEDS[case], width=3, replacement=replacement)
    assert chi_square_pvalue(counts, P) > ALPHA


@pytest.mark.parametrize("case", tree_cases(fast={"far without replacement"}))
def test_tree_verify_detects_residual_is_p(case):
    """Recursive rejection that never moves to the residual fails the same check at the same n."""
    q, replacement = tree_case(case)
    counts = first_token_counts_tree(q, P, TREE_N[case], seed=SEEDS[case], width=3, replacement=replacement,
                                     verify=tree_residual_is_p)
    assert chi_square_pvalue(counts, P) <= ALPHA


def test_tree_verify_detects_a_wrong_sibling_law():
    """Siblings drawn without replacement but verified as if drawn with replacement (q not
    renormalised): the output is no longer p, and the chi-square test must say so (fast tier)."""
    counts = first_token_counts_tree(QS["far"], P, WRONG_SIBLING_N, seed=5, width=3, replacement=False, claim=True)
    assert chi_square_pvalue(counts, P) <= ALPHA


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


def tree_drafter(models, dname: str, width: int, depth: int):
    target, close, far = models
    if dname == "ngram-tree":
        return NgramTreeDrafter(min_n=1, max_n=2, max_matches=4, max_depth=depth, min_score=0.0)
    if dname == "suffix":     # its corpus grows with every finished generation: trees by frequency
        return create("suffix", target, max_n=2, max_depth=depth, min_score=0.0, max_tokens=2000)
    if dname == "lookahead":  # window, pool and own-text nodes in one trie (each generation: 3 steps)
        return create("lookahead", target, window=2, ngram=2, guesses=2, own_nodes=2)
    which, scheme = dname.split("/")
    return SampledTreeDrafter(close if which == "close" else far, width, scheme == "with", depth)


# case                          n      residual_is_p needs   tier
# far/with       w=2 d=2 topk3  2,900  2,624                 full
# close/without  w=2 d=2 topp0.8 2,700 808                   full
# far/without    w=3 d=1 t1.0   800    664                   fast
# ngram-tree     d=2 t0.7       2,700  2,416                 full
# suffix         d=2 topk3      1,100  992                   fast
# lookahead      d=2 t0.7       3,300  2,976                 full
@pytest.mark.parametrize("dname,width,depth,pname,n", [
    case("far/with", 2, 2, "topk3", n=2900), case("close/without", 2, 2, "topp0.8", n=2700),
    case("far/without", 3, 1, "t1.0", n=800, fast=True), case("ngram-tree", 0, 2, "t0.7", n=2700),
    case("suffix", 0, 2, "topk3", n=1100, fast=True), case("lookahead", 0, 2, "t0.7", n=3300)])
def test_engine_tree_sampling_matches_target(models, dname, width, depth, pname, n):
    """n generations of 3 tokens per case with trees (sampled: ``width`` siblings per node,
    ``depth`` levels; n-gram, suffix and lookahead tries of up to 6 nodes), against the enumerated
    512-outcome law."""
    assert check_engine(models, tree_drafter(models, dname, width, depth), dname, pname, n, k=6) > ALPHA


# ------------------------------------------------------------------------------------ power, shown
@pytest.mark.parametrize("family,dname,pname,k,n", [
    case("chain", "ngram", "t1.0", 2, n=1000, fast=True), case("chain", "close", "t1.0", 2, n=1300),
    case("heads", "eagle", "t0.7", 6, n=1300), case("tree", "far/without", "t1.0", 6, n=800)])
def test_engine_detects_residual_is_p(models, family, dname, pname, k, n):
    """The engine with ``residual_is_p`` put in fails its case's check at its case's n (seeds apart
    from the sizing study's): chains (one-hot and model drafts), a learned head's drawn tree, and a
    sampled tree of three siblings."""
    drafter = {"chain": lambda: chain_drafter(models, dname), "heads": lambda: head_drafter(models, dname, 2),
               "tree": lambda: tree_drafter(models, dname, 3, 1)}[family]()
    with wrong_verifier("residual_is_p"):
        assert check_engine(models, drafter, dname, pname, n, k, first_seed=WRONG_SEEDS) <= ALPHA


def test_engine_detects_a_temperature_off(models):
    """Plain decoding at a temperature 25% too high fails plain decoding's check at PLAIN_N (fast tier)."""
    target = models[0]
    counts = run_engine(target, NoDrafter(), "none", SamplingParams(1.25), PLAIN_N, 0, WRONG_SEEDS)
    assert chi_square_pvalue(counts, exact_distribution(target, PARAMS["t1.0"])) <= ALPHA
