"""Model runtime: parity with transformers for every architecture, batch invariance, KV rollback."""

import json

import pytest
import torch

from conftest import tiny_model
from specserve.errors import SpecserveError
from specserve.models import RuntimeOptions, load_model
from specserve.models.config import ModelConfig


def hf_tiny(tmp_path, arch: str):
    """Save a tiny random transformers model of ``arch`` and return (dir, hf model)."""
    import transformers

    common = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    cfg = {
        "llama": lambda: transformers.LlamaConfig(**common, rope_scaling={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64}, tie_word_embeddings=True),
        "mistral": lambda: transformers.MistralConfig(**common, sliding_window=None),
        "qwen2": lambda: transformers.Qwen2Config(**common),
        "qwen3": lambda: transformers.Qwen3Config(**common, head_dim=16),
    }[arch]()
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():  # non-trivial norms and biases so that every parameter matters
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(tmp_path)
    return str(tmp_path), model


# fbgemm rounds weights to fp16 once at load time: its tolerance reflects that rounding.
TOLERANCE = {"torch": 1e-4, "native": 1e-4, "fbgemm": 3e-2}


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    """One saved tiny transformers model per architecture, shared by the runtimes' cases."""
    made = {}

    def get(arch: str):
        if arch not in made:
            made[arch] = hf_tiny(tmp_path_factory.mktemp(f"hf-{arch}"), arch)
        return made[arch]
    return get


@pytest.mark.parametrize("kernels", ["torch", "native", "fbgemm"])
@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3"])
def test_logits_match_transformers(hf_dirs, arch, kernels):
    path, hf = hf_dirs(arch)
    ours = load_model(path, RuntimeOptions(kernels=kernels))
    assert ours.options.kernels == kernels
    ids = torch.randint(0, 96, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids).logits
    cache = ours.model.new_cache(2, 128)
    got = ours.model(ids, cache, [0, 1], [0, 0]).logits
    assert (got - ref).abs().max().item() <= TOLERANCE[kernels]
    # incremental decoding through the cache gives the same logits as the full pass
    cache2 = ours.model.new_cache(2, 128)
    ours.model(ids[:, :30], cache2, [0, 1], [0, 0])
    step = ours.model(ids[:, 30:], cache2, [0, 1], [30, 30]).logits
    assert (step - ref[:, 30:]).abs().max().item() <= TOLERANCE[kernels]
    # a long prompt (the native runtime's GEMM prefill path)
    long_ids = torch.randint(0, 96, (1, 120), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        long_ref = hf(long_ids).logits
    got = ours.model(long_ids, ours.model.new_cache(1, 192), [0], [0]).logits
    assert (got - long_ref).abs().max().item() <= TOLERANCE[kernels]


def test_unsupported_architecture_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(SpecserveError, match="unsupported architecture"):
        load_model(str(tmp_path))


@pytest.mark.parametrize("spec,msg", [("/no/such/dir", "does not exist"), ("", "empty")])
def test_missing_files_refused(spec, msg):
    with pytest.raises(SpecserveError, match=msg):
        load_model(spec)


def test_missing_config_and_weights_refused(tmp_path):
    with pytest.raises(SpecserveError, match="no config.json"):
        load_model(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 8, "hidden_size": 8,
                                                      "intermediate_size": 8, "num_hidden_layers": 1,
                                                      "num_attention_heads": 2}))
    with pytest.raises(SpecserveError, match="safetensors"):
        load_model(str(tmp_path))


