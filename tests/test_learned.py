"""Learned drafters (EAGLE, Medusa) and their training, on tiny random models.

The drafters' fast paths are checked against the training code's slow reference (the
training-time-test unroll, teacher-forced along each drafted path); training is checked to learn,
to be deterministic under a seed and to resume from a checkpoint exactly; heads are refused for
another target.
"""

import math

import pytest
import torch

from conftest import prompt_features, tiny_config, tiny_head, tiny_model, tiny_state_dict
from specserve.drafters import DraftProposal, DraftRequest, Feedback, create
from specserve.errors import SpecserveError
from specserve.sampling import SamplingParams
from specserve.drafters.heads import load_head
from specserve.train.data import DataConfig, generate, load
from specserve.train.objectives import eagle_unroll
from specserve.train.trainer import Data, TrainConfig, Trainer

PROMPT = [5, 9, 14, 3, 22, 9, 14, 3, 40, 41, 7, 9]


@pytest.fixture(scope="module")
def target():
    return tiny_model(seed=41, vocab=64, layers=3, kernels="torch")


def reference_path_probs(target, head_dir, tokens: list[int], n: int, path: list[int]) -> list[float]:
    """P(path[i]) under the head, teacher-forced: the unroll over tokens[:n+1] + path (pending at n)."""
    cfg, module, vocab_ids = load_head(head_dir)
    seq = tokens[:n + 1] + path
    feats = prompt_features(target, seq, tuple(cfg.feature_layers))
    f = torch.stack([feats[l] for l in cfg.feature_layers], 1)[None]            # [1, T, F, hidden]
    emb = target.model.weight_rows("embed", torch.tensor(seq).roll(-1))[None]
    rows = target.model.weight_rows("lm_head", vocab_ids)
    sub = {int(t): i for i, t in enumerate(vocab_ids)}
    with torch.no_grad():
        outs = eagle_unroll(module, module.fused(f), emb, len(path))
        probs = []
        for i, t in enumerate(path):
            o = outs[i][0, n - 1 + i]                                             # depth i+1's entry
            probs.append(float((module.norm(o) @ rows.T).softmax(-1)[sub[t]]))
    return probs


@pytest.fixture(scope="module")
def target4():
    return tiny_model(seed=42, vocab=64, layers=4, kernels="torch")


@pytest.mark.parametrize("layout", ["eagle", "eagle3"])
def test_eagle_tree_matches_the_training_unroll(layout, target, target4):
    """Every node's confidence is the product of the head's probabilities along its path computed
    by the slow reference: so the drafter's positions, masks and inputs at every depth are training's,
    for a head of either layout (eagle3: EAGLE-3's, on a 4-layer target: three inner feature layers)."""
    target = target4 if layout == "eagle3" else target
    head = tiny_head(layout, target)
    d = create("eagle", target, head=head, topk=3, depth=4, window=0)    # training's context: all of it
    d.bind(1, 64)
    prompt = PROMPT
    d.begin(0, prompt, SamplingParams(), 16)
    d.feedback(Feedback(0, DraftProposal([]), [], [7], prompt_features(target, prompt, d.feature_layers)))
    tokens = prompt + [7]
    prop = d.propose([DraftRequest(0, tokens, 12, SamplingParams())])[0]
    assert len(prop) == 12 and not prop.is_chain and max(prop.depths()) >= 3
    parents = prop.parent_list()
    for i in range(len(prop)):
        path, a = [], i
        while a >= 0:
            path.insert(0, prop.tokens[a])
            a = parents[a]
        ref = math.prod(reference_path_probs(target, head, tokens, len(prompt), path))
        assert prop.confidence[i] == pytest.approx(ref, rel=1e-3, abs=1e-6)
    # best-first selection and depth-first emission: a parent is never less confident than its child,
    # and the first path is the likeliest child at every depth
    for i, p in enumerate(parents):
        assert p < i and (p < 0 or prop.confidence[p] >= prop.confidence[i] - 1e-9)
    roots = [i for i, p in enumerate(parents) if p < 0]
    assert roots[0] == 0 and prop.confidence[0] == max(prop.confidence[r] for r in roots)


