"""The drafter interface: begin, propose, feedback, end.

A drafter is called by the engine and never drives it.  Per sequence the engine calls ``begin``
once with the prompt; ``feedback`` once after the prompt's prefill (with the prompt's target
features, if the drafter asked for any) and then after every step; ``propose`` every step with the
whole sequence so far (prompt + generated tokens; the last one is the *pending* token whose
successors are being drafted); and finally ``end``.  ``propose`` takes a batch so that drafters
that run a model can batch their own passes.

A proposal is a **tree** of nodes in topological order: node i has a token and a parent index
(-1: a child of the pending token; always < i).  A chain is parents -1, 0, 1, ... and is written
with ``parents=None``, the common case, which costs nothing extra anywhere.  ``num_draft`` (the
request's ``k``) is the node budget: a proposal has at most k nodes, and no node deeper than
``max_depth``.

Sampling drafters return ``probs``: row i is the distribution q node i's token was drawn from,
given its ancestors and its earlier siblings.  Siblings drawn independently *with replacement*
share one q; siblings drawn *without replacement* carry q renormalised over the tokens not drawn
before them.  Verification (``specserve.verify``) is exact in both cases.  ``probs=None`` means
every node is deterministic (one-hot q), as for n-gram lookup.

Random draws: ``begin`` takes the sequence's ``generator``, a ``torch.Generator`` the engine
creates per sequence (None for a greedy request; seeded from the request's seed, apart from the
stream verification draws from).  A drafter that samples draws from it and from nothing else, and
creates and seeds no generator of its own, so a seeded request is reproducible.

Options: each drafter declares its options as one dataclass, ``Options`` (a field per option,
written with ``option``: its default, help and check, each written once), from which
``__init_subclass__`` derives the ``Option`` declarations (``options``: name, type, default, help)
the registry reads; and it declares the largest draft the adaptive controller may give it
(``max_auto_draft``).  A drafter is built as ``cls(target, **options)`` and keeps
``self.opts = self.Options(**options)``, whose ``__post_init__`` refuses bad values.  The registry
builds drafters from the declarations, and the command line, the server and the benchmark read
them from there, with no per-drafter code of their own.  A request's draft length is ``auto`` (chosen every step by the controller,
``specserve.control``) unless it names a number, which then means exactly that number.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Any, Callable, ClassVar, get_type_hints

import torch
from torch import Tensor

from specserve import trees
from specserve.errors import SpecserveError
from specserve.limits import NO_LIMIT
from specserve.sampling import SamplingParams

REQUIRED = object()      # the default of an option that must be given


@dataclass(frozen=True)
class Option:
    """One constructor option a drafter declares."""
    name: str
    type: type                 # int, float or str
    default: Any = REQUIRED
    help: str = ""
    check: Callable[[Any], Any] | None = None   # raises SpecserveError for a bad value (run before loading)

    @property
    def required(self) -> bool:
        return self.default is REQUIRED


def option(default: Any = REQUIRED, help: str = "", check: Callable[[Any], Any] | None = None) -> Any:
    """A field of a drafter's ``Options`` dataclass: its one default, its help and its check."""
    extra = {} if default is REQUIRED else {"default": default}
    return field(metadata={"help": help, "check": check}, **extra)


def at_least(low: float, drafter: str, name: str) -> Callable[[Any], Any]:
    """The check of a number option of ``drafter`` that must be >= low."""
    def check(v):
        if v < low:
            raise SpecserveError(f"{drafter} option {name} must be >= {low}, got {v}")
        return v
    return check


def positive(drafter: str, name: str) -> Callable[[Any], Any]:
    return at_least(1, drafter, name)


def non_negative(drafter: str, name: str) -> Callable[[Any], Any]:
    return at_least(0, drafter, name)


@dataclass(frozen=True)
class CheckedOptions:
    """The base of an ``Options`` dataclass whose options are checked one by one: built directly, it
    runs every option's check as the registry does, in field order (but those named in ``unchecked``)."""
    unchecked: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self) -> None:
        for f in fields(self):
            check = f.metadata.get("check")
            if check is not None and f.name not in self.unchecked:
                check(getattr(self, f.name))


