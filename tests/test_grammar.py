"""Grammars, penalties and logprobs: hand-built trees under a grammar, the pure penalty functions
against hand-computed values, and the engine on tiny random models (forced tokens drafted for
free, logprobs equal to plain decoding's and to a full forward pass, prompt scoring, penalised
decoding against a slow reference, limits and errors)."""

import json

import pytest
import torch

from conftest import TINY_SCHEMA, grammar_compiler, tiny_model
from specserve.constrain import GrammarSpec
from specserve.constrain.grammar import allowed, new_bitmask
from specserve.constrain.penalties import path_counts, penalise
from specserve.constrain.tree import masks, shape, single_token
from specserve.trees import paths_of
from specserve.control import PrefillPolicy
from specserve.drafters import DraftProposal, create
from specserve.engine import Engine, Request
from specserve.engine.constrained import under_grammar
from specserve.errors import SpecserveError
from specserve.sampling import SamplingParams

VOCAB = 64
EOS = VOCAB - 1


@pytest.fixture(scope="module")
def target():
    return tiny_model(seed=41, vocab=VOCAB, layers=2)


def text(pieces, tokens):
    return "".join(pieces[t] for t in tokens if t != EOS)


# ---------------------------------------------------------------------------- pure pieces
def test_bitmask_unpacking_and_single_token():
    bm = new_bitmask(2, 70)
    bm[0, 0] = 1 << 5
    bm[0, 2] = 1 << 3                       # tokens 5 and 67
    bm[1, 1] = -(1 << 31)                   # token 63 (the sign bit)
    ok = allowed(bm, 70)
    assert ok.shape == (2, 70)
    assert ok[0].nonzero().flatten().tolist() == [5, 67]
    assert ok[1].nonzero().flatten().tolist() == [63]
    assert single_token(bm[0]) is None and single_token(bm[1]) == 63
    assert single_token(new_bitmask(1, 70)[0]) is None


def test_shape_prunes_keeps_drawn_and_forces(grammar_vocab):
    """Grammar "xyz(a|b)" over pieces with "xy" a token.  Draft: x -> y -> q -> a (q forbidden after
    "xy": it and its child go), and b below the root (forbidden there, but drawn: kept, childless).
    At y (text "xy") no child is allowed, so the forced text "z" is proposed below it."""
    comp, pieces, ix = grammar_vocab
    m = comp.compile(GrammarSpec("regex", "xyz(a|b)")).matcher()
    tokens = [ix["x"], ix["y"], ix["q"], ix["a"], ix["b"]]
    parents = [-1, 0, 1, 2, -1]
    out = shape(m, tokens, parents, [False, False, False, False, True], room=8, max_depth=10, jump=True)
    assert out.keep == [0, 1, 4]
    # below y the forced "z"; beside x (deterministic) at the root the other spelling of "xyz", xy z;
    # beside y below x none: the forced "yz" starts with y, already drafted
    assert out.chains == [(1, [ix["z"]]), (-1, [ix["xy"], ix["z"]])]
    # room 2 in all: after "z" below y, one token is left for the chain at the root
    tight = shape(m, tokens, parents, [False, False, False, False, True], room=2, max_depth=10, jump=True)
    assert tight.chains == [(1, [ix["z"]]), (-1, [ix["xy"]])] and tight.forced == 2
    drawn = shape(m, tokens, parents, [True, False, False, False, True], room=8, max_depth=10, jump=True)
    assert drawn.chains == [(1, [ix["z"]])]             # beside a drawn node: nothing added
    # nothing drafted: at the root the grammar forces "xyz", the longest tokens first ("xy", "z")
    root = shape(m, [], [], [], room=8, max_depth=10, jump=True)
    assert root.keep == [] and root.chains == [(-1, [ix["xy"], ix["z"]])]
    assert shape(m, [], [], [], room=1, max_depth=10, jump=True).chains == [(-1, [ix["xy"]])]
    assert shape(m, [], [], [], room=8, max_depth=10, jump=False).chains == []
    # the matcher is back at the root: the whole text is still accepted from there
    assert all(m.accept(t) for t in [ix["xy"], ix["z"], ix["a"]])


