"""Native CPU kernels: exact dequantization, accuracy against float64 references, and the property
the runtime is built on: every output row is bit-identical however many rows share the call."""

import ctypes

import gguf
import numpy as np
import pytest
import torch
from gguf import quants

from specserve.models import native as nt
from specserve.models.native.paths import ATTENTION

# Only a CPU without the instructions excuses these tests; a failing build fails them.
pytestmark = pytest.mark.skipif(not set(nt.REQUIRED_CPU_FLAGS) <= nt.build._cpu_flags(),
                                reason="this CPU lacks AVX2/FMA/F16C")

GGUF_TYPES = {nt.Q4_1: gguf.GGMLQuantizationType.Q4_1, nt.Q8_0: gguf.GGMLQuantizationType.Q8_0,
              nt.Q4_0: gguf.GGMLQuantizationType.Q4_0, nt.Q5_0: gguf.GGMLQuantizationType.Q5_0,
              nt.Q5_1: gguf.GGMLQuantizationType.Q5_1, nt.Q4_K: gguf.GGMLQuantizationType.Q4_K,
              nt.Q5_K: gguf.GGMLQuantizationType.Q5_K, nt.Q6_K: gguf.GGMLQuantizationType.Q6_K}
K_QUANTS = (nt.Q4_K, nt.Q5_K, nt.Q6_K)
BLOCKS = [nt.Q8_0, nt.Q4_1, nt.Q4_0, nt.Q5_0, nt.Q5_1, *K_QUANTS]


