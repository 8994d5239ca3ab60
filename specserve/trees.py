"""Drafted trees: the few rules every layer shares (drafters, verification, the engine's layout).

A tree of N nodes is in topological order: ``parents[i]`` is node i's parent index (-1: a child of
the pending token), always below i.  ``parents`` None means a chain, where node i's parent is i - 1.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def chain_parents(n: int) -> list[int]:
    """The parents of a chain of n nodes: -1, 0, 1, ..., n - 2."""
    return list(range(-1, n - 1))


def is_chain(parents: Sequence[int] | None) -> bool:
    """Whether the tree is a chain (None, or every node's parent the node before it)."""
    return parents is None or all(p == i - 1 for i, p in enumerate(parents))


def parent_list(parents: Sequence[int] | None, n: int) -> list[int]:
    """The parents of a tree of n nodes as a new list (a chain's spelled out)."""
    return list(parents) if parents is not None else chain_parents(n)


class Nodes:
    """The shape of a drafted tree of ``tokens`` and ``parents`` (None: a chain), for the dataclasses
    that carry one (``Row``, the drafters' ``DraftProposal``)."""
    tokens: list[int]
    parents: list[int] | None

    @property
    def is_chain(self) -> bool:
        return is_chain(self.parents)

    def parent_list(self) -> list[int]:
        return parent_list(self.parents, len(self.tokens))


def children_of(parents: Sequence[int]) -> list[list[int]]:
    """kids[p + 1]: the children of node p (kids[0]: of the pending token), in order."""
    kids: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for i, p in enumerate(parents):
        kids[p + 1].append(i)
    return kids


def paths_of(tokens: Sequence[int], parents: Sequence[int]) -> list[tuple[int, ...]]:
    """Each node's token path below the pending token (a node's identity across proposals)."""
    out: list[tuple[int, ...]] = []
    for t, p in zip(tokens, parents):
        out.append((out[p] if p >= 0 else ()) + (t,))
    return out


def one_hot_rows(tokens: Sequence[int] | Tensor, vocab: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None) -> Tensor:
    """[N, vocab] rows of q for N deterministic nodes: probability 1 on each node's token."""
    index = torch.as_tensor(tokens, dtype=torch.long, device=device)                      # [N]
    return torch.nn.functional.one_hot(index, vocab).to(dtype)
