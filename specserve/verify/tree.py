"""Verification of drafted trees: pure functions over tensors (terms as in ``specserve.verify.chain``).

A drafted *tree* has N nodes in topological order: node i holds token ``tokens[i]`` and its parent
``parents[i]`` (-1: a child of the pending token; always < i).  A chain is parents -1, 0, 1, ...
The target is scored at the pending token and at every node (``target_*[0]`` and ``[i + 1]``), so
the target's distribution for a node's children is row ``parent + 1``.  Verification walks from
the pending token down; the **accepted path** is the list of node indices it accepts, root to leaf,
and the step emits their tokens followed by one recovered or bonus token, as for a chain.

Greedy: the accepted path is the longest root-to-node path whose every node equals the target's
argmax at its parent (among equally long ones, the one ending at the lowest node index).

Sampling: multi-candidate speculative sampling by recursive rejection over siblings (SpecInfer,
Miao et al., ASPLOS 2024, Algorithm 2 "multi-step speculative sampling"; the same recursion with
drafts drawn without replacement is Jeon et al. 2024, "Recursive Speculative Decoding").  At a
node with target distribution r (at first p), its children c_1, c_2, ... are tried in list order:
c_j is accepted with probability min(1, r(c_j) / q_j(c_j)); on rejection r becomes
normalise(max(0, r - q_j)) and the next child is tried; when every child is rejected the
recovered token is drawn from r, and at a leaf the bonus token from p.  Here **q_j is the
distribution node c_j was drawn from given everything drafted before it** (its ancestors and its
earlier siblings): siblings drawn i.i.d. *with replacement* share one q; siblings drawn *without
replacement* carry q renormalised over the tokens not yet drawn; a deterministic drafter's node
(no q) is one-hot on its token.  The output is then distributed exactly as p (each stage is the
single-draft lemma applied to r and q_j, whatever q_j is, as long as it is fixed before the
stage's uniform draw is made).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from specserve.trees import children_of
from specserve.verify.chain import PLACEHOLDER


@dataclass
class TreeVerifyResult:
    tokens: Tensor        # [B, N+1] int64: accepted path's tokens, then the recovered/bonus token, then PLACEHOLDER
    path: Tensor          # [B, N] int64: accepted node indices root to leaf, then PLACEHOLDER
    num_accepted: Tensor  # [B] int64

    def row(self, b: int) -> list[int]:
        """The tokens emitted for row b (num_accepted + 1 of them)."""
        return self.tokens[b, : int(self.num_accepted[b]) + 1].tolist()

    def accepted_nodes(self, b: int) -> list[int]:
        return self.path[b, : int(self.num_accepted[b])].tolist()


def greedy_tree_verify(tokens: Tensor, parents: Tensor, num_nodes: Tensor, target_logits: Tensor) -> TreeVerifyResult:
    """Accept the longest path of nodes that each equal the target's argmax at their parent.

    tokens:        [B, N] int64 drafted node tokens (entries at or past num_nodes are ignored)
    parents:       [B, N] int64 parent node index, -1 for children of the pending token
    num_nodes:     [B] int64
    target_logits: [B, N+1, V] at the pending token (0) and at each node (i + 1)

    Example: tokens [a, b, c], parents [-1, -1, 1], argmax at pending/a/b/c = [b, x, c, y]
    -> path [1, 2], tokens [b, c, y].  The walk over nodes is small index work: numpy on the host.
    """
    return greedy_tree_verify_argmax(tokens, parents, num_nodes, target_logits.argmax(-1))


def greedy_tree_verify_argmax(tokens: Tensor, parents: Tensor, num_nodes: Tensor, argmax: Tensor) -> TreeVerifyResult:
    """``greedy_tree_verify`` given the target's argmax tokens [B, N+1] instead of its logits."""
    bsz, n = tokens.shape
    dev = tokens.device
    argmax = argmax.cpu().numpy()                                                      # [B, N+1]
    tok, par, num = tokens.cpu().numpy(), parents.cpu().numpy(), num_nodes.cpu().numpy()
    rows = np.arange(bsz)
    ok = np.zeros((bsz, n), dtype=bool)
    depth = np.zeros((bsz, n), dtype=np.int64)
    for i in range(n):                                  # topological order: a parent is done first
        p = par[:, i]
        up = np.maximum(p, 0)
        valid = i < num
        ok[:, i] = valid & np.where(p >= 0, ok[rows, up], True) & (tok[:, i] == argmax[rows, p + 1])
        depth[:, i] = np.where(valid, np.where(p >= 0, depth[rows, up], 0) + 1, 0)
    score = np.where(ok, depth, 0)                                                     # [B, N]
    best = score.argmax(1) if n else np.zeros(bsz, dtype=np.int64)                     # first of the deepest
    num_accepted = score[rows, best] if n else np.zeros(bsz, dtype=np.int64)
    path = np.full((bsz, n), PLACEHOLDER, dtype=np.int64)
    node = best.copy()
    for d in range(int(num_accepted.max()) if n else 0, 0, -1):                        # walk up from the leaf
        here = num_accepted >= d
        path[here, d - 1] = node[here]
        node = np.where(here, par[rows, np.maximum(node, 0)], node)
    final = argmax[rows, np.where(num_accepted > 0, best + 1, 0)]
    out = np.full((bsz, n + 1), PLACEHOLDER, dtype=np.int64)
    out[:, :n] = np.where(path >= 0, np.take_along_axis(tok, np.maximum(path, 0), 1), PLACEHOLDER)
    out[rows, num_accepted] = final

    def t(a: np.ndarray) -> Tensor:
        return torch.from_numpy(a).to(dev)
    return TreeVerifyResult(t(out), t(path), t(num_accepted))


