"""The eagle and medusa drafters as they were before their drafting was vectorised (copied verbatim
from specserve/drafters/eagle.py and medusa.py at commit 98f2adf, unregistered): the slow reference
the fast paths are checked against (tests/test_eagle_speed_paths.py) and timed against
(experiments/eagle_step_time.py --impl ref).  Since then: the layer runs through the head module's own
pieces (``inputs``, ``normed``, ``residual``, ``mlp``), so either layout (eagle, eagle3) is checked,
a deeper head's layers run in turn (``stack``), each with its own keys and values, and the sampled
chain it draws lives here (the drafters draw trees; ``sample_width=1`` is this chain)."""

from __future__ import annotations

import heapq
import math
from typing import Any, Callable

import torch
from torch import Tensor

from specserve.drafters.base import DraftProposal, DraftRequest, Drafter, Feedback, draw_generator
from specserve.drafters.eagle import EagleOptions
from specserve.drafters.heads.modules import rotary
from specserve.drafters.heads.runtime import depth_first, describe_head, head_path, open_head
from specserve.drafters.medusa import MedusaOptions
from specserve.sampling import SamplingParams, exponential_noise, processed_probs, race


# the sampled chain the drafters drew before sampled trees (``sample_width=1`` draws the same)
def sample_reduced(logits: Tensor, vocab_ids: Tensor, vocab_size: int, sampling: SamplingParams,
                   gen: torch.Generator) -> tuple[int, float, Tensor]:
    """Draw one token from a head's logits over its reduced vocabulary.

    logits: [Vr] over ``vocab_ids`` [Vr].  Temperature, top-k and top-p over the Vr tokens give the
    same law as over the whole vocabulary with the others at -inf (they have no mass and sort last),
    at a fraction of the cost.  Returns (token id, its probability, q [V] zero outside the subset).
    """
    q_sub = processed_probs(logits, sampling)                                   # [Vr]
    i = int(race(q_sub, exponential_noise(tuple(q_sub.shape), gen)))
    q = torch.zeros(vocab_size)
    q[vocab_ids] = q_sub
    return int(vocab_ids[i]), float(q_sub[i]), q


def sampled_chain(logits_at: Callable[[int, list[int]], Tensor], depth: int, vocab_ids: Tensor, vocab_size: int,
                  sampling: SamplingParams, gen: torch.Generator) -> DraftProposal:
    """A chain of ``depth`` tokens drawn one by one with ``sample_reduced``, with its q rows.

    ``logits_at(d, drawn)``: the head's reduced-vocabulary logits [Vr] for depth d + 1, given the
    tokens ``drawn`` at depths 1..d.  A node's confidence is the product of its path's draws' q."""
    tokens: list[int] = []
    probs: list[Tensor] = []
    conf: list[float] = []
    c = 1.0
    for d in range(depth):
        tok, p, q = sample_reduced(logits_at(d, tokens), vocab_ids, vocab_size, sampling, gen)
        c *= p
        tokens.append(tok)
        probs.append(q)
        conf.append(c)
    return DraftProposal(tokens, torch.stack(probs), None, conf)


class _RefSeq:
    """One sequence's head state: features of committed positions, and the head's real entries."""

    def __init__(self, capacity: int, hidden: int, kv_heads: int, head_dim: int, gen: torch.Generator | None,
                 layers: int = 1):
        self.g = torch.empty(capacity, hidden)              # fused target features g_t, t < n_fused
        self.n_fused = 0
        self.raw: list[Tensor] = []                         # features not fused yet ([n, F, hidden] each)
        self.n_feat = 0                                     # positions whose features arrived
        self.k = [torch.empty(capacity, kv_heads, head_dim) for _ in range(layers)]  # per head layer, its keys/
        self.v = [torch.empty(capacity, kv_heads, head_dim) for _ in range(layers)]  # values: real entries first,
                                                                                      # then the tree's (scratch)
        self.n_real = 0
        self.last: Tensor | None = None                     # output of the newest real entry [hidden]
        self.gen = gen

    def reserve(self, n: int) -> None:
        """Room for n positions (real entries plus a tree's scratch), growing by doubling."""
        cap = self.g.shape[0]
        if n <= cap:
            return
        new = max(n, 2 * cap)
        def grow(old: Tensor) -> Tensor:
            grown = torch.empty((new,) + tuple(old.shape[1:]))
            grown[:cap] = old
            return grown
        self.g, self.k, self.v = grow(self.g), [grow(k) for k in self.k], [grow(v) for v in self.v]