def test_masks_follow_each_nodes_path(grammar_vocab):
    comp, pieces, ix = grammar_vocab
    m = comp.compile(GrammarSpec("regex", "xyz(a|b)")).matcher()
    tokens, parents = [ix["x"], ix["xy"], ix["y"], ix["q"]], [-1, -1, 0, 2]      # q is forbidden after "xy"
    rows = allowed(masks(m, tokens, parents), VOCAB)
    names = [{pieces[t] for t in r.nonzero().flatten().tolist()} for r in rows]
    assert names[0] == {"x", "xy"}                     # the root
    assert names[1] == {"y"}                           # after "x"
    assert names[2] == {"z"} and names[3] == {"z"}     # after "xy", spelt either way
    assert rows[4].all()                               # below a forbidden node: never read


def test_under_grammar_builds_the_proposal(grammar_vocab):
    """Forced nodes come last, one-hot where the proposal carries q, confidence 1; the drafter's own
    nodes and the accepted path through them are what ``drafted`` gives back."""
    comp, pieces, ix = grammar_vocab
    from specserve.constrain import Shaper
    g = comp.compile(GrammarSpec("regex", "xyz(a|b)"))
    q = torch.zeros(2, VOCAB)
    q[0, ix["x"]] = 1.0
    q[1, ix["y"]], q[1, ix["b"]] = 0.5, 0.5
    prop = DraftProposal([ix["x"], ix["y"]], q, [-1, 0], [0.9, 0.4])
    out = under_grammar(prop, Shaper(g, SamplingParams(), [1], VOCAB), room=8, max_depth=8, jump=True)
    # z below y; beside x (one-hot, so deterministic) at the root, the forced "xyz" spelt xy z
    assert out.tokens == [ix["x"], ix["y"], ix["z"], ix["xy"], ix["z"]] and out.parents == [-1, 0, 1, -1, 3]
    assert out.forced == 3 and out.drafter_nodes == 2 and out.confidence == [0.9, 0.4, 1.0, 1.0, 1.0]
    assert all(out.probs[n, out.tokens[n]] == 1 and out.probs[n].sum() == 1 for n in (2, 3, 4))
    own, path = out.drafted([0, 1, 2])
    assert own.tokens == prop.tokens and path == [0, 1]
    out.check(VOCAB)


