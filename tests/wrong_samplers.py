"""Known-wrong speculative samplers, for showing that the distribution tests have power.

Each is a drop-in for ``rejection_verify`` (chains) or ``tree_rejection_verify_row`` (trees), with
the same randomness in the same order; ``wrong_verifier`` puts a pair of them into the engine's
verification (``specserve.verify.rows``) for the length of a ``with`` block.

* ``residual_is_p``: accepts drafted x with probability min(1, p(x) / q(x)) as it should, but on
  rejection draws from p instead of normalise(max(0, p - q)) (trees: the next sibling is tried
  against the same p, and the recovered token drawn from it).  A chain's output is then
  min(p, q) + (1 - sum min(p, q)) p instead of p: too much of what the drafter likes.  The classic
  mistake, and a quiet one: the closer q is to p (few rejections) or the farther (the residual is
  nearly p), the smaller its effect.
* ``always_accept``: every drafted token is accepted (the output follows q, not p).
"""

from __future__ import annotations

import contextlib

import torch
from torch import Tensor

import specserve.verify.rows as verify_rows
from specserve.trees import children_of
from specserve.verify.chain import VerifyResult, rejection_verify
from specserve.verify.tree import tree_rejection_verify_row


def chain_residual_is_p(draft: Tensor, num_draft: Tensor, draft_probs: Tensor | None, target_probs: Tensor,
                        uniform: Tensor, noise: Tensor) -> VerifyResult:
    """``rejection_verify`` whose recovered token is drawn from p, not from the residual."""
    res = rejection_verify(draft, num_draft, draft_probs, target_probs, uniform, noise)
    rows = torch.arange(draft.shape[0], device=draft.device)
    final = (target_probs[rows, res.num_accepted] / noise).argmax(-1)          # p where the walk stopped
    tokens = res.tokens.clone()
    tokens[rows, res.num_accepted] = final
    return VerifyResult(tokens, res.num_accepted)


def tree_residual_is_p(tokens: list[int], parents: list[int], draft_probs: Tensor | None, target_probs: Tensor,
                       uniform: Tensor, noise: Tensor) -> tuple[list[int], list[int]]:
    """``tree_rejection_verify_row`` that never moves to the residual: every sibling is tried
    against p at its parent, and the recovered token drawn from that p."""
    kids = children_of(parents)
    path: list[int] = []
    node = -1
    while True:
        r = target_probs[node + 1]
        accepted = None
        for c in kids[node + 1]:
            x = tokens[c]
            q_x = draft_probs[c, x] if draft_probs is not None else 1.0
            if bool(uniform[c] * q_x < r[x]):
                accepted = c
                break
        if accepted is None:
            return path, [tokens[i] for i in path] + [int((r / noise).argmax())]
        path.append(accepted)
        node = accepted


def chain_always_accept(draft, num_draft, draft_probs, target_probs, uniform, noise) -> VerifyResult:
    """``rejection_verify`` with every acceptance draw 0: u q(x) < p(x) holds wherever p(x) > 0."""
    return rejection_verify(draft, num_draft, draft_probs, target_probs, torch.zeros_like(uniform), noise)


def tree_always_accept(tokens, parents, draft_probs, target_probs, uniform, noise):
    """``tree_rejection_verify_row`` accepting the first child at every node."""
    return tree_rejection_verify_row(tokens, parents, draft_probs, target_probs, torch.zeros_like(uniform), noise)


WRONG = {"residual_is_p": (chain_residual_is_p, tree_residual_is_p),
         "always_accept": (chain_always_accept, tree_always_accept)}


@contextlib.contextmanager
def wrong_verifier(name: str):
    """The engine verifies with the wrong sampler ``name`` (a key of ``WRONG``) inside the block."""
    chain, tree = WRONG[name]
    saved = verify_rows.rejection_verify, verify_rows.tree_rejection_verify_row
    verify_rows.rejection_verify, verify_rows.tree_rejection_verify_row = chain, tree
    try:
        yield
    finally:
        verify_rows.rejection_verify, verify_rows.tree_rejection_verify_row = saved
