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


# ---------------------------------------------------------------------------------------------- trees
from specserve.verify import greedy_tree_verify, reference_tree_verify, tree_rejection_verify_row  # noqa: E402


def random_tree(g: torch.Generator, n: int) -> list[int]:
    """Parents of a random n-node tree in topological order (-1: child of the pending token)."""
    return [int(torch.randint(-1, i, (1,), generator=g)) for i in range(n)]


@pytest.mark.parametrize("tokens,parents,argmax,expect,path", [
    # pending's children a=1, b=2; a's child 3; b's child 4.  argmax rows: pending, then each node
    ([1, 2, 3, 4], [-1, -1, 0, 1], [2, 0, 4, 0, 5], [2, 4, 5], [1, 3]),      # second branch, two deep
    ([1, 2, 3, 4], [-1, -1, 0, 1], [1, 3, 0, 5, 0], [1, 3, 5], [0, 2]),      # first branch, bonus from node 2
    ([1, 2, 3, 4], [-1, -1, 0, 1], [5, 3, 4, 0, 0], [5], []),               # no child matches: recovered only
    ([], [], [3], [3], []),                                                  # empty tree: plain step
    ([1, 1, 2], [-1, -1, 1], [1, 0, 2, 4], [1, 2, 4], [1, 2]),               # duplicate siblings: the longer path
    ([1, 2, 3], [-1, 0, 1], [1, 2, 3, 0], [1, 2, 3, 0], [0, 1, 2]),          # a chain: all accepted
])
def test_greedy_tree_hand_built(tokens, parents, argmax, expect, path):
    n = max(len(tokens), 1)
    logits = onehot_logits(argmax + [0] * (n + 1 - len(argmax)))[None]
    t = torch.tensor([tokens + [0] * (n - len(tokens))])
    par = torch.tensor([parents + [-1] * (n - len(parents))])
    res = greedy_tree_verify(t, par, torch.tensor([len(tokens)]), logits)
    assert res.row(0) == expect and res.accepted_nodes(0) == path
    assert reference_tree_verify(tokens, parents, logits[0, : len(tokens) + 1]) == expect


def test_fast_greedy_tree_matches_reference_and_chain():
    """300 random batches of random trees: the batched path equals the enumerating reference; on
    chains it equals greedy_verify."""
    g = torch.Generator().manual_seed(11)
    for trial in range(300):
        bsz, n = 3, int(torch.randint(0, 9, (1,), generator=g))
        logits = torch.randn(bsz, n + 1, V, generator=g)
        chain = trial % 3 == 0
        parents = torch.tensor([list(range(-1, n - 1)) if chain else random_tree(g, n) for _ in range(bsz)],
                               dtype=torch.long).view(bsz, n)
        num = torch.randint(0, n + 1, (bsz,), generator=g)
        # most nodes copy the argmax at their parent so that deep paths occur
        at_parent = logits.argmax(-1).gather(1, (parents + 1).clamp(min=0))
        tokens = torch.where(torch.rand(bsz, n, generator=g) < 0.6, at_parent, torch.randint(0, V, (bsz, n), generator=g))
        fast = greedy_tree_verify(tokens, parents, num, logits)
        for b in range(bsz):
            k = int(num[b])
            assert fast.row(b) == reference_tree_verify(tokens[b, :k].tolist(), parents[b, :k].tolist(),
                                                        logits[b, : k + 1])
        if chain:
            assert torch.equal(fast.tokens, greedy_verify(tokens, num, logits).tokens)


