"""The decoder protocol every runtime implements, and the layout of one target pass.

A pass feeds ``tokens [B, T]``: row b's T tokens go to cache row ``rows[b]`` at cache slots
``start[b] .. start[b] + T - 1`` (token t at slot ``start[b] + t``).  Slots ``0 .. start[b] - 1``
hold the row's cached prefix.  Within the pass the tokens of a row form a forest given by
``parents [B, T]`` (the index of each token's parent among the row's T tokens, ``-1`` for a root,
always smaller than the token's own index); ``parents=None`` means a chain (parent of t is t - 1).
Then, for token t of row b:

* its **depth** is the number of its ancestors in the pass (0 for a root);
* its **rotary position** is ``start[b] + depth``;
* it **attends** to the prefix slots and to the slots of its ancestors and itself, nothing else.

So a tree of draft nodes is scored in one pass, each node seeing exactly the keys it would see if
its root-to-node path were fed as a chain.

A pass may also be **ragged**: ``tokens [N]`` flat, with ``lengths [B]`` tokens per sequence (summing
to N) and ``parents [N]`` indices relative to each sequence's own tokens; nothing is padded, and
the logits (and features) come back flat, ``[N, V]``.  ``tokens [B, T]`` is the same as a ragged
pass with every length T, returned as ``[B, T, V]``.  Worked example (start 10, pending token p with drafted
children a, b and a's child c)::

    tokens  [p,  a,  b,  c]     parents [-1, 0, 0, 1]     depth [0, 1, 1, 2]
    slots   [10, 11, 12, 13]    rotary positions [10, 11, 11, 12]
    c attends to slots 0..9, 10 (p), 11 (a), 13 (c); b to 0..9, 10, 12.

The model knows nothing of speculation: which slots hold valid entries afterwards, and moving an
accepted path's entries together (``KVCache.compact``), is the engine's business.

``logits_for`` (ragged passes) names the flat token indices whose logits are wanted: logits come
back ``[len(logits_for), V]`` in that order, and a prompt chunk's rows cost no LM head.
``last_only`` (``[B, T]`` passes) asks for each row's last token only: logits ``[B, 1, V]``.

``features`` asks for hidden states: layer i < L means the input of decoder layer i (the output of
layer i - 1; 0 is the embedding), ``L = num_layers`` the final normed output.  They come back for
every fed position as ``ForwardOutput.features[layer]`` ``[B, T, hidden]``; asking for none costs
nothing.
"""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol, runtime_checkable

import numpy as np
import torch
from torch import Tensor

from specserve.models.config import ModelConfig
from specserve.models.draft_layer import DraftLayerSpec
from specserve.models.kv_cache import KVCache

# The parts a pass is timed by (``PartTimer``): projections, attention, LM head, the rest.
PARTS = ("qkv", "o", "gate_up", "down", "attention", "lm_head", "norms+activation")


@dataclass
class ForwardOutput:
    logits: Tensor                                             # [B, T, V] (or [B, 1, V] with last_only)
    features: dict[int, Tensor] = field(default_factory=dict)  # layer -> [B, T, hidden]


class PartTimer:
    """Accumulates seconds per part of a pass; a runtime given one times its own calls with it."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)

    def wrap(self, part: str, fn: Callable) -> Callable:
        """``fn`` timed into ``part``."""
        def timed(*args, **kwargs):
            s = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[part] += time.perf_counter() - s
        return timed


class OnCpu:
    """A runtime whose passes run on the CPU over float32 activations and caches (``Decoder``'s
    ``dtype`` and ``device``): the native runtime, and a replay's stand-in target."""

    @property
    def dtype(self) -> torch.dtype:
        return torch.float32

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")