def test_eagle_catch_up_after_accepting_matches_one_pass(target):
    """After steps that accept tokens, the head's real entries equal a fresh drafter's given the whole
    sequence at once (features arrive in pieces, entries are extended incrementally)."""
    head = tiny_head("eagle", target)
    layers = load_head(head)[0].feature_layers
    full = PROMPT + [7, 8, 9, 10, 11]
    feats = prompt_features(target, full, tuple(layers))
    a = create("eagle", target, head=head, window=0)
    a.begin(0, PROMPT, SamplingParams(), 16)
    a.feedback(Feedback(0, DraftProposal([]), [], [7], {l: f[:len(PROMPT)] for l, f in feats.items()}))
    a.propose([DraftRequest(0, PROMPT + [7], 6, SamplingParams())])
    n = len(PROMPT)
    a.feedback(Feedback(0, DraftProposal([8, 9]), [0, 1], [8, 9, 10], {l: f[n:n + 3] for l, f in feats.items()}))
    pa = a.propose([DraftRequest(0, full[:n + 4], 6, SamplingParams())])[0]
    b = create("eagle", target, head=head, window=0)
    b.begin(0, full[:n + 3], SamplingParams(), 16)
    b.feedback(Feedback(0, DraftProposal([]), [], [10], {l: f[:n + 3] for l, f in feats.items()}))
    pb = b.propose([DraftRequest(0, full[:n + 4], 6, SamplingParams())])[0]
    assert pa.tokens == pb.tokens and pa.parents == pb.parents
    assert pa.confidence == pytest.approx(pb.confidence, rel=1e-5)


def sampled_proposal(kind, target, k, **options):
    head = tiny_head(kind, target)
    d = create(kind, target, head=head, **options)
    sp = SamplingParams(temperature=0.8, top_p=0.9, seed=3)
    d.begin(0, PROMPT, sp, 16, generator=torch.Generator().manual_seed(3))
    d.feedback(Feedback(0, DraftProposal([]), [], [7], prompt_features(target, PROMPT, d.feature_layers)))
    prop = d.propose([DraftRequest(0, PROMPT + [7], k, sp)])[0]
    prop.check(64)
    return prop, set(load_head(head)[2].tolist())


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
def test_sampled_width_one_drafts_chains_with_proper_q(kind, target):
    prop, vocab = sampled_proposal(kind, target, 3, sample_width=1)
    assert prop.is_chain and len(prop) == 3
    for row in prop.probs:
        assert float(row.sum()) == pytest.approx(1.0, abs=1e-5)
        assert all(i in vocab for i in row.nonzero().flatten().tolist())       # zero outside the reduced vocabulary


@pytest.mark.parametrize("kind,width", [("eagle", 2), ("eagle", 3), ("medusa", 2), ("medusa", 3)])
def test_sampled_trees_draw_siblings_without_replacement(kind, width, target):
    """Siblings are distinct; each one's q is its first sibling's q with the earlier siblings' tokens
    removed and renormalised (what it was drawn from); every node has positive q; the budget is filled
    and the tree is deeper than one level."""
    k = 7
    prop, vocab = sampled_proposal(kind, target, k, sample_width=width)
    parents = prop.parent_list()
    assert len(prop) == k and max(prop.depths()) >= 2 and not prop.is_chain
    by_parent: dict[int, list[int]] = {}
    for i, p in enumerate(parents):
        assert p < i
        by_parent.setdefault(p, []).append(i)
    for p, sib in by_parent.items():
        assert len(sib) <= width
        assert len({prop.tokens[i] for i in sib}) == len(sib)
        first = prop.probs[sib[0]]
        for j, i in enumerate(sib):
            row = prop.probs[i]
            assert float(row.sum()) == pytest.approx(1.0, abs=1e-5) and float(row[prop.tokens[i]]) > 0
            assert all(t in vocab for t in row.nonzero().flatten().tolist())
            expect = first.clone()
            expect[[prop.tokens[e] for e in sib[:j]]] = 0
            torch.testing.assert_close(row, expect / expect.sum(), rtol=1e-5, atol=1e-6)


def test_head_for_another_target_is_refused(target):
    other_weights = tiny_model(seed=42, vocab=64, layers=3, kernels="torch")
    with pytest.raises(SpecserveError, match="fingerprint"):
        create("eagle", other_weights, head=tiny_head("eagle", target))
    other_shape = tiny_model(seed=41, vocab=64, layers=2, kernels="torch")
    with pytest.raises(SpecserveError, match="num_layers 3"):
        create("medusa", other_shape, head=tiny_head("medusa", target))
    with pytest.raises(SpecserveError, match="no head at"):
        create("eagle", target, head="/nonexistent/head")
    with pytest.raises(SpecserveError, match="medusa head, which the eagle drafter does not run"):
        create("eagle", target, head=tiny_head("medusa", target))


# -- training -------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def counting():
    """A tiny target whose greedy continuation counts up (x -> x + 1 mod 64) after a random prompt:
    learnable, so training must reach high acceptance (a random tiny model's output is noise)."""
    sd = tiny_state_dict(tiny_config(vocab=64, layers=3), 41, scale=0.05)
    emb = torch.randn(64, 32, generator=torch.Generator().manual_seed(3))
    sd["model.embed_tokens.weight"] = emb
    sd["lm_head.weight"] = emb.roll(1, 0) * 3
    return tiny_model(seed=41, vocab=64, layers=3, kernels="torch", sd=sd)