@pytest.mark.parametrize("with_q", [True, False])
def test_tree_rejection_on_chains_equals_chain_rejection(with_q):
    """200 random chains: the tree sampler computes exactly what rejection_verify does, bit for bit."""
    g = torch.Generator().manual_seed(99)
    for _ in range(200):
        k = int(torch.randint(0, 6, (1,), generator=g))
        p = torch.softmax(torch.randn(1, k + 1, V, generator=g) * 2, -1)
        q = torch.softmax(torch.randn(1, k, V, generator=g) * 2, -1) if with_q else None
        draft = (torch.multinomial(q[0], 1, generator=g).view(1, k) if with_q and k
                 else torch.randint(0, V, (1, k), generator=g))
        uniform, noise = torch.rand(1, k, generator=g), -torch.log(torch.rand(1, V, generator=g))
        chain = rejection_verify(draft, torch.tensor([k]), q, p, uniform, noise).row(0)
        path, tokens = tree_rejection_verify_row(draft[0].tolist(), list(range(-1, k - 1)),
                                                 q[0] if with_q else None, p[0], uniform[0], noise)
        assert tokens == chain and path == list(range(len(chain) - 1))


def test_tree_rejection_hand_built():
    """p nearly one-hot: a wrong first sibling is rejected, the right second sibling accepted, then
    its child is rejected and the recovered token is p's mode there, whatever the draws."""
    eps = 1e-9
    p = torch.full((4, V), eps)
    p[0, 2] = p[1, 0] = p[2, 5] = p[3, 0] = 1.0           # at pending: 2; at node 1 (token 2): 5
    p = p / p.sum(-1, keepdim=True)
    tokens, parents = [1, 2, 4], [-1, -1, 1]                # siblings 1, 2 under pending; 4 under node 1
    for seed in range(5):
        g = torch.Generator().manual_seed(seed)
        u = torch.rand(3, generator=g) * 0.999 + 1e-4
        path, out = tree_rejection_verify_row(tokens, parents, None, p, u, -torch.log(torch.rand(V, generator=g)))
        assert path == [1] and out == [2, 5]


def test_a_token_the_target_excludes_is_never_accepted_even_at_u_zero():
    """u = 0 (torch.rand can return it) with p(x) = 0: the strict test u q(x) < p(x) rejects x, in
    the batched path, the reference and the tree row; p(x) > 0 at u = 0 is accepted."""
    p = torch.tensor([[[0.5, 0.5, 0, 0, 0, 0], [0.5, 0.5, 0, 0, 0, 0]]])          # [1, 2, V]
    q = torch.tensor([[[0.25, 0.25, 0.5, 0, 0, 0]]])                               # [1, 1, V]
    u, noise = torch.zeros(1, 1), torch.ones(1, V)
    for x, accepted in [(2, 0), (1, 1)]:
        res = rejection_verify(torch.tensor([[x]]), torch.tensor([1]), q, p, u, noise)
        assert int(res.num_accepted[0]) == accepted and res.row(0)[0] in (0, 1)
        ref = reference_verify([x], q[0], p[0], None, u[0], noise[0])
        assert ref == res.row(0)
        for probs in (q[0], None):
            path, out = tree_rejection_verify_row([x], [-1], probs, p[0], u[0], noise[0])
            assert len(path) == accepted and out[0] in (0, 1)


def test_a_sampled_row_verifies_the_same_alone_and_beside_rows_that_carry_q():
    """verify_rows: a one-hot (deterministic) chain's outcome does not depend on being batched with
    a row that carries q (its q is then one-hot, never zero); 20 seeds, logits fixed."""
    from specserve.sampling import SamplingParams
    from specserve.verify.rows import Row, verify_rows

    logits = torch.randn(8, V, generator=torch.Generator().manual_seed(3))           # [M, V]
    q = torch.softmax(torch.randn(3, V, generator=torch.Generator().manual_seed(4)), -1)
    sampling = SamplingParams(1.0)
    differs = 0
    for seed in range(20):
        def rows(with_q: bool) -> list[Row]:
            one_hot = Row([1, 2, 3], None, None, 0, sampling, torch.Generator().manual_seed(seed))
            drawn = Row([0, 4, 5], None, q, 4, sampling, torch.Generator().manual_seed(seed + 100))
            return [one_hot, drawn] if with_q else [one_hot]
        alone, batched = verify_rows(rows(False), logits), verify_rows(rows(True), logits)
        assert (alone[0].path, alone[0].tokens) == (batched[0].path, batched[0].tokens)
        differs += len(alone[0].path) < 3
    assert differs >= 5                     # the one-hot row is rejected often: the check can tell
