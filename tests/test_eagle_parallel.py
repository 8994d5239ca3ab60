"""The parallel-drafting EAGLE head (``eagle-parallel``, P-EAGLE) on tiny random models.

The drafter's one-pass tree is checked against the training code's slow reference (the unroll with
placeholder inputs), its catch-up against a fresh drafter, training against a learnable target, and
the refusals (a head of the other kind, a depth the head was not trained for).  Its engine
exactness and sampled law are the conformance suite's and ``test_distribution``'s.
"""

import math

import pytest
import torch

from conftest import prompt_features, tiny_head, tiny_model
from specserve.drafters import DraftProposal, DraftRequest, Feedback, create
from specserve.drafters.heads import load_head
from specserve.errors import SpecserveError
from specserve.sampling import SamplingParams
from specserve.train.objectives import eagle_unroll
from test_learned import PROMPT, _trainer, counting, data_dir  # noqa: F401  (fixtures)

K = 4


@pytest.fixture(scope="module")
def target():
    return tiny_model(seed=41, vocab=64, layers=4, kernels="torch")


def reference_depth_probs(target, head_dir, tokens: list[int], n: int) -> list[torch.Tensor]:
    """The head's distribution [V] at depths 1..K after pending position n, from the training unroll
    with placeholder inputs over the whole sequence (positions after n are masked out)."""
    cfg, module, vocab_ids = load_head(head_dir)
    seq = tokens[:n + 1] + [0] * (cfg.parallel - 1)
    feats = prompt_features(target, seq, tuple(cfg.feature_layers))
    f = torch.stack([feats[l] for l in cfg.feature_layers], 1)[None]            # [1, T, F, hidden]
    emb = target.model.weight_rows("embed", torch.tensor(seq).roll(-1))[None]
    rows = target.model.weight_rows("lm_head", vocab_ids)
    hold = (module.placeholder_state(), target.model.weight_rows("embed", torch.tensor([cfg.mask_token_id]))[0])
    out = []
    with torch.no_grad():
        outs = eagle_unroll(module, module.fused(f), emb, cfg.parallel, hold)
        for i in range(cfg.parallel):
            p = torch.zeros(target.config.vocab_size)
            p[vocab_ids] = (module.norm(outs[i][0, n - 1 + i]) @ rows.T).softmax(-1)
            out.append(p)
    return out


def drafted(target, head, prompt, pending, k, **options):
    d = create("eagle-parallel", target, head=head, window=0, **options)
    d.begin(0, prompt, SamplingParams(), 16)
    d.feedback(Feedback(0, DraftProposal([]), [], [pending], prompt_features(target, prompt, d.feature_layers)))
    return d, d.propose([DraftRequest(0, prompt + [pending], k, SamplingParams())])[0]


@pytest.mark.parametrize("layout,depth", [("eagle", 1), ("eagle3", 1), ("eagle", 2), ("eagle3", 2)])
def test_parallel_tree_matches_the_training_unroll(layout, depth, target):
    """Every node's confidence is the product of the reference's probabilities of its tokens at their
    depths (one pass: a depth's distribution does not depend on the path above it), for either layout
    and for heads of two decoder layers (whose placeholders see the first layer's outputs)."""
    head = tiny_head(layout, target, parallel=K, head_layers=depth)
    assert_tree_is_the_unroll(target, head, PROMPT, 7, 12, rel=1e-3)


def assert_tree_is_the_unroll(target, head, prompt, pending, budget, rel) -> float:
    """The test above's check: the drafter's tree of ``budget`` nodes after ``prompt`` + ``pending``;
    returns the largest relative difference of a node's confidence from the reference's."""
    _, prop = drafted(target, head, prompt, pending, budget, topk=3)
    assert len(prop) == budget and not prop.is_chain and max(prop.depths()) >= 3
    ref = reference_depth_probs(target, head, prompt + [pending], len(prompt))
    parents, worst = prop.parent_list(), 0.0
    for i in range(len(prop)):
        path, a = [], i
        while a >= 0:
            path.insert(0, prop.tokens[a])
            a = parents[a]
        want = math.prod(float(ref[j][t]) for j, t in enumerate(path))
        assert prop.confidence[i] == pytest.approx(want, rel=rel, abs=1e-7)
        worst = max(worst, abs(prop.confidence[i] / want - 1) if want > 1e-7 else 0.0)
    for i, p in enumerate(parents):
        assert p < i and (p < 0 or prop.confidence[p] >= prop.confidence[i] - 1e-9)
    # the first path is the argmax of every depth
    chain = [0]
    while len(chain) < K and (kids := [i for i, p in enumerate(parents) if p == chain[-1]]):
        chain.append(kids[0])
    assert [prop.tokens[i] for i in chain] == [int(r.argmax()) for r in ref[:len(chain)]]
    return worst


