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
