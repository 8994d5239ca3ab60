"""Verification: hand-built cases, the fast batched paths against the slow reference, determinism."""

import pytest
import torch

from specserve.verify import PLACEHOLDER, greedy_verify, reference_verify, rejection_verify

V = 6


def onehot_logits(tokens: list[int]) -> torch.Tensor:
    """Target logits [len, V] whose argmax is the given token at each position."""
    out = torch.zeros(len(tokens), V)
    out[torch.arange(len(tokens)), torch.tensor(tokens)] = 5.0
    return out


@pytest.mark.parametrize("draft,target,expect,n_acc", [
    ([1, 2, 3], [4, 2, 3, 5], [4], 0),             # first-position mismatch: recovered token only
    ([1, 2, 3], [1, 2, 3, 5], [1, 2, 3, 5], 3),    # all accepted: bonus token
    ([], [4], [4], 0),                             # empty draft: one plain decoding step
    ([1, 2, 3], [1, 2, 0, 5], [1, 2, 0], 2),       # mismatch in the middle
    ([1, 5, 3], [1, 5, 3, 0], [1, 5, 3, 0], 3),    # EOS (say 5) inside the draft is just a token here
])
def test_greedy_hand_built(draft, target, expect, n_acc):
    k = max(len(draft), 1)
    d = torch.tensor([draft + [0] * (k - len(draft))])
    logits = onehot_logits(target + [0] * (k + 1 - len(target)))[None]
    res = greedy_verify(d, torch.tensor([len(draft)]), logits)
    assert res.row(0) == expect
    assert int(res.num_accepted[0]) == n_acc
    assert res.tokens[0, n_acc + 1:].eq(PLACEHOLDER).all()
    assert reference_verify(draft, None, None, logits[0, : len(draft) + 1], None, None) == expect


def test_greedy_batch_rows_with_different_draft_lengths():
    draft = torch.tensor([[1, 2, 3], [2, 2, 0], [0, 0, 0]])
    num_draft = torch.tensor([3, 2, 0])
    logits = torch.stack([onehot_logits([1, 2, 4, 5]), onehot_logits([2, 2, 1, 3]), onehot_logits([3, 1, 1, 1])])
    res = greedy_verify(draft, num_draft, logits)
    assert [res.row(i) for i in range(3)] == [[1, 2, 4], [2, 2, 1], [3]]
    assert res.num_accepted.tolist() == [2, 2, 0]


def test_rejection_near_one_hot_cases():
    """p and q nearly one-hot: acceptance and recovery are forced, whatever the random draws."""
    eps = 1e-9
    p = torch.full((1, 3, V), eps)
    p[0, 0, 1] = p[0, 1, 4] = p[0, 2, 2] = 1.0
    p = p / p.sum(-1, keepdim=True)
    draft = torch.tensor([[1, 3]])                       # x1 = 1 matches p, x2 = 3 has p ~ 0
    for seed in range(5):
        g = torch.Generator().manual_seed(seed)
        uniform = torch.rand(1, 2, generator=g) * 0.999 + 1e-4
        noise = -torch.log(torch.rand(1, V, generator=g))
        res = rejection_verify(draft, torch.tensor([2]), None, p, uniform, noise)
        assert res.row(0) == [1, 4]                      # accepted 1, rejected 3, recovered 4


def test_rejection_disjoint_draft_never_accepts():
    p = torch.tensor([[[0.5, 0.5, 0, 0, 0, 0]] * 2])     # [1, 2, V]
    q = torch.tensor([[[0, 0, 0.5, 0.5, 0, 0]]])          # [1, 1, V]
    for seed in range(20):
        g = torch.Generator().manual_seed(seed)
        res = rejection_verify(torch.tensor([[2]]), torch.tensor([1]), q, p, torch.rand(1, 1, generator=g),
                               -torch.log(torch.rand(1, V, generator=g)))
        assert int(res.num_accepted[0]) == 0 and res.row(0)[0] in (0, 1)


@pytest.mark.parametrize("with_q", [True, False])
def test_fast_rejection_matches_reference(with_q):
    """200 random batches: the batched fast path equals the per-row reference bit for bit."""
    g = torch.Generator().manual_seed(1234)
    for _ in range(200):
        bsz, k = 3, int(torch.randint(1, 5, (1,), generator=g))
        p = torch.softmax(torch.randn(bsz, k + 1, V, generator=g) * 2, -1)
        q = torch.softmax(torch.randn(bsz, k, V, generator=g) * 2, -1) if with_q else None
        num_draft = torch.randint(0, k + 1, (bsz,), generator=g)
        if with_q:
            draft = torch.multinomial(q.view(-1, V), 1, generator=g).view(bsz, k)
        else:
            draft = torch.randint(0, V, (bsz, k), generator=g)
        uniform = torch.rand(bsz, k, generator=g)
        noise = -torch.log(torch.rand(bsz, V, generator=g))
        fast = rejection_verify(draft, num_draft, q, p, uniform, noise)
        for b in range(bsz):
            n = int(num_draft[b])
            ref = reference_verify(draft[b, :n].tolist(), q[b, :n] if with_q else None, p[b, : n + 1], None,
                                   uniform[b], noise[b])
            assert fast.row(b) == ref


def test_fast_greedy_matches_reference():
    g = torch.Generator().manual_seed(7)
    for _ in range(200):
        bsz, k = 4, int(torch.randint(0, 5, (1,), generator=g))
        logits = torch.randn(bsz, k + 1, V, generator=g)
        num_draft = torch.randint(0, k + 1, (bsz,), generator=g)
        # half of the drafts copy the argmax so that long accepted runs occur
        draft = torch.where(torch.rand(bsz, k, generator=g) < 0.7, logits[:, :k].argmax(-1),
                            torch.randint(0, V, (bsz, k), generator=g))
        fast = greedy_verify(draft, num_draft, logits)
        for b in range(bsz):
            n = int(num_draft[b])
            assert fast.row(b) == reference_verify(draft[b, :n].tolist(), None, None, logits[b, : n + 1], None, None)


def test_rejection_is_deterministic_given_draws():
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(2, 4, V, generator=g), -1)
    q = torch.softmax(torch.randn(2, 3, V, generator=g), -1)
    draft = torch.randint(0, V, (2, 3), generator=g)
    u, e = torch.rand(2, 3, generator=g), -torch.log(torch.rand(2, V, generator=g))
    a = rejection_verify(draft, torch.tensor([3, 2]), q, p, u, e)
    b = rejection_verify(draft, torch.tensor([3, 2]), q, p, u.clone(), e.clone())
    assert torch.equal(a.tokens, b.tokens)
