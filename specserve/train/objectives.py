"""What each head kind trains on: one ``Objective`` per ``HeadConfig.kind``, chosen by ``OBJECTIVES``.

Terms as in ``specserve.drafters.heads.modules`` and ``trainer``.  An objective gives the head's
config for a ``TrainConfig``, the head's outputs j = 0, 1, ... over a batch (normed, ready for the
reduced LM head), and their **alignment**: output j at position u trains against the target's
distribution p_{u+ahead} and is defined from u >= first (the same offsets say which token a
validation chain's depth j + 1 is read from).

* EAGLE, with *training-time test* (EAGLE-3): the head is unrolled ``steps`` times over every
  sequence at once (``eagle_unroll``); every step's output at u predicts x_{u+2}: ahead 1, first j.
  Both layouts (``eagle``, ``eagle3``: see ``modules``) train the same way; ``eagle3`` takes exactly
  three feature layers inside the stack, the only ones vLLM and SGLang can feed it.
* Medusa: block j over f^L_t predicts x_{t+2+j}: ahead 1 + j, first 0.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from specserve.drafters.heads import HeadConfig, new_config
from specserve.drafters.heads.files import check_eagle3_layers


def shift(x: Tensor, n: int) -> Tensor:
    """x [B, T, ...] moved n positions later along T (x'[u] = x[u - n]), zeros first."""
    if n == 0:
        return x
    return torch.cat([torch.zeros_like(x[:, :n]), x[:, :-n]], 1)


def eagle_unroll(head, g0: Tensor, emb_next: Tensor, steps: int,
                 placeholder: tuple[Tensor, Tensor] | None = None) -> list[Tensor]:
    """Training-time test: g0 [B, T, hidden] fused real features, emb_next [B, T, hidden] embeddings
    of x_{u+1} -> ``steps`` outputs [B, T, hidden]; output j at u predicts x_{u+2} (valid for u >= j).
    ``head``: an EagleHead or an Eagle3Head (the same ``inputs``, ``qkv``, ``finish``); a deeper
    head's layers run in turn at every step, each over its own keys (``stack``).

    Step j (0-based) at position u takes the embedding of x_{u+1} and, for j = 0, the fused real
    feature g_u, for j > 0 the step j-1 output at u - 1; it attends to the step-0 keys of positions
    <= u - j (their inputs are real features) and to one key of each later step on its own diagonal
    (step i at position u - (j - i)), exactly what drafting j + 1 tokens deep attends to.

    ``placeholder`` (g [hidden], emb [hidden]), for a parallel head (P-EAGLE): every step j > 0 takes
    these inputs instead, at every position; the attention is the same, which is what one pass over
    the real entry at u - j and the j placeholders after it attends to (``modules``)."""
    B, T, _ = g0.shape
    pos = torch.arange(T).expand(B, T)
    layers = head.stack()
    ks, vs = [[] for _ in layers], [[] for _ in layers]          # per layer, per step [B, T, H, d]
    outs = []
    g_in, emb_in = g0, emb_next
    for j in range(steps):
        if j and placeholder is not None:
            g_in, emb_in = (t.expand(B, T, -1) for t in placeholder)
        x = head.inputs(g_in, emb_in)
        for layer, lk, lv in zip(layers, ks, vs):
            x = _unrolled_layer(layer, x, pos, j, lk, lv)
        outs.append(x)
        g_in = shift(x, 1)
    return outs


def _unrolled_layer(layer, x: Tensor, pos: Tensor, j: int, ks: list[Tensor], vs: list[Tensor]) -> Tensor:
    """One decoder layer at unroll step j (``eagle_unroll``): x [B, T, in] its input, pos [B, T];
    ``ks``, ``vs`` this layer's keys and values of steps 0..j-1 ([B, T, H, d], kv heads repeated),
    to which step j's are appended.  Returns the layer's output [B, T, hidden]."""
    c = layer.cfg
    T = x.shape[1]
    rep = c.num_heads // c.num_kv_heads
    scale = 1.0 / math.sqrt(c.head_dim)
    q, k, v = layer.qkv(x, pos)                                              # [B, T, H(kv), d]
    ks.append(k.repeat_interleave(rep, 2))
    vs.append(v.repeat_interleave(rep, 2))
    s0 = torch.einsum("bqhd,bkhd->bhqk", q, ks[0]) * scale                   # [B, H, T, T]
    allowed = torch.ones(T, T, dtype=torch.bool).tril(-j)                    # step-0 keys at <= u - j
    s0 = s0.masked_fill(~allowed, float("-inf"))
    diag = [torch.einsum("bqhd,bqhd->bhq", q, shift(ks[i], j - i)) * scale for i in range(1, j + 1)]
    p = torch.cat([s0] + [d[..., None] for d in diag], -1).softmax(-1)      # [B, H, T, T + j]
    att = torch.einsum("bhqk,bkhd->bqhd", p[..., :T], vs[0])
    for i in range(1, j + 1):
        att = att + p[..., T + i - 1].transpose(1, 2)[..., None] * shift(vs[i], j - i)
    return layer.finish(x, att.flatten(-2))
    return outs


class Objective:
    """One head kind's training objective (module docstring)."""

    def head_config(self, cfg, target) -> HeadConfig:
        """The head's config for ``cfg`` (a TrainConfig) and ``target`` (a LoadedModel)."""
        raise NotImplementedError

    def outputs(self, module, b, steps: int, embed: Tensor) -> list[Tensor]:
        """Outputs j = 0.. over batch ``b``: normed [B, T, hidden] each; ``embed`` [V, hidden] the target's."""
        raise NotImplementedError

    def alignment(self, j: int) -> tuple[int, int]:
        """(ahead, first) of output j (module docstring)."""
        raise NotImplementedError

    def val_depth(self, cfg) -> int:
        """How deep a validation chain drafts."""
        raise NotImplementedError


class EagleObjective(Objective):
    """EAGLE's training-time test; a parallel head (``TrainConfig.parallel`` = K) unrolls K steps
    with placeholder inputs after the first (``eagle_unroll``)."""

    kind = "eagle"

    def head_config(self, cfg, target) -> HeadConfig:
        head = new_config(self.kind, target, list(cfg.layers), 0, cfg.intermediate_size)
        head.parallel, head.mask_token_id, head.num_layers = cfg.parallel, cfg.mask_token_id, cfg.head_layers
        return head

    def outputs(self, module, b, steps: int, embed: Tensor) -> list[Tensor]:
        g0 = module.fused(b.feats)
        emb_next = embed[b.tokens.roll(-1, 1)]                                   # x_{u+1} (last: unused)
        c = module.cfg
        hold = (module.placeholder_state(), embed[c.mask_token_id]) if c.parallel else None
        return [module.norm(o) for o in eagle_unroll(module, g0, emb_next, steps, hold)]

    def alignment(self, j: int) -> tuple[int, int]:
        return 1, j

    def val_depth(self, cfg) -> int:
        return cfg.parallel or cfg.val_depth


class Eagle3Objective(EagleObjective):
    """EAGLE-3's exact layout, trained as ``eagle`` is; refused unless vLLM and SGLang could serve it."""

    kind = "eagle3"

    def head_config(self, cfg, target) -> HeadConfig:
        check_eagle3_layers(cfg.layers, target.config.num_layers)
        return super().head_config(cfg, target)


class MedusaObjective(Objective):
    def head_config(self, cfg, target) -> HeadConfig:
        return new_config("medusa", target, [target.config.num_layers], cfg.num_medusa, cfg.intermediate_size)

    def outputs(self, module, b, steps: int, embed: Tensor) -> list[Tensor]:
        hs = module(b.final)                                                     # [B, T, M, hidden]
        return [hs[:, :, j] for j in range(hs.shape[2])]

    def alignment(self, j: int) -> tuple[int, int]:
        return 1 + j, 0

    def val_depth(self, cfg) -> int:
        return cfg.num_medusa


OBJECTIVES: dict[str, Objective] = {"eagle": EagleObjective(), "eagle3": Eagle3Objective(),
                                    "medusa": MedusaObjective()}
