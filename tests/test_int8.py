"""Int8-activation kernels (q8.h): activation quantization by hand, packed weights that read back
exactly, products against a float64 reference of the quantized operands, and the property the
runtime is built on: the same bits alone or batched, at any thread count, on every instruction set."""

import itertools

import numpy as np
import pytest
import torch

from conftest import tiny_model
from specserve.errors import SpecserveError
from specserve.models import RuntimeOptions
from specserve.models import native as nt
from specserve.models.native import packed as pk
from specserve.models.native.paths import ATTENTION
from test_native import BLOCKS, K_QUANTS, make_weight

pytestmark = pytest.mark.skipif(not set(nt.REQUIRED_CPU_FLAGS) <= nt.build._cpu_flags(),
                                reason="this CPU lacks AVX2/FMA/F16C")
OTHER_PATHS = ["avx512-vnni", "avx-vnni", "avx512-vnni-512", "avx512-vnni-tiles"]


@pytest.fixture(autouse=True)
def best_path():
    yield
    pk.set_path(None)


def test_quantize_rows_by_hand():
    """Block 0: amax 2.54 -> d = 0.02, q = round(x / d); block 1 all zero: d = 0, q = 0."""
    x = torch.zeros(1, 64)
    x[0, :4] = torch.tensor([2.54, -1.27, 0.011, -0.009])
    x[0, 20] = 0.5
    q, d, sx, hs = pk.quantize_rows(x)
    assert d[0, 0].item() == pytest.approx(0.02, rel=1e-6) and d[0, 1].item() == 0.0
    assert q[0, :4].tolist() == [127, -64, 1, 0] and q[0, 20].item() == 25        # -63.5 rounds to even
    assert int(q[0, 32:].abs().sum()) == 0
    assert hs[0, 0].tolist() == [127 - 64 + 1, 25] and hs[0, 1].tolist() == [0, 0]
    assert sx[0, 0].item() == pytest.approx(0.02 * (127 - 64 + 1 + 25), rel=1e-6)


@pytest.mark.parametrize("fmt", BLOCKS)
def test_packed_weights_read_back_exactly(fmt):
    """Packing keeps every value: the packed rows equal gguf's reference dequantizer (37 rows: a padded
    last group of 8)."""
    w, ref = make_weight(fmt, 37, 512 if fmt in K_QUANTS else 96)
    assert torch.equal(pk.PackedWeight.pack(w).dequantize(), ref)