def test_config_errors_are_one_line():
    with pytest.raises(SpecserveError, match="lacks required field"):
        ModelConfig.from_hf({"model_type": "llama"})
    with pytest.raises(SpecserveError, match="fbgemm needs"):
        RuntimeOptions(dtype="bfloat16", kernels="fbgemm").resolve()
    with pytest.raises(SpecserveError, match="unknown dtype"):
        RuntimeOptions(dtype="int3").resolve()
    with pytest.raises(SpecserveError, match="native needs device=cpu and dtype=float32"):
        RuntimeOptions(dtype="bfloat16", kernels="native").resolve()
    with pytest.raises(SpecserveError, match="has its own attention"):
        RuntimeOptions(kernels="native", attention="sdpa").resolve()
    with pytest.raises(SpecserveError, match="attention=native needs kernels=native"):
        RuntimeOptions(kernels="torch", attention="native").resolve()
    with pytest.raises(SpecserveError, match="unknown kernels"):
        RuntimeOptions(kernels="cuda-graphs").resolve()


def test_auto_picks_native_and_never_rewrites_an_explicit_choice():
    assert RuntimeOptions().resolve().kernels == "native"
    assert RuntimeOptions(kernels="fbgemm").resolve() == RuntimeOptions("float32", "cpu", "fbgemm", "invariant",
                                                                        kv="f32")
    assert RuntimeOptions(attention="sdpa").resolve().kernels == "fbgemm"


def test_kv_setting():
    """kv: auto is the stated default on the native runtime, an explicit choice is kept, bf16 off
    the native runtime and unknown names are refused with the reason; the cache follows it."""
    from specserve.models.loader import DEFAULT_KV
    assert RuntimeOptions().resolve().kv == DEFAULT_KV
    assert RuntimeOptions(kv="bf16").resolve().kv == "bf16"
    assert RuntimeOptions(kv="f32").resolve().kv == "f32"
    with pytest.raises(SpecserveError, match="kv=bf16 needs kernels=native"):
        RuntimeOptions(kernels="fbgemm", kv="bf16").resolve()
    with pytest.raises(SpecserveError, match="unknown kv 'int4'"):
        RuntimeOptions(kv="int4").resolve()
    lm = tiny_model(seed=1, kv="bf16")
    cache = lm.model.new_cache(1, 16)
    assert cache.k_all.dtype == torch.bfloat16 and cache.v_all.dtype == torch.bfloat16
    other = tiny_model(seed=1, kv="f32")
    with pytest.raises(ValueError, match="runs kv=f32"):
        other.model(torch.tensor([[1, 2]]), cache, [0], [0])


@pytest.mark.parametrize("kernels", ["native", "native-int8", "fbgemm"])
def test_batch_invariant_runtime(kernels):
    """native (fp32 and int8 activations), and fbgemm + invariant attention: the logits of a token
    are bit-identical whether it is scored in a 1-token pass, in a (k+1)-token verification pass, or
    next to other sequences."""
    lm = tiny_model(seed=3, vocab=64, layers=2, kernels=kernels)
    assert lm.options.batch_invariant
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 64, (1, 70), generator=g)
    cont = torch.randint(0, 64, (1, 12), generator=g)
    m = lm.model
    # reference: prefill, then one token per pass
    c1 = m.new_cache(4, 256)
    m(prompt, c1, [0], [0])
    ref = [m(cont[:, i:i + 1], c1, [0], [70 + i]).logits[0, 0] for i in range(12)]
    # verification pass of 9 tokens, in row 2 of a batch with another sequence of different length
    c2 = m.new_cache(4, 256)
    m(prompt, c2, [2], [0])
    other = torch.randint(0, 64, (1, 130), generator=g)
    m(other, c2, [1], [0])
    batch = torch.cat([cont[:, :9], torch.randint(0, 64, (1, 9), generator=g)])
    out = m(batch, c2, [2, 1], [70, 130]).logits
    for i in range(9):
        assert torch.equal(out[0, i], ref[i])
    if kernels.startswith("native"):
        # a prompt prefilled whole, in chunks of any sizes, or one token at a time (beside another
        # sequence's pass) leaves the same cache bits and gives the same logits
        whole_cache = m.new_cache(2, 256)
        whole = m(prompt, whole_cache, [0], [0]).logits[0]
        for sizes in ([1] * 70, [5, 64, 1], [33, 37]):
            c = m.new_cache(2, 256)
            got, at = [], 0
            for n in sizes:
                lengths = [n, 3]
                toks = torch.cat([prompt[0, at:at + n], torch.randint(0, 64, (3,), generator=g)])
                got.append(m(toks, c, [0, 1], [at, 0], lengths=lengths).logits[:n])
                at += n
            assert torch.equal(torch.cat(got), whole)
            assert torch.equal(c.k_all[:, 0, :, :70], whole_cache.k_all[:, 0, :, :70])
            assert torch.equal(c.v_all[:, 0, :, :70], whole_cache.v_all[:, 0, :, :70])


