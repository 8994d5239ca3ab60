"""One sequence's logits shaping: its grammar state and its token counts, advanced as it commits.

The engine keeps a ``Shaper`` for each sequence whose request has a grammar or a penalty, and calls
it at three points of a step: ``shape`` after drafting (forbidden drafts out, forced tokens in,
``specserve.constrain.tree``), ``apply`` on the pass's logits rows of the sequence before
verification (penalties from each row's own path, then the grammar mask), and ``commit`` with the
tokens the step committed.  Plain decoding goes through the same calls with an empty draft, so
speculative and plain decoding see the same distributions at every position.
"""

from __future__ import annotations

import torch
from torch import Tensor

from specserve.constrain.grammar import Grammar, apply_mask, new_bitmask
from specserve.constrain.penalties import path_counts, penalise
from specserve.constrain.spelling import Spelling
from specserve.constrain.tree import Shaped, masks, shape
from specserve.trees import paths_of
from specserve.models import rowops
from specserve.sampling import SamplingParams


class Shaper:
    def __init__(self, grammar: Grammar | None, sampling: SamplingParams, prompt: list[int], vocab_size: int,
                 spelling: Spelling | None = None):
        """``spelling``: where forced chains are drafted, how the target spells forced text (learnt
        here from every committed token the grammar forced, and read when drafting)."""
        self.matcher = grammar.matcher() if grammar is not None else None
        self.spelling = spelling if self.matcher is not None else None
        self.last = prompt[-1] if prompt else -1                       # the last committed token
        self._bits = new_bitmask(1, vocab_size)                         # masks' rows, reused (grown as needed)
        self.sampling, self.vocab = sampling, vocab_size
        self.counts = torch.zeros(vocab_size, dtype=torch.float32)     # generated tokens
        self.seen = torch.zeros(vocab_size, dtype=torch.bool)          # prompt and generated tokens
        if sampling.penalised and prompt:
            self.seen[torch.tensor(prompt)] = True

    @staticmethod
    def needed(grammar: Grammar | None, sampling: SamplingParams) -> bool:
        return grammar is not None or sampling.penalised

    def commit(self, tokens: list[int]) -> None:
        """Committed tokens, in order (a token the grammar refuses is a bug upstream)."""
        for t in tokens:
            if self.matcher is not None and not self.matcher.terminated:
                text = self.matcher.forced_text() if self.spelling is not None else ""
                if text:
                    self.spelling.learn(self.last, text, t)
                elif self.spelling is not None and t in self.matcher.stop_ids:
                    self.spelling.end = t
                if not self.matcher.accept(t):
                    raise RuntimeError(f"committed token {t} is outside the grammar")
            self.last = t
        if self.sampling.penalised and tokens:
            idx = torch.tensor(tokens)
            self.counts.index_put_((idx,), torch.ones(len(tokens)), accumulate=True)
            self.seen[idx] = True

    def shape(self, tokens: list[int], parents: list[int], drawn: list[bool], room: int, max_depth: int,
              jump: bool) -> Shaped:
        if self.matcher is None or self.matcher.terminated:
            return Shaped(list(range(len(tokens))))
        return shape(self.matcher, tokens, parents, drawn, room, max_depth, jump, self.last, self.spelling)

    def apply(self, logits: Tensor, tokens: list[int], parents: list[int], inplace: bool = False) -> Tensor:
        """logits: [N + 1, V], the rows of the pending token and the N nodes.  Returns float32 [N + 1, V]:
        penalised, then masked by the grammar (``inplace``: written into ``logits``, float32 rows with
        contiguous entries, and returned).  A greedy request's rows are read by their argmax alone,
        and the mask leaves an allowed argmax where it is (the first maximum stays the first), so
        they are masked only where the argmax is a token the grammar forbids there."""
        sp = self.sampling
        if sp.penalised:
            pc = path_counts(paths_of(tokens, parents), self.vocab)
            out = penalise(logits, (self.counts + pc).to(logits.device), (self.seen | (pc > 0)).to(logits.device),
                           sp.presence_penalty, sp.frequency_penalty, sp.repetition_penalty)
            out = logits.copy_(out) if inplace else out
        else:
            out = logits if inplace else logits.float().clone()
        if self.matcher is None or self.matcher.terminated:
            return out
        if len(self._bits) < len(tokens) + 1:
            self._bits = new_bitmask(max(len(tokens) + 1, 2 * len(self._bits)), self.vocab)
        bitmask = masks(self.matcher, tokens, parents, self._bits)
        if not sp.greedy:
            apply_mask(out, bitmask)
            return out
        words = bitmask.numpy()                                                       # [N + 1, W]
        for r, t in enumerate(rowops.argmax(out).tolist()):                            # [N + 1] argmax
            if not (int(words[r, t >> 5]) >> (t & 31)) & 1:
                apply_mask(out[r:r + 1], bitmask[r:r + 1])
        return out
