"""Native CPU kernels: exact dequantization, accuracy against float64 references, and the property
the runtime is built on: every output row is bit-identical however many rows share the call."""

import gguf
import numpy as np
import pytest
import torch
from gguf import quants

from specserve.models import native as nt

# Only a CPU without the instructions excuses these tests; a failing build fails them.
pytestmark = pytest.mark.skipif(not set(nt.REQUIRED_CPU_FLAGS) <= nt._cpu_flags(),
                                reason="this CPU lacks AVX2/FMA/F16C")

GGUF_TYPES = {nt.Q4_1: gguf.GGMLQuantizationType.Q4_1, nt.Q8_0: gguf.GGMLQuantizationType.Q8_0}


def make_weight(fmt: int, n: int, k: int, seed: int = 0) -> tuple[nt.NativeWeight, torch.Tensor]:
    """A random weight in ``fmt`` and its reference fp32 values (gguf's own dequantizer for blocks)."""
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.1
    if fmt in GGUF_TYPES:
        blocks = quants.quantize(w.numpy(), GGUF_TYPES[fmt])
        ref = torch.from_numpy(np.array(quants.dequantize(blocks, GGUF_TYPES[fmt]), dtype=np.float32))
        return nt.NativeWeight(torch.from_numpy(blocks), fmt, (n, k)), ref
    nw = nt.NativeWeight.from_float(w, fmt)
    return nw, (w.half().float() if fmt == nt.F16 else w)


@pytest.mark.parametrize("fmt", [nt.F32, nt.F16, nt.Q8_0, nt.Q4_1])
def test_dequantization_is_exact(fmt):
    w, ref = make_weight(fmt, 37, 96)
    assert torch.equal(w.dequantize(), ref)


@pytest.mark.parametrize("fmt", [nt.F32, nt.F16, nt.Q8_0, nt.Q4_1])
def test_linear_matches_float64_reference(fmt):
    w, ref = make_weight(fmt, 75, 128, seed=1)          # 75 rows: exercises the row tails
    x = torch.randn(13, 128, generator=torch.Generator().manual_seed(2))
    bias = torch.randn(75, generator=torch.Generator().manual_seed(3))
    expect = x.double() @ ref.double().T + bias.double()
    got = nt.linear(x, w, bias)
    assert (got.double() - expect).abs().max().item() < 1e-4
    # accumulate: out += x W^T + b
    base = torch.randn(13, 75, generator=torch.Generator().manual_seed(4))
    acc = nt.linear(x, w, bias, out=base.clone(), accumulate=True)
    assert (acc.double() - (expect + base.double())).abs().max().item() < 1e-4


@pytest.mark.parametrize("fmt", [nt.F32, nt.Q8_0, nt.Q4_1])
def test_linear_rows_are_invariant_to_row_count(fmt):
    """Row r of x W^T has the same bits computed alone, in any group of 2..20 rows, at any offset."""
    w, _ = make_weight(fmt, 130, 256, seed=5)
    x = torch.randn(20, 256, generator=torch.Generator().manual_seed(6))
    alone = torch.cat([nt.linear(x[i:i + 1].contiguous(), w) for i in range(20)])
    for m in range(2, 21):
        for lo in (0, 20 - m):
            assert torch.equal(nt.linear(x[lo:lo + m].contiguous(), w), alone[lo:lo + m])


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


def reference_attention(q, kc, vc, rows, pos, groups):
    """float64 softmax attention. q: [B*T, H, D]; kc, vc: [R, Hkv, C, D]; pos: [B*T]."""
    bt, h, d = q.shape
    t = bt // len(rows)
    out = torch.empty(bt, h, d, dtype=torch.float64)
    for i in range(bt):
        r, p = rows[i // t], int(pos[i])
        for head in range(h):
            k = kc[r, head // groups, : p + 1].double()
            v = vc[r, head // groups, : p + 1].double()
            s = (k @ q[i, head].double()) * d ** -0.5
            out[i, head] = torch.softmax(s, 0) @ v
    return out


def test_attention_matches_reference_and_is_invariant():
    lib = nt.library()
    g = torch.Generator().manual_seed(7)
    rows_n, hkv, cap, d, h = 3, 2, 64, 16, 6
    kc = torch.randn(rows_n, hkv, cap, d, generator=g)
    vc = torch.randn(rows_n, hkv, cap, d, generator=g)

    def run(q, rows, pos, t):
        out = torch.empty_like(q)
        rows_t, pos_t = torch.tensor(rows, dtype=torch.int64), pos.to(torch.int64).contiguous()
        lib.ss_attention(q.data_ptr(), kc.data_ptr(), vc.data_ptr(), rows_t.data_ptr(), pos_t.data_ptr(),
                         len(rows), t, h, hkv, cap, d, d ** -0.5, out.data_ptr())
        return out

    q = torch.randn(2 * 9, h, d, generator=g)
    pos = torch.tensor([list(range(20, 29)), list(range(41, 50))]).reshape(-1)   # lengths 21..50
    got = run(q, [2, 0], pos, 9)
    assert (got.double() - reference_attention(q, kc, vc, [2, 0], pos, h // hkv)).abs().max() < 1e-5
    # each query alone (one-token pass, batch of one) gives the same bits
    for i in range(18):
        alone = run(q[i:i + 1].contiguous(), [[2, 0][i // 9]], pos[i:i + 1], 1)
        assert torch.equal(alone[0], got[i])


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