def test_logits_for_picks_rows_with_the_same_bits():
    for kernels in ("native", "native-int8", "fbgemm"):
        m = tiny_model(seed=5, vocab=64, kernels=kernels).model
        toks = torch.randint(0, 64, (100,), generator=torch.Generator().manual_seed(1))
        full = m(toks, m.new_cache(2, 256), [0, 1], [0, 0], lengths=[90, 10]).logits
        some = m(toks, m.new_cache(2, 256), [0, 1], [0, 0], lengths=[90, 10], logits_for=[89, 99, 3]).logits
        assert some.shape == (3, 64)
        assert torch.equal(some, full[[89, 99, 3]]) if kernels.startswith("native") else torch.allclose(some, full[[89, 99, 3]])
        with pytest.raises(ValueError, match="logits_for"):
            m(toks, m.new_cache(2, 256), [0, 1], [0, 0], lengths=[90, 10], logits_for=[100])


def test_kv_rollback_is_a_length_change():
    lm = tiny_model(seed=4, vocab=64)
    m = lm.model
    ids = torch.randint(0, 64, (1, 20), generator=torch.Generator().manual_seed(2))
    c = m.new_cache(1, 64)
    m(ids[:, :10], c, [0], [0])
    c.set_length(0, 10)
    a = m(ids[:, 10:11], c, [0], [10]).logits
    m(torch.randint(0, 64, (1, 5)), c, [0], [11])        # speculative tokens, then rejected
    c.set_length(0, 11)
    b = m(ids[:, 11:12], c, [0], [11]).logits             # overwrites position 11
    fresh = m.new_cache(1, 64)
    m(ids[:, :11], fresh, [0], [0])
    assert torch.equal(b, m(ids[:, 11:12], fresh, [0], [11]).logits)
    assert a.shape == (1, 1, 64)
    with pytest.raises(ValueError):
        c.set_length(0, 10_000)


def test_hidden_states_on_request():
    lm = tiny_model(seed=5, vocab=64)
    c = lm.model.new_cache(1, 64)
    out = lm.model(torch.tensor([[1, 2, 3]]), c, [0], [0], features=(1, 2))
    assert set(out.features) == {1, 2} and out.features[2].shape == (1, 3, 32)


# ---------------------------------------------------------------------------------------------- trees
def _paths(parents: list[int]) -> list[list[int]]:
    out = []
    for t in range(len(parents)):
        path = [t]
        while parents[path[0]] >= 0:
            path.insert(0, parents[path[0]])
        out.append(path)
    return out


