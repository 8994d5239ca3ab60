"""Forced text drafted in the target's own spelling (``specserve.constrain.spelling``) and priced at
the rate the target accepts it (``Controller.forced_rate``): hand-built cases on a tiny vocabulary,
the shaper learning from commits, and the engine on a tiny random model (exact, and better drafts
once the spelling is known)."""


from conftest import grammar_compiler, tiny_model
from specserve.constrain import GrammarSpec, Shaper
from specserve.constrain.spelling import Spelling, chain
from specserve.control import DEFAULTS, Controller, CostModel, SeqView, StepPlan, Traits
from specserve.control.controller import forced_gains
from specserve.drafters import DraftProposal, create
from specserve.engine import Engine, Request
from specserve.sampling import SamplingParams

VOCAB = 64
EOS = VOCAB - 1


def test_chain_spells_as_learnt_else_as_xgrammar(grammar_vocab):
    """Regex "xyz(a|b)": the forced text "xyz" is "xy" + "z" for xgrammar; once the target was seen
    writing "x" then "y" there, the chain is x, y, then z (xgrammar's, where nothing was learnt)."""
    comp, pieces, ix = grammar_vocab
    m = comp.compile(GrammarSpec("regex", "xyz(a|b)")).matcher()
    assert chain(m, 1, 8, None) == [ix["xy"], ix["z"]]
    sp = Spelling()
    assert chain(m, 1, 8, sp) == [ix["xy"], ix["z"]]
    sp.learn(1, "xyz", ix["x"])
    sp.learn(ix["x"], "yz", ix["y"])
    assert chain(m, 1, 8, sp) == [ix["x"], ix["y"], ix["z"]]
    assert chain(m, 1, 2, sp) == [ix["x"], ix["y"]]                    # the budget
    assert chain(m, 7, 8, sp) == [ix["x"], ix["y"], ix["z"]]           # another predecessor: the text alone
    sp.learn(9, "xyz", ix["a"])                                        # a guess the grammar refuses
    assert sp.guess(9, "xyz") == ix["a"] and chain(m, 9, 8, sp) == []
    assert chain(m, 1, 8, sp) == [ix["x"], ix["y"], ix["z"]]           # its own predecessor's entry wins
    assert all(m.accept(t) for t in [ix["xy"], ix["z"], ix["b"]])      # the matcher was left at the root


def test_spelling_keeps_the_newest_entries():
    sp = Spelling(capacity=2)
    for i, text in enumerate(["ab", "cd", "ef"]):
        sp.learn(0, text, i)
    assert sp.guess(0, "ab") is None and sp.guess(0, "cd") == 1 and sp.guess(0, "ef") == 2
    sp.learn(0, "cd", 5)                                               # refreshed: now the newest
    sp.learn(0, "gh", 6)
    assert sp.guess(0, "cd") == 5 and sp.guess(0, "ef") is None
    sp.reset()
    assert sp.guess(0, "cd") is None and not sp.after and not sp.alone


def test_shaper_learns_each_forced_token_it_commits(grammar_vocab):
    comp, pieces, ix = grammar_vocab
    g = comp.compile(GrammarSpec("regex", "xyz(a|b)"))
    sp = Spelling()
    shaper = Shaper(g, SamplingParams(), [4, 1], VOCAB, sp)
    shaper.commit([ix["x"], ix["y"]])
    shaper.commit([ix["z"], ix["a"]])
    assert sp.after == {(1, "xyz"): ix["x"], (ix["x"], "yz"): ix["y"], (ix["y"], "z"): ix["z"]}
    assert sp.alone == {"xyz": ix["x"], "yz": ix["y"], "z": ix["z"]}   # "a" was not forced: not learnt
    plain = Shaper(g, SamplingParams(), [4, 1], VOCAB)
    plain.commit([ix["x"], ix["y"]])
    assert plain.spelling is None


