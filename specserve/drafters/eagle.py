"""``eagle``: a one-layer head trained on the target's own features drafts a dynamic tree (EAGLE-2).

Terms as in ``specserve.drafters.heads.modules``: position t has token x_t and target features f_t; the head's
*real* entry at t reads g_t = fuse(f_t) and the embedding of x_{t+1}, and its output o_t predicts
x_{t+2}.  When the engine asks for a draft after the pending token x_n, the target's features are
known up to position n - 1, so the real entries run up to t = n - 1 and o_{n-1} gives the
distribution of x_{n+1}, the first drafted token.  Expanding a drafted node c (a token at sequence
position m) runs one more entry at position m - 1 with c's embedding and its parent's output in
place of the unknown real feature; the entry attends to the real entries and to c's ancestors'
entries, exactly as in training (training-time test).

The tree (greedy, EAGLE-2): the root's ``topk`` likeliest tokens are depth 1; at each further depth
the ``topk`` nodes with the highest *cumulative* probability (the product of the head's
probabilities along the path) are expanded, each into its ``topk`` likeliest children (``topk``
capped at the budget k; a node that can no longer reach the top k is not expanded, which keeps a
small budget's drafting cheap); finally the k nodes with the highest cumulative probability are kept (a child's never exceeds its parent's, so
they form a tree) and emitted depth-first, likeliest child first.  The cumulative probabilities are
the proposal's confidence, which the adaptive controller calibrates and trims by.  Greedy drafts are
one-hot (deterministic), so verification is exact whatever the head says.

Under sampling the head drafts a tree of drawn nodes (``SampledTree``): each expanded node's
``sample_width`` children drawn without replacement from q, the head's distribution over its reduced
vocabulary processed like the target's (temperature, top-k, top-p) and zero outside the vocabulary;
each node carries the q it was drawn from given its earlier siblings, for exact recursive rejection
(``specserve.verify.tree``).  The ``sample_width`` likeliest drawn nodes of a depth are expanded; the
proposal is the first k nodes in the order they were drawn, so no node is kept or dropped by its own
draw (which would bias the output).  ``sample_width=1`` is a chain.

The head's key/value entries of real positions are kept per sequence and extended, when a draft is
next asked for, with the positions committed since the last one, at most the newest ``window`` of
them (a step that asks for no draft costs nothing beyond keeping references to the features of the
window).  A draft after a long prompt, or after a stretch in which the controller drafted nothing,
then costs ``window`` entries, not one per position; the skipped positions get no entry and the
head attends to the entries it has, at their true positions (what the window costs in acceptance:
BENCHMARKS.md, section 16, "Probes that cost little: a catch-up window").  The sequences drafting
in one step share the head's calls: one call for their new real entries, then one per depth for all their trees' expanded
nodes (attention alone runs per sequence, over its own entries); a tree's bookkeeping is a few array
operations per depth on its whole frontier, its ancestor mask grown a depth at a time
(``specserve.drafters.heads.tree``).  q, k and v are one matrix product, rotary positions come from
a table, and greedy and sampled trees share the same calls.

Where the target's runtime runs the head's layer in one call (``Decoder.draft_layer``: the native
kernels), each head call is that one foreign call, attention under the tree's masks included, and the
final norm before the reduced LM head another; elsewhere the layer runs op by op in torch around the
runtime's products (``ops``, converted only where that path runs).  The two differ only in the order
their norms, RoPE and attention round (tests/test_draft_layer.py); at a few rows the op-by-op layer's
small torch operations cost more than its products (BENCHMARKS.md, section 25).  A head of several
decoder layers (``HeadConfig.num_layers``) runs them in turn in every head call, each layer with its
own keys and values per sequence at the same slots (one foreign call per layer).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from specserve.drafters.base import (DraftProposal, DraftRequest, Feedback, draw_generator, non_negative, option,
                                     positive)
from specserve.drafters.heads.runtime import HeadDrafter, HeadOptions, head_option, RopeTable, sample_width_option
from specserve.drafters.heads.tree import SampledTree, Tree
from specserve.drafters.registry import register
from specserve.errors import SpecserveError
from specserve.models.draft_layer import DraftLayerSpec, DraftPart
from specserve.sampling import SamplingParams


class _Seq:
    """One sequence's head state: features of committed positions, and the head's real entries."""

    def __init__(self, capacity: int, hidden: int, kv_heads: int, head_dim: int, gen: torch.Generator | None,
                 layers: int = 1):
        self.g = torch.empty(capacity, hidden)              # fused target features g_t, t < n_fused
        self.n_fused = 0
        self.raw: list[tuple[Tensor, ...]] = []             # features not fused yet (per layer [n, hidden])
        self.n_feat = 0                                     # positions whose features arrived
        self.k = torch.empty(layers, capacity, kv_heads, head_dim)  # each head layer's keys/values: real
        self.v = torch.empty(layers, capacity, kv_heads, head_dim)  # entries first, then (scratch) the tree's
        self.n_real = 0                                     # slots holding real entries
        self.caught = 0                                     # positions t < caught need no real entry
        self.last: Tensor | None = None                     # output of the newest real entry [hidden]
        self.gen = gen

    def reserve(self, n: int) -> None:
        """Room for n positions (real entries plus a tree's scratch), growing by doubling."""
        cap = self.g.shape[0]
        if n <= cap:
            return
        new = max(n, 2 * cap)
        for name, dim in (("g", 0), ("k", 1), ("v", 1)):
            old = getattr(self, name)
            shape = list(old.shape)
            shape[dim] = new
            grown = torch.empty(shape)
            grown.narrow(dim, 0, cap).copy_(old)
            setattr(self, name, grown)


_Part = tuple[_Seq, int, int, "Tensor | None"]   # (state, first slot, rows, mask): see EagleDrafter._entries


@dataclass(frozen=True)
class EagleOptions(HeadOptions):
    head: str = head_option("eagle")
    topk: int = option(8, "children per expanded node, and nodes expanded per depth", check=positive("eagle", "topk"))
    depth: int = option(6, "deepest drafted token", check=positive("eagle", "depth"))
    window: int = option(8, "real entries a draft catches up on after positions committed without one: "
                         "the newest this many (0: every position); bounds what a draft costs after a "
                         "stretch of steps that drafted nothing", check=non_negative("eagle", "window"))
    sample_width: int = sample_width_option("eagle")


@register("eagle")
class EagleDrafter(HeadDrafter):
    max_auto_draft = 24
    Options = EagleOptions
    head_kinds = ("eagle", "eagle3")

    parallel_head = False                                 # runs heads trained to draft in parallel (P-EAGLE)

    def __init__(self, target: Any, **options: Any):
        module = self._open(target, options)
        if bool(self.cfg.parallel) != self.parallel_head:
            raise SpecserveError(f"the head at {self.head_dir} drafts " + (
                f"{self.cfg.parallel} tokens per pass (parallel drafting); run it with eagle-parallel"
                if self.cfg.parallel else "one token per pass; run it with eagle"))
        self.target = target
        self.max_tree_depth = self.opts.depth
        m = target.model
        self.head = module
        self.lin = {"fuse": m.matmul(module.fuse.weight)}                  # the fusion, on the target's kernels
        self._ops: list[dict] | None = None                                  # see ``ops``
        c = self.cfg
        with torch.no_grad():
            layers = []
            for i, layer in enumerate(module.stack()):                       # the layout's layer, then plain ones
                layers.append(m.draft_layer(DraftLayerSpec(
                    c.kind if i == 0 else "decoder", c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim,
                    c.intermediate_size, c.rms_norm_eps, layer.draft_weights())))
                if layers[-1] is None:
                    break
        self.layer = layers if layers[-1] is not None else None             # None: op by op (``ops``)
        self.norm_w = module.norm.weight.detach().float().contiguous()      # the final norm's weight [hidden]
        self.rope = RopeTable(self.cfg.head_dim, self.cfg.rope_theta)
        self.vocab_np = self.vocab_ids.numpy()
        self.seqs: dict[int, _Seq] = {}
        self.max_len = 4096

    # -- lifecycle -------------------------------------------------------------------------------------
    def bind(self, max_batch: int, max_len: int) -> None:
        self.max_len = max_len

    def begin(self, seq_id: int, prompt: list[int], sampling: SamplingParams, max_new_tokens: int,
              generator: torch.Generator | None = None) -> None:
        c = self.cfg
        self.seqs[seq_id] = _Seq(len(prompt) + 256, c.hidden_size, c.num_kv_heads, c.head_dim,
                                 draw_generator(sampling, generator), c.num_layers)

    def end(self, seq_id: int) -> None:
        self.seqs.pop(seq_id, None)

    @torch.inference_mode()
    def feedback(self, fb: Feedback) -> None:
        s = self.seqs.get(fb.seq_id)
        if s is None or not fb.features:
            return
        feats = tuple(fb.features[l] for l in self.feature_layers)
        s.raw.append(feats)                                   # fused when next drafted from (lazily:
        s.n_feat += feats[0].shape[0]                         # no work while no draft is asked for)
        w = self.opts.window
        while w and len(s.raw) > 1 and s.n_fused + s.raw[0][0].shape[0] <= s.n_feat - w:
            s.n_fused += s.raw.pop(0)[0].shape[0]             # never read: outside the window

    # -- the head ----------------------------------------------------------------------------------------
    @property
    def ops(self) -> list[dict]:
        """Per decoder layer of the head, its products by name on the target's kernels (those of its
        ``draft_weights``: q, k and v as one ``qkv``; the fusion is ``lin``'s), for running the layers
        op by op: the torch runtimes' path, and the one tests and experiments compare the one-call
        layer with (by setting ``layer`` to None).  Converted on first use: a drafter running the one-call layer never
        needs them."""
        if self._ops is None:
            m = self.target.model
            self._ops = [{name: m.matmul(w) for name, w in layer.draft_weights().items() if w.dim() == 2}
                         for layer in self.head.stack()]                   # the products, not the norms
        return self._ops

    def _entries(self, parts: list[_Part], g: Tensor, tokens: Tensor, pos: Tensor) -> Tensor:
        """Run head entries, of one sequence or several at once: g [M, hidden] state inputs, tokens [M]
        (embedding ids), pos [M] rotary positions; the rows are the parts' in order, a part (s, at, m,
        mask) being m rows of sequence s whose keys/values are written at its slots at..at+m-1 in every
        layer of the head (see ``_attend`` for the keys they see).  Returns the last layer's outputs
        [M, hidden]."""
        emb = self.target.model.weight_rows("embed", tokens).cpu()
        if self.layer is not None:                            # the runtime's one call per layer
            x = g
            for l, layer in enumerate(self.layer):
                x = layer(x, emb if l == 0 else None, pos, self.rope.cos, self.rope.sin,
                          [DraftPart(s.k[l], s.v[l], at, m, s.n_real, mask) for s, at, m, mask in parts])
            return x
        x = self.head.inputs(g, emb, self.ops[0])             # either layout (``modules``), op by op
        for l, (layer, lin) in enumerate(zip(self.head.stack(), self.ops)):
            q, k, v = self._qkv(layer.normed(x), pos, lin)
            att, lo = [], 0
            for s, at, m, mask in parts:
                att.append(self._attend(s, l, at, mask, q[lo:lo + m], k[lo:lo + m], v[lo:lo + m]))
                lo += m
            x = layer.mlp(layer.residual(x) + lin["o"](torch.cat(att) if len(att) > 1 else att[0]), lin)
        return x

    def _qkv(self, hn: Tensor, pos: Tensor, lin: dict) -> tuple[Tensor, Tensor, Tensor]:
        """hn [M, in] (normed) -> q [M, H, d] (contiguous), k, v [M, Hkv, d]: one product (``lin``'s
        qkv), RoPE on q and k at once (the same values as ``rotary``, its cos and sin read from the table)."""
        c = self.cfg
        hq, hk = c.num_heads, c.num_kv_heads
        qkv = lin["qkv"](hn).view(len(hn), hq + 2 * hk, c.head_dim)
        qk = self.rope.rotate(qkv[:, :hq + hk], pos)
        return qk[:, :hq].contiguous(), qk[:, hq:], qkv[:, hq + hk:]

    def _attend(self, s: _Seq, l: int, at: int, mask: Tensor | None, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """One sequence's m rows in head layer l: q [m, H, d], k, v [m, Hkv, d] written at slots
        at..at+m-1.  Keys visible: its real entries, and then slots n_real..at+m-1 under ``mask``
        [m, at + m - n_real] (None: causal over all the slots).  Returns the attention output [m, H * d]."""
        c = self.cfg
        m = len(q)
        s.k[l, at:at + m], s.v[l, at:at + m] = k, v
        keys, vals = s.k[l, :at + m], s.v[l, :at + m]
        # grouped-query attention without copying keys: q [m, Hkv, rep, d] against k [K, Hkv, d]
        q = q.view(m, c.num_kv_heads, c.num_heads // c.num_kv_heads, c.head_dim)
        scores = torch.einsum("qgrd,kgd->grqk", q, keys) * (1.0 / math.sqrt(c.head_dim))
        if mask is not None:
            scores[..., s.n_real:].masked_fill_(~mask, float("-inf"))
        elif m > 1:
            scores[..., at:].masked_fill_(torch.ones(m, m, dtype=torch.bool).triu(1), float("-inf"))
        return torch.einsum("grqk,kgd->qgrd", scores.softmax(-1), vals).reshape(m, -1)

    def _logits(self, o: Tensor) -> Tensor:
        """Outputs [M, hidden] -> reduced-vocabulary logits [M, Vr]."""
        if self.layer is not None:
            return self.lm(self.layer[-1].norm(o.contiguous(), self.norm_w))
        return self.lm(self.head.norm(o))

    def _catch_up(self, batch: list[tuple[_Seq, list[int]]], extra: list[int] | None = None) -> list[Tensor]:
        """Real entries for every position whose features and next token are known (t <= n - 1), for
        each sequence of ``batch`` ((state, tokens)): one fuse and one entries call for them all.  With
        a ``window`` w, positions older than n - w that no draft has caught up on are skipped: their
        features are never fused and they get no entry (the head attends to the entries it has, at
        their true rotary positions).  ``extra``: per sequence, placeholder entries (a parallel head's)
        run in the same call after its real ones, at positions n, n + 1, ...; their outputs
        [e, hidden] are returned per sequence (their keys and values are scratch: the next call
        overwrites them)."""
        w = self.opts.window
        extra = extra or [0] * len(batch)
        work = []                                             # (state, tokens, first position, n)
        for s, tokens in batch:
            n = len(tokens) - 1                                # the pending token's position
            if s.n_feat != n:
                raise RuntimeError(f"eagle: features for {s.n_feat} positions, expected {n}")
            work.append((s, tokens, max(s.caught, n - w) if w else s.caught, n))
        self._fuse_new([(s, lo) for s, _, lo, _ in work if s.raw])
        parts: list[_Part] = []
        g, tokens, pos, spans = [], [], [], []
        for (s, toks, lo, n), e in zip(work, extra):
            self.rope.reserve(n + self.max_tree_depth + 1)
            real = max(n - lo, 0)
            if real + e:
                parts.append((s, s.n_real, real + e, None))
                g += [s.g[lo:n]] if real else []
                g += [self.hold_g.expand(e, -1)] if e else []
                tokens += toks[lo + 1:n + 1] + ([self.hold_token] * e if e else [])
                pos += range(lo, n + e) if real else range(n, n + e)
            spans.append((real, e, n))
        held: list[Tensor] = []
        out = self._entries(parts, torch.cat(g) if len(g) > 1 else g[0], torch.tensor(tokens),
                            torch.tensor(pos)) if parts else None
        end = 0
        for (s, _, _, _), (real, e, n) in zip(work, spans):
            if real:
                s.n_real, s.last = s.n_real + real, out[end + real - 1]
            s.caught = max(s.caught, n)
            held.append(out[end + real:end + real + e] if e else torch.empty(0))
            end += real + e
        return held

    def _fuse_new(self, fresh: list[tuple[_Seq, int]]) -> None:
        """Fuse the features that arrived since the last draft ((state, first position needed) each),
        in one product for all the sequences, into their ``g`` rows."""
        if not fresh:
            return
        rows = [torch.cat([torch.cat(p, -1) for p in s.raw])[max(lo - s.n_fused, 0):] for s, lo in fresh]
        fused, at = self.lin["fuse"](torch.cat(rows).float().cpu()), 0   # [N, F * hidden] -> [N, hidden]
        for (s, _), r in zip(fresh, rows):
            n, m = s.n_feat, len(r)
            s.reserve(n + self.max_tree_depth * self.topk + 1)
            s.g[n - m:n] = fused[at:at + m]
            s.raw, s.n_fused, at = [], n, at + m

    def _children(self, o: Tensor, parts: list[tuple[int, Tree]]) -> list[tuple[Tensor, Tensor]]:
        """The children of outputs o [M, hidden]: per part (m rows, its tree), (scores [m, kk] float32,
        indices into the reduced vocabulary [m, kk]): the rows' top kk log-probabilities, or for a
        ``SampledTree`` its draws (then log-probabilities of the draws)."""
        logits = self._logits(o)
        sampled = [isinstance(t, SampledTree) for _, t in parts]
        logp = logits.log_softmax(-1) if not all(sampled) else None       # greedy trees rank by it
        kks = {t.kk for _, t in parts}
        whole = logp.topk(kks.pop()) if not any(sampled) and len(kks) == 1 else None
        out, lo = [], 0
        for (m, t), drawn in zip(parts, sampled):
            if whole is not None:
                out.append((whole.values[lo:lo + m], whole.indices[lo:lo + m]))
            else:
                out.append(t.draw(logits[lo:lo + m]) if drawn else logp[lo:lo + m].topk(t.kk))
            lo += m
        return out

    # -- drafting ------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def propose(self, requests: list[DraftRequest]) -> list[DraftProposal]:
        out = [DraftProposal([]) for _ in requests]
        asked = [(i, r, self.seqs[r.seq_id], min(self.max_tree_depth, r.max_depth, r.k)) for i, r in enumerate(requests)]
        asked = [a for a in asked if a[3] > 0]                # a request for no draft costs nothing
        if asked:
            self._catch_up([(s, r.tokens) for _, r, s, _ in asked])   # positions committed since the last draft
        trees = []
        for i, r, s, depth in asked:
            if s.last is None:
                continue
            h = self.cfg.hidden_size
            if r.sampling.greedy:
                t = Tree(r.k, depth, min(self.topk, len(self.vocab_ids), r.k), h)
            else:
                t = SampledTree(r.k, depth, min(self.opts.sample_width, len(self.vocab_ids), r.k), h, r.sampling, s.gen)
            trees.append((i, (s, len(r.tokens) - 1, t)))
        if trees:
            self._trees([w for _, w in trees])
            for i, (_, _, t) in trees:
                out[i] = t.proposal(self.vocab_np, self.vocab_size)
        return out

    def _trees(self, work: list[tuple[_Seq, int, Tree]]) -> None:
        """EAGLE-2's dynamic trees (module docstring) after pending positions n, for every (state, n,
        tree) of ``work`` together: one call to the head for their roots, then one per depth for all
        the nodes they expand (``Tree.select``: only nodes that can still reach the final top budget)."""
        for (_, _, t), (v, i) in zip(work, self._children(torch.stack([s.last for s, _, _ in work]),
                                                          [(1, t) for _, _, t in work])):
            t.roots(v[0], i[0])
        for d in range(1, max(t.depth for _, _, t in work)):
            live = [(s, n, t) for s, n, t in work if d < t.depth and not t.done and t.select()]
            if not live:
                break
            g = torch.empty(sum(len(t.expand) for _, _, t in live), self.cfg.hidden_size)
            parts: list[_Part] = []
            tokens, pos, lo = [], [], 0
            for s, n, t in live:
                m = len(t.expand)
                tok, mask = t.entries(s.last, g[lo:lo + m])
                parts.append((s, s.n_real + t.used - m, m, mask))
                tokens.append(tok)
                pos += [n - 1 + d] * m
                lo += m
            o = self._entries(parts, g, torch.from_numpy(self.vocab_np[np.concatenate(tokens)]), torch.tensor(pos))
            lo = 0
            for (s, n, t), (v, i) in zip(live, self._children(o, [(len(t.expand), t) for _, _, t in live])):
                t.grow(o[lo:lo + len(v)], v, i)
                lo += len(v)