@runtime_checkable
class Decoder(Protocol):
    """What the engine, the drafters and the benchmark may rely on, whatever the runtime."""

    config: ModelConfig
    kernel: str           # native | fbgemm | torch
    attention: str        # native | invariant | sdpa
    # The longest run of one sequence's tokens in a pass whose results are batch-invariant (the same
    # bits however the pass is composed, and however a prompt is cut into chunks of at most this
    # many tokens); 0 when the runtime is not batch-invariant.
    invariant_tokens: int

    @property
    def dtype(self) -> torch.dtype: ...

    @property
    def device(self) -> torch.device: ...

    def new_cache(self, rows: int, max_len: int, slack: int = 64) -> KVCache:
        """A cache of ``rows`` slots holding up to ``max_len`` positions each (+ ``slack``)."""

    def forward(self, tokens: Tensor, cache: KVCache, rows: list[int], start: list[int], *,
                lengths: list[int] | None = None, parents: Tensor | None = None, last_only: bool = False,
                features: tuple[int, ...] = (), logits_for: list[int] | None = None) -> ForwardOutput:
        """One pass, laid out as the module docstring says.  tokens [B, T] (or [N] with ``lengths``
        [B]: a ragged pass); rows, start [B]; parents shaped as tokens (None: chains).  Returns
        logits [B, T, V] ([B, 1, V] with ``last_only``; ragged: [N, V], or [len(logits_for), V])
        and ``features[layer]`` [B, T, hidden] (ragged: [N, hidden]).  Refuses ``last_only`` on a
        ragged pass and ``logits_for`` on a [B, T] one."""

    def __call__(self, tokens: Tensor, cache: KVCache, rows: list[int], start: list[int], *,
                 lengths: list[int] | None = None, parents: Tensor | None = None, last_only: bool = False,
                 features: tuple[int, ...] = (), logits_for: list[int] | None = None) -> ForwardOutput:
        """``forward`` (an ``nn.Module`` call)."""

    def matmul(self, weight: Tensor, bias: Tensor | None = None) -> Callable[[Tensor], Tensor]:
        """y = x W^T (+ b) on this runtime's own kernels, for a learned drafter's head: weight
        [out, in] and bias [out] are converted once, here; the function maps x [M, in] to
        float32 [M, out] on the CPU (heads run there whatever the model's device)."""

    def draft_layer(self, spec: DraftLayerSpec) -> Callable | None:
        """A learned drafter's EAGLE layer (``specserve.models.draft_layer``) run by this runtime in one
        call per head call: a function (g, emb, pos, cos, sin, parts) -> outputs [M, hidden] with a
        ``norm(x, w)`` method (RMSNorm at the layer's epsilon), its products as ``matmul``'s; or None
        where the runtime has no such call (the drafter then runs the layer op by op)."""

    def weight_bytes(self) -> int:
        """Bytes of weights one decoding pass reads, as this runtime stores them."""

    def set_timer(self, timer: PartTimer | None) -> None:
        """Time every part of later passes into ``timer`` (None: stop timing)."""

    def weight_rows(self, which: str, ids: Tensor) -> Tensor:
        """Rows ``ids`` [n] of the token embedding (``which="embed"``) or of the LM head
        (``"lm_head"``), as the runtime computes with them: float32 [n, hidden] on the model's device."""

    def layer_subset(self, keep: list[int]) -> "Decoder":
        """A decoder that runs only layers ``keep`` (in order), sharing every weight with this one
        (self-speculation); it needs a cache of its own (``new_cache``)."""

    def thread_choices(self) -> tuple[int, ...]:
        """Compute thread counts this runtime can switch between without changing its numerics
        (empty: it cannot)."""

    def set_threads(self, n: int) -> int:
        """Use ``n`` compute threads for later passes (one of ``thread_choices``); returns it."""

    def release_threads(self) -> bool:
        """End the calling thread's pool of compute threads, for a thread that will run no more
        passes (a server's main thread after start-up): idle pooled threads of one thread slow the
        passes another thread runs.  Returns whether a pool was ended."""


def tree_depths(parents: Tensor) -> Tensor:
    """Depth of every token: parents [B, T] (-1 for roots, parents[b, t] < t) -> [B, T] int64.

    Example: parents [[-1, 0, 0, 1]] -> [[0, 1, 1, 2]].  (Small index work: numpy on the host.)
    """
    par = parents.cpu().numpy()
    depth = np.zeros(par.shape, dtype=np.int64)
    rows = np.arange(par.shape[0])
    for t in range(1, par.shape[1]):
        p = par[:, t]
        depth[:, t] = np.where(p >= 0, depth[rows, np.maximum(p, 0)] + 1, 0)
    return torch.from_numpy(depth).to(parents.device)