def test_engine_drafts_forced_text_as_the_target_spelt_it():
    """A grammar that fixes the whole text ("xyzxyzxyz"), which the vocabulary spells several ways
    ("x", "y", "z", "xy"): speculative output equals plain decoding's; once one request has been
    decoded, the drafter label's spelling memory holds the target's choices and a second, identical
    request has every forced node accepted; forgetting empties it."""
    comp, pieces = grammar_compiler(VOCAB)
    target = tiny_model(seed=43, vocab=VOCAB, layers=2)
    g = comp.compile(GrammarSpec("regex", "xyzxyzxyz"))
    req = dict(prompt=[5, 6, 7], max_tokens=20, grammar=g, eos_ids=frozenset({EOS}))
    plain = Engine(target, {"none": create("none", target)}, max_batch=1, max_len=96).generate([Request(**req)])[0]
    spec = Engine(target, {"ngram": create("ngram", target)}, max_batch=1, max_len=96)
    first = spec.generate([Request(**req, drafter="ngram", num_draft=8)])[0]
    second = spec.generate([Request(**req, drafter="ngram", num_draft=8)])[0]
    assert "".join(pieces[t] for t in plain.tokens if t != EOS) == "xyzxyzxyz"
    assert first.tokens == plain.tokens and second.tokens == plain.tokens
    assert spec.drafting.spelling("ngram").after
    # the first request met the mixed spelling (x y z beside xy z) unprepared; the second did not
    assert first.stats.forced_accepted < first.stats.forced_tokens
    assert second.stats.forced_tokens > 0 and second.stats.forced_accepted == second.stats.forced_tokens
    assert second.stats.target_passes < first.stats.target_passes
    assert spec.drafting.forget_spellings() and not spec.drafting.spelling("ngram").after
    assert not spec.drafting.forget_spellings()


def test_forced_nodes_are_priced_at_the_rate_they_are_accepted():
    """A forced node's gain is its parent's times the label's forced rate; the rate learns only from
    forced nodes whose parent was accepted (a rejected parent says nothing of the spelling)."""
    ctl = Controller({"d": Traits(8, False)}, CostModel([1, 2, 64], [0.010, 0.011, 0.073], 0.0),
                     max_draft=32, thread_choices=(1,))
    assert ctl.forced_rate("d") == DEFAULTS.forced_prior
    prop = DraftProposal([11, 12, 13], None, [-1, 0, 1], forced=2)     # node 0 the drafter's, 1 and 2 forced
    assert forced_gains(prop, [0.5, 0.0, 0.0], 0.8) == [0.5, 0.5 * 0.8, 0.5 * 0.8 * 0.8]
    view = SeqView(0, "d", 4, 10, 50)
    ctl.learn(view, prop, [], StepPlan({0: 4}))                        # the drafter's node rejected
    assert ctl.forced_rate("d") == DEFAULTS.forced_prior
    ctl.learn(view, prop, [0], StepPlan({0: 4}))                       # the first forced node rejected
    low = ctl.forced_rate("d")
    assert low < DEFAULTS.forced_prior
    ctl.learn(view, prop, [0, 1, 2], StepPlan({0: 4}))                 # both accepted
    assert ctl.forced_rate("d") > low


def test_forced_nodes_alone_are_not_charged_the_drafters_seconds():
    """A costly drafter (50 ms a proposal against a 10 ms pass) whose proposal holds only forced nodes:
    keeping them costs no drafting, so they are kept where the pass's extra token pays; a node of the
    drafter's own would carry the drafting cost, and is not kept."""
    from specserve.control import Candidate, choose
    flat = CostModel([1, 64], [0.010, 0.0101], 0.0)
    forced_only = Candidate(0, 10, [0.9], [-1], draft_s=0.050, drafter_nodes=0)
    assert choose([forced_only], flat)[0] == {0: [0]}
    own = Candidate(0, 10, [0.9], [-1], draft_s=0.050, drafter_nodes=1)
    assert choose([own], flat)[0] == {0: []}
    assert choose([Candidate(0, 10, [0.9], [-1], draft_s=0.050)], flat)[0] == {0: []}