@pytest.mark.parametrize("kernels", ["native", "native-int8", "fbgemm", "torch"])
def test_tree_pass_equals_chain_pass_and_decoding(kernels):
    """Random trees of up to 33 tokens, two rows with unaligned prefixes in one pass: every node's
    logits equal those of its root-to-node path fed as a chain, and of one-token decoding steps,
    bit for bit on the batch-invariant runtimes (native, fbgemm) and to 1e-4 on torch + sdpa."""
    lm = tiny_model(seed=8, vocab=64, kernels=kernels, attention="sdpa" if kernels == "torch" else "auto")
    m = lm.model
    g = torch.Generator().manual_seed(3)
    starts = [29, 70]
    prompts = [torch.randint(0, 64, (1, s), generator=g) for s in starts]

    def same(a, b):
        return torch.equal(a, b) if kernels != "torch" else (a - b).abs().max().item() <= 1e-4

    for n in (3, 9, 33):
        cache = m.new_cache(4, 160)
        for r, p in enumerate(prompts):
            m(p, cache, [r], [0])
            m(p, cache, [r + 2], [0])
        parents = torch.tensor([[-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, n)]
                                for _ in starts])
        tokens = torch.randint(0, 64, (2, n), generator=g)
        tree = m(tokens, cache, [0, 1], starts, parents=parents).logits               # [2, n, V]
        for b, start in enumerate(starts):
            for path in _paths(parents[b].tolist())[-4:]:                               # deepest nodes last
                chain = m(tokens[b, path][None], cache, [b + 2], [start]).logits[0]
                assert same(tree[b, path], chain)
            steps = [m(tokens[b, [t]][None], cache, [b + 2], [start + i]).logits[0, 0] for i, t in enumerate(path)]
            assert same(tree[b, path], torch.stack(steps))


@pytest.mark.parametrize("kv", ["f32", "bf16"])
def test_compacting_an_accepted_path_gives_the_chain_cache(kv):
    """After a tree pass, moving one path's entries together (KVCache.compact, on the native slot
    moves) leaves exactly the cache a chain pass over that path writes, so the next token's logits
    are the same bits; with either KV cache type."""
    lm = tiny_model(seed=9, vocab=64, kv=kv)
    m = lm.model
    prompt = torch.randint(0, 64, (1, 21), generator=torch.Generator().manual_seed(4))
    tokens = torch.tensor([[5, 9, 3, 7, 1, 2]])
    parents = torch.tensor([[-1, 0, 0, 2, 3, 1]])          # accepted path: 0 -> 2 -> 3 -> 4
    cache = m.new_cache(2, 64)
    for r in range(2):
        m(prompt, cache, [r], [0])
    m(tokens, cache, [0], [21], parents=parents)
    cache.compact(0, 21, [0, 2, 3, 4])
    m(tokens[:, [0, 2, 3, 4]], cache, [1], [21])
    for k, v in zip(cache.k, cache.v):
        assert torch.equal(k[0, :, :25], k[1, :, :25]) and torch.equal(v[0, :, :25], v[1, :, :25])
    nxt = torch.tensor([[11]])
    assert torch.equal(m(nxt, cache, [0], [25]).logits, m(nxt, cache, [1], [25]).logits)


def test_native_slot_moves_equal_tensor_indexing():
    """KVCache.compact's native moves against the tensor indexing it replaces, on caches of both
    element types: random increasing paths from slot 0, rows other than the moved one untouched."""
    from specserve.models.native.kernels import move_slots
    g = torch.Generator().manual_seed(12)
    for dtype in (torch.float32, torch.bfloat16):
        for _ in range(20):
            cache = torch.randn(3, 4, 2, 32, 8, generator=g).to(dtype)
            n = int(torch.randint(2, 12, (1,), generator=g))
            path = [0] + sorted(torch.randperm(15, generator=g)[:n - 1].add(1).tolist())
            start, row = int(torch.randint(0, 16, (1,), generator=g)), int(torch.randint(0, 4, (1,), generator=g))
            moves = [(start + i, start + p) for i, p in enumerate(path) if p != i]
            ref = cache.clone()
            layers = ref[:, row]
            layers[:, :, [d for d, _ in moves]] = layers[:, :, [s for _, s in moves]]
            move_slots(cache, row, [d for d, _ in moves], [s for _, s in moves])
            assert torch.equal(cache, ref)