def ancestor_mask(parents: Tensor) -> Tensor:
    """anc[b, t, u] is True when token u is t itself or one of its ancestors: [B, T] -> [B, T, T].

    Example: parents [[-1, 0, 0, 1]] -> row 3 (c) is [True, True, False, True].
    """
    par = parents.cpu().numpy()
    bsz, t_len = par.shape
    anc = np.broadcast_to(np.eye(t_len, dtype=bool), (bsz, t_len, t_len)).copy()
    rows = np.arange(bsz)
    for t in range(1, t_len):
        p = par[:, t]
        anc[:, t] |= anc[rows, np.maximum(p, 0)] & (p >= 0)[:, None]
    return torch.from_numpy(anc).to(parents.device)


def logit_rows(lengths: list[int] | None, last_only: bool, logits_for: list[int] | None) -> list[int] | None:
    """The flat token indices a ragged pass (``lengths`` [B]) returns logits for: ``logits_for``,
    checked to lie in [0, N), or None for every token.  A [B, T] pass (``lengths`` None) takes no
    ``logits_for`` and returns None; a ragged one takes no ``last_only``."""
    if lengths is None:
        if logits_for is not None:
            raise ValueError("logits_for is for ragged passes")
        return None
    if last_only:
        raise ValueError("last_only is for [B, T] passes")
    n = sum(lengths)
    if logits_for is not None and len(logits_for) and not 0 <= min(logits_for) <= max(logits_for) < n:
        raise ValueError(f"logits_for indices must be in [0, {n})")
    return logits_for


def check_parents(parents: Tensor, t_len: int) -> None:
    """Refuse a forest that is not topologically ordered (a parent index must be < the child's)."""
    par = parents.cpu().numpy()
    if par.shape[-1] != t_len or bool(((par >= np.arange(t_len)) | (par < -1)).any()):
        raise ValueError("parents must satisfy -1 <= parents[b, t] < t")


@dataclass
class Layout:
    """A pass as a flat list of N tokens (see the module docstring); numpy arrays, on the host."""
    lengths: list[int]            # tokens per sequence [B]
    offsets: np.ndarray           # [B+1]: sequence b owns tokens offsets[b] .. offsets[b+1]-1
    seq_of: np.ndarray            # [N]: each token's sequence
    index: np.ndarray             # [N]: each token's index within its sequence (its slot is start + index)
    depth: np.ndarray             # [N]: ancestors in the pass
    parents: np.ndarray | None    # [N]: parent index within the sequence (-1: a root); None: all chains

    @classmethod
    def of(cls, tokens: Tensor, lengths: list[int] | None, parents: Tensor | None) -> "Layout":
        """From ``tokens [B, T]`` (``lengths`` None) or ragged ``tokens [N]`` with ``lengths``;
        ``parents`` of the same shape as ``tokens``, or None.  Refuses malformed layouts."""
        if lengths is None:
            if tokens.dim() != 2:
                raise ValueError("a pass takes tokens [B, T], or tokens [N] with lengths")
            lengths = [tokens.shape[1]] * tokens.shape[0]
        elif tokens.dim() != 1 or sum(lengths) != tokens.shape[0] or min(lengths, default=0) < 1:
            raise ValueError("a ragged pass takes tokens [N] and lengths >= 1 summing to N")
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        seq_of = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
        index = np.arange(offsets[-1], dtype=np.int64) - offsets[seq_of]
        if parents is None:
            return cls(list(lengths), offsets, seq_of, index, index.copy(), None)
        par = parents.reshape(-1).cpu().numpy().astype(np.int64)
        if len(par) != len(index) or bool(((par >= index) | (par < -1)).any()):
            raise ValueError("parents must satisfy -1 <= parents[i] < i within each sequence")
        depth = np.zeros(len(par), dtype=np.int64)
        for i in np.flatnonzero(par >= 0):                    # parents come first in each sequence
            depth[i] = depth[offsets[seq_of[i]] + par[i]] + 1
        return cls(list(lengths), offsets, seq_of, index, depth, par)


@contextmanager
def timed(model: Decoder, timer: PartTimer) -> Iterator[PartTimer]:
    """``with timed(model, timer):`` every pass inside is timed by part."""
    model.set_timer(timer)
    try:
        yield timer
    finally:
        model.set_timer(None)