@pytest.mark.slow
@pytest.mark.parametrize("head", ["eagle-parallel", "eagle3-parallel"])
def test_shipped_parallel_heads_on_the_default_model(head, default_tokenizer):
    """The shipped parallel head and its EAGLE-3 twin (what ``specserve export eagle default``
    writes), on the default model with fp32 activations: the drafter's tree is the training unroll's,
    at several points of a real prompt.  The runtime holds a head's weights as float16 blocks against
    fp32 activations, so a node's confidence (a product over up to 4 depths) is the reference's to
    1% (measured: at most 0.3%)."""
    from specserve.drafters.heads.runtime import shipped_head
    from specserve.models.loader import RuntimeOptions, load_model

    target = load_model("default", RuntimeOptions(activations="f32"))
    path = str(shipped_head(head))
    assert create("eagle-parallel", target, head=path).layer is not None          # the native one call
    toks = default_tokenizer.encode("Write a short poem about the sea, and then explain what it means.")
    worst = max(assert_tree_is_the_unroll(target, path, toks[:n], toks[n], 16, rel=1e-2)
                for n in (6, 11, len(toks) - 1))
    print(f"{head}: confidences within {worst:.2e} of the reference's")


def test_parallel_catch_up_after_accepting_matches_one_pass(target):
    """Placeholder entries are scratch: after a step that accepted tokens the next draft equals a
    fresh drafter's given the whole sequence at once."""
    head = tiny_head("eagle", target, parallel=K)
    layers = load_head(head)[0].feature_layers
    full = PROMPT + [7, 8, 9, 10, 11]
    feats = prompt_features(target, full, tuple(layers))
    n = len(PROMPT)
    a, _ = drafted(target, head, PROMPT, 7, 6)
    a.feedback(Feedback(0, DraftProposal([8, 9]), [0, 1], [8, 9, 10], {l: f[n:n + 3] for l, f in feats.items()}))
    pa = a.propose([DraftRequest(0, full[:n + 4], 6, SamplingParams())])[0]
    _, pb = drafted(target, head, full[:n + 3], 10, 6)
    assert pa.tokens == pb.tokens and pa.parents == pb.parents
    assert pa.confidence == pytest.approx(pb.confidence, rel=1e-5)


def test_depth_and_budget_bound_the_tree(target):
    head = tiny_head("eagle", target, parallel=K)
    _, prop = drafted(target, head, PROMPT, 7, 40, topk=4)
    assert len(prop) <= 40 and max(prop.depths()) == K
    _, prop = drafted(target, head, PROMPT, 7, 40, topk=4, depth=2)
    assert max(prop.depths()) == 2
    _, prop = drafted(target, head, PROMPT, 7, 3, topk=1)
    assert prop.is_chain and len(prop) == 3


def test_heads_of_the_other_kind_are_refused(target):
    with pytest.raises(SpecserveError, match="run it with eagle-parallel"):
        create("eagle", target, head=tiny_head("eagle", target, parallel=K))
    with pytest.raises(SpecserveError, match="run it with eagle$"):
        create("eagle-parallel", target, head=tiny_head("eagle", target))
    with pytest.raises(SpecserveError, match="deeper than"):
        create("eagle-parallel", target, head=tiny_head("eagle", target, parallel=K), depth=K + 1)