@pytest.mark.parametrize("kernels", ["native", "torch"])
def test_features_for_every_fed_position(kernels):
    """Features of a tree pass are the chain pass's features of each node's path (native: bit for
    bit), for the layers asked; none asked, none returned."""
    lm = tiny_model(seed=5, vocab=64, kernels=kernels, attention="sdpa" if kernels == "torch" else "auto")
    m, last = lm.model, lm.config.num_layers
    cache = m.new_cache(2, 64)
    prompt = torch.tensor([[1, 2, 3, 4, 5]])
    out = m(prompt, cache, [0], [0], last_only=True, features=(1, last))
    assert set(out.features) == {1, last} and out.features[last].shape == (1, 5, 32)
    m(prompt, cache, [1], [0])
    tree = m(torch.tensor([[6, 7, 8]]), cache, [0], [5], parents=torch.tensor([[-1, 0, 0]]), features=(last,))
    chain = m(torch.tensor([[6, 8]]), cache, [1], [5], features=(last,))
    assert not m(torch.tensor([[6]]), cache, [1], [5]).features
    diff = (tree.features[last][0, [0, 2]] - chain.features[last][0]).abs().max().item()
    assert diff == 0.0 if kernels == "native" else diff <= 1e-5


RUNTIMES = ["native", "native-int8", "fbgemm", "torch"]


def _runtime(kernels: str, seed: int):
    return tiny_model(seed=seed, vocab=64, kernels=kernels, attention="sdpa" if kernels == "torch" else "auto").model


@pytest.mark.parametrize("kernels", RUNTIMES)
def test_every_runtime_keeps_the_decoder_protocol(kernels):
    """What ``Decoder.forward`` promises, on every runtime: a [B, T] tree pass returns logits
    [B, T, V] and features [B, T, hidden]; the same tokens as a ragged pass (every length T, parents
    flat) return features [N, hidden] and, with ``logits_for``, logits [len(logits_for), V] in that
    order, with the same values (bit for bit where the runtime is batch-invariant); ``last_only``
    gives [B, 1, V], each row's last token; ``last_only`` on a ragged pass and ``logits_for`` on a
    [B, T] one are refused."""
    m = _runtime(kernels, seed=6)
    last, hid = m.config.num_layers, m.config.hidden_size
    assert isinstance(m.dtype, torch.dtype) and isinstance(m.device, torch.device) and m.weight_bytes() > 0
    g = torch.Generator().manual_seed(2)
    cache = m.new_cache(4, 64)
    prompts = torch.randint(0, 64, (2, 9), generator=g)
    m(prompts, cache, [0, 1], [0, 0])                     # rows 2, 3 hold the same prefixes as rows 0, 1
    m(prompts, cache, [2, 3], [0, 0])
    toks = torch.randint(0, 64, (2, 4), generator=g)
    parents = torch.tensor([[-1, 0, 0, 1], [-1, 0, 1, -1]])
    padded = m(toks, cache, [0, 1], [9, 9], parents=parents, features=(0, last))
    assert padded.logits.shape == (2, 4, 64) and padded.features[last].shape == (2, 4, hid)
    pick = [7, 0, 5, 2]
    ragged = m(toks.reshape(-1), cache, [2, 3], [9, 9], lengths=[4, 4], parents=parents.reshape(-1),
               features=(0, last), logits_for=pick)
    assert ragged.logits.shape == (4, 64) and ragged.features[last].shape == (8, hid)
    expect, expect_f = padded.logits.reshape(8, 64)[pick], padded.features[last].reshape(8, hid)
    if m.invariant_tokens:
        assert torch.equal(ragged.logits, expect) and torch.equal(ragged.features[last], expect_f)
        assert torch.equal(ragged.features[0], padded.features[0].reshape(8, hid))
    else:
        assert torch.allclose(ragged.logits, expect, atol=1e-4) and torch.allclose(ragged.features[last], expect_f,
                                                                                    atol=1e-5)
    chain = m(toks, cache, [0, 1], [9, 9], last_only=True)
    assert chain.logits.shape == (2, 1, 64)
    with pytest.raises(ValueError, match="last_only"):
        m(toks.reshape(-1), cache, [2, 3], [9, 9], lengths=[4, 4], last_only=True)
    with pytest.raises(ValueError, match="logits_for"):
        m(toks, cache, [0, 1], [9, 9], logits_for=[0])