class RefEagle(Drafter):
    name = "eagle"
    tree = True
    confidence = True
    max_auto_draft = 24
    Options = EagleOptions

    def __init__(self, target: Any, **options: Any):
        o = self.opts = self.Options(**options)
        self.target = target
        self.cfg, module, self.vocab_ids = open_head("eagle", o.head, target, kinds=("eagle", "eagle3"))
        self.head_dir = str(head_path("eagle", o.head))
        self.topk, self.max_tree_depth = o.topk, o.depth
        self.feature_layers = tuple(self.cfg.feature_layers)
        m = target.model
        self.head = module
        self.lins = [{name: m.matmul(getattr(layer, name).weight) for name in layer.LINEARS}  # on the target's
                     for layer in module.stack()]                                               # kernels, per layer
        self.lin = self.lins[0]
        self.lm = m.matmul(m.weight_rows("lm_head", self.vocab_ids).cpu())   # the reduced LM head [Vr, hidden]
        self.vocab_list = self.vocab_ids.tolist()
        self.vocab_size = target.config.vocab_size
        self.seqs: dict[int, _RefSeq] = {}
        self.max_len = 4096

    # -- lifecycle -------------------------------------------------------------------------------------
    def bind(self, max_batch: int, max_len: int) -> None:
        self.max_len = max_len

    def describe(self) -> dict:
        return describe_head(self.cfg, self.head_dir, len(self.vocab_list))

    def begin(self, seq_id: int, prompt: list[int], sampling: SamplingParams, max_new_tokens: int,
              generator: torch.Generator | None = None) -> None:
        c = self.cfg
        self.seqs[seq_id] = _RefSeq(len(prompt) + 256, c.hidden_size, c.num_kv_heads, c.head_dim,
                                 draw_generator(sampling, generator), c.num_layers)

    def end(self, seq_id: int) -> None:
        self.seqs.pop(seq_id, None)

    @torch.inference_mode()
    def feedback(self, fb: Feedback) -> None:
        s = self.seqs.get(fb.seq_id)
        if s is None or not fb.features:
            return
        feats = torch.stack([fb.features[l].float().cpu() for l in self.feature_layers], 1)    # [n, F, hidden]
        s.raw.append(feats)                                   # fused when next drafted from (lazily:
        s.n_feat += feats.shape[0]                            # no work while no draft is asked for)

    # -- the head ----------------------------------------------------------------------------------------
    def _entries(self, s: _RefSeq, g: Tensor, tokens: list[int], pos: Tensor, at: int, mask: Tensor | None) -> Tensor:
        """Run head entries: g [M, hidden] state inputs, tokens (M embeddings), pos [M] rotary positions;
        their keys/values are written at slots at..at+M-1.  Keys visible: slots [0, at + M) under
        ``mask`` [M, at + M] (None: causal over the slots).  Returns the outputs [M, hidden]."""
        h, c = self.head, self.cfg
        emb = self.target.model.weight_rows("embed", torch.tensor(tokens)).cpu()
        x = h.inputs(g, emb, self.lin)                        # either layout, by the module's own pieces
        m = len(tokens)
        for layer, lin, sk, sv in zip(h.stack(), self.lins, s.k, s.v):
            hn = layer.normed(x)
            q = lin["q"](hn).view(-1, c.num_heads, c.head_dim)
            k, v = lin["kv"](hn).view(-1, 2, c.num_kv_heads, c.head_dim).unbind(1)
            q, k = rotary(q, pos, c.rope_theta), rotary(k, pos, c.rope_theta)
            sk[at:at + m], sv[at:at + m] = k, v
            keys, vals = sk[:at + m], sv[:at + m]
            # grouped-query attention without copying keys: q [m, Hkv, rep, d] against k [K, Hkv, d]
            q = q.view(m, c.num_kv_heads, c.num_heads // c.num_kv_heads, c.head_dim)
            scores = torch.einsum("qgrd,kgd->grqk", q, keys) * (1.0 / math.sqrt(c.head_dim))
            allowed = mask if mask is not None else torch.ones(m, at + m, dtype=torch.bool).tril(at)
            att = torch.einsum("grqk,kgd->qgrd", scores.masked_fill(~allowed, float("-inf")).softmax(-1),
                               vals).reshape(m, -1)
            x = layer.mlp(layer.residual(x) + lin["o"](att), lin)
        return x

    def _logits(self, o: Tensor) -> Tensor:
        """Outputs [M, hidden] -> reduced-vocabulary logits [M, Vr]."""
        return self.lm(self.head.norm(o))

    def _catch_up(self, s: _RefSeq, tokens: list[int]) -> None:
        """Real entries for every position whose features and next token are known (t <= n - 1)."""
        n = len(tokens) - 1                                    # the pending token's position
        if s.n_feat != n:
            raise RuntimeError(f"eagle: features for {s.n_feat} positions, expected {n}")
        if s.raw:
            s.reserve(n + self.max_tree_depth * self.topk + 1)
            s.g[s.n_fused:n] = self.lin["fuse"](torch.cat(s.raw).flatten(1))
            s.raw, s.n_fused = [], n
        lo = s.n_real
        if lo < n:
            pos = torch.arange(lo, n)
            out = self._entries(s, s.g[lo:n], tokens[lo + 1:n + 1], pos, lo, None)
            s.n_real, s.last = n, out[-1]

    # -- drafting ------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def propose(self, requests: list[DraftRequest]) -> list[DraftProposal]:
        out = []
        for r in requests:
            s = self.seqs[r.seq_id]
            depth = min(self.max_tree_depth, r.max_depth, r.k)
            if depth > 0:
                self._catch_up(s, r.tokens)                   # positions committed since the last draft
            if depth <= 0 or s.last is None:
                out.append(DraftProposal([]))
            elif r.sampling.greedy:
                out.append(self._tree(s, len(r.tokens) - 1, r.k, depth))
            else:
                out.append(self._chain(s, len(r.tokens) - 1, depth, r.sampling))
        return out

    def _tree(self, s: _RefSeq, n: int, budget: int, depth: int) -> DraftProposal:
        """EAGLE-2's dynamic tree (module docstring) after pending position n.  Only nodes that can
        still reach the final top-``budget`` are expanded: a node whose cumulative probability is
        not above the budget-th best so far cannot, since its children's never exceed its own."""
        kk = min(self.topk, len(self.vocab_ids), budget)
        logp = self._logits(s.last[None]).log_softmax(-1)[0]
        top = logp.topk(kk)
        tokens = [self.vocab_list[i] for i in top.indices.tolist()]
        parents, cum = [-1] * kk, top.values.tolist()
        depths, slot = [1] * kk, [-1] * kk                     # slot: the node's head entry (-1: none yet)
        outputs: dict[int, Tensor] = {}
        frontier = list(range(kk))
        used = 0
        for d in range(1, depth):
            bar = sorted(cum, reverse=True)[budget - 1] if len(cum) >= budget else float("-inf")
            expand = [i for i in sorted(frontier, key=lambda i: -cum[i])[:kk] if cum[i] > bar]
            if not expand:
                break
            at = s.n_real + used
            used += len(expand)
            for j, i in enumerate(expand):
                slot[i] = at + j
            mask = torch.zeros(len(expand), at + len(expand), dtype=torch.bool)
            mask[:, :s.n_real] = True
            for j, i in enumerate(expand):
                a = i
                while a >= 0:
                    mask[j, slot[a]] = True
                    a = parents[a]
            g = torch.stack([s.last if parents[i] < 0 else outputs[parents[i]] for i in expand])
            o = self._entries(s, g, [tokens[i] for i in expand], torch.tensor([n - 1 + d] * len(expand)), at, mask)
            top = self._logits(o).log_softmax(-1).topk(kk)
            frontier = []
            for j, i in enumerate(expand):
                outputs[i] = o[j]
                for v, t in zip(top.values[j].tolist(), top.indices[j].tolist()):
                    tokens.append(self.vocab_list[t])
                    parents.append(i)
                    cum.append(cum[i] + v)
                    depths.append(d + 1)
                    slot.append(-1)
                    frontier.append(len(tokens) - 1)
        keep = sorted(range(len(tokens)), key=lambda i: (-cum[i], depths[i], i))[:budget]
        return depth_first(tokens, parents, cum, set(keep))

    def _chain(self, s: _RefSeq, n: int, depth: int, sampling: SamplingParams) -> DraftProposal:
        """A sampled chain with its q rows (module docstring): depth d + 1's logits come from the entry
        of depth d's token, causal over the slots (the real entries, the chain's earlier entries, itself)."""
        out = [s.last]                                        # out[d]: the output depth d + 1 is drawn from

        def logits_at(d: int, drawn: list[int]) -> Tensor:
            if d > 0:
                out.append(self._entries(s, out[-1][None], [drawn[-1]], torch.tensor([n + d - 1]),
                                         s.n_real + d - 1, None)[0])
            return self._logits(out[-1][None])[0]
        return sampled_chain(logits_at, depth, self.vocab_ids, self.vocab_size, sampling, s.gen)


class RefMedusa(Drafter):
    name = "medusa"
    tree = True
    confidence = True
    max_auto_draft = 16
    Options = MedusaOptions

    def __init__(self, target: Any, **options: Any):
        o = self.opts = self.Options(**options)
        self.cfg, module, vocab_ids = open_head("medusa", o.head, target)
        self.head_dir = str(head_path("medusa", o.head))
        self.topk = o.topk
        self.feature_layers = tuple(self.cfg.feature_layers)
        m = target.model
        self.blocks = [m.matmul(b.weight, b.bias) for b in module.blocks]          # on the target's kernels
        self.lm = m.matmul(m.weight_rows("lm_head", vocab_ids).cpu())         # the reduced LM head [Vr, hidden]
        self.vocab_ids, self.vocab_list = vocab_ids, vocab_ids.tolist()
        self.vocab_size = target.config.vocab_size
        self.last: dict[int, Tensor] = {}
        self.gen: dict[int, torch.Generator] = {}

    def describe(self) -> dict:
        return describe_head(self.cfg, self.head_dir, len(self.vocab_list))

    def begin(self, seq_id: int, prompt: list[int], sampling: SamplingParams, max_new_tokens: int,
              generator: torch.Generator | None = None) -> None:
        gen = draw_generator(sampling, generator)
        if gen is not None:
            self.gen[seq_id] = gen

    def end(self, seq_id: int) -> None:
        self.last.pop(seq_id, None)
        self.gen.pop(seq_id, None)

    def feedback(self, fb: Feedback) -> None:
        f = fb.features.get(self.feature_layers[0])
        if f is not None and len(f):
            self.last[fb.seq_id] = f[-1].float().cpu()

    @torch.inference_mode()
    def _logits(self, f: Tensor, depth: int) -> Tensor:
        """f [hidden] -> the first ``depth`` blocks' reduced-vocabulary logits [depth, Vr]."""
        x = f[None]
        h = torch.cat([x + torch.nn.functional.silu(b(x)) for b in self.blocks[:depth]])
        return self.lm(h)

    @torch.inference_mode()
    def propose(self, requests: list[DraftRequest]) -> list[DraftProposal]:
        out = []
        for r in requests:
            depth = min(len(self.blocks), r.max_depth, r.k)
            f = self.last.get(r.seq_id)
            if depth <= 0 or f is None:
                out.append(DraftProposal([]))
            elif r.sampling.greedy:
                out.append(self._tree(self._logits(f, depth).log_softmax(-1), r.k))
            else:
                logits = self._logits(f, depth)                   # [depth, Vr]: the heads see no drafted token
                out.append(sampled_chain(lambda d, drawn: logits[d], depth, self.vocab_ids, self.vocab_size,
                                         r.sampling, self.gen[r.seq_id]))
        return out

    def _tree(self, logp: Tensor, budget: int) -> DraftProposal:
        """Best-first over the Cartesian product of each depth's top tokens (module docstring)."""
        top = logp.topk(min(self.topk, logp.shape[1]))
        vals, idx = top.values.tolist(), top.indices.tolist()
        depth = len(vals)
        tokens, parents, score = [], [], []
        heap = [(-vals[0][c], -1, 0, c) for c in range(len(vals[0]))]      # (-score, parent, depth index, choice)
        heapq.heapify(heap)
        while heap and len(tokens) < budget:
            neg, parent, d, c = heapq.heappop(heap)
            tokens.append(self.vocab_list[idx[d][c]])
            parents.append(parent)
            score.append(-neg)
            me = len(tokens) - 1
            if d + 1 < depth:
                for c2 in range(len(vals[d + 1])):
                    heapq.heappush(heap, (neg - vals[d + 1][c2], me, d + 1, c2))
        return depth_first(tokens, parents, score, set(range(len(tokens))))
