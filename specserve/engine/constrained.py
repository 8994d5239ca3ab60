"""A sequence's draft under its grammar: the shaper's verdict (``specserve.constrain.tree``) applied to
a ``DraftProposal``: forbidden nodes out, forced chains appended as the proposal's last nodes
(``DraftProposal.forced``), one-hot where the proposal carries q rows, confidence 1."""

from __future__ import annotations

import torch

from specserve.constrain import Shaper
from specserve.drafters.base import DraftProposal


def drawn_nodes(prop: DraftProposal) -> list[bool]:
    """Per node: drawn from a q that is not one-hot at its token."""
    if prop.probs is None or not len(prop):
        return [False] * len(prop)
    idx = torch.arange(len(prop), device=prop.probs.device)
    q_x = prop.probs[idx, torch.tensor(prop.tokens, device=prop.probs.device)]
    return (q_x < 1).tolist()


def under_grammar(prop: DraftProposal, shaper: Shaper, room: int, max_depth: int, jump: bool) -> DraftProposal:
    """``prop`` pruned to what the grammar allows, with the forced chains added (at most ``room`` nodes,
    none deeper than ``max_depth``; none unless ``jump``)."""
    shaped = shaper.shape(prop.tokens, prop.parent_list(), drawn_nodes(prop), room, max_depth, jump)
    kept = prop.subset(shaped.keep)
    if not shaped.chains:
        return kept
    index = {old: new for new, old in enumerate(shaped.keep)}
    tokens, parents = list(kept.tokens), kept.parent_list()
    for at, chain in shaped.chains:
        p = index[at] if at >= 0 else -1
        for t in chain:
            tokens.append(t)
            parents.append(p)
            p = len(tokens) - 1
    k = shaped.forced
    probs = kept.probs
    if probs is not None:
        rows = torch.zeros((k, probs.shape[1]), dtype=probs.dtype, device=probs.device)
        rows[torch.arange(k), torch.tensor(tokens[-k:])] = 1
        probs = torch.cat([probs, rows])
    extend = (lambda xs, v: None if xs is None else list(xs) + [v] * k)
    return DraftProposal(tokens, probs, parents, extend(kept.confidence, 1.0), extend(kept.future_gain, 0.0),
                         None if kept.origins is None else list(kept.origins) + [{} for _ in range(k)],
                         kept.forced + k)