@pytest.mark.parametrize("kernels", RUNTIMES)
def test_matmul_runs_on_the_runtimes_own_kernels(kernels):
    """``Decoder.matmul``: y = x W^T (+ b) within the runtime's rounding of a float64 reference (int8
    activations against Q8_0 weights: 2% of the output's scale; float16 weights: 0.2%; fp32: 1e-5),
    and bit for bit what the learned drafters' heads computed before the hook existed (their
    ``Matmul``, spelled out): Q8_0 blocks on the int8 kernels (in_features a multiple of 32),
    float16 blocks on the native f32 kernels, float32 torch otherwise."""
    from specserve.models import native as nt
    from specserve.models.native import packed as pk

    m = _runtime(kernels, seed=7)
    g = torch.Generator().manual_seed(8)
    for n, k, with_bias in ((48, 64, True), (40, 64, False), (16, 24, True)):
        w, x = torch.randn(n, k, generator=g), torch.randn(5, k, generator=g)
        b = torch.randn(n, generator=g) if with_bias else None
        y = m.matmul(w, b)(x)
        ref = x.double() @ w.double().T + (b.double() if b is not None else 0)
        int8 = kernels == "native-int8" and k % 32 == 0
        tol = 2e-2 if int8 else 2e-3 if kernels.startswith("native") else 1e-5
        assert y.dtype == torch.float32 and y.shape == (5, n)
        assert (y.double() - ref).abs().max().item() <= tol * ref.abs().max().item()
        if int8:
            expect = nt.linear(x, pk.PackedWeight.pack(pk.quantize_q8_0(w)), b)
        elif kernels.startswith("native"):
            expect = nt.linear(x, nt.NativeWeight.from_float(w, nt.F16), b)
        else:
            expect = x @ w.T + b if b is not None else x @ w.T
        assert torch.equal(y, expect)


@pytest.mark.parametrize("kernels", ["native", "fbgemm", "torch"])
def test_timer_hook_times_every_part(kernels):
    """A PartTimer set through the hook times each part of a pass, and once removed, passes are no
    longer timed (and give the same logits)."""
    from specserve.models.decoder import PartTimer, timed

    m = _runtime(kernels, seed=6)
    cache = m.new_cache(1, 64)
    x = torch.tensor([[1, 2, 3, 4]])
    plain = m(x, cache, [0], [0]).logits
    with timed(m, PartTimer()) as timer:
        assert torch.equal(m(x, cache, [0], [0]).logits, plain)
    for part in ("qkv", "o", "gate_up", "down", "attention", "lm_head"):
        assert timer.seconds[part] > 0, part
    before = dict(timer.seconds)
    m(x, cache, [0], [0])
    assert dict(timer.seconds) == before


GEMMA_LIKE = dict(arch="gemma3", qk_norm=True, post_norms=True, activation="gelu_tanh", embed_scale=32 ** 0.5,
                  sliding_window=8, sliding_pattern=2, local_rope_theta=1e4, tie_word_embeddings=True)


@pytest.mark.parametrize("kernels", ["native", "native-int8"])
@pytest.mark.parametrize("arch", [dict(attention_bias=True), GEMMA_LIKE], ids=["llama-bias", "gemma-like"])
def test_native_timer_keeps_every_bit(kernels, arch):
    """ss_forward timing its own kernel calls: a timed pass gives the logits and features of an untimed
    one, bit for bit (a chain with features, a ragged tree pass with logits_for; Gemma's post norms,
    q/k norms, gelu and embedding scale), and every part of decoder.PARTS gets seconds > 0."""
    from specserve.models.decoder import PARTS, PartTimer, timed

    lm = tiny_model(seed=6, vocab=64, kernels=kernels, **arch)
    m, last = lm.model, lm.config.num_layers
    cache = m.new_cache(2, 64)
    toks, parents = torch.tensor([5, 1, 2, 3, 4, 7, 8]), torch.tensor([-1, 0, 1, -1, 0, 0, 1])

    def run() -> list[torch.Tensor]:
        a = m(torch.tensor([[1, 2, 3, 4]]), cache, [0], [0], features=(0, last))
        b = m(toks, cache, [0, 1], [4, 0], lengths=[3, 4], parents=parents, features=(1,), logits_for=[0, 2, 5])
        return [a.logits, *a.features.values(), b.logits, *b.features.values()]

    plain = run()
    with timed(m, PartTimer()) as timer:
        got = run()
    assert len(got) == len(plain) == 5 and all(torch.equal(x, y) for x, y in zip(got, plain))
    assert set(timer.seconds) == set(PARTS) and all(timer.seconds[p] > 0 for p in PARTS), dict(timer.seconds)