def declared(options_type: type) -> tuple[Option, ...]:
    """The ``Option`` declarations of an ``Options`` dataclass, in field order."""
    hints = get_type_hints(options_type)
    return tuple(Option(f.name, hints[f.name], REQUIRED if f.default is MISSING else f.default,
                        f.metadata.get("help", ""), f.metadata.get("check")) for f in fields(options_type))


@dataclass(frozen=True)
class NoOptions:
    """The options of a drafter that takes none."""


@dataclass
class DraftRequest:
    seq_id: int
    tokens: list[int]          # prompt + generated so far; tokens[-1] is the pending token
    k: int                     # node budget: propose at most this many nodes
    sampling: SamplingParams
    max_depth: int = NO_LIMIT  # no node deeper than this (the engine: tokens left to generate - 1)
    parts: dict[str, int] | None = None   # a merging drafter (``MergingDrafter``): each part's node budget,
                                          # chosen by the controller; None: every part gets ``k``


def per_node(forced_value: Callable[[], Any]) -> Any:
    """An optional per-node list field of a proposal (None: not given): ``subset`` picks its kept
    entries, and a node a grammar forces (``with_forced``) gets ``forced_value()``."""
    return field(default=None, metadata={"per_node": forced_value})


@dataclass
class DraftProposal(trees.Nodes):
    tokens: list[int]                        # N node tokens, topological order
    probs: Tensor | None = None              # [N, V] q per node (see the module docstring); None: one-hot
    parents: list[int] | None = None         # N parent indices (-1: child of the pending token); None: a chain
    confidence: list[float] | None = per_node(lambda: 1.0)
    # ^ optional per-node score in [0, 1] (higher: likelier accepted)
    future_gain: list[float] | None = per_node(lambda: 0.0)
    # ^ optional per-node tokens expected in *later* steps from running the node (lookahead's window:
    #   the n-grams its outputs add to the pool); the controller adds it to the node's gain, never to
    #   the confidence it calibrates against what was accepted
    forced: int = 0
    # ^ the last ``forced`` nodes are not the drafter's: the engine added them where a grammar forces
    #   the text (``specserve.constrain.tree``); the drafter's own nodes are the first ones

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def drafter_nodes(self) -> int:
        """How many nodes the drafter proposed (the first ones; the rest a grammar forced)."""
        return len(self.tokens) - self.forced

    def drafted(self, path: list[int]) -> tuple["DraftProposal", list[int]]:
        """The drafter's own nodes and the part of an accepted ``path`` that runs through them."""
        if not self.forced:
            return self, path
        n = self.drafter_nodes
        return self.subset(list(range(n))), [i for i in path if i < n]

    def trim_confidence(self) -> list[float] | None:
        """The confidences the controller may rank, trim and calibrate nodes by: None when the nodes
        were drawn at random (``probs`` set).  Keeping a drawn node or not by a score of its own token
        biases the output: a node kept only when it is likely under q is no longer distributed as q,
        and verification assumes it is.  Drawn nodes are trimmed by their depths alone, which the
        draws do not touch (a node's place in the tree may depend on its ancestors' and earlier
        siblings' draws, never on its own)."""
        return self.confidence if self.probs is None else None

    def depths(self) -> list[int]:
        """Depth of every node (1 for a child of the pending token)."""
        out: list[int] = []
        for p in self.parent_list():
            out.append(1 if p < 0 else out[p] + 1)
        return out

    def paths(self) -> list[tuple[int, ...]]:
        """Each node's token path below the pending token (a node's identity across proposals)."""
        return trees.paths_of(self.tokens, self.parent_list())

    @property
    def depth(self) -> int:
        """The deepest node's depth (0 for an empty proposal; a chain of k tokens: k)."""
        return max(self.depths(), default=0)

    def truncated(self, k: int, max_depth: int) -> "DraftProposal":
        """The first k nodes that lie within ``max_depth`` and whose ancestors are all kept."""
        if len(self) <= k and self.depth <= max_depth:
            return self
        parents, depths = self.parent_list(), self.depths()
        keep: list[int] = []
        kept: set[int] = set()
        for i, (p, d) in enumerate(zip(parents, depths)):
            if len(keep) == k:
                break
            if d <= max_depth and (p < 0 or p in kept):
                kept.add(i)
                keep.append(i)
        return self.subset(keep)

    def subset(self, keep: list[int]) -> "DraftProposal":
        """The nodes ``keep`` (ascending; each kept node's parent kept too), re-indexed."""
        if len(keep) == len(self):
            return self
        parents = self.parent_list()
        new_index = {old: new for new, old in enumerate(keep)}
        pick = (lambda xs: None if xs is None else [xs[i] for i in keep])
        probs = self.probs[keep] if self.probs is not None and keep else None
        return replace(self, tokens=pick(self.tokens), probs=probs,
                       parents=None if self.parents is None else [new_index.get(parents[i], -1) for i in keep],
                       forced=sum(1 for i in keep if i >= self.drafter_nodes),
                       **{f.name: pick(getattr(self, f.name)) for f in self._per_node()})

    def with_forced(self, tokens: list[int], parents: list[int], probs: Tensor | None) -> "DraftProposal":
        """The proposal with the nodes a grammar forces appended (``tokens``, ``parents`` and ``probs``:
        the whole proposal's, the new nodes last); each per-node field gets its forced value."""
        k = len(tokens) - len(self)
        return replace(self, tokens=tokens, probs=probs, parents=parents, forced=self.forced + k,
                       **{f.name: None if getattr(self, f.name) is None else
                          list(getattr(self, f.name)) + [f.metadata["per_node"]() for _ in range(k)]
                          for f in self._per_node()})

    def _per_node(self) -> list:
        """The optional per-node list fields (``per_node``), a subclass's included."""
        return [f for f in fields(self) if "per_node" in f.metadata]

    def check(self, vocab_size: int) -> None:
        """Raise ValueError unless the proposal is a well-formed tree over the vocabulary."""
        n = len(self.tokens)
        if self.parents is not None:
            if len(self.parents) != n or any(not -1 <= p < i for i, p in enumerate(self.parents)):
                raise ValueError(f"parents must satisfy -1 <= parents[i] < i, got {self.parents}")
        if any(not 0 <= t < vocab_size for t in self.tokens):
            raise ValueError("drafted token outside the vocabulary")
        if self.probs is not None:
            if tuple(self.probs.shape) != (n, vocab_size):
                raise ValueError(f"probs must be [{n}, {vocab_size}], got {tuple(self.probs.shape)}")
            dev = self.probs.device
            q_x = self.probs[torch.arange(n, device=dev), torch.tensor(self.tokens, dtype=torch.long, device=dev)]
            if not bool(((q_x > 0) & torch.isfinite(q_x)).all()):
                raise ValueError("a node's token has no probability under the q it was drawn from")
        for f in self._per_node():
            if getattr(self, f.name) is not None and len(getattr(self, f.name)) != n:
                raise ValueError(f"{f.name} needs one value per node")
        if not 0 <= self.forced <= n:
            raise ValueError("forced must count nodes of the proposal")


