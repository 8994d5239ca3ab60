"""What the engine does for grammars, penalties and logprobs, by phase of a step.

3b. ``constrain``: each grammar-bound draft as the grammar allows it (``under_grammar``: the
shaper's verdict, ``specserve.constrain.tree``, applied to a ``DraftProposal``: forbidden nodes out,
forced chains appended as the proposal's last nodes, ``DraftProposal.forced``, one-hot where the
proposal carries q rows, confidence 1).  8. ``shape_logits``: the pass's rows of each sequence
shaped (penalties from each node's own path, the grammar's masks), the raw rows kept for logprobs.
9. ``commit``: committed tokens into the sequence, its shaper and its logprobs; ``score_prompt``: a
prompt chunk's logprobs.  Nothing here changes the KV cache.
"""

from __future__ import annotations

import torch
from torch import Tensor

from specserve.constrain import Shaper
from specserve.constrain.spelling import Spelling
from specserve.control import SeqView
from specserve.drafters.base import DraftProposal
from specserve.engine.types import Sequence, TokenLogprob
from specserve.limits import MAX_DRAFT
from specserve.sampling import logprobs_of, sample
from specserve.trees import one_hot_rows


def speculates(s: Sequence) -> bool:
    """The sequence's drafts may be more than nothing: a draft size other than 0 and a drafter other
    than plain decoding's (one whose own drafts ``auto`` never keeps, such as a layer-skip draft that
    found no layers worth skipping, still gets the forced tokens, priced by the controller)."""
    return s.request.num_draft != 0 and s.drafter.speculates


def attach(s: Sequence, vocab: int, spelling: Spelling) -> None:
    """A new sequence's shaper (a grammar or a penalty) and logprob lists, where its request asks;
    ``spelling``: how its drafter label's sequences saw the target spell forced text (used, and
    taught, when the sequence speculates)."""
    req = s.request
    if Shaper.needed(req.grammar, req.sampling):
        s.shaper = Shaper(req.grammar, req.sampling, req.prompt, vocab, spelling if speculates(s) else None)
    s.logprobs = [] if req.logprobs is not None else None
    s.prompt_logprobs = [None] if req.prompt_logprobs is not None else None


def first_token(s: Sequence, row: Tensor) -> int:
    """The first generated token, sampled from the prompt's last logits row ([1, V]) as shaped."""
    shaped = s.shaper.apply(row, [], []) if s.shaper is not None else row
    return int(sample(shaped[0], s.request.sampling, s.generator))


def constrain(decoding: list[Sequence], views: list[SeqView], proposals: dict[int, DraftProposal]) -> None:
    """Each grammar-bound draft pruned to what its grammar allows, with the forced chains added when
    the request speculates (a drafter that drafts, a draft size other than 0)."""
    for s, v in zip(decoding, views):
        if s.shaper is None or s.shaper.matcher is None:
            continue
        prop = proposals[s.seq_id]
        jump = v.num_draft != 0 and speculates(s)
        proposals[s.seq_id] = under_grammar(prop, s.shaper, MAX_DRAFT - len(prop), v.depth, jump)


def shape_logits(decoding: list[Sequence], proposals: dict[int, DraftProposal], offsets: list[int],
                 lengths: list[int], logits: Tensor) -> dict[int, Tensor]:
    """Shape, in place, the rows of every sequence with a shaper (sequence i: ``logits`` [M, V] rows
    offsets[i] .. + lengths[i]); returns, for sequences that asked for logprobs, their raw rows."""
    raw = {}
    for s, at, n in zip(decoding, offsets, lengths):
        if s.logprobs is not None:
            raw[s.seq_id] = logits[at:at + n].clone()
        if s.shaper is not None:
            prop = proposals[s.seq_id]
            s.shaper.apply(logits[at:at + n], prop.tokens, prop.parent_list(), inplace=True)
    return raw


def commit(s: Sequence, tokens: list[int], raw: Tensor | None, rows: list[int]) -> None:
    """Commit ``tokens`` (``Sequence.commit``); the shaper advances by those committed, and each gets
    its logprobs from ``raw`` (raw logits rows; token j's position is row ``rows[j]``)."""
    n = s.commit(tokens)
    if s.shaper is not None:
        s.shaper.commit(tokens[:n])
    if raw is not None and n:
        s.logprobs += [TokenLogprob(t, lp, top) for t, (lp, top) in
                       zip(tokens[:n], logprobs_of(raw[rows[:n]], tokens[:n], s.request.logprobs))]


def score_prompt(s: Sequence, start: int, rows: Tensor) -> None:
    """A scored prompt chunk at prompt position ``start``: rows [n, V] predict positions start + 1 ..."""
    prompt = s.request.prompt
    m = min(len(rows), len(prompt) - start - 1)
    toks = prompt[start + 1:start + 1 + m]
    s.prompt_logprobs += [TokenLogprob(t, lp, top) for t, (lp, top) in
                          zip(toks, logprobs_of(rows[:m], toks, s.request.prompt_logprobs))]


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
        probs = torch.cat([probs, one_hot_rows(tokens[-k:], probs.shape[1], probs.dtype, probs.device)])
    return kept.with_forced(tokens, parents, probs)