def test_penalties_by_hand():
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0], [2.0, -1.0, 0.5, 3.0]])
    counts = torch.tensor([[0.0, 2.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    seen = torch.tensor([[True, True, False, False], [False, False, False, False]])
    out = penalise(logits, counts, seen, presence=0.5, frequency=0.25, repetition=2.0)
    # token 0: seen, positive -> 2 / 2; token 1: -1 - 0.5 - 0.5 = -2, seen, negative -> -4;
    # token 3: 3 - 0.5 - 0.25 = 2.25, unseen
    assert torch.equal(out[0], torch.tensor([1.0, -4.0, 0.5, 2.25]))
    assert torch.equal(out[1], logits[1])
    assert torch.equal(penalise(logits, counts, seen, 0.0, 0.0, 1.0), logits)


def test_path_counts_per_node():
    tokens, parents = [3, 3, 1, 2], [-1, 0, -1, 1]
    paths = paths_of(tokens, parents)
    assert paths == [(3,), (3, 3), (1,), (3, 3, 2)]
    c = path_counts(paths, 5)
    assert c[0].sum() == 0 and c[2, 3] == 2 and c[3, 1] == 1 and c[4].tolist() == [0, 0, 1, 2, 0]


def test_invalid_grammars_are_one_line_errors(grammar_vocab):
    comp = grammar_vocab[0]
    for spec, needle in ((GrammarSpec("regex", "(ab"), "invalid regex"),
                         (GrammarSpec("json_schema", '{"type": "bogus"}'), "invalid json_schema"),
                         (GrammarSpec("json_schema", "{not json"), "not JSON"),
                         (GrammarSpec("json_schema", "[1]"), "a schema is a JSON object"),
                         (GrammarSpec("grammar", "root ::= undefined_rule"), "invalid grammar")):
        with pytest.raises(SpecserveError, match=needle) as e:
            comp.compile(spec)
        assert "\n" not in str(e.value) and "/project/" not in str(e.value)
    with pytest.raises(SpecserveError, match="kind"):
        GrammarSpec("yaml", "x")
    with pytest.raises(SpecserveError, match="needs its source"):
        GrammarSpec("regex", "")


# ---------------------------------------------------------------------------- the engine
def plain_and(target, name, reqs, k="auto", **opts):
    """Outputs of plain decoding, then of drafter ``name`` (draft size ``k``), for the same requests
    (given as kwargs dicts)."""
    plain = Engine(target, {"none": create("none", target)}, max_batch=2, max_len=160)
    spec = Engine(target, {name: create(name, target, **opts)}, max_batch=2, max_len=160)
    return (plain.generate([Request(**r) for r in reqs]),
            spec.generate([Request(**r, drafter=name, num_draft=k) for r in reqs]))


def test_forced_text_is_drafted_for_free(target, grammar_vocab):
    """A grammar that fixes the whole text ("qrstuvw", one spelling only): plain decoding takes a pass
    per token, speculation verifies the forced chain in one pass and then the forced end of text."""
    comp, pieces, ix = grammar_vocab
    g = comp.compile(GrammarSpec("regex", "qrstuvw"))
    req = dict(prompt=[5, 6, 7], max_tokens=20, grammar=g, eos_ids=frozenset({EOS}))
    # a fixed draft size: under "auto" the budget follows measured step times, which a busy machine moves
    (plain,), (spec,) = plain_and(target, "ngram", [req], k=8)
    assert text(pieces, plain.tokens) == "qrstuvw" and plain.tokens[-1] == EOS and plain.finish_reason == "stop"
    assert spec.tokens == plain.tokens
    assert plain.stats.target_passes == 8                 # the prefill gives "q"; 6 letters and the end
    assert spec.stats.target_passes == 2                  # the prefill, then "rstuvw" and the end in one pass
    assert spec.stats.forced_accepted == spec.stats.forced_tokens == 7


def test_forced_chains_run_on_to_the_end_of_text(grammar_vocab):
    """Where the grammar allows only one token after a forced chain, or only end-of-text tokens, the
    chain goes on with it: "xyz" is drafted as xy, z, then the end of text; with two end-of-text
    tokens, the one the target wrote last (``Spelling.end``), else the lowest."""
    from specserve.constrain import GrammarCompiler
    from specserve.constrain.spelling import Spelling

    comp, pieces, ix = grammar_vocab
    m = comp.compile(GrammarSpec("regex", "xyz")).matcher()
    assert shape(m, [], [], [], room=8, max_depth=10, jump=True).chains == [(-1, [ix["xy"], ix["z"], EOS])]
    assert shape(m, [], [], [], room=2, max_depth=10, jump=True).chains == [(-1, [ix["xy"], ix["z"]])]
    assert all(m.accept(t) for t in [ix["xy"], ix["z"], EOS]) and m.terminated
    two = GrammarCompiler.from_vocab(pieces, [EOS, ix["q"]]).compile(GrammarSpec("regex", "xyz")).matcher()
    assert shape(two, [], [], [], room=8, max_depth=10, jump=True).chains == [(-1, [ix["xy"], ix["z"], ix["q"]])]
    seen = Spelling()
    seen.end = EOS
    chains = shape(two, [], [], [], room=8, max_depth=10, jump=True, spelling=seen).chains
    assert chains == [(-1, [ix["xy"], ix["z"], EOS])]


def test_schema_output_validates_and_matches_plain_sampled_per_seed(target, grammar_vocab):
    """Sampling under a schema: every output is a complete document of the schema or stopped by
    max_tokens; a seeded request gives the same output alone and in a batch (plain decoding)."""
    comp, pieces, ix = grammar_vocab
    g = comp.compile(GrammarSpec("json_schema", json.dumps(TINY_SCHEMA)))
    reqs = [dict(prompt=[3, 4, 5 + i], max_tokens=60, grammar=g, eos_ids=frozenset({EOS}),
                 sampling=SamplingParams(0.9, seed=i)) for i in range(6)]
    plain, spec = plain_and(target, "ngram-tree", reqs)
    for out in plain + spec:
        if out.finish_reason == "stop":
            doc = json.loads(text(pieces, out.tokens))
            assert set(doc) == {"name", "age", "ok"} and len(doc["name"]) <= 8 and doc["age"] <= 999
        else:
            m = g.matcher()
            assert all(m.accept(t) for t in out.tokens) and len(out.tokens) == 60
    alone = Engine(target, {"none": create("none", target)}, max_batch=1, max_len=160).generate([Request(**reqs[2])])[0]
    assert alone.tokens == plain[2].tokens


def test_unsatisfiable_within_max_tokens_ends_by_length(target, grammar_vocab):
    comp, pieces, ix = grammar_vocab
    g = comp.compile(GrammarSpec("regex", "qrstuvwxyz"))
    (plain,), (spec,) = plain_and(target, "ngram", [dict(prompt=[1, 2], max_tokens=4, grammar=g,
                                                          eos_ids=frozenset({EOS}))])
    for out in (plain, spec):
        assert out.finish_reason == "length" and text(pieces, out.tokens) == "qrst"


def test_logprobs_equal_plain_decodings_and_a_full_pass(target):
    """Greedy: the same numbers, bit for bit, plain and speculative.  Both equal log_softmax of a full
    forward pass over prompt + output (to float tolerance: another pass shape)."""
    prompt = [10, 20, 30, 10, 20, 30, 10, 20]
    reqs = [dict(prompt=prompt, max_tokens=16, logprobs=3)]
    for name, opts in (("ngram", {}), ("ngram-tree", {}), ("auto", {}), ("oracle", {"alpha": 0.8})):
        (plain,), (spec,) = plain_and(target, name, reqs, k=4, **opts)
        assert spec.tokens == plain.tokens and spec.logprobs == plain.logprobs
        assert spec.stats.drafted_tokens > 0
    assert spec.stats.accepted_tokens > 0                  # the oracle's drafts: runs of accepted tokens
    assert [lp.token for lp in plain.logprobs] == plain.tokens
    full = target.model(torch.tensor([prompt + plain.tokens]), target.model.new_cache(1, 64), [0], [0]).logits[0]
    ref = torch.log_softmax(full[len(prompt) - 1:-1].float(), -1)
    for lp, row in zip(plain.logprobs, ref):
        assert abs(lp.logprob - float(row[lp.token])) < 1e-4
        assert [t for t, _ in lp.top] == row.topk(3).indices.tolist()
        assert lp.top[0][1] >= lp.top[1][1] >= lp.top[2][1]


def test_sampled_logprobs_are_those_of_the_committed_tokens(target):
    """Sampled, speculative: the logprobs are the target's at the positions of the tokens committed,
    whatever was drafted (a full pass over the output gives the same numbers)."""
    prompt = [10, 20, 30, 10, 20, 30, 10, 20]
    (_,), (spec,) = plain_and(target, "draft-model", [dict(prompt=prompt, max_tokens=20, logprobs=0,
                                                            sampling=SamplingParams(0.8, seed=3))], k=4,
                              model=tiny_model(seed=41, vocab=VOCAB, layers=2))      # q = p: runs accepted
    assert spec.stats.accepted_tokens > 0
    full = target.model(torch.tensor([prompt + spec.tokens]), target.model.new_cache(1, 64), [0], [0]).logits[0]
    ref = torch.log_softmax(full[len(prompt) - 1:-1].float(), -1)
    assert len(spec.logprobs) == len(spec.tokens)
    for lp, row in zip(spec.logprobs, ref):
        assert abs(lp.logprob - float(row[lp.token])) < 1e-4 and lp.top == ()


@pytest.mark.parametrize("chunk", [None, 16])
def test_prompt_logprobs_score_the_prompt(target, chunk):
    """max_tokens 0 with prompt_logprobs: nothing generated, every prompt token but the first scored
    (across prefill chunks), equal to a full forward pass; a cached prefix is not used."""
    prompt = list(range(1, 41))
    eng = Engine(target, {"none": create("none", target)}, max_batch=1, max_len=128,
                 prefill=PrefillPolicy(chunk=chunk, prefix_cache_mb=4))
    eng.generate([Request(prompt, 2)])                       # fills the prefix pool
    out = eng.generate([Request(prompt, 0, prompt_logprobs=2)])[0]
    assert out.tokens == [] and out.finish_reason == "length" and out.stats.cached_tokens == 0
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(prompt)
    full = target.model(torch.tensor([prompt]), target.model.new_cache(1, 64), [0], [0]).logits[0]
    ref = torch.log_softmax(full.float(), -1)
    for j in range(1, len(prompt)):
        lp = out.prompt_logprobs[j]
        assert lp.token == prompt[j] and abs(lp.logprob - float(ref[j - 1, prompt[j]])) < 1e-4
        assert [t for t, _ in lp.top] == ref[j - 1].topk(2).indices.tolist()
    both = eng.generate([Request(prompt, 3, prompt_logprobs=0, logprobs=0)])[0]
    assert len(both.tokens) == 3 == len(both.logprobs) and len(both.prompt_logprobs) == len(prompt)


def penalised_reference(target, prompt, n, sp: SamplingParams):
    """Greedy decoding with penalties, one full forward pass per token (the slow reference)."""
    out = []
    for _ in range(n):
        logits = target.model(torch.tensor([prompt + out]), target.model.new_cache(1, 128), [0], [0]).logits[0, -1]
        logits = logits.float().clone()
        for t in set(out):
            logits[t] -= sp.presence_penalty + sp.frequency_penalty * out.count(t)
        for t in set(prompt + out):
            logits[t] = logits[t] / sp.repetition_penalty if logits[t] > 0 else logits[t] * sp.repetition_penalty
        out.append(int(logits.argmax()))
    return out


@pytest.mark.parametrize("name", ["ngram", "ngram-tree", "suffix", "auto"])
def test_penalised_greedy_equals_plain_and_the_reference(target, name):
    """Penalties change the output (so the test has power), and speculative decoding, whose drafted
    nodes are each penalised from their own path, gives plain decoding's output exactly."""
    prompt = [10, 20, 30, 10, 20, 30, 10, 20, 30, 10]
    sp = SamplingParams(presence_penalty=0.4, frequency_penalty=0.3, repetition_penalty=1.3)
    (free,), _ = plain_and(target, "ngram", [dict(prompt=prompt, max_tokens=24)])
    (plain,), (spec,) = plain_and(target, name, [dict(prompt=prompt, max_tokens=24, sampling=sp)], k=4)
    assert plain.tokens != free.tokens
    assert spec.tokens == plain.tokens
    assert spec.stats.drafted_tokens > 0
    assert plain.tokens == penalised_reference(target, prompt, 24, sp)


def test_request_checks(target, grammar_vocab):
    eng = Engine(target, {"none": create("none", target)}, max_batch=1, max_len=64)
    for req, needle in ((Request([1], 0), "max_tokens must be >= 1"),
                        (Request([1], 2, logprobs=21), "logprobs must be an integer in"),
                        (Request([1], 2, prompt_logprobs=-1), "prompt_logprobs"),
                        (Request([1], 2, logprobs=True), "logprobs")):
        with pytest.raises(SpecserveError, match=needle):
            eng.check(req)
    other, _ = grammar_compiler(32)
    with pytest.raises(SpecserveError, match="compiled for 32 tokens"):
        eng.check(Request([1], 2, grammar=other.compile(GrammarSpec("json_object"))))
    for bad in (dict(presence_penalty=3.0), dict(frequency_penalty=-2.5), dict(repetition_penalty=0.0)):
        with pytest.raises(SpecserveError, match=next(iter(bad))):
            SamplingParams(**bad)


def test_mask_kernel_equals_the_reference():
    """xgrammar's in-place kernel against ``allowed`` + ``masked_fill``, random masks, 1 and 7 rows."""
    from specserve.constrain.grammar import apply_mask
    g = torch.Generator().manual_seed(0)
    for rows, vocab in ((1, 70), (7, 49152)):
        bm = torch.randint(-2**31, 2**31 - 1, (rows, (vocab + 31) // 32), dtype=torch.int32, generator=g)
        logits = torch.randn(rows, vocab, generator=g)
        fast = logits.clone()
        apply_mask(fast, bm)
        assert torch.equal(fast, logits.masked_fill(~allowed(bm, vocab), float("-inf")))


def test_greedy_rows_masked_only_where_the_argmax_is_forbidden(grammar_vocab):
    """A greedy shaper's rows have the argmax of the fully masked rows (rows whose argmax the grammar
    allows are left unmasked); a sampled shaper's rows are the fully masked rows."""
    from specserve.constrain import Shaper
    from specserve.constrain.grammar import apply_mask
    comp, pieces, ix = grammar_vocab
    g = comp.compile(GrammarSpec("json_schema", json.dumps(TINY_SCHEMA)))
    tokens, parents = [ix['{"'], ix["name"], ix['":"'], ix["a"]], [-1, 0, 1, 2]
    gen = torch.Generator().manual_seed(1)
    for trial in range(20):
        logits = torch.randn(5, VOCAB, generator=gen) * 3
        logits[trial % 5, ix["a"]] += 10 * (trial % 2)          # some rows' argmax allowed, some not
        full = logits.clone()
        apply_mask(full, masks(g.matcher(), tokens, parents))
        greedy = Shaper(g, SamplingParams(), [1], VOCAB).apply(logits, tokens, parents)
        assert torch.equal(greedy.argmax(-1), full.argmax(-1))
        sampled = Shaper(g, SamplingParams(1.0), [1], VOCAB).apply(logits, tokens, parents)
        assert torch.equal(sampled, full)