def reference(x: torch.Tensor, ref_w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """float64 product of the quantized activations (as the kernel quantizes them) and the exact weights."""
    q, d, _, _ = pk.quantize_rows(x)
    xq = (q.double().view(x.shape[0], -1, 32) * d.double()[..., None]).view(x.shape)
    return xq @ ref_w.double().T + (bias.double() if bias is not None else 0)


@pytest.mark.parametrize("fmt", BLOCKS)
def test_linear_matches_float64_reference_of_quantized_operands(fmt):
    """The integer block sums are exact: only the fp32 combination of block results rounds (relative
    1e-6 of the output scale).  75 rows: padded groups; with a bias and accumulating."""
    k = 512 if fmt in K_QUANTS else 128
    w, ref_w = make_weight(fmt, 75, k, seed=1)
    p = pk.PackedWeight.pack(w)
    x = torch.randn(13, k, generator=torch.Generator().manual_seed(2))
    bias = torch.randn(75, generator=torch.Generator().manual_seed(3))
    expect = reference(x, ref_w, bias)
    tol = 1e-6 * max(1.0, expect.abs().max().item()) * 4
    assert (nt.linear(x, p, bias).double() - expect).abs().max().item() < tol
    base = torch.randn(13, 75, generator=torch.Generator().manual_seed(4))
    acc = nt.linear(x, p, bias, out=base.clone(), accumulate=True)
    assert (acc.double() - (expect + base.double())).abs().max().item() < tol
    # and close to the fp32-activation product (the int8 rounding of x is all that differs)
    f32 = nt.linear(x, w, bias).double()
    assert (nt.linear(x, p, bias).double() - f32).abs().max().item() < 0.02 * f32.abs().max().item()


@pytest.mark.parametrize("fmt", BLOCKS)
def test_rows_are_bit_identical_alone_batched_and_at_any_thread_count(fmt):
    """Row r of x W^T: alone, in every group of 2..20 rows at two offsets, and at 1 thread."""
    w, _ = make_weight(fmt, 130, 512 if fmt in K_QUANTS else 256, seed=5)
    p = pk.PackedWeight.pack(w)
    x = torch.randn(20, w.shape[1], generator=torch.Generator().manual_seed(6))
    alone = torch.cat([nt.linear(x[i:i + 1].contiguous(), p) for i in range(20)])
    for m in range(2, 21):
        for lo in (0, 20 - m):
            assert torch.equal(nt.linear(x[lo:lo + m].contiguous(), p), alone[lo:lo + m])
    lib = nt.library()
    lib.ss_set_threads(1)
    try:
        assert torch.equal(nt.linear(x, p), alone)
    finally:
        lib.ss_set_threads(0)


@pytest.mark.parametrize("path", OTHER_PATHS)
def test_every_instruction_set_gives_the_avx2_bits(path):
    """The VNNI paths against the AVX2 path, every format, 1..16 rows (the tiled path switches tiles
    after 2 and runs up to 12 tokens at once) and a 64-row prompt chunk, 75
    and 83 output rows (10 and 11 row groups: the 512-bit path's pairs, a padded group, an odd one)."""
    if not pk.path_runs(path):
        pytest.skip(f"this CPU cannot run the {path} path: its bits are not checked on this machine")
    for fmt, n in itertools.product(BLOCKS, (75, 83)):
        w, _ = make_weight(fmt, n, 512 if fmt in K_QUANTS else 256, seed=9)
        p = pk.PackedWeight.pack(w)
        bias = torch.randn(n, generator=torch.Generator().manual_seed(1))
        for m in (1, 2, 3, 5, 9, 12, 16, 64):
            x = torch.randn(m, w.shape[1], generator=torch.Generator().manual_seed(m))
            pk.set_path("avx2")
            a = nt.linear(x, p, bias)
            pk.set_path(path)
            assert torch.equal(nt.linear(x, p, bias), a), (nt.FORMAT_NAMES[fmt], m)


def test_k_quants_pack_in_the_files_bits():
    """Q4_K and Q6_K packed keep the file's bits (4.625 and 6.5625 a weight, where fp32 scales took 6
    and 9.5): 64 rows x 512 in 18,944 and 26,880 bytes; Q8_0 stays at 8.5 bits."""
    for fmt, size in ((nt.Q4_K, 18944), (nt.Q6_K, 26880), (nt.Q8_0, 64 * 512 * 17 // 16)):
        w, _ = make_weight(fmt, 64, 512)
        assert pk.PackedWeight.pack(w).nbytes == size, nt.FORMAT_NAMES[fmt]


def test_fused_parts_of_different_formats_pack_each_in_its_own():
    """A K-quant mix's QKV (Q4_K q, Q4_K k, Q6_K v: no common format) packs part by part: its rows
    read back exactly, and one product equals the three parts' products side by side, bit for bit,
    with a bias and accumulating, on every path the CPU runs and at 1 token and 9."""
    parts = [make_weight(fmt, n, 512, seed=s) for fmt, n, s in ((nt.Q4_K, 40, 1), (nt.Q4_K, 16, 2), (nt.Q6_K, 16, 3))]
    fused = pk.fuse([w for w, _ in parts])
    assert isinstance(fused, pk.FusedParts)
    mixed = pk.PackedWeight.pack(fused)
    assert mixed.fmt == pk.MIXED and mixed.shape == (72, 512)
    assert torch.equal(mixed.dequantize(), torch.cat([ref for _, ref in parts]))
    singles = [pk.PackedWeight.pack(w) for w, _ in parts]
    bias = torch.randn(72, generator=torch.Generator().manual_seed(7))
    for path in ["avx2", *[p for p in OTHER_PATHS if pk.path_runs(p)]]:
        pk.set_path(path)
        for m in (1, 9):
            x = torch.randn(m, 512, generator=torch.Generator().manual_seed(m))
            expect = torch.cat([nt.linear(x, p, b) for p, b in zip(singles, bias.split([40, 16, 16]))], 1)
            assert torch.equal(nt.linear(x, mixed, bias), expect), (path, m)
            base = torch.randn(m, 72, generator=torch.Generator().manual_seed(9))
            assert torch.equal(nt.linear(x, mixed, bias, out=base.clone(), accumulate=True), base + expect)
    # one format fuses into one block weight; for f32 activations parts become one weight: Q8_0 where
    # every part's blocks are Q8_0 blocks exactly, else fp32 rows
    a, b = make_weight(nt.Q4_K, 8, 256)[0], make_weight(nt.Q4_K, 8, 256, seed=1)[0]
    same = pk.PackedWeight.pack(pk.fuse([a, b]))            # packed side by side, no stacked copy first
    assert same.fmt == pk.PACKED + nt.Q4_K and torch.equal(same.data, pk.PackedWeight.pack(nt.NativeWeight.cat([a, b])).data)
    q8 = pk.fuse([make_weight(nt.Q5_0, 8, 64)[0], make_weight(nt.Q8_0, 8, 64)[0]]).as_float()
    assert q8.fmt == nt.Q8_0
    assert fused.as_float().fmt == nt.F32 and torch.equal(fused.as_float().dequantize(), mixed.dequantize())


def test_a_path_the_cpu_lacks_is_refused():
    missing = [p for p in OTHER_PATHS if not pk.path_runs(p)]
    if not missing:
        pytest.skip("this CPU runs every path")
    with pytest.raises(ValueError, match="cannot run"):
        pk.set_path(missing[0])
    assert pk.current_path() in pk.PATHS


@pytest.mark.parametrize("kv", ["f32", "bf16"])
def test_whole_model_passes_same_bits_on_every_path(kv):
    """A tiny Q4_1 / Q8_0 model, with each KV cache type: a 9-token verification pass beside another
    sequence, on each int8 and attention path the CPU runs and at 1 thread, equals one-token decoding
    on the AVX2 paths at the default threads."""
    lm = tiny_model(seed=4, vocab=64, kernels="native-int8", kv=kv)
    m = lm.model
    g = torch.Generator().manual_seed(0)
    prompt, cont = torch.randint(0, 64, (1, 40), generator=g), torch.randint(0, 64, (1, 9), generator=g)
    pk.set_path("avx2")
    ATTENTION.set("avx2")
    c = m.new_cache(2, 128)
    m(prompt, c, [0], [0])
    ref = torch.stack([m(cont[:, i:i + 1], c, [0], [40 + i]).logits[0, 0] for i in range(9)])
    attention = [a for a in ATTENTION.names if ATTENTION.runs(a)]
    try:
        for path, att in itertools.product(["avx2", *[p for p in OTHER_PATHS if pk.path_runs(p)]], attention):
            pk.set_path(path)
            ATTENTION.set(att)
            c = m.new_cache(2, 128)
            m(prompt, c, [1], [0])
            m(torch.randint(0, 64, (1, 17), generator=g), c, [0], [0])
            out = m(torch.cat([cont, cont[:, :5].repeat(1, 2)[:, :9]]), c, [1, 0], [40, 17]).logits
            assert torch.equal(out[0], ref), (path, att)
    finally:
        ATTENTION.set(None)
    m.set_threads(1)
    try:
        c = m.new_cache(1, 128)
        m(prompt, c, [0], [0])
        assert torch.equal(m(cont, c, [0], [40]).logits[0], ref)
    finally:
        m.set_threads(0)


def test_activations_setting():
    """auto: int8 over blocks, f32 over float weights; int8 over float weights or off the native
    kernels is refused with the reason; f32 over blocks keeps the blocks unpacked."""
    assert tiny_model(seed=1, vocab=64).model.activations == "f32"
    assert tiny_model(seed=1, vocab=64, kernels="native-int8").model.activations == "int8"
    with pytest.raises(ValueError, match="needs quantized"):
        tiny_model(seed=1, vocab=64, activations="int8")
    with pytest.raises(SpecserveError, match="needs kernels=native"):
        RuntimeOptions(kernels="torch", activations="int8").resolve()
    with pytest.raises(SpecserveError, match="unknown activations"):
        RuntimeOptions(activations="int4").resolve()
    from conftest import quantized, tiny_config, tiny_state_dict
    sd = quantized(tiny_state_dict(tiny_config(vocab=64), 1))
    f32 = tiny_model(seed=1, vocab=64, sd=sd, activations="f32").model
    assert f32.activations == "f32" and isinstance(f32.layers[0].qkv, nt.NativeWeight)
    int8 = tiny_model(seed=1, vocab=64, sd=sd).model
    # Q4_1 / Q8_0 pack into as many bytes as they had (fp16 scales kept; every matrix a multiple of 8 rows)
    assert isinstance(int8.layers[0].qkv, pk.PackedWeight) and int8.weight_bytes() == f32.weight_bytes()
    ids = torch.randint(0, 64, (1, 30), generator=torch.Generator().manual_seed(2))
    a = f32(ids, f32.new_cache(1, 64), [0], [0]).logits
    b = int8(ids, int8.new_cache(1, 64), [0], [0]).logits
    assert not torch.equal(a, b) and ((a - b).norm() / a.norm()).item() < 0.1     # close, not equal
    assert torch.equal(int8.weight_rows("embed", torch.tensor([3, 9])), f32.weight_rows("embed", torch.tensor([3, 9])))
    # Q4_0 blocks: the int8 kernels read their 4 bits; fp32 activations run them (fused ones too) as Q8_0
    sd4 = quantized(tiny_state_dict(tiny_config(vocab=64), 1), fmt=nt.Q4_0)
    f32 = tiny_model(seed=1, vocab=64, sd=sd4, activations="f32").model
    int8 = tiny_model(seed=1, vocab=64, sd=sd4).model
    assert {f32.layers[0].qkv.fmt, f32.layers[0].gate_up.fmt, f32.layers[0].o.fmt} == {nt.Q8_0}
    assert {int8.layers[0].qkv.fmt, int8.layers[0].gate_up.fmt, int8.layers[0].o.fmt} == {pk.PACKED + nt.Q4_0}


def test_float_weights_quantized_to_q8_0_for_the_heads():
    """quantize_q8_0: every value within half a step of the original (the step d = max|w| / 127 of its
    block, plus the fp16 rounding of d), zero blocks stay zero, and what the int8 kernels compute from
    it is close to the float product."""
    w = torch.randn(24, 96, generator=torch.Generator().manual_seed(3))
    w[5, :32] = 0
    q = pk.quantize_q8_0(w)
    back = q.dequantize()
    step = (w.view(24, 3, 32).abs().amax(-1, keepdim=True) / 127).expand(24, 3, 32).reshape(24, 96)
    assert ((back - w).abs() <= step * 0.5 + w.abs() * 1e-3 + 1e-7).all()
    assert int(back[5, :32].abs().sum()) == 0
    x = torch.randn(3, 96, generator=torch.Generator().manual_seed(4))
    got = nt.linear(x, pk.PackedWeight.pack(q))
    assert ((got - x @ w.T).norm() / (x @ w.T).norm()).item() < 0.02


def test_ceilings_double_the_work_until_the_time_is_long_enough(monkeypatch):
    """int8_peak / fma_peak: the kernel is called with 2x the iterations until one call lasts at least
    ``seconds``; the rate is threads x iterations x work per iteration / that call's time.  A fake
    kernel that takes 1 ns an iteration fixes what each must return; the real kernels return a finite
    positive rate (how fast is the benchmark's business, not a test's)."""
    calls = {"int8": [], "fma": []}

    class Fake:
        def ss_set_threads(self, n):
            return 2

        def ss_int8_peak(self, iters, sink):
            calls["int8"].append(iters)
            return iters * 1e-9

        def ss_fma_peak(self, iters, sink):
            calls["fma"].append(iters)
            return iters * 1e-9

    real_int8, real_fma = pk.int8_peak(0.01), nt.fma_peak(0.01)
    assert np.isfinite(real_int8) and real_int8 > 0 and np.isfinite(real_fma) and real_fma > 0
    with monkeypatch.context() as m:                   # (undone before this module's fixtures reset the path)
        m.setattr(pk, "library", lambda: Fake())
        m.setattr(nt.kernels, "library", lambda: Fake())
        assert pk.int8_peak(0.001) == pytest.approx(2 * 8 * 32 * 1e9)      # 8 x 32 multiply-adds an iteration
        assert nt.fma_peak(0.001) == pytest.approx(2 * 96 * 1e9)
    assert calls["int8"] == [1 << k for k in range(14, 21)]                  # 2^20 ns: the first >= 1 ms
    assert calls["fma"] == [1 << k for k in range(16, 21)]


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
def test_learned_heads_run_on_the_int8_kernels_and_keep_greedy_identity(kind):
    """On a target with int8 activations a head's matrix products run as Q8_0 blocks on the int8
    kernels (its LM head over the reduced vocabulary of ``tiny_head``, the first 48 tokens, checked
    bit for bit); drafting (k = 4) still gives plain decoding's tokens."""
    from conftest import tiny_head
    from specserve.drafters import create
    from specserve.engine import Engine, Request

    target = tiny_model(seed=41, vocab=64, layers=3, kernels="native-int8")
    d = create(kind, target, head=tiny_head(kind, target))
    rows = target.model.weight_rows("lm_head", torch.arange(48))
    x = torch.randn(3, target.config.hidden_size, generator=torch.Generator().manual_seed(5))
    assert torch.equal(d.lm(x), nt.linear(x, pk.PackedWeight.pack(pk.quantize_q8_0(rows))))
    prompt = [5, 9, 14, 3, 22, 9, 14, 3, 40, 41, 7, 9]
    plain = Engine(target, {"none": create("none", target)}, max_batch=1, max_len=128)
    ref = plain.generate([Request(prompt, 24)])[0].tokens
    eng = Engine(target, {kind: d}, max_batch=1, max_len=128)
    assert eng.generate([Request(prompt, 24, drafter=kind, num_draft=4)])[0].tokens == ref