@pytest.fixture(scope="module")
def data_dir(counting, tmp_path_factory):
    """48 random prompts answered greedily by the tiny target: 3 shards of 16 (the last: validation)."""
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(1, 64, (int(torch.randint(6, 14, (1,), generator=g)),), generator=g).tolist()
               for _ in range(48)]
    out = tmp_path_factory.mktemp("data")
    n = counting.config.num_layers
    generate(counting, prompts, frozenset(), str(out), DataConfig(layers=(1, n), max_new_tokens=24, batch=8,
                                                                    shard_sequences=16))
    return str(out)


def _trainer(target, data_dir, out, kind="eagle", **kw):
    meta, shards = load(data_dir)
    n = target.config.num_layers
    layers = (1, n) if kind == "eagle" else (n,)
    cfg = TrainConfig(kind=kind, layers=layers, vocab=kw.pop("vocab", 56), steps=kw.pop("steps", 2), num_medusa=2,
                      epochs=kw.pop("epochs", 4 if kind == "eagle" else 20), lr=kw.pop("lr", 3e-3 if kind == "eagle" else 1e-2),
                      batch_tokens=160, checkpoint_every=kw.pop("checkpoint_every", 100), seed=1, **kw)
    return Trainer(cfg, target, Data(meta, shards, layers), str(out))


def test_several_data_folders_train_together_each_holding_out_its_last_shard(counting, data_dir):
    """``Data(..., more)``: the folders' training shards and their held-out shards pooled; folders of
    other layers are refused."""
    meta, shards = load(data_dir)
    one = Data(meta, shards, (1, 3))
    two = Data(meta, shards, (1, 3), [(meta, shards[:2])])
    assert len(two.train) == len(one.train) + len(Data(meta, shards[:2], (1, 3)).train)
    assert len(two.val) == len(one.val) + len(Data(meta, shards[:2], (1, 3)).val)
    assert torch.equal(two.val[-1]["tokens"], Data(meta, shards[:2], (1, 3)).val[-1]["tokens"])
    with pytest.raises(SpecserveError, match="hold different layers"):
        Data(meta, shards, (1, 3), [({**meta, "layers": [1, 2, 3]}, shards)])
    with pytest.raises(SpecserveError, match="at least two shards"):
        Data(meta, shards, (1, 3), [(meta, shards[:1])])