def random_k_blocks(fmt: int, n: int, k: int, g: np.random.Generator) -> np.ndarray:
    """Rows of K-quant blocks with every bit random except the fp16 scales (finite, of a weight's
    size): gguf's Python package cannot quantize to K-quants, and any bits are a valid block."""
    blocks = g.integers(0, 256, size=(n, k // 256, nt.BLOCK_BYTES[fmt]), dtype=np.uint8)
    scales = (g.standard_normal((n, k // 256, 2)) * 0.01).astype(np.float16).view(np.uint8)
    if fmt == nt.Q6_K:
        blocks[..., 208:210] = scales[..., :2]                    # d last
    else:
        blocks[..., 0:4] = scales                                 # d, dmin first
    return blocks.reshape(n, -1)


def make_weight(fmt: int, n: int, k: int, seed: int = 0) -> tuple[nt.NativeWeight, torch.Tensor]:
    """A random weight in ``fmt`` and its reference fp32 values (gguf's own dequantizer for blocks)."""
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.1
    if fmt in GGUF_TYPES:
        blocks = (random_k_blocks(fmt, n, k, np.random.default_rng(seed)) if fmt in K_QUANTS
                  else quants.quantize(w.numpy(), GGUF_TYPES[fmt]))
        ref = torch.from_numpy(np.array(quants.dequantize(blocks, GGUF_TYPES[fmt]), dtype=np.float32))
        return nt.NativeWeight(torch.from_numpy(blocks), fmt, (n, k)), ref
    nw = nt.NativeWeight.from_float(w, fmt)
    return nw, (w.half().float() if fmt == nt.F16 else w)


@pytest.mark.parametrize("fmt", [nt.F32, nt.F16, *BLOCKS])
def test_dequantization_is_exact(fmt):
    """Bit-equal to gguf's reference dequantizer (K-quants: 37 rows x 2 super-blocks of random bits)."""
    w, ref = make_weight(fmt, 37, 512 if fmt in K_QUANTS else 96)
    assert torch.equal(w.dequantize(), ref)


@pytest.mark.parametrize("fmt", [nt.F32, nt.F16, *BLOCKS])
def test_linear_matches_float64_reference(fmt):
    k = 512 if fmt in K_QUANTS else 128
    w, ref = make_weight(fmt, 75, k, seed=1)            # 75 rows: exercises the row tails
    x = torch.randn(13, k, generator=torch.Generator().manual_seed(2))
    bias = torch.randn(75, generator=torch.Generator().manual_seed(3))
    expect = x.double() @ ref.double().T + bias.double()
    got = nt.linear(x, w, bias)
    tol = 1e-4 * max(1.0, ref.abs().max().item() * 10)   # random K-quant bits make larger weights
    assert (got.double() - expect).abs().max().item() < tol
    # accumulate: out += x W^T + b
    base = torch.randn(13, 75, generator=torch.Generator().manual_seed(4))
    acc = nt.linear(x, w, bias, out=base.clone(), accumulate=True)
    assert (acc.double() - (expect + base.double())).abs().max().item() < tol


@pytest.mark.parametrize("fmt", [nt.F32, nt.Q8_0, nt.Q4_1, nt.Q5_1, nt.Q4_K, nt.Q6_K])
def test_linear_rows_are_invariant_to_row_count(fmt):
    """Row r of x W^T has the same bits computed alone, in any group of 2..20 rows, at any offset."""
    w, _ = make_weight(fmt, 130, 256, seed=5)
    x = torch.randn(20, 256, generator=torch.Generator().manual_seed(6))
    alone = torch.cat([nt.linear(x[i:i + 1].contiguous(), w) for i in range(20)])
    for m in range(2, 21):
        for lo in (0, 20 - m):
            assert torch.equal(nt.linear(x[lo:lo + m].contiguous(), w), alone[lo:lo + m])


def test_releasing_a_threads_pool_keeps_every_later_result():
    """A server's main thread gives up its pool of compute threads before the engine thread runs:
    later kernels, in this thread (a new pool) and in another, give the same bits."""
    import threading
    w, _ = make_weight(nt.Q4_1, 130, 256, seed=8)
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(9))
    before = nt.linear(x, w)
    assert nt.library().ss_release_threads() == 0
    assert nt.library().ss_release_threads() == 0                                  # nothing left: still fine
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("other", nt.linear(x, w)))
    t.start()
    t.join()
    assert torch.equal(out["other"], before) and torch.equal(nt.linear(x, w), before)


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="multiple of 32"):
        nt.NativeWeight(torch.zeros(4, 20, dtype=torch.uint8), nt.Q4_1, (4, 40))
    with pytest.raises(ValueError, match="needs uint8 data"):
        nt.NativeWeight(torch.zeros(4, 21, dtype=torch.uint8), nt.Q4_1, (4, 32))


def test_cat_mixed_formats_falls_back_to_exact_f32():
    a, ra = make_weight(nt.Q4_1, 8, 64)
    b, rb = make_weight(nt.Q8_0, 4, 64)
    c = nt.NativeWeight.cat([a, b])
    assert c.fmt == nt.F32 and torch.equal(c.dequantize(), torch.cat([ra, rb]))
    d = nt.NativeWeight.cat([a, a])
    assert d.fmt == nt.Q4_1 and torch.equal(d.dequantize(), torch.cat([ra, ra]))


def reference_attention(q, kc, vc, rows, keys, groups):
    """float64 softmax attention.  q: [B*T, H, D]; kc, vc: [R, Hkv, C, D]; keys[i]: the cache slots
    query i attends to."""
    bt, h, d = q.shape
    t = bt // len(rows)
    out = torch.empty(bt, h, d, dtype=torch.float64)
    for i in range(bt):
        r, slots = rows[i // t], torch.tensor(keys[i])
        for head in range(h):
            k = kc[r, head // groups, slots].double()
            v = vc[r, head // groups, slots].double()
            s = (k @ q[i, head].double()) * d ** -0.5
            out[i, head] = torch.softmax(s, 0) @ v
    return out


G = torch.Generator().manual_seed(7)
ROWS_N, HKV, CAP, D, H = 3, 2, 64, 16, 6
KC = torch.randn(ROWS_N, HKV, CAP, D, generator=G)
VC = torch.randn(ROWS_N, HKV, CAP, D, generator=G)


def run_attention(q, rows, start, t, parents=None, window=0, kc=None, vc=None):
    """ss_attention over KC/VC (or kc/vc: fp32 or bf16 caches [R, Hkv, C, D] of any shape; q: [B*T, H, D]):
    rows/start per row, t tokens per row, optional parents [B*T] and sliding window."""
    kc = KC if kc is None else kc
    vc = VC if vc is None else vc
    heads, (_, hkv, cap, d) = q.shape[1], kc.shape
    out = torch.empty_like(q)
    rows_t, start_t = torch.tensor(rows, dtype=torch.int64), torch.tensor(start, dtype=torch.int64)
    if parents is None:
        depth = torch.arange(t).repeat(len(rows))
        par_ptr = None
    else:
        par = torch.tensor(parents, dtype=torch.int64)
        depth = torch.zeros(len(parents), dtype=torch.int64)
        for i, p in enumerate(parents):
            depth[i] = depth[(i // t) * t + p] + 1 if p >= 0 else 0
        par_ptr = par.data_ptr()
    pos = (start_t.repeat_interleave(t) + depth).contiguous()
    offsets = torch.arange(len(rows) + 1, dtype=torch.int64) * t
    nt.library().ss_attention(q.data_ptr(), kc.data_ptr(), vc.data_ptr(), rows_t.data_ptr(), start_t.data_ptr(),
                              offsets.data_ptr(), pos.data_ptr(), par_ptr, len(rows), heads, hkv, cap, d, d ** -0.5,
                              window, out.data_ptr(), int(kc.dtype == torch.bfloat16))
    return out


def test_attention_matches_reference_and_is_invariant():
    q = torch.randn(2 * 9, H, D, generator=G)
    got = run_attention(q, [2, 0], [20, 41], 9)                      # chains: lengths 21..50
    keys = [list(range(s + t + 1)) for s in (20, 41) for t in range(9)]
    assert (got.double() - reference_attention(q, KC, VC, [2, 0], keys, H // HKV)).abs().max() < 1e-5
    # each query alone (one-token pass, batch of one) gives the same bits
    for i in range(18):
        alone = run_attention(q[i:i + 1].contiguous(), [[2, 0][i // 9]], [[20, 41][i // 9] + i % 9], 1)
        assert torch.equal(alone[0], got[i])


def test_tree_attention_sees_prefix_and_ancestors_only_bit_for_bit():
    """A tree of 7 tokens at an unaligned prefix (29 slots): each node's output equals the float64
    reference over (prefix + its path), and is bit-identical to its path fed as a chain."""
    parents = [-1, 0, 0, 1, 1, 2, 4]                 # 0: pending; 6's path is 0 -> 1 -> 4 -> 6
    q = torch.randn(7, H, D, generator=G)
    start = 29
    got = run_attention(q, [1], [start], 7, parents)
    paths = []
    for t in range(7):
        path = [t]
        while parents[path[0]] >= 0:
            path.insert(0, parents[path[0]])
        paths.append(path)
    keys = [list(range(start)) + [start + u for u in path] for path in paths]
    assert (got.double() - reference_attention(q, KC, VC, [1], keys, H // HKV)).abs().max() < 1e-5
    for t, path in enumerate(paths):
        # the same path laid out as a chain: copy its keys/values to consecutive slots of row 2
        KC[2, :, :start], VC[2, :, :start] = KC[1, :, :start], VC[1, :, :start]
        for i, u in enumerate(path):
            KC[2, :, start + i], VC[2, :, start + i] = KC[1, :, start + u], VC[1, :, start + u]
        chain = run_attention(q[path].contiguous(), [2], [start], len(path))
        assert torch.equal(chain[-1], got[t])


@pytest.mark.parametrize("window", [0, 7])
def test_bf16_cache_attention_is_the_fp32_kernel_over_its_values(window):
    """A bf16 cache gives, bit for bit, what the fp32 kernel gives over the same values widened:
    chains of 9 tokens in two rows (groups of several queries: keys and values widened once per
    group), each query alone (one query: widened as read), and a tree (a shared cached prefix, then
    each node's own path)."""
    kb, vb = KC.to(torch.bfloat16), VC.to(torch.bfloat16)
    kf, vf = kb.float(), vb.float()
    q = torch.randn(2 * 9, H, D, generator=G)
    got = run_attention(q, [2, 0], [20, 41], 9, window=window, kc=kb, vc=vb)
    assert torch.equal(got, run_attention(q, [2, 0], [20, 41], 9, window=window, kc=kf, vc=vf))
    for i in (0, 8, 13):
        one = q[i:i + 1].contiguous()
        args = ([[2, 0][i // 9]], [[20, 41][i // 9] + i % 9], 1)
        assert torch.equal(run_attention(one, *args, window=window, kc=kb, vc=vb)[0], got[i])
    parents, qt = [-1, 0, 0, 1, 1, 2, 4], torch.randn(7, H, D, generator=G)
    tree = run_attention(qt, [1], [29], 7, parents, window=window, kc=kb, vc=vb)
    assert torch.equal(tree, run_attention(qt, [1], [29], 7, parents, window=window, kc=kf, vc=vf))


def test_bf16_cache_writes_round_to_nearest_even():
    """ss_rope_cache into a bf16 cache writes exactly torch's rounding (to nearest, ties to even) of
    what it writes into an fp32 cache, keys (rotated) and values, at every token's slot; values at
    the bf16 halfway points included."""
    n, hq, hkv, d, cap = 5, 4, 2, 16, 16
    g = torch.Generator().manual_seed(11)
    qkv = torch.randn(n, (hq + 2 * hkv) * d, generator=g)
    qkv[0, hq * d:] = torch.tensor([1 + k * 2.0 ** -8 for k in range(2 * hkv * d)])      # ties, both ways
    cos, sin = torch.randn(64, d, generator=g), torch.randn(64, d, generator=g)
    rows, start = torch.tensor([1], dtype=torch.int64), torch.tensor([3], dtype=torch.int64)
    offsets, seq_of = torch.tensor([0, n], dtype=torch.int64), torch.zeros(n, dtype=torch.int64)
    pos = torch.arange(3, 3 + n, dtype=torch.int64)
    caches = {}
    for dtype in (torch.float32, torch.bfloat16):
        kc, vc = torch.zeros(2, hkv, cap, d, dtype=dtype), torch.zeros(2, hkv, cap, d, dtype=dtype)
        q_out = torch.empty(n, hq, d)
        nt.library().ss_rope_cache(qkv.data_ptr(), cos.data_ptr(), sin.data_ptr(), rows.data_ptr(), start.data_ptr(),
                                   offsets.data_ptr(), seq_of.data_ptr(), pos.data_ptr(), n, hq, hkv, cap, d, None,
                                   None, 1e-6, q_out.data_ptr(), kc.data_ptr(), vc.data_ptr(),
                                   int(dtype == torch.bfloat16))
        caches[dtype] = (kc, vc, q_out)
    (k32, v32, q32), (k16, v16, q16) = caches[torch.float32], caches[torch.bfloat16]
    assert torch.equal(q16, q32)
    assert torch.equal(k16.view(torch.int16), k32.to(torch.bfloat16).view(torch.int16))
    assert torch.equal(v16.view(torch.int16), v32.to(torch.bfloat16).view(torch.int16))
    assert torch.equal(v32[1, :, 3:3 + n].permute(1, 0, 2).reshape(n, -1), qkv[:, (hq + hkv) * d:])


@pytest.mark.parametrize("window", [1, 5, 13, 30])
def test_sliding_window_attention_sees_the_window_only_bit_for_bit(window):
    """A query at position p sees keys at positions p - window + 1 .. p (chains: slot = position; a
    tree's nodes sit at their depth): against the float64 reference over those keys, and each chain
    query alone gives the same bits as in the pass."""
    q = torch.randn(2 * 9, H, D, generator=G)
    got = run_attention(q, [2, 0], [20, 41], 9, window=window)
    keys = [list(range(max(0, s + t + 1 - window), s + t + 1)) for s in (20, 41) for t in range(9)]
    assert (got.double() - reference_attention(q, KC, VC, [2, 0], keys, H // HKV)).abs().max() < 1e-5
    for i in range(18):
        alone = run_attention(q[i:i + 1].contiguous(), [[2, 0][i // 9]], [[20, 41][i // 9] + i % 9], 1, window=window)
        assert torch.equal(alone[0], got[i])
    parents, start = [-1, 0, 0, 1, 1, 2, 4], 29
    qt = torch.randn(7, H, D, generator=G)
    tree = run_attention(qt, [1], [start], 7, parents, window=window)
    depth = [0] * 7
    for i, p in enumerate(parents):
        depth[i] = depth[p] + 1 if p >= 0 else 0
    tkeys = []
    for t in range(7):
        path = [t]
        while parents[path[0]] >= 0:
            path.insert(0, parents[path[0]])
        low = start + depth[t] - window + 1
        tkeys.append([x for x in range(start) if x >= low] + [start + u for u in path if start + depth[u] >= low])
    assert (tree.double() - reference_attention(qt, KC, VC, [1], tkeys, H // HKV)).abs().max() < 1e-5


@pytest.mark.parametrize("kv", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("d", [16, 24, 64])
def test_every_attention_path_gives_the_avx2_bits(kv, d):
    """The AVX-512 path against the AVX2 path, bit for bit: chains of 1..17 tokens in two rows (groups
    of 3..51 queries per kv head: whole quads, partial ones at each query's last keys, odd queries
    alone), with and without a sliding window, and a tree (a shared cached prefix, then each node's
    own path).  d = 24 is not a multiple of 16: every query runs alone there."""
    if not ATTENTION.runs("avx512"):
        pytest.skip("this CPU cannot run the avx512 attention path: its bits are not checked on this machine")
    g = torch.Generator().manual_seed(d)
    heads, hkv, cap = 6, 2, 96
    kc, vc = torch.randn(3, hkv, cap, d, generator=g).to(kv), torch.randn(3, hkv, cap, d, generator=g).to(kv)
    cases = [(torch.randn(2 * t, heads, d, generator=g), [2, 0], [20, 41], t, None, w)
             for t in (1, 2, 3, 5, 9, 17) for w in (0, 7)]
    cases.append((torch.randn(7, heads, d, generator=g), [1], [29], 7, [-1, 0, 0, 1, 1, 2, 4], 0))
    try:
        for q, rows, start, t, parents, window in cases:
            ATTENTION.set("avx2")
            want = run_attention(q, rows, start, t, parents, window, kc, vc)
            ATTENTION.set("avx512")
            assert torch.equal(run_attention(q, rows, start, t, parents, window, kc, vc), want), (t, window, parents)
    finally:
        ATTENTION.set(None)


def test_an_attention_path_is_chosen_and_named():
    assert ATTENTION.runs("avx2") and ATTENTION.current() in ATTENTION.names
    assert ATTENTION.set(None) == ATTENTION.current()
    if not ATTENTION.runs("avx512"):
        with pytest.raises(ValueError, match="cannot run the attention path 'avx512'"):
            ATTENTION.set("avx512")


@pytest.mark.slow        # it runs the (missing) compiler, and the library is rebuilt after it: subprocesses
def test_missing_compiler_is_a_clear_refusal(monkeypatch, tmp_path):
    from specserve.errors import SpecserveError
    from specserve.models import RuntimeOptions

    monkeypatch.setenv("SPECSERVE_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    nt.library.cache_clear()
    try:
        assert "does not run" in nt.unavailable_reason()
        with pytest.raises(SpecserveError, match="kernels=native is unavailable"):
            RuntimeOptions(kernels="native").resolve()
        assert RuntimeOptions().resolve().kernels == "fbgemm"       # auto falls back, stated in resolve
    finally:
        nt.library.cache_clear()


@pytest.mark.parametrize("fmt", [nt.Q4_0, nt.Q5_0])
def test_small_blocks_as_q8_0_keep_every_value(fmt):
    """GGUF K-quant mixes fuse Q5_0 q/k with a Q8_0 v: the Q8_0 copy dequantizes to the same bits, and
    the fused weight keeps its blocks (no fp32 fallback)."""
    w, ref = make_weight(fmt, 21, 96, seed=9)
    assert torch.equal(w.as_q8_0().dequantize(), ref)
    v, vref = make_weight(nt.Q8_0, 5, 96, seed=10)
    fused = nt.NativeWeight.cat([w, v])
    assert fused.fmt == nt.Q8_0 and torch.equal(fused.dequantize(), torch.cat([ref, vref]))


def test_forward_structures_and_parts_are_the_librarys():
    """abi.py's SsPass / SsLayer have the library's sizes and its parts are decoder.PARTS in order; a
    library that differs is refused at load, and a pass of another version or size before it runs."""
    from specserve.models.decoder import PARTS
    from specserve.models.native import abi

    lib = nt.library()
    got = (ctypes.c_int64 * 4)()
    lib.ss_forward_abi(got)
    assert tuple(got) == (nt.ABI_VERSION, ctypes.sizeof(abi.SsPass), ctypes.sizeof(abi.SsLayer), len(PARTS))
    assert abi.part_names(lib) == PARTS
    for field, value, why in (("version", nt.ABI_VERSION - 1, "version"), ("pass_size", 8, "sizes"),
                              ("layer_size", 8, "sizes")):
        p = abi.SsPass.new()
        setattr(p, field, value)
        with pytest.raises(RuntimeError, match=why):
            abi.run_pass(lib, p)


def test_a_library_of_other_parts_is_refused(monkeypatch):
    from specserve.models.native import abi

    monkeypatch.setattr(abi, "PARTS", tuple(reversed(abi.PARTS)))
    with pytest.raises(RuntimeError, match="times the parts"):
        abi.bind(nt.library(), "lib")
    monkeypatch.setattr(abi, "ABI_VERSION", abi.ABI_VERSION + 1)
    with pytest.raises(RuntimeError, match="stale"):
        abi.bind(nt.library(), "lib")


def test_the_abi_check_compares_every_field_by_name_and_offset():
    """The loaded library's structures agree with abi.py field by field; a mirror with two 8-byte
    fields swapped (same sizes, so a size check passes) or one field renamed is refused."""
    import ctypes

    from specserve.models.native import abi

    lib = nt.library()
    abi.check_fields(lib.ss_forward_field, 0, abi.SsPass, "lib")
    abi.check_fields(lib.ss_draft_layer_field, 1, abi.SsDraftPart, "lib")
    fields = list(abi.SsDraftPart._fields_)
    fields[0], fields[1] = fields[1], fields[0]                    # k and v: two pointers swapped
    swapped = type("Swapped", (ctypes.Structure,), {"_fields_": fields})
    assert ctypes.sizeof(swapped) == ctypes.sizeof(abi.SsDraftPart)
    with pytest.raises(RuntimeError, match=r"Swapped's fields .*\('k', 8\)"):
        abi.check_fields(lib.ss_draft_layer_field, 1, swapped, "lib")
    renamed = type("Renamed", (ctypes.Structure,), {"_fields_": [("kk", fields[1][1])] + fields[1:]})
    with pytest.raises(RuntimeError, match="Renamed's fields"):
        abi.check_fields(lib.ss_draft_layer_field, 1, renamed, "lib")
