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


def test_eagle_tree_matches_the_training_unroll(target):
    """Every node's confidence is the product of the head's probabilities along its path computed
    by the slow reference: so the drafter's positions, masks and inputs at every depth are training's."""
    head = tiny_head("eagle", target)
    d = create("eagle", target, head=head, topk=3, depth=4)
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
    a = create("eagle", target, head=head)
    a.begin(0, PROMPT, SamplingParams(), 16)
    a.feedback(Feedback(0, DraftProposal([]), [], [7], {l: f[:len(PROMPT)] for l, f in feats.items()}))
    a.propose([DraftRequest(0, PROMPT + [7], 6, SamplingParams())])
    n = len(PROMPT)
    a.feedback(Feedback(0, DraftProposal([8, 9]), [0, 1], [8, 9, 10], {l: f[n:n + 3] for l, f in feats.items()}))
    pa = a.propose([DraftRequest(0, full[:n + 4], 6, SamplingParams())])[0]
    b = create("eagle", target, head=head)
    b.begin(0, full[:n + 3], SamplingParams(), 16)
    b.feedback(Feedback(0, DraftProposal([]), [], [10], {l: f[:n + 3] for l, f in feats.items()}))
    pb = b.propose([DraftRequest(0, full[:n + 4], 6, SamplingParams())])[0]
    assert pa.tokens == pb.tokens and pa.parents == pb.parents
    assert pa.confidence == pytest.approx(pb.confidence, rel=1e-5)


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
def test_sampled_drafts_are_chains_with_proper_q(kind, target):
    head = tiny_head(kind, target)
    d = create(kind, target, head=head)
    sp = SamplingParams(temperature=0.8, top_p=0.9, seed=3)
    d.begin(0, PROMPT, sp, 16, generator=torch.Generator().manual_seed(3))
    d.feedback(Feedback(0, DraftProposal([]), [], [7], prompt_features(target, PROMPT, d.feature_layers)))
    prop = d.propose([DraftRequest(0, PROMPT + [7], 3, sp)])[0]
    assert prop.is_chain and len(prop) == 3
    prop.check(64)
    vocab = set(load_head(head)[2].tolist())
    for row in prop.probs:
        assert float(row.sum()) == pytest.approx(1.0, abs=1e-5)
        assert all(i in vocab for i in row.nonzero().flatten().tolist())       # zero outside the reduced vocabulary


def test_head_for_another_target_is_refused(target):
    other_weights = tiny_model(seed=42, vocab=64, layers=3, kernels="torch")
    with pytest.raises(SpecserveError, match="fingerprint"):
        create("eagle", other_weights, head=tiny_head("eagle", target))
    other_shape = tiny_model(seed=41, vocab=64, layers=2, kernels="torch")
    with pytest.raises(SpecserveError, match="num_layers 3"):
        create("medusa", other_shape, head=tiny_head("medusa", target))
    with pytest.raises(SpecserveError, match="no head at"):
        create("eagle", target, head="/nonexistent/head")
    with pytest.raises(SpecserveError, match="not eagle"):
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
    cfg = TrainConfig(kind=kind, layers=layers, vocab=56, steps=2, num_medusa=2,
                      epochs=kw.pop("epochs", 4 if kind == "eagle" else 20), lr=kw.pop("lr", 3e-3 if kind == "eagle" else 1e-2),
                      batch_tokens=160, checkpoint_every=kw.pop("checkpoint_every", 100), seed=1, **kw)
    return Trainer(cfg, target, Data(meta, shards, layers), str(out))


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
