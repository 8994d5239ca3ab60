"""A target that says again what it said: the engine's real step over recorded greedy texts.

Terms.  A **text**: a prompt and the continuation the real target decoded for it (greedy).  A
``ReplayTarget`` is a decoder (``specserve.models.decoder``) that runs no model: its greedy choice
after any position of a text is that text's next token, and after the end of a continuation the
end of text, so an engine over it generates every text again token for token, through every phase
of ``Engine.step`` (controller, drafters, grammar, layout, verification, commit, feedback), and its
drafters are accepted exactly what the real target would accept of them.  Features are the real
target's, from one teacher-forced pass over each text.

Its KV cache holds, at each position of a row, the token written there (as a float: token ids are
exact in float32), so that the engine's own KV changes (prefix copies, accepted paths compacted,
rollbacks) keep telling it which text a row holds and what sits at every position.  A node's text
is its row's committed positions and its ancestors in the pass.  A pass's **predicted seconds**
(``pass_s``, added up) are the cost model's for its layout, never the replay's own time.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from torch import Tensor

from specserve.control.cost import CostModel
from specserve.models.config import ModelConfig
from specserve.models.decoder import ForwardOutput, Layout, OnCpu, PartTimer, logit_rows
from specserve.models.kv_cache import KVCache


class FrozenCost(CostModel):
    """A cost model that no pass corrects: a replay's passes are predicted, never measured."""

    @classmethod
    def of(cls, cost: CostModel) -> "FrozenCost":
        """A copy of ``cost``, its correction as it stands, that will not change."""
        return cls(**vars(copy.deepcopy(cost)))

    def observe(self, *args, **kwargs) -> None:       # ``CostModel.observe``'s arguments, ignored
        return None


class ReplayTarget(OnCpu):
    """The recorded texts as a decoder (the module docstring); ``texts`` [n] token lists (prompt +
    continuation), ``features`` per text: layer -> [len(text), hidden], ``end``: the end-of-text id."""

    kernel = "replay"
    attention = "replay"

    def __init__(self, config: ModelConfig, invariant_tokens: int, texts: list[list[int]], features: list[dict],
                 cost: CostModel, end: int):
        self.config, self.invariant_tokens, self.cost, self.end = config, invariant_tokens, cost, end
        self.texts = [np.asarray(t, dtype=np.int64) for t in texts]
        self.features = features
        self.pass_s = 0.0                             # the cost model's seconds of every pass so far
        self._text_of: dict[int, int] = {}            # cache row -> the text it held last

    def new_cache(self, rows: int, max_len: int, slack: int = 64) -> KVCache:
        """One layer, one head of width one: position p of a row holds the token written there."""
        return KVCache(1, rows, 1, max_len, 1, torch.float32, "cpu", slack=slack)

    def thread_choices(self) -> tuple[int, ...]:
        return (1,)

    def set_threads(self, n: int) -> int:
        return 1

    def release_threads(self) -> bool:
        return False

    def set_timer(self, timer: PartTimer | None) -> None:
        """Nothing to time: a replay's passes are predicted."""

    def weight_bytes(self) -> int:
        return 0

    def __call__(self, *args, **kwargs) -> ForwardOutput:
        return self.forward(*args, **kwargs)

    def forward(self, tokens: Tensor, cache: KVCache, rows: list[int], start: list[int], *,
                lengths: list[int] | None = None, parents: Tensor | None = None, last_only: bool = False,
                features: tuple[int, ...] = (), logits_for: list[int] | None = None) -> ForwardOutput:
        """A ragged pass (the engine's only kind): tokens [N] written at their slots; logits [n, V]
        one-hot on each token's next token in its text (rows ``logits_for``, else all), features
        [N, hidden] the real target's at each token's position."""
        if lengths is None:
            raise ValueError("a replay takes ragged passes only")
        lay = Layout.of(tokens, lengths, parents)
        flat = tokens.reshape(-1).to(torch.int64).numpy()
        store = cache.k[0][:, 0, :, 0]                                     # [rows, capacity] token per slot
        nxt = np.full(len(flat), self.end, dtype=np.int64)
        where = np.full((len(flat), 2), -1, dtype=np.int64)               # (text, position) of each token
        for b, (row, s0) in enumerate(zip(rows, start)):
            a, z = int(lay.offsets[b]), int(lay.offsets[b + 1])
            store[row, s0:s0 + z - a] = torch.from_numpy(flat[a:z]).to(torch.float32)
            texts = self._texts(row, store[row, :s0].to(torch.int64).numpy())
            for j in range(a, z):
                path = self._path(flat, lay, a, j)
                text = next((i for i in texts if self.texts[i][s0:s0 + len(path)].tolist() == path), None)
                if text is None:
                    continue
                pos = s0 + len(path) - 1
                where[j] = (text, pos)
                if pos + 1 < len(self.texts[text]):
                    nxt[j] = self.texts[text][pos + 1]
        self.pass_s += self.cost.predict(list(lengths), list(start))
        pick = logit_rows(lengths, last_only, logits_for)
        idx = np.arange(len(flat)) if pick is None else np.asarray(pick, dtype=np.int64)
        logits = torch.zeros(len(idx), self.config.vocab_size)
        logits[torch.arange(len(idx)), torch.from_numpy(nxt[idx])] = 1.0
        return ForwardOutput(logits=logits, features={layer: self._features(layer, where) for layer in features})

    @staticmethod
    def _path(flat: np.ndarray, lay: Layout, a: int, j: int) -> list[int]:
        """The tokens from the sequence's first token in the pass down to token ``j`` (its ancestors)."""
        if lay.parents is None:
            return flat[a:j + 1].tolist()
        out, i = [], j
        while i >= a:
            out.append(int(flat[i]))
            p = int(lay.parents[i])
            i = a + p if p >= 0 else a - 1
        return out[::-1]

    def _texts(self, row: int, committed: np.ndarray) -> list[int]:
        """The texts whose first positions spell a row's ``committed`` tokens (the row's last text first,
        if it still does); a node below them is on the text whose next positions spell its path, and
        on none (a rejected node's descendant: any logits do) where none does."""
        last = self._text_of.get(row)
        order = ([last] if last is not None else []) + [i for i in range(len(self.texts)) if i != last]
        out = [i for i in order if len(self.texts[i]) >= len(committed)
               and np.array_equal(self.texts[i][:len(committed)], committed)]
        if out:
            self._text_of[row] = out[0]
        return out

    def _features(self, layer: int, where: np.ndarray) -> Tensor:
        """[N, hidden]: the real target's features at each token's text position (zeros off the texts)."""
        out = torch.zeros(len(where), self.config.hidden_size)
        for j, (text, pos) in enumerate(where.tolist()):
            if text >= 0 and layer in self.features[text]:
                out[j] = self.features[text][layer][pos]
        return out
