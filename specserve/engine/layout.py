"""One step's pass layout: what the ragged target pass feeds, and where each part's rows come back.

Built once per step from the decoding entries and the prompt chunks.  Decoding entry b feeds its
pending token and its kept nodes (``lengths[b] = 1 + N_b``, nothing padded) after its
``starts[b]`` cached positions; node parents shift by one (the pending token is the entry's index
0).  Then each prompt chunk, a chain after the prompt's cached positions.  Logits come back for
the decoding entries' rows (in pass order) and then for the last row of each chunk that ends its
prompt; no LM head runs for the other chunk rows.  A pass of chains only passes no parents.
Worked example (entry 0: pending p, nodes a, b with b a child of p; a chunk x y z that ends its
prompt)::

    tokens [p, a, b, x, y, z]   parents [-1, 0, 0, -1, 0, 1]   lengths [3, 3]
    offsets [0, 3]   logits_for [0, 1, 2, 5]   entry 0's logits rows 0..2, the chunk's first token: row 3
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from specserve.models.decoder import ForwardOutput
from specserve.models.kv_cache import KVCache
from specserve.trees import chain_parents, is_chain


@dataclass(frozen=True)
class Entry:
    """A decoding sequence's part of the pass."""
    row: int
    start: int                    # cached positions before the pass
    pending: int                  # its pending token
    nodes: list[int]              # kept node tokens
    parents: list[int]            # per node (-1: child of the pending token)


@dataclass(frozen=True)
class Chunk:
    """A prompt chunk's part of the pass."""
    row: int
    start: int                    # prompt positions already cached
    tokens: list[int]
    ends_prompt: bool
    score: bool = False           # logits for every row (a prompt whose logprobs were asked for)


@dataclass
class PassLayout:
    tokens: list[int]             # [M] flat
    parents: list[int] | None     # [M] per entry's own tokens; None: every entry a chain
    rows: list[int]               # per entry, then per chunk: cache row
    starts: list[int]             # ... cached positions before the pass
    lengths: list[int]            # ... tokens fed
    offsets: list[int]            # ... first flat index
    logits_for: list[int] | None  # flat indices whose logits come back (None: all: no chunk in the pass)
    features: tuple[int, ...]     # layers whose features come back
    entries: int                  # how many of the parts are decoding entries (the first ones)
    first_token: list[int | None]  # per chunk: the logits row of its prompt's first token (None: not ending)
    scored: list[int | None]      # per chunk: the logits row of its first token, for a scored chunk (the
                                  # chunk's rows follow in order); None: not scored

    @classmethod
    def build(cls, entries: list[Entry], chunks: list[Chunk], features: tuple[int, ...]) -> "PassLayout":
        tokens: list[int] = []
        parents: list[int] = []
        for e in entries:
            tokens += [e.pending] + e.nodes
            parents += [-1] + [p + 1 for p in e.parents]
        decode_rows = len(tokens)
        wanted: list[int] = []                 # chunk rows whose logits come back, in order
        first: list[int | None] = []
        scored: list[int | None] = []
        for c in chunks:
            base = len(tokens)
            tokens += c.tokens
            parents += chain_parents(len(c.tokens))
            scored.append(decode_rows + len(wanted) if c.score else None)
            wanted += range(base, len(tokens)) if c.score else [len(tokens) - 1] if c.ends_prompt else []
            first.append(decode_rows + len(wanted) - 1 if c.ends_prompt else None)
        lengths = [1 + len(e.nodes) for e in entries] + [len(c.tokens) for c in chunks]
        chains = all(is_chain(e.parents) for e in entries)
        return cls(tokens, None if chains else parents, [e.row for e in entries] + [c.row for c in chunks],
                   [e.start for e in entries] + [c.start for c in chunks], lengths,
                   list(itertools.accumulate([0] + lengths[:-1])),
                   list(range(decode_rows)) + wanted if chunks else None, features, len(entries), first, scored)

    @property
    def decode_lengths(self) -> list[int]:
        return self.lengths[:self.entries]

    @property
    def decode_starts(self) -> list[int]:
        return self.starts[:self.entries]

    def chunk_offset(self, j: int) -> int:
        """Chunk j's first flat index (its features' first row)."""
        return self.offsets[self.entries + j]

    def run(self, model, cache: KVCache) -> ForwardOutput:
        dev = model.device
        return model(torch.tensor(self.tokens, device=dev), cache, self.rows, self.starts, lengths=self.lengths,
                     parents=torch.tensor(self.parents, device=dev) if self.parents is not None else None,
                     features=self.features, logits_for=self.logits_for)
