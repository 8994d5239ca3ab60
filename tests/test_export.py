"""EAGLE-3 heads (``eagle3`` layout) exported for vLLM and SGLang, on a tiny random target.

The exported files are read back with safetensors and json only, checked against the names, shapes
and config keys the two loaders read (``LOADER_TENSORS``, ``LOADER_CONFIG``), and the draft model is
run again from those tensors alone by an independent transcription of vLLM's ``Eagle3`` midlayer
(``vllm_draft``): its draft logits must be our ``Eagle3Head``'s (training's unroll) for a prefix
with causal attention and for the next draft step, and for a parallel head's placeholder slots as
vLLM's parallel drafting fills them.  The ``eagle`` layout is refused, and the ``eagle3`` layout
trains (a few optimiser steps lower the loss).  On the default model (slow): ``export eagle
default`` writes the shipped EAGLE-3 twin, whose file drafts what the head drafts.

Sources read (the snapshots the code index holds):
  vLLM  vllm-project/vllm@583507d13075783a12ccbd774575974d10ca4959 vllm/model_executor/models/llama_eagle3.py
        vllm-project/vllm@4e1790651fc758c06c7a903dd4cd82364ac91b27 vllm/v1/worker/gpu_model_runner.py
            (``_get_eagle3_aux_layers_from_config``: top-level ``eagle_aux_hidden_state_layer_ids``)
        vllm-project/vllm@e06c9ba2a6ea923a84add30f5dafaea126429b81 vllm/model_executor/models/llama.py
            (aux state ``hidden_states + residual`` appended before layer ``idx`` runs)
        vllm-project/vllm@23c5aa92d517802488a0c77a5f58cd0a2019c5a3 vllm/transformers_utils/configs/eagle.py
            (``LlamaForCausalLMEagle3`` kept as the architecture)
  SGLang sgl-project/sglang@d737979cbd17c6162f39c1953cfa72d3d23cc0d0 python/sglang/srt/models/llama_eagle3.py
        sgl-project/sglang@bf7a0e237e8d5b2ce5402f5d2fafce31e012dbdf python/sglang/srt/models/llama.py
            (``set_eagle3_layers_to_capture``: ids + 1; ids from the draft's ``eagle_config``)
"""

import json
import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from conftest import prompt_features, tiny_head, tiny_model
from specserve.cli import main
from specserve.drafters.heads import build, load_head, new_config, save_head
from specserve.errors import SpecserveError
from specserve.export import export_eagle3
from specserve.train.objectives import eagle_unroll

LAYERS = [3, 1, 2]            # unsorted on purpose: the export orders fc's blocks by layer
SEQ = [5, 9, 14, 3, 22, 9, 14, 3, 40, 41, 7, 9, 30]

# name -> (shape from the head config c and the draft vocabulary size vr, dtype); the loaders read
# these names (vLLM: Eagle3LlamaForCausalLM.load_weights prefixes "model.", LlamaModel.load_weights
# renames "midlayer." -> "layers.0." and stacks q/k/v, gate/up; "d2t" -> draft_id_to_target_id,
# "t2d" skipped.  SGLang: LlamaForCausalLMEagle3.load_weights, the same stacking, d2t -> hot_token_id).
LOADER_TENSORS = {
    "fc.weight": (lambda c, vr: (c.hidden_size, 3 * c.hidden_size), torch.float16),
    "midlayer.input_layernorm.weight": (lambda c, vr: (c.hidden_size,), torch.float16),
    "midlayer.hidden_norm.weight": (lambda c, vr: (c.hidden_size,), torch.float16),
    "midlayer.self_attn.q_proj.weight": (lambda c, vr: (c.num_heads * c.head_dim, 2 * c.hidden_size), torch.float16),
    "midlayer.self_attn.k_proj.weight": (lambda c, vr: (c.num_kv_heads * c.head_dim, 2 * c.hidden_size),
                                         torch.float16),
    "midlayer.self_attn.v_proj.weight": (lambda c, vr: (c.num_kv_heads * c.head_dim, 2 * c.hidden_size),
                                         torch.float16),
    "midlayer.self_attn.o_proj.weight": (lambda c, vr: (c.hidden_size, c.num_heads * c.head_dim), torch.float16),
    "midlayer.post_attention_layernorm.weight": (lambda c, vr: (c.hidden_size,), torch.float16),
    "midlayer.mlp.gate_proj.weight": (lambda c, vr: (c.intermediate_size, c.hidden_size), torch.float16),
    "midlayer.mlp.up_proj.weight": (lambda c, vr: (c.intermediate_size, c.hidden_size), torch.float16),
    "midlayer.mlp.down_proj.weight": (lambda c, vr: (c.hidden_size, c.intermediate_size), torch.float16),
    "norm.weight": (lambda c, vr: (c.hidden_size,), torch.float16),
    "lm_head.weight": (lambda c, vr: (vr, c.hidden_size), torch.float16),     # ParallelLMHead(draft_vocab_size, H)
    "d2t": (lambda c, vr: (vr,), torch.int64),                                # target id - draft id
    "t2d": (lambda c, vr: (c.vocab_size,), torch.bool),                       # skipped by both
}

