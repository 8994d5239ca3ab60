"""Verification of drafted tokens: pure functions over tensors.

Terms (used everywhere in specserve):

* **drafted tokens** ``x_1..x_k``: what the drafter proposed for one sequence in one step.
* **p** is always the **target** model's processed distribution (after temperature/top-k/top-p);
  **q** is always the **drafter's** processed distribution.  A drafter that gives no q (n-gram,
  oracle) is treated as one-hot on its token.
* **accepted tokens**: the longest prefix of drafted tokens that passes verification.
* **recovered token**: when drafted token ``x_{n+1}`` is rejected, the replacement sampled from
  ``normalise(max(0, p_{n+1} - q_{n+1}))`` (greedy: the target's argmax).
* **bonus token**: when all k drafted tokens are accepted, one more token sampled from ``p_{k+1}``.

Each step thus emits ``num_accepted + 1`` tokens.  Acceptance follows Leviathan, Kalman and Matias,
"Fast Inference from Transformers via Speculative Decoding" (ICML 2023), Algorithm 1, and Chen et
al., "Accelerating Large Language Model Decoding with Speculative Sampling" (2023): accept ``x``
with probability ``min(1, p(x) / q(x))``.  The output is then distributed exactly as p.

Outputs are fixed-shape: ``tokens`` is ``[B, K+1]`` padded with ``PLACEHOLDER``; row b holds its
accepted tokens followed by its recovered or bonus token.  Example (K=3)::

    drafted [[a, b, c], [d, e, PAD]]  num_draft [3, 2]   target argmax [[a, b, z, y], [w, v, u, t]]
    -> tokens [[a, b, z, -1], [w, -1, -1, -1]]   num_accepted [2, 0]

Randomness is passed in (``uniform`` for acceptance tests, ``noise`` for the exponential race), so
the batched fast path and the per-row reference can be checked bit for bit.

Drafted *trees* (several candidates per position) are verified by the functions after the "trees"
marker below, with the same terms: accepted tokens are then an accepted *path* of nodes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

PLACEHOLDER = -1


@dataclass
class VerifyResult:
    tokens: Tensor        # [B, K+1] int64: accepted tokens, then the recovered/bonus token, then PLACEHOLDER
    num_accepted: Tensor  # [B] int64

    def row(self, b: int) -> list[int]:
        """The tokens emitted for row b (num_accepted + 1 of them)."""
        return self.tokens[b, : int(self.num_accepted[b]) + 1].tolist()


def _valid(num_draft: Tensor, k: int) -> Tensor:
    return torch.arange(k, device=num_draft.device)[None, :] < num_draft[:, None]      # [B, K]


def _emit(draft: Tensor, num_accepted: Tensor, final: Tensor) -> Tensor:
    """Compose [B, K+1]: drafted tokens before num_accepted, the final token at it, PLACEHOLDER after."""
    bsz, k = draft.shape
    out = torch.cat([draft, draft.new_full((bsz, 1), PLACEHOLDER)], dim=1)
    pos = torch.arange(k + 1, device=draft.device)[None, :]
    out = out.masked_fill(pos > num_accepted[:, None], PLACEHOLDER)
    return out.scatter(1, num_accepted[:, None], final[:, None])


def greedy_verify(draft: Tensor, num_draft: Tensor, target_logits: Tensor) -> VerifyResult:
    """Accept while the drafted token equals the target's argmax.

    draft:         [B, K] int64 drafted tokens (entries at or past num_draft are ignored)
    num_draft:     [B] int64, 0 <= num_draft <= K
    target_logits: [B, K+1, V] target logits at the pending token and after each drafted token
    """
    return greedy_verify_argmax(draft, num_draft, target_logits.argmax(-1))


def greedy_verify_argmax(draft: Tensor, num_draft: Tensor, argmax: Tensor) -> VerifyResult:
    """``greedy_verify`` given the target's argmax tokens [B, K+1] instead of its logits."""
    k = draft.shape[1]
    match = (draft == argmax[:, :k]) & _valid(num_draft, k)                            # [B, K]
    num_accepted = match.long().cumprod(dim=1).sum(dim=1)                              # [B]
    final = argmax.gather(1, num_accepted[:, None]).squeeze(1)                         # [B]
    return VerifyResult(_emit(draft, num_accepted, final), num_accepted)