@dataclass
class Feedback:
    """What one step (or the prompt's prefill) did to a sequence, handed to its drafter."""
    seq_id: int
    proposal: DraftProposal                  # what was verified (empty after the prefill)
    accepted: list[int]                      # accepted node indices, root to leaf
    emitted: list[int]                       # tokens appended to the sequence this step
    features: dict[int, Tensor] = field(default_factory=dict)
    # ^ layer -> [n, hidden]: target features of the n positions the cache committed this step, in
    #   order (after the prefill: every prompt position; after a step: the pending token, then the
    #   accepted nodes).  Only the layers the drafter declared in ``feature_layers``.
    predicted: list[int] | None = None
    # ^ the target's most likely token after each row of the pass: [pending token, node 0, node 1, ...]
    #   (len(proposal) + 1), whatever was accepted; only for drafters that set ``wants_predictions``


class Drafter(ABC):
    name: ClassVar[str] = ""
    synthetic: ClassVar[bool] = False        # True when outputs are a study, not a real drafter
    tree: ClassVar[bool] = False             # proposes trees (num_draft is then a node budget)
    max_auto_draft: ClassVar[int] = 8        # the largest draft (node budget) ``auto`` may choose
    speculates: ClassVar[bool] = True        # False for plain decoding: nothing drafted, not even the
                                             # tokens a grammar forces
    confidence: ClassVar[bool] = False       # proposals carry per-node confidence: under ``auto`` the drafter
                                             # is asked for its largest draft and the controller trims it
    preload: ClassVar[bool] = False          # cheap and option-free: a server loads it for requests to name
    Options: ClassVar[type] = NoOptions      # the options dataclass (see the module docstring)
    options: ClassVar[tuple[Option, ...]] = ()   # derived from ``Options``: what the registry reads
    feature_layers: tuple[int, ...] = ()     # target layers whose features ``feedback`` should carry
    wants_predictions: ClassVar[bool] = False  # ``feedback`` carries the target's argmax at every node

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if "Options" in cls.__dict__:
            cls.options = declared(cls.Options)

    def bind(self, max_batch: int, max_len: int) -> None:
        """The engine will run at most ``max_batch`` sequences of at most ``max_len`` tokens."""

    def validate(self, sampling: SamplingParams) -> None:
        """Refuse (SpecserveError) sampling settings this drafter cannot serve, before admission."""

    def begin(self, seq_id: int, prompt: list[int], sampling: SamplingParams, max_new_tokens: int,
              generator: torch.Generator | None = None) -> None:
        """A new sequence starts; ``prompt`` is its full prompt, ``generator`` the one its drafts are
        drawn with (None: a greedy request; see the module docstring)."""

    @abstractmethod
    def propose(self, requests: list[DraftRequest]) -> list[DraftProposal]:
        """Draft up to ``request.k`` nodes for each request, in order."""

    def feedback(self, fb: Feedback) -> None:
        """The prefill, or the last proposal's verification, for ``fb.seq_id``."""

    def end(self, seq_id: int) -> None:
        """The sequence finished or was dropped; forget it."""

    def describe(self) -> dict:
        """What a report should say about this drafter beyond its spec (a learned head: where it came from)."""
        return {}

    def reset_memory(self) -> bool:
        """Forget what was learnt across requests (a corpus of earlier texts, drafter-wide rates), as a
        fresh server would start; True when there was such memory.  Per-sequence state is untouched."""
        return False