# config.json keys the loaders read, and the value each must have for our head c on target t
LOADER_CONFIG = {
    "architectures": lambda c, t, vr: ["LlamaForCausalLMEagle3"],    # SGLang EntryClass; vLLM registry
    "model_type": lambda c, t, vr: "llama",
    "num_hidden_layers": lambda c, t, vr: 1,                          # SGLang refuses anything else
    "hidden_size": lambda c, t, vr: t.hidden_size,                    # vLLM asserts = the embedding's
    "target_hidden_size": lambda c, t, vr: t.hidden_size,             # fc: [H, 3 * target_hidden_size]
    "intermediate_size": lambda c, t, vr: c.intermediate_size,
    "num_attention_heads": lambda c, t, vr: c.num_heads,
    "num_key_value_heads": lambda c, t, vr: c.num_kv_heads,
    "head_dim": lambda c, t, vr: c.head_dim,
    "hidden_act": lambda c, t, vr: "silu",
    "rms_norm_eps": lambda c, t, vr: c.rms_norm_eps,
    "rope_theta": lambda c, t, vr: c.rope_theta,
    "rope_scaling": lambda c, t, vr: None,                            # the head's rotary is unscaled
    "max_position_embeddings": lambda c, t, vr: t.max_position_embeddings,
    "vocab_size": lambda c, t, vr: t.vocab_size,                      # vLLM scatters draft logits into it
    "draft_vocab_size": lambda c, t, vr: vr,
    "tie_word_embeddings": lambda c, t, vr: False,                    # SGLang: else lm_head = embed_tokens
    "eagle_aux_hidden_state_layer_ids": lambda c, t, vr: sorted(LAYERS),                 # vLLM: our layer i
    "eagle_config": lambda c, t, vr: {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in sorted(LAYERS)],
                                      "use_aux_hidden_state": True},                     # SGLang: i - 1
}


@pytest.fixture(scope="module")
def target():
    return tiny_model(seed=43, vocab=64, layers=5, kernels="torch")


@pytest.fixture(scope="module")
def head(target, tmp_path_factory):
    """A random eagle3 head over a scattered reduced vocabulary (so d2t is not a constant), norms random too."""
    cfg = new_config("eagle3", target, LAYERS)
    torch.manual_seed(11)
    module = build(cfg)
    for name, p in module.named_parameters():
        if name.endswith("norm.weight"):
            torch.nn.init.normal_(p, 1.0, 0.2)
    vocab = torch.randperm(64, generator=torch.Generator().manual_seed(2))[:40].sort().values
    d = tmp_path_factory.mktemp("eagle3-head")
    save_head(d, cfg, module, vocab)
    return str(d)


