"""The logits-row kernels (``specserve.models.rowops``): the native argmax and grammar mask against
torch's argmax, xgrammar's kernel and the unpacked reference, on hand-built and random rows."""

import pytest
import torch

from specserve.constrain.grammar import allowed
from specserve.models import rowops

native = pytest.mark.skipif(not rowops.native(), reason="the native kernels do not build on this machine")


@native
def test_native_argmax_is_torchs_first_maximum():
    """Ties (small integers), rows of every length around the 32-wide rounds, all -inf rows, NaN
    (torch ranks it first) and a maximum in the scalar tail; rows strided inside a larger pass."""
    from specserve.models.native import argmax_rows
    g = torch.Generator().manual_seed(0)
    for n in (1, 7, 8, 9, 31, 32, 33, 63, 64, 65, 1000, 49152, 49155):
        for case in range(8):
            x = torch.randint(-3, 3, (5, n), generator=g).float()
            if case == 1:
                x[:] = float("-inf")
            if case == 2:
                x[2, n // 2] = float("nan")
                x[3, -1] = float("nan")
            if case == 3:
                x[:, -1] = 100.0
            if case == 4:
                x[1, :] = float("-inf")
                x[1, n - 1] = -1e30
            assert torch.equal(argmax_rows(x), x.argmax(-1)), (n, case)
    wide = torch.randn(9, 300, generator=g)
    assert torch.equal(argmax_rows(wide[2:7, :257]), wide[2:7, :257].argmax(-1))
    with pytest.raises(ValueError):
        argmax_rows(wide.t())


@native
def test_native_mask_equals_xgrammars_kernel_and_the_reference():
    """Random masks with words all set, all clear and mixed, vocabularies not a multiple of 32."""
    import xgrammar as xgr
    from specserve.models.native import mask_rows
    g = torch.Generator().manual_seed(1)
    for rows, vocab in ((1, 70), (3, 95), (7, 49152), (2, 49155)):
        words = (vocab + 31) // 32
        bm = torch.randint(-2**31, 2**31 - 1, (rows, words), dtype=torch.int32, generator=g)
        bm[:, ::3] = 0
        bm[:, 1::5] = -1
        logits = torch.randn(rows, vocab, generator=g)
        ours, theirs = logits.clone(), logits.clone()
        mask_rows(ours, bm)
        xgr.apply_token_bitmask_inplace(theirs, bm)
        assert torch.equal(ours, logits.masked_fill(~allowed(bm, vocab), float("-inf")))
        assert torch.equal(ours, theirs)


def test_dispatch_falls_back_to_torch_where_the_kernel_does_not_apply():
    """float64 rows (no native kernel) get torch's argmax and the same mask."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(4, 100, generator=g, dtype=torch.float64)
    assert torch.equal(rowops.argmax(x), x.argmax(-1))
    bm = torch.randint(-2**31, 2**31 - 1, (4, 4), dtype=torch.int32, generator=g)
    y = x.float().clone()
    rowops.mask(y, bm)
    assert torch.equal(y, x.float().masked_fill(~allowed(bm, 100), float("-inf")))


def _random_tree(g: torch.Generator, n: int, vocab: int, chain: bool) -> tuple[list[int], list[int]]:
    """n node tokens from a small vocabulary (so siblings repeat and paths tie) and parents."""
    tokens = torch.randint(0, vocab, (n,), generator=g).tolist()
    parents = [i - 1 if chain else int(torch.randint(-1, i, (1,), generator=g)) for i in range(n)]
    return tokens, parents


@native
def test_native_greedy_walk_equals_the_tensor_reference():
    """300 random passes of 1-6 rows, chains and trees of 0-12 nodes over a 5-token vocabulary
    (ties among siblings and among the deepest paths are common), logits rows of small integers
    (ties inside a row), rows strided inside a wider pass: the native walk's paths and emitted
    tokens equal ``greedy_tree_verify_argmax`` / ``greedy_verify_argmax`` on torch's argmax."""
    from specserve.models.native import greedy_walk_rows
    from specserve.sampling import SamplingParams
    from specserve.verify.rows import Row, verify_rows
    g = torch.Generator().manual_seed(3)
    for case in range(300):
        chain = case % 3 == 0
        b = int(torch.randint(1, 7, (1,), generator=g))
        shapes = [_random_tree(g, int(torch.randint(0, 13, (1,), generator=g)), 5, chain) for _ in range(b)]
        offsets = [0]
        for t, _ in shapes[:-1]:
            offsets.append(offsets[-1] + len(t) + 1 + int(torch.randint(0, 2, (1,), generator=g)))
        m = offsets[-1] + len(shapes[-1][0]) + 1
        wide = torch.randint(0, 3, (m, 9), generator=g).float()
        logits = wide[:, :5]
        rows = [Row(t, None if chain else p, None, o, SamplingParams(), None) for (t, p), o in zip(shapes, offsets)]
        reference = verify_rows(rows, logits)
        walked = greedy_walk_rows(logits, offsets, [t for t, _ in shapes], None if chain else [p for _, p in shapes])
        assert [(o.path, o.tokens[-1]) for o in reference] == walked, case
        assert verify_rows(rows, logits, walk_of=greedy_walk_rows) == reference, case


@native
def test_native_greedy_walk_hand_built():
    """Pending row argmax 2; nodes 0 (token 2, root) and 1 (token 2, root) tie: node 0's subtree is
    deeper (node 2 under it matches row 1's argmax 4), so the path is [0, 2] and the emitted token is
    node 2's row's argmax (1).  A plain row (no nodes) emits its argmax; a rejected chain emits the
    pending row's; an accepted one the argmax after its last node."""
    from specserve.models.native import greedy_walk_rows
    rows = torch.full((8, 6), -1.0)
    for r, best in enumerate([2, 4, 0, 1, 3, 5, 0, 3]):
        rows[r, best] = 1.0
    got = greedy_walk_rows(rows, [0, 4, 5], [[2, 2, 4], [], [1, 1]], [[-1, -1, 0], [], [-1, 0]])
    assert got == [([0, 2], 1), ([], 3), ([], 5)]
    assert greedy_walk_rows(rows, [6], [[0]], None) == [([0], 3)]
    with pytest.raises(ValueError):
        greedy_walk_rows(rows, [6], [[0, 3]], None)             # rows 6..8: past the pass