class MergingDrafter(Drafter):
    """A drafter that merges other drafters' proposals (``auto``): the controller gives each of its
    parts its own node budget (``DraftRequest.parts``), calibration, cost and probes, and its
    proposals are ``MergedProposal``."""

    @abstractmethod
    def parts(self) -> dict[str, Drafter]:
        """The parts by name."""


@dataclass
class MergedProposal(DraftProposal):
    """A merging drafter's proposal: what the controller prices part by part
    (``specserve.control.parts``) and the engine times part by part (``draft_s_by_part``)."""
    origins: list[dict[str, float]] | None = per_node(dict)
    # ^ per node, the parts that proposed it, each with its own confidence for the node
    #   (uncalibrated); the controller calibrates each part's confidences separately and prices a
    #   node by its best part
    part_draft_s: dict[str, float] | None = None
    # ^ per part asked for this request, its share of that part's ``propose`` call (the call's
    #   seconds over the requests it drafted for)


def parts_of(drafter: Drafter) -> dict[str, Drafter]:
    """A merging drafter's parts by name; none for any other drafter."""
    return drafter.parts() if isinstance(drafter, MergingDrafter) else {}


def draft_s_by_part(proposals: list) -> dict[str, tuple[float, int]]:
    """Per part, over a merging drafter's proposals of one call: its drafting seconds and the requests
    it drafted for (anything but a ``MergedProposal``, such as a fault, counts for nothing)."""
    out: dict[str, tuple[float, int]] = {}
    for prop in proposals:
        for part, seconds in ((prop.part_draft_s if isinstance(prop, MergedProposal) else None) or {}).items():
            total, n = out.get(part, (0.0, 0))
            out[part] = (total + seconds, n + 1)
    return out


def draw_generator(sampling: SamplingParams, generator: torch.Generator | None) -> torch.Generator | None:
    """The generator a sampling drafter draws a sequence's tokens with: ``begin``'s ``generator``
    (None for a greedy request).  A sampled sequence begun without one is refused: a drafter never
    seeds a stream of its own."""
    if sampling.greedy:
        return None
    if generator is None:
        raise ValueError("a sampled sequence's drafter needs the generator the engine gives begin()")
    return generator