def test_export_writes_what_vllm_and_sglang_load(target, head, tmp_path):
    out = export_eagle3(head, tmp_path / "draft", target)
    tensors = load_file(str(out / "model.safetensors"))
    conf = json.loads((out / "config.json").read_text())
    cfg, _, vocab_ids = load_head(head)
    vr = len(vocab_ids)
    assert set(tensors) == set(LOADER_TENSORS)                        # no embed_tokens: both share the target's
    for name, (shape, dtype) in LOADER_TENSORS.items():
        assert tuple(tensors[name].shape) == shape(cfg, vr) and tensors[name].dtype == dtype, name
    for key, want in LOADER_CONFIG.items():
        assert conf[key] == want(cfg, target.config, vr), key
    d2t = tensors["d2t"]
    assert torch.equal(torch.arange(vr) + d2t, vocab_ids)              # draft id i -> target id vocab_ids[i]
    assert torch.equal(tensors["t2d"].nonzero().flatten(), vocab_ids)
    rows = target.model.weight_rows("lm_head", vocab_ids)
    assert torch.allclose(tensors["lm_head.weight"].float(), rows, atol=1e-3, rtol=1e-3)


def test_feature_layer_i_is_the_stream_entering_layer_i(target):
    """The anchor of the id mapping: our layer 0 is the embedding (nothing has run), so layer i is
    what enters layer i, vLLM's aux id i (appended before layer i runs) and SGLang's id i - 1."""
    f = prompt_features(target, SEQ, (0, 1))
    assert torch.equal(f[0], target.model.weight_rows("embed", torch.tensor(SEQ)))
    assert not torch.allclose(f[1], f[0])