def test_data_shards_hold_prompt_and_answer_features(counting, data_dir):
    meta, shards = load(data_dir)
    assert len(shards) == 3 and meta["layers"] == [1, 3]
    sh = shards[0]
    n = int(sh["tokens"].numel())
    assert sh["features"].shape == (n, 2, counting.config.hidden_size)
    assert int(sh["seq_start"][-1]) == n and 0 < int(sh["prompt_mask"].sum()) < n
    # the recorded features are the target's for that sequence
    a, b = int(sh["seq_start"][0]), int(sh["seq_start"][1])
    seq = sh["tokens"][a:b].tolist()
    ref = prompt_features(counting, seq, (1, 3))
    assert torch.allclose(sh["features"][a:b, 1].float(), ref[3], atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("kind,floor", [("eagle", 2.0), ("medusa", 1.0)])
def test_training_learns(kind, floor, counting, data_dir, tmp_path):
    """Validation acceptance of a greedy chain (5 deep for EAGLE, 2 Medusa heads) goes from about 0
    for the untrained head to most of the chain (deterministic under the seed: no chance involved)."""
    tr = _trainer(counting, data_dir, tmp_path, kind)
    before = tr.validate()["accepted"]
    after = tr.run()["accepted"]
    assert before < 0.2 and after > floor, (before, after)
    tr.export(str(tmp_path / "head"), {"wall_seconds": 0})
    d = create(kind, counting, head=str(tmp_path / "head"))
    assert d.cfg.training["validation"]["accepted"] == pytest.approx(after)
    assert (tmp_path / "head" / "loss.png").stat().st_size > 1000


def test_training_is_deterministic_and_resumes_exactly(counting, data_dir, tmp_path):
    target = counting
    straight = _trainer(target, data_dir, tmp_path / "a", epochs=1)
    straight.run()

    class Stop(Exception):
        pass

    def stop_after(step, total, *_):
        if step == 4:
            raise Stop
    broken = _trainer(target, data_dir, tmp_path / "b", epochs=1, checkpoint_every=3)
    with pytest.raises(Stop):
        broken.run(progress=stop_after)
    resumed = _trainer(target, data_dir, tmp_path / "b", epochs=1, checkpoint_every=3)
    assert resumed.resume() and resumed.step == 3
    resumed.run()
    again = _trainer(target, data_dir, tmp_path / "c", epochs=1)
    again.run()
    for k, v in straight.module.state_dict().items():
        assert torch.equal(v, again.module.state_dict()[k]), k          # same seed, same weights
        assert torch.equal(v, resumed.module.state_dict()[k]), k        # interrupted + resumed = straight
    with pytest.raises(SpecserveError, match="other settings"):
        _trainer(target, data_dir, tmp_path / "b", epochs=2, lr=1e-2).resume()


def test_features_of_regenerated_sequences_are_the_generated_ones(counting, data_dir, tmp_path):
    """``train data --from-sequences``: one teacher-forced pass per sequence gives the shards that
    generating the answers gave (tokens, masks and offsets exactly; features to fp16 rounding)."""
    import gzip
    import json
    from specserve.train.data import from_sequences
    meta, shards = load(data_dir)
    rows = []
    for sh in shards:
        starts = sh["seq_start"].tolist()
        for a, b in zip(starts, starts[1:]):
            toks, n_prompt = sh["tokens"][a:b].tolist(), int(sh["prompt_mask"][a:b].sum())
            rows.append({"prompt_ids": toks[:n_prompt], "answer_ids": toks[n_prompt:]})
    seq_dir = tmp_path / "seqs"
    seq_dir.mkdir()
    with gzip.open(seq_dir / "seqs-00000.jsonl.gz", "wt") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    (seq_dir / "meta.json").write_text(json.dumps({"shards": [{"file": "seqs-00000.jsonl.gz"}]}))
    n = counting.config.num_layers
    out = from_sequences(counting, str(seq_dir), str(tmp_path / "data"),
                         DataConfig(layers=(1, n), max_new_tokens=24, shard_sequences=16))
    meta2, shards2 = load(str(out))
    assert meta2["layers"] == meta["layers"] and len(shards2) == len(shards)
    for old, new in zip(shards, shards2):
        for name in ("tokens", "prompt_mask", "seq_start"):
            assert torch.equal(old[name], new[name])
        assert torch.allclose(old["features"].float(), new["features"].float(), atol=2e-2, rtol=2e-2)


def test_an_eagle3_head_drafts_through_the_engine_exactly(target4):
    """The ``eagle`` drafter on an EAGLE-3-layout head: greedy output equals plain decoding, and
    seeded sampled trees give the same tokens run after run (k = 1 and 6)."""
    from specserve.engine import Engine, Request
    prompts = [PROMPT, [3, 1, 4, 1, 5, 9, 2, 6], [8, 8, 8, 30, 31]]
    plain = Engine(target4, {"none": create("none", target4)}, max_batch=1, max_len=96)
    want = [plain.generate([Request(p, 20)])[0].tokens for p in prompts]
    for k in (1, 6):
        d = create("eagle", target4, head=tiny_head("eagle3", target4), topk=3, depth=4)
        eng = Engine(target4, {"eagle": d}, max_batch=2, max_len=96)
        outs = eng.generate([Request(p, 20, drafter="eagle", num_draft=k) for p in prompts])
        assert [o.tokens for o in outs] == want and sum(o.stats.drafted_tokens for o in outs) > 0
    sp = [SamplingParams(temperature=0.8, seed=s) for s in range(3)]
    runs = []
    for _ in range(2):
        eng = Engine(target4, {"eagle": create("eagle", target4, head=tiny_head("eagle3", target4))},
                     max_batch=3, max_len=96)
        runs.append([o.tokens for o in eng.generate([Request(p, 20, s, drafter="eagle", num_draft=6)
                                                     for p, s in zip(prompts, sp)])])
    assert runs[0] == runs[1]


def test_validation_along_an_epoch_keeps_each_heads_figure(counting, data_dir, tmp_path):
    """``val_every``: validation within the epoch, with the positions trained on so far (rising by a
    whole batch each time), and the head of that moment kept: reloaded, it drafts, and its own
    validation is the figure recorded."""
    tr = _trainer(counting, data_dir, tmp_path, epochs=1, val_every=2)
    tr.run()
    along = tr.history["step_val"]
    total = tr.total_steps()
    assert [e["step"] for e in along] == list(range(2, total, 2))
    assert all(0 < a["positions"] < b["positions"] <= tr.history["positions"] for a, b in zip(along, along[1:]))
    first = tr.history["step_val"][0]
    kept = tmp_path / f"at-step-{first['step']}"
    d = create("eagle", counting, head=str(kept))
    tr.module.load_state_dict(load_head(kept)[1].state_dict())
    assert tr.validate()["accepted"] == pytest.approx(first["accepted"], abs=0.02) and d.cfg.kind == "eagle"
