"""A learned drafter's EAGLE layer in one native call (``Decoder.draft_layer``, draft_layer.cpp) against
the drafter's op-by-op layer (the module's pieces over the same products), for both layouts: the
outputs, the keys and values written at each part's slots (and nothing else), the masks and causal
parts; the refusals of a call that does not fit its buffers or tables; the torch runtimes' None.

On fp32 activations the two differ only in the order their norms, RoPE and attention round (2e-5
relative); on int8 activations a product's input rows may round to neighbouring int8 codes, so the
bound is looser there (int8 quantisation of about 1/127 of a block's largest value)."""

import pytest
import torch

from conftest import tiny_head, tiny_model
from specserve.drafters import create
from specserve.drafters.eagle import _Seq
from specserve.models.draft_layer import DraftLayerSpec, DraftPart
from specserve.train.objectives import _unrolled_layer

SHAPE = dict(vocab=96, hidden_size=128, num_heads=4, num_kv_heads=2, head_dim=32, intermediate_size=256)
WIDE_GROUPS = dict(SHAPE, num_heads=6, num_kv_heads=1)      # six query heads a key: attended 4 + 2 at a time


@pytest.fixture(scope="module", params=[("native", SHAPE), ("native-int8", SHAPE), ("native", WIDE_GROUPS)],
                ids=["native", "native-int8", "native-6-heads-a-key"])
def target(request):
    kernels, shape = request.param
    return tiny_model(seed=61, layers=4, kernels=kernels, **shape)


def states(d, gen: torch.Generator) -> list[_Seq]:
    """Two sequences with 9 and 5 real entries already in their buffers (random keys and values)."""
    c = d.cfg
    out = []
    for n_real in (9, 5):
        s = _Seq(32, c.hidden_size, c.num_kv_heads, c.head_dim, None, c.num_layers)
        s.k.normal_(generator=gen)
        s.v.normal_(generator=gen)
        s.n_real = n_real
        out.append(s)
    return out


@torch.inference_mode()
def run(d, one_call: bool, seqs: list[_Seq], masks) -> tuple[torch.Tensor, list]:
    """One call over both sequences: 3 causal catch-up rows of the first after its real entries, and 4
    tree rows of the second at slots 7..10 under ``masks`` [4, 6]; returns (outputs, the buffers)."""
    gen = torch.Generator().manual_seed(5)
    g = torch.randn(7, d.cfg.hidden_size, generator=gen)
    tokens = torch.randint(0, 90, (7,), generator=gen)
    pos = torch.tensor([9, 10, 11, 6, 7, 7, 8])
    s0, s1 = [_copy(s) for s in seqs]
    parts = [(s0, 9, 3, None), (s1, 7, 4, masks)]
    d.rope.reserve(16)
    keep, d.layer = d.layer, d.layer if one_call else None
    try:
        out = d._entries(parts, g, tokens, pos)
    finally:
        d.layer = keep
    return out, [(s0.k, s0.v), (s1.k, s1.v)]


def _copy(s: _Seq) -> _Seq:
    t = _Seq(s.k.shape[1], s.g.shape[1], s.k.shape[2], s.k.shape[3], None, s.k.shape[0])
    t.k, t.v, t.n_real = s.k.clone(), s.v.clone(), s.n_real
    return t