def rejection_verify(draft: Tensor, num_draft: Tensor, draft_probs: Tensor | None, target_probs: Tensor,
                     uniform: Tensor, noise: Tensor) -> VerifyResult:
    """Speculative sampling (rejection sampling) over a batch.

    draft:        [B, K] int64 drafted tokens
    num_draft:    [B] int64
    draft_probs:  [B, K, V] q, or None for one-hot drafts
    target_probs: [B, K+1, V] p
    uniform:      [B, K] U[0, 1) draws for the acceptance tests
    noise:        [B, V] Exp(1) draws for the one recovered-or-bonus token per row
    """
    bsz, k = draft.shape
    idx = draft.clamp(min=0)[..., None]                                                # [B, K, 1]
    p_x = target_probs[:, :k].gather(-1, idx).squeeze(-1)                              # [B, K]
    q_x = draft_probs.gather(-1, idx).squeeze(-1) if draft_probs is not None else torch.ones_like(p_x)
    accept = (uniform * q_x <= p_x) & _valid(num_draft, k)                             # u < p/q
    num_accepted = accept.long().cumprod(dim=1).sum(dim=1)                             # [B]
    rows = torch.arange(bsz, device=draft.device)
    p_final = target_probs[rows, num_accepted]                                         # [B, V]
    rejected = num_accepted < num_draft                                                # [B]
    at = num_accepted.clamp(max=max(k - 1, 0))
    if k == 0:
        dist = p_final
    else:
        if draft_probs is not None:
            q_final = draft_probs[rows, at]                                            # [B, V]
        else:
            q_final = torch.nn.functional.one_hot(draft[rows, at].clamp(min=0), p_final.shape[-1]).to(p_final.dtype)
        residual = (p_final - q_final).clamp_min(0)                                    # max(0, p - q)
        # p == q up to rounding leaves no residual mass; then p itself is the right distribution
        empty = residual.sum(-1, keepdim=True) <= 0
        residual = torch.where(empty, p_final, residual)
        dist = torch.where(rejected[:, None], residual, p_final)
    final = (dist / noise).argmax(-1)
    return VerifyResult(_emit(draft, num_accepted, final), num_accepted)


def reference_verify(draft: list[int], draft_probs: Tensor | None, target_probs: Tensor | None,
                     target_logits: Tensor | None, uniform: Tensor | None, noise: Tensor | None) -> list[int]:
    """Slow, obviously-correct verification of one sequence; the fast paths are tested against it.

    Greedy when ``target_logits`` ([k+1, V]) is given; otherwise rejection sampling with
    target_probs [k+1, V], draft_probs [k, V] or None, uniform [k], noise [V].
    Returns the emitted tokens (accepted, then recovered or bonus).
    """
    out: list[int] = []
    if target_logits is not None:
        for i, x in enumerate(draft):
            best = int(target_logits[i].argmax())
            if best != x:
                return out + [best]
            out.append(x)
        return out + [int(target_logits[len(draft)].argmax())]
    for i, x in enumerate(draft):
        p = target_probs[i]
        q = draft_probs[i] if draft_probs is not None else torch.nn.functional.one_hot(
            torch.tensor(x, device=p.device), p.shape[-1]).to(p.dtype)
        if bool(uniform[i] * q[x] <= p[x]):
            out.append(x)
            continue
        residual = (p - q).clamp_min(0)
        if bool(residual.sum() <= 0):
            residual = p
        return out + [int((residual / noise).argmax())]
    return out + [int((target_probs[len(draft)] / noise).argmax())]


# ---------------------------------------------------------------------------------------------- trees
#
# A drafted *tree* has N nodes in topological order: node i holds token ``tokens[i]`` and its parent
# ``parents[i]`` (-1: a child of the pending token; always < i).  A chain is parents -1, 0, 1, ...
# The target is scored at the pending token and at every node (``target_*[0]`` and ``[i + 1]``), so
# the target's distribution for a node's children is row ``parent + 1``.  Verification walks from
# the pending token down; the **accepted path** is the list of node indices it accepts, root to leaf,
# and the step emits their tokens followed by one recovered or bonus token, as for a chain.
#
# Greedy: the accepted path is the longest root-to-node path whose every node equals the target's
# argmax at its parent (among equally long ones, the one ending at the lowest node index).
#
# Sampling: multi-candidate speculative sampling by recursive rejection over siblings (SpecInfer,
# Miao et al., ASPLOS 2024, Algorithm 2 "multi-step speculative sampling"; the same recursion with
# drafts drawn without replacement is Jeon et al. 2024, "Recursive Speculative Decoding").  At a
# node with target distribution r (at first p), its children c_1, c_2, ... are tried in list order:
# c_j is accepted with probability min(1, r(c_j) / q_j(c_j)); on rejection r becomes
# normalise(max(0, r - q_j)) and the next child is tried; when every child is rejected the
# recovered token is drawn from r, and at a leaf the bonus token from p.  Here **q_j is the
# distribution node c_j was drawn from given everything drafted before it** (its ancestors and its
# earlier siblings): siblings drawn i.i.d. *with replacement* share one q; siblings drawn *without
# replacement* carry q renormalised over the tokens not yet drawn; a deterministic drafter's node
# (no q) is one-hot on its token.  The output is then distributed exactly as p (each stage is the
# single-draft lemma applied to r and q_j, whatever q_j is, as long as it is fixed before the
# stage's uniform draw is made).


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
    children: dict[int, list[int]] = {}
    for i, p in enumerate(parents):
        children.setdefault(p, []).append(i)
    path: list[int] = []
    node = -1
    while True:
        r = target_probs[node + 1]
        residual = None
        accepted = None
        for c in children.get(node, []):
            if residual is not None:                    # the previous sibling was rejected
                r = residual / residual.sum()
            x = tokens[c]
            q = draft_probs[c] if draft_probs is not None else None
            q_x = q[x] if q is not None else torch.ones((), dtype=r.dtype, device=r.device)
            if bool(uniform[c] * q_x <= r[x]):
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
