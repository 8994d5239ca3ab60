"""Verification of drafted chains: pure functions over tensors.

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
with probability ``min(1, p(x) / q(x))``.  The output is then distributed exactly as p.  With
``u`` drawn from U[0, 1), the test is ``u * q(x) < p(x)``: strict, so a token that p gives no mass
(outside top-k or top-p, or masked by a grammar) is never accepted, not even at ``u = 0``.

Outputs are fixed-shape: ``tokens`` is ``[B, K+1]`` padded with ``PLACEHOLDER``; row b holds its
accepted tokens followed by its recovered or bonus token.  Example (K=3)::

    drafted [[a, b, c], [d, e, PAD]]  num_draft [3, 2]   target argmax [[a, b, z, y], [w, v, u, t]]
    -> tokens [[a, b, z, -1], [w, -1, -1, -1]]   num_accepted [2, 0]

Randomness is passed in (``uniform`` for acceptance tests, ``noise`` for the exponential race), so
the batched fast path and the per-row reference can be checked bit for bit.

Drafted *trees* (several candidates per position) are verified by ``specserve.verify.tree``, with
the same terms: accepted tokens are then an accepted *path* of nodes.
"""

from __future__ import annotations

from dataclasses import dataclass

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
    accept = (uniform * q_x < p_x) & _valid(num_draft, k)                              # u < p/q
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
        if bool(uniform[i] * q[x] < p[x]):
            out.append(x)
            continue
        residual = (p - q).clamp_min(0)
        if bool(residual.sum() <= 0):
            residual = p
        return out + [int((residual / noise).argmax())]
    return out + [int((target_probs[len(draft)] / noise).argmax())]