@pytest.mark.parametrize("kernels", ["native", "native-int8", "fbgemm", "torch"])
def test_ragged_pass_equals_separate_passes(kernels):
    """One ragged pass over three sequences of 1, 5 and 3 tokens (the last a tree) gives each token
    the logits and features of its own sequence's pass: bit for bit on native and fbgemm."""
    lm = tiny_model(seed=12, vocab=64, kernels=kernels, attention="sdpa" if kernels == "torch" else "auto")
    m, last = lm.model, lm.config.num_layers
    g = torch.Generator().manual_seed(5)
    starts = [13, 40, 7]
    cache = m.new_cache(6, 96)
    for r, s in enumerate(starts):
        p = torch.randint(0, 64, (1, s), generator=g)
        m(p, cache, [r], [0])
        m(p, cache, [r + 3], [0])
    seqs = [torch.randint(0, 64, (n,), generator=g) for n in (1, 5, 3)]
    tree = torch.tensor([-1, 0, 0])
    parents = torch.cat([torch.tensor([-1]), torch.arange(-1, 4), tree])
    out = m(torch.cat(seqs), cache, [0, 1, 2], starts, lengths=[1, 5, 3], parents=parents, features=(last,))
    assert out.logits.shape == (9, 64) and out.features[last].shape == (9, 32)
    alone = [m(seqs[0][None], cache, [3], [starts[0]], features=(last,)),
             m(seqs[1][None], cache, [4], [starts[1]], features=(last,)),
             m(seqs[2][None], cache, [5], [starts[2]], parents=tree[None], features=(last,))]
    ref = torch.cat([a.logits[0] for a in alone])
    ref_f = torch.cat([a.features[last][0] for a in alone])
    if kernels == "torch":
        assert (out.logits - ref).abs().max().item() <= 1e-4
    else:
        assert torch.equal(out.logits, ref) and torch.equal(out.features[last], ref_f)
    with pytest.raises(ValueError):
        m(torch.cat(seqs), cache, [0, 1, 2], starts, lengths=[1, 5, 2])


def test_fbgemm_rows_are_the_same_in_passes_of_any_length():
    """FBGEMM's fp16-weight GEMM on AVX2-only CPUs computes the rows of a last block of 1 or 2 with
    other microkernels (different bits); the fbgemm Linear calls it on fixed-size row blocks, so a
    row's bits do not depend on the pass's length or the row's place in it."""
    from specserve.models.layers import Linear, fbgemm_available
    if not fbgemm_available():
        pytest.skip("this torch build has no FBGEMM fp16-weight GEMM")
    g = torch.Generator().manual_seed(5)
    lin = Linear(torch.randn(192, 64, generator=g), torch.randn(192, generator=g), "fbgemm")
    x = torch.randn(64, 64, generator=g)
    ref = lin(x)
    for start in (0, 1, 5):
        for n in (1, 2, 3, 7, 8, 14, 31, 32, 50):
            assert torch.equal(lin(x[start:start + n]), ref[start:start + n]), (start, n)
    assert lin(x[:1].view(1, 1, 64)).shape == (1, 1, 192)