def tree_rejection_verify_row(tokens: list[int], parents: list[int], draft_probs: Tensor | None,
                              target_probs: Tensor, uniform: Tensor, noise: Tensor) -> tuple[list[int], list[int]]:
    """Recursive rejection sampling over one drafted tree (see the section comment above).

    tokens, parents: N nodes;  draft_probs: [N, V] q per node, or None for one-hot nodes;
    target_probs: [N+1, V] p at the pending token and at each node;  uniform: [N] U[0, 1), node i's
    acceptance draw;  noise: [V] Exp(1) for the one recovered or bonus token.
    Returns (accepted node indices root to leaf, emitted tokens).  On a chain this computes exactly
    what ``rejection_verify`` does for that row, bit for bit.
    """
    kids = children_of(parents)
    path: list[int] = []
    node = -1
    while True:
        r = target_probs[node + 1]
        residual = None
        accepted = None
        for c in kids[node + 1]:
            if residual is not None:                    # the previous sibling was rejected
                r = residual / residual.sum()
            x = tokens[c]
            q = draft_probs[c] if draft_probs is not None else None
            q_x = q[x] if q is not None else torch.ones((), dtype=r.dtype, device=r.device)
            if bool(uniform[c] * q_x < r[x]):
                accepted = c
                break
            q = q if q is not None else torch.nn.functional.one_hot(torch.tensor(x, device=r.device),
                                                                    r.shape[-1]).to(r.dtype)
            residual = (r - q).clamp_min(0)             # max(0, r - q)
            if bool(residual.sum() <= 0):               # r == q up to rounding: r itself is right
                residual = r
        if accepted is None:
            dist = residual if residual is not None else r
            final = int((dist / noise).argmax())
            return path, [tokens[i] for i in path] + [final]
        path.append(accepted)
        node = accepted


def reference_tree_verify(tokens: list[int], parents: list[int], target_logits: Tensor) -> list[int]:
    """Slow greedy reference: enumerate every root-to-node path, keep the longest that matches the
    target's argmax at every step (lowest end index among equals).  target_logits: [N+1, V]."""
    best: list[int] = []
    for end in range(len(tokens)):
        path = [end]
        while parents[path[0]] >= 0:
            path.insert(0, parents[path[0]])
        if all(tokens[i] == int(target_logits[parents[i] + 1].argmax()) for i in path) and len(path) > len(best):
            best = path
    final = int(target_logits[best[-1] + 1 if best else 0].argmax())
    return [tokens[i] for i in best] + [final]