def test_parallel_training_learns(counting, data_dir, tmp_path):  # noqa: F811
    """On the counting target (x -> x + 1), every depth of one pass is learnable from the real entry:
    validation acceptance of the 3-deep chain goes from about 0 to well above what depth 1 alone gives
    (seeded: no chance involved)."""
    tr = _trainer(counting, data_dir, tmp_path, parallel=3, steps=3, epochs=12, lr=1e-2)
    before = tr.validate()
    after = tr.run()
    assert before["depth"] == 3 and before["accepted"] < 0.2 and after["accepted"] > 1.2, (before, after)
    assert after["by_depth"][1] > 0.2 and after["by_depth"][2] > 0.1      # placeholders learned (chance: 1/56)
    tr.export(str(tmp_path / "head"), {"wall_seconds": 0})
    d = create("eagle-parallel", counting, head=str(tmp_path / "head"))
    assert d.cfg.parallel == 3 and d.max_tree_depth == 3


def test_training_starts_from_a_head(counting, data_dir, tmp_path):  # noqa: F811
    """``init``: a parallel head starts from a one-token head's weights and reduced vocabulary (its
    placeholder new); a head of other layers or another vocabulary size is refused."""
    ar = _trainer(counting, data_dir, tmp_path / "ar", epochs=1)
    ar.run()
    ar.export(str(tmp_path / "ar-head"), {"wall_seconds": 0})
    _, module, vocab_ids = load_head(str(tmp_path / "ar-head"))
    tr = _trainer(counting, data_dir, tmp_path / "p", parallel=3, steps=3, init=str(tmp_path / "ar-head"))
    assert torch.equal(tr.vocab_ids, vocab_ids)
    mine = tr.module.state_dict()
    assert set(mine) - set(module.state_dict()) == {"mask_hidden"}
    for k, v in module.state_dict().items():
        assert torch.equal(mine[k], v), k
    with pytest.raises(SpecserveError, match="differs from this run's"):
        _trainer(counting, data_dir, tmp_path / "q", parallel=3, steps=3, init=str(tmp_path / "ar-head"), vocab=40)
    other = tiny_head("eagle", counting, layers=[2, 3])
    with pytest.raises(SpecserveError, match="this run trains eagle on layers"):
        _trainer(counting, data_dir, tmp_path / "r", parallel=3, steps=3, init=other)


def test_a_deeper_head_starts_as_the_shallower_one_and_trains(counting, data_dir, tmp_path):  # noqa: F811
    """``head_layers``: a head of two layers started from a parallel head of one keeps all its weights
    (its placeholder too) and begins as exactly that head (the new layer's residual branches at
    zero); training then moves the new layer.  A start deeper than the run is refused."""
    one = _trainer(counting, data_dir, tmp_path / "one", parallel=3, steps=3, epochs=1)
    one.run()
    one.export(str(tmp_path / "one-head"), {"wall_seconds": 0})
    _, module, _ = load_head(str(tmp_path / "one-head"))
    two = _trainer(counting, data_dir, tmp_path / "two", parallel=3, steps=3, epochs=1, head_layers=2,
                   init=str(tmp_path / "one-head"))
    assert two.module.cfg.num_layers == 2 and len(two.module.extra) == 1
    for k, v in module.state_dict().items():
        assert torch.equal(two.module.state_dict()[k], v), k
    b = two.data.collate(two.data.val, list(range(min(4, len(two.data.val)))))
    one.module = module                                  # the saved (float16-rounded) weights two started from
    with torch.no_grad():
        for x, y in zip(two.outputs(b, 3), one.outputs(b, 3)):
            assert torch.equal(x, y)
    before = {k: v.clone() for k, v in two.module.extra.state_dict().items()}
    two.run()
    moved = [k for k, v in two.module.extra.state_dict().items() if not torch.equal(v, before[k])]
    assert {"0.o.weight", "0.down.weight", "0.q.weight"} <= set(moved)
    two.export(str(tmp_path / "two-head"), {"wall_seconds": 0})
    assert load_head(str(tmp_path / "two-head"))[0].num_layers == 2
    with pytest.raises(SpecserveError, match="a head of 2 layers; this run trains 1"):
        _trainer(counting, data_dir, tmp_path / "three", parallel=3, steps=3, init=str(tmp_path / "two-head"))