def rms(x, w, eps):
    """vLLM's RMSNorm (float32): x * rsqrt(mean(x^2) + eps) * w."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def neox_rope(x, pos, theta):
    """vLLM's get_rope(is_neox_style=True): x [T, heads, d], pos [T]."""
    d = x.shape[-1]
    ang = pos.double()[:, None] / theta ** (torch.arange(0, d, 2).double() / d)
    cos, sin = ang.cos().float()[:, None], ang.sin().float()[:, None]
    x1, x2 = x[..., :d // 2], x[..., d // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def vllm_draft(t, conf, embeds, hidden, pos, past=None):
    """vLLM's LlamaModel.forward with its one Eagle3 LlamaDecoderLayer, from the file's tensors t:
    embeds, hidden [T, H] (hidden: fc(aux) or the previous step's pre-norm output), pos [T]; attends
    causally to ``past`` (k, v [P, kv_heads, d]) and itself.  Returns draft logits scattered into the
    target vocabulary [T, V] (-inf outside), the pre-norm output [T, H] and (k, v) with past."""
    m, eps = "midlayer.", conf["rms_norm_eps"]
    nh, nkv, d = conf["num_attention_heads"], conf["num_key_value_heads"], conf["head_dim"]
    T = hidden.shape[0]
    residual = hidden
    x = torch.cat([rms(embeds, t[m + "input_layernorm.weight"], eps),
                   rms(hidden, t[m + "hidden_norm.weight"], eps)], -1)
    q = neox_rope((x @ t[m + "self_attn.q_proj.weight"].T).view(T, nh, d), pos, conf["rope_theta"])
    k = neox_rope((x @ t[m + "self_attn.k_proj.weight"].T).view(T, nkv, d), pos, conf["rope_theta"])
    v = (x @ t[m + "self_attn.v_proj.weight"].T).view(T, nkv, d)
    if past is not None:
        k, v = torch.cat([past[0], k]), torch.cat([past[1], v])
    P = k.shape[0] - T
    kr, vr = k.repeat_interleave(nh // nkv, 1), v.repeat_interleave(nh // nkv, 1)
    scores = torch.einsum("qhd,khd->hqk", q, kr) / math.sqrt(d)
    scores = scores.masked_fill(~torch.ones(T, P + T, dtype=torch.bool).tril(P), float("-inf"))
    att = torch.einsum("hqk,khd->qhd", scores.softmax(-1), vr).reshape(T, nh * d)
    residual = att @ t[m + "self_attn.o_proj.weight"].T + residual              # post_attention_layernorm(h, residual)
    h = rms(residual, t[m + "post_attention_layernorm.weight"], eps)
    h = F.silu(h @ t[m + "mlp.gate_proj.weight"].T) * (h @ t[m + "mlp.up_proj.weight"].T)
    h = h @ t[m + "mlp.down_proj.weight"].T
    prenorm = h + residual                                                      # norm(h, residual)
    logits = rms(prenorm, t["norm.weight"], eps) @ t["lm_head.weight"].T        # compute_logits: [T, Vr]
    full = logits.new_full((T, conf["vocab_size"]), float("-inf"))
    full[:, torch.arange(conf["draft_vocab_size"]) + t["d2t"]] = logits
    return full, prenorm, (k, v)


def test_vllm_midlayer_from_the_file_gives_our_draft_logits(target, head, tmp_path):
    """Step 1 over a prefix (causal, positions 0..T-1, token x_{t+1} with the target's aux states at t)
    and step 2 from every prefix end u - 1 (token x_{u+1}, the pre-norm output as the state, position
    u, keys: step 1's at <= u - 1 and its own) equal our head's unroll, output for output."""
    out = export_eagle3(head, tmp_path / "draft", target, dtype="float32")
    t = {k: (v.float() if v.is_floating_point() else v) for k, v in load_file(str(out / "model.safetensors")).items()}
    conf = json.loads((out / "config.json").read_text())
    cfg, module, vocab_ids = load_head(head)
    T = len(SEQ) - 1
    aux = prompt_features(target, SEQ, tuple(conf["eagle_aux_hidden_state_layer_ids"]))
    hidden = torch.cat([aux[i][:T] for i in conf["eagle_aux_hidden_state_layer_ids"]], -1) @ t["fc.weight"].T
    embeds = target.model.weight_rows("embed", torch.tensor(SEQ[1:]))            # x_{t+1}, the target's embedding
    ref1, pre1, (k1, v1) = vllm_draft(t, conf, embeds, hidden, torch.arange(T))
    feats = torch.stack([prompt_features(target, SEQ, tuple(cfg.feature_layers))[i][:T] for i in cfg.feature_layers], 1)
    with torch.no_grad():
        ours = eagle_unroll(module, module.fused(feats[None]), embeds[None], 2)
        rows = target.model.weight_rows("lm_head", vocab_ids)
        q1, q2 = ((module.norm(o[0]) @ rows.T) for o in ours)
    torch.testing.assert_close(ref1[:, vocab_ids], q1, rtol=1e-4, atol=1e-4)
    assert torch.isinf(ref1).sum() == T * (64 - len(vocab_ids))
    for u in range(1, T):
        ref2, _, _ = vllm_draft(t, conf, embeds[u:u + 1], pre1[u - 1:u], torch.tensor([u]), (k1[:u], v1[:u]))
        torch.testing.assert_close(ref2[0, vocab_ids], q2[u], rtol=1e-4, atol=1e-4)


def test_export_refuses_the_old_layout_in_one_line(target, tmp_path, capsys):
    from specserve.drafters.heads.runtime import shipped_head

    old = tiny_head("eagle", target)
    assert main(["export", "eagle", old, "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert "not EAGLE-3's" in err and "--layout eagle3" in err and "\n" not in err
    assert not (tmp_path / "x").exists()
    assert main(["export", "eagle", str(tmp_path / "none"), "--out", str(tmp_path / "x")]) == 2
    assert "no head at" in capsys.readouterr().err
    # the shipped eagle head, whose layout is this project's: refused by its config alone
    assert main(["export", "eagle", str(shipped_head("eagle")), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "specserve/data/heads/eagle" in err and "not EAGLE-3's" in err and not (tmp_path / "x").exists()


def test_export_refuses_layers_the_servers_cannot_feed(target, tmp_path):
    cfg = new_config("eagle3", target, [1, 2, 5])                     # 5 = L: the final normed output
    d = tmp_path / "bad"
    save_head(d, cfg, build(cfg), torch.arange(40))
    with pytest.raises(SpecserveError, match="three distinct feature layers in 1..4"):
        export_eagle3(d, tmp_path / "out", target)


def test_eagle3_layout_trains(target, tmp_path):
    """A few optimiser steps on the tiny random target's self-distillation data lower the loss of a
    fixed batch (the same objective as eagle's: training-time test)."""
    from specserve.train.data import DataConfig, generate, load
    from specserve.train.trainer import Data, TrainConfig, Trainer

    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(1, 64, (10,), generator=g).tolist() for _ in range(24)]
    generate(target, prompts, frozenset(), str(tmp_path / "data"),
             DataConfig(layers=(1, 2, 3, 5), max_new_tokens=16, batch=8, shard_sequences=12))
    meta, shards = load(str(tmp_path / "data"))
    layers = tuple(LAYERS)
    cfg = TrainConfig(kind="eagle3", layers=layers, vocab=48, steps=2, epochs=10, max_steps=12, lr=3e-3,
                      batch_tokens=160, seed=1)
    tr = Trainer(cfg, target, Data(meta, shards, layers), str(tmp_path / "out"))
    assert type(tr.module).__name__ == "Eagle3Head"
    b = tr.data.collate(tr.data.train, tr.data.batches(tr.data.train, 160, None)[0])
    with torch.no_grad():
        before = float(tr.loss(b))
    tr.run()
    with torch.no_grad():
        after = float(tr.loss(b))
    assert after < 0.9 * before, (before, after)
    with pytest.raises(SpecserveError, match="three distinct feature layers"):
        Trainer(TrainConfig(kind="eagle3", layers=(1, 5)), target, Data(meta, shards, (1, 5)), str(tmp_path / "x"))


def test_train_layout_flag_picks_the_kind_and_refuses_before_any_data():
    import argparse

    from specserve.cli import build_parser
    from specserve.train.cli import head_layers

    args = build_parser().parse_args(["train", "eagle", "--out", "x"])
    assert (args.layout, args.features) == ("eagle", None)
    assert head_layers(args, 30) == ("eagle", (30,))                  # today's default: unchanged
    args.layout = "eagle3"
    assert head_layers(args, 30) == ("eagle3", (2, 15, 27))           # fused by default
    args.features = "last"
    with pytest.raises(SpecserveError, match="in 1..29"):
        head_layers(args, 30)
    assert head_layers(argparse.Namespace(what="medusa"), 30) == ("medusa", (30,))


@pytest.fixture(scope="module")
def parallel_head(target, tmp_path_factory):
    """A random parallel (P-EAGLE) eagle3 head drafting 3 tokens a pass, placeholder token 6."""
    cfg = new_config("eagle3", target, LAYERS)
    cfg.parallel, cfg.mask_token_id = 3, 6
    torch.manual_seed(12)
    module = build(cfg)
    torch.nn.init.normal_(module.mask_hidden, std=1.0)
    d = tmp_path_factory.mktemp("peagle-head")
    save_head(d, cfg, module, torch.arange(48))
    return str(d)


def test_parallel_head_exports_what_vllm_parallel_drafting_reads(target, parallel_head, tmp_path):
    """vLLM's parallel drafting (P-EAGLE: ``parallel_drafting``) from the file: the prefix's slots,
    then K - 1 placeholder slots at the next positions with the embedding of ``pard_token`` and
    fc(``mask_hidden``) as their state, attending causally; each placeholder's logits equal our
    head's for that depth (the training unroll with placeholder inputs, which the drafter matches)."""
    out = export_eagle3(parallel_head, tmp_path / "draft", target, dtype="float32")
    conf = json.loads((out / "config.json").read_text())
    assert conf["pard_token"] == conf["ptd_token_id"] == 6 and conf["specserve"]["parallel"] == 3
    parallel_drafts_match(target, parallel_head, out, SEQ)


def parallel_drafts_match(target, head_dir, out, seq: list[int]) -> None:
    """The test above's check for the head at ``head_dir`` exported (float32) to ``out``, over ``seq``."""
    t = {k: (v.float() if v.is_floating_point() else v) for k, v in load_file(str(out / "model.safetensors")).items()}
    conf = json.loads((out / "config.json").read_text())
    cfg, module, vocab_ids = load_head(head_dir)
    assert tuple(t["mask_hidden"].shape) == (3 * cfg.hidden_size,)      # vLLM: fc_input_size elements
    K, T = cfg.parallel, len(seq) - 1
    P = T - (K - 1)                                                      # real slots 0..P-1, pending x_P
    aux = prompt_features(target, seq, tuple(conf["eagle_aux_hidden_state_layer_ids"]))
    hidden = torch.cat([aux[i][:P] for i in conf["eagle_aux_hidden_state_layer_ids"]], -1) @ t["fc.weight"].T
    embeds = target.model.weight_rows("embed", torch.tensor(seq[1:P + 1]))
    ref, _, past = vllm_draft(t, conf, embeds, hidden, torch.arange(P))
    hold_e = target.model.weight_rows("embed", torch.tensor([conf["pard_token"]] * (K - 1)))
    hold_h = (t["mask_hidden"] @ t["fc.weight"].T).expand(K - 1, -1)      # combine_hidden_states(mask_hidden)
    held, _, _ = vllm_draft(t, conf, hold_e, hold_h, torch.arange(P, P + K - 1), past)
    feats = torch.stack([prompt_features(target, seq, tuple(cfg.feature_layers))[i][:T] for i in cfg.feature_layers], 1)
    emb_all = target.model.weight_rows("embed", torch.tensor(seq[1:]))
    with torch.no_grad():
        hold = (module.placeholder_state(), target.model.weight_rows("embed", torch.tensor([cfg.mask_token_id]))[0])
        ours = eagle_unroll(module, module.fused(feats[None]), emb_all[None], K, hold)
        rows = target.model.weight_rows("lm_head", vocab_ids)
        depth = [module.norm(ours[j][0, P - 1 + j]) @ rows.T for j in range(K)]
    torch.testing.assert_close(ref[P - 1, vocab_ids], depth[0], rtol=1e-4, atol=1e-4)
    for j in range(1, K):
        torch.testing.assert_close(held[j - 1, vocab_ids], depth[j], rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_default_is_the_shipped_parallel_heads_eagle3_twin(default_target, default_tokenizer, tmp_path, capsys):
    """``specserve export eagle default`` writes the shipped EAGLE-3 twin for the default model: the
    loaders' names, shapes and config, and vLLM's parallel drafting from the file drafts what the
    head drafts, on a real prompt's features."""
    from specserve.drafters.heads.runtime import shipped_head
    from specserve.export import DEFAULT

    out = tmp_path / "draft"
    assert main(["export", "eagle", "default", "--out", str(out), "--dtype", "float32"]) == 0
    assert '"parallel_drafting": true' in capsys.readouterr().err
    cfg, _, vocab_ids = load_head(shipped_head(DEFAULT))
    assert cfg.kind == "eagle3" and cfg.parallel == 4 and cfg.target["hidden_size"] == default_target.config.hidden_size
    tensors, conf = load_file(str(out / "model.safetensors")), json.loads((out / "config.json").read_text())
    assert set(tensors) == set(LOADER_TENSORS) | {"mask_hidden"}
    for name, (shape, _) in LOADER_TENSORS.items():
        assert tuple(tensors[name].shape) == shape(cfg, len(vocab_ids)), name
    assert conf["eagle_aux_hidden_state_layer_ids"] == sorted(cfg.feature_layers)
    assert conf["vocab_size"] == default_target.config.vocab_size and conf["draft_vocab_size"] == len(vocab_ids)
    seq = default_tokenizer.encode("The capital of France is Paris, and the capital of Italy is Rome.")
    parallel_drafts_match(default_target, shipped_head(DEFAULT), out, seq)