@pytest.mark.parametrize("layout,depth", [("eagle", 1), ("eagle3", 1), ("eagle", 2), ("eagle3", 3)])
def test_one_call_is_the_op_by_op_layer(layout, depth, target):
    """Either layout, and heads of several layers (one call per layer, each over its own buffers)."""
    d = create("eagle", target, head=tiny_head(layout, target, head_layers=depth))
    assert d.layer is not None and len(d.layer) == depth
    gen = torch.Generator().manual_seed(3)
    seqs = states(d, gen)
    masks = torch.tensor([[1, 0, 1, 0, 0, 0], [1, 1, 0, 1, 0, 0], [1, 0, 0, 0, 1, 0], [0, 1, 1, 0, 0, 1]],
                         dtype=torch.bool)
    a, bufs_a = run(d, True, seqs, masks)
    b, bufs_b = run(d, False, seqs, masks)
    int8 = target.options.activations == "int8"
    tol = dict(rtol=3e-2, atol=3e-2 * float(b.abs().max())) if int8 else dict(rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(a, b, **tol)
    for (ka, va), (kb, vb), s, (at, m) in zip(bufs_a, bufs_b, seqs, [(9, 3), (7, 4)]):
        written = slice(at, at + m)
        torch.testing.assert_close(ka[:, written], kb[:, written], **tol)     # every layer's
        torch.testing.assert_close(va[:, written], vb[:, written], **tol)
        for buf, orig in ((ka, s.k), (va, s.v)):                    # no other slot is touched
            assert torch.equal(buf[:, :at], orig[:, :at]) and torch.equal(buf[:, at + m:], orig[:, at + m:])
            assert not torch.equal(buf[:, written], orig[:, written])
    # the masks are read: another mask, other outputs for the second sequence's rows alone
    own = torch.zeros(4, 6, dtype=torch.bool)
    own[range(4), range(2, 6)] = True                                # each row's own slot
    c, _ = run(d, True, seqs, ~masks | own)
    assert torch.equal(c[:3], a[:3]) and not torch.allclose(c[3:], a[3:])


def test_calls_that_do_not_fit_are_refused(target):
    d = create("eagle", target, head=tiny_head("eagle", target))
    c = d.cfg
    k = torch.zeros(8, c.num_kv_heads, c.head_dim)
    g = torch.zeros(2, c.hidden_size)
    d.rope.reserve(16)
    cos, sin = d.rope.cos, d.rope.sin

    def call(pos, parts):
        return d.layer[0](g, g, torch.tensor(pos), cos, sin, parts)

    assert call([0, 1], [DraftPart(k, k.clone(), 0, 2, 0, None)]).shape == (2, c.hidden_size)
    with pytest.raises(RuntimeError, match="rotary tables"):
        call([0, len(cos)], [DraftPart(k, k.clone(), 0, 2, 0, None)])
    with pytest.raises(RuntimeError, match="outside"):
        call([0, 1], [DraftPart(k, k.clone(), 7, 2, 0, None)])             # slots 7, 8 of 8
    with pytest.raises(RuntimeError, match="outside"):
        call([0, 1], [DraftPart(k, k.clone(), 3, 2, 2, torch.ones(2, 2, dtype=torch.bool))])   # needs 3 columns
    with pytest.raises(ValueError, match="cover 1 rows of 2"):
        call([0, 1], [DraftPart(k, k.clone(), 0, 1, 0, None)])
    with pytest.raises(ValueError, match="contiguous float32"):
        call([0, 1], [DraftPart(k.double(), k.clone(), 0, 2, 0, None)])
    with pytest.raises(ValueError, match="reads the entries' embeddings"):
        d.layer[0](g, None, torch.tensor([0, 1]), cos, sin, [DraftPart(k, k.clone(), 0, 2, 0, None)])


def test_a_deeper_heads_plain_layers_read_no_embedding(target):
    """The ``decoder`` layout (a deeper head's later layers) is x = g through a plain pre-norm layer:
    the same output whatever embedding is passed, and the module's own layer in torch."""
    d = create("eagle", target, head=tiny_head("eagle", target, head_layers=2))
    c = d.cfg
    d.rope.reserve(16)
    gen = torch.Generator().manual_seed(7)
    g, e = torch.randn(3, c.hidden_size, generator=gen), torch.randn(3, c.hidden_size, generator=gen)
    pos = torch.tensor([0, 1, 2])

    def call(emb):
        k = torch.zeros(8, c.num_kv_heads, c.head_dim)
        return d.layer[1](g, emb, pos, d.rope.cos, d.rope.sin, [DraftPart(k, k.clone(), 0, 3, 0, None)])

    a = call(None)
    assert torch.equal(a, call(e))
    with torch.no_grad():
        want = _unrolled_layer(d.head.extra[0], g[None], pos[None], 0, [], [])[0]
    int8 = target.options.activations == "int8"
    tol = dict(rtol=3e-2, atol=3e-2 * float(want.abs().max())) if int8 else dict(rtol=2e-4, atol=2e-4)
    torch.testing.assert_close(a, want, **tol)


def test_specs_are_checked_and_torch_runs_the_layer_op_by_op():
    t = tiny_model(seed=62, layers=4, kernels="torch", **SHAPE)
    d = create("eagle", t, head=tiny_head("eagle", t))
    assert d.layer is None                                          # the torch runtime has no one-call layer
    w = {"norm_e": torch.ones(8)}
    with pytest.raises(ValueError, match="unknown draft layer layout"):
        DraftLayerSpec("medusa", 8, 1, 1, 8, 8, 1e-5, w)
    with pytest.raises(ValueError, match="needs the weights norm_g, qkv"):
        DraftLayerSpec("eagle3", 8, 1, 1, 8, 8, 1e-5, w)
    with pytest.raises(ValueError, match="needs the weights attn_norm, qkv"):
        DraftLayerSpec("decoder", 8, 1, 1, 8, 8, 1e-5, w)
