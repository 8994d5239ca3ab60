"""A learned drafter's EAGLE layer (``specserve.models.draft_layer``) on the native kernels: one call
(``ss_draft_layer``, draft_layer.cpp) runs the whole layer for every entry of every sequence in a
head call, its products on the same kernels and in the same formats as ``NativeModel.matmul``."""

from __future__ import annotations

import torch
from torch import Tensor

from specserve.models.draft_layer import DraftLayerSpec, DraftPart
from specserve.models.native.abi import SsDraftLayer, SsDraftPart, run_draft_layer
from specserve.models.native.build import library
from specserve.models.native.formats import BlockWeight

NORMS = ("norm_e", "norm_g", "attn_norm", "mlp_norm")
PRODUCTS = ("fc", "qkv", "o", "gate_up", "down")
LAYOUTS = {"eagle": 0, "eagle3": 1, "decoder": 2}        # SsDraftLayer.layout


class NativeDraftLayer:
    """``spec``'s layer with its products converted once by ``block`` (weight [out, in] -> the kernels'
    blocks).  ``layer(g, emb, pos, cos, sin, parts)`` runs one call; ``norm(x, w)`` is the kernels'
    RMSNorm with the layer's epsilon."""

    def __init__(self, spec: DraftLayerSpec, block):
        self.spec, self.lib = spec, library()
        self.norms = {n: spec.weights[n].detach().float().contiguous() for n in NORMS if n in spec.weights}
        self.products: dict[str, BlockWeight] = {n: block(spec.weights[n]) for n in PRODUCTS if n in spec.weights}
        fields = {n: w.data_ptr() for n, w in self.norms.items()}
        for n, w in self.products.items():
            fields[n], fields[f"{n}_fmt"] = w.data.data_ptr(), w.fmt
        # the call's structure, its fixed fields set once (a call sets the rest: one caller at a time)
        self.call = SsDraftLayer.new(layout=LAYOUTS[spec.layout], hid=spec.hidden, H=spec.heads,
                                     Hkv=spec.kv_heads, D=spec.head_dim, inter=spec.intermediate, eps=spec.eps,
                                     scale=spec.head_dim ** -0.5, **fields)

    def __call__(self, g: Tensor, emb: Tensor | None, pos: Tensor, cos: Tensor, sin: Tensor,
                 parts: list[DraftPart]) -> Tensor:
        """g, emb [M, hidden] float32 (emb: None for the ``decoder`` layout, which reads none), pos [M] int64, cos, sin [positions, (1,) head_dim] (rotate-half
        tables, sin's first half negated), parts covering the M rows in order -> outputs [M, hidden]."""
        g, pos = g.float().contiguous(), pos.to(torch.int64).contiguous()
        if emb is None and self.spec.layout != "decoder":
            raise ValueError(f"draft layer: the {self.spec.layout} layout reads the entries' embeddings")
        emb = g if emb is None else emb.float().contiguous()
        m = len(g)
        out = torch.empty(m, self.spec.hidden)
        table = (SsDraftPart * len(parts))()
        row = 0
        for i, p in enumerate(parts):
            mask = p.mask
            if p.k.dtype != torch.float32 or p.v.dtype != torch.float32 or not (p.k.is_contiguous() and p.v.is_contiguous()):
                raise ValueError("draft layer: a part's keys and values must be contiguous float32 buffers")
            if mask is not None and (mask.dtype != torch.bool or mask.stride(1) != 1):
                raise ValueError("draft layer: a part's mask must be bool with contiguous rows")
            table[i] = SsDraftPart(k=p.k.data_ptr(), v=p.v.data_ptr(), capacity=p.k.shape[0], row0=row, m=p.m,
                                   at=p.at, n_real=p.n_real, mask=mask.data_ptr() if mask is not None else None,
                                   mask_stride=mask.stride(0) if mask is not None else 0)
            row += p.m
        if row != m:
            raise ValueError(f"draft layer: the parts cover {row} rows of {m}")
        c = self.call
        c.M, c.B, c.g, c.emb, c.pos, c.out = m, len(parts), g.data_ptr(), emb.data_ptr(), pos.data_ptr(), out.data_ptr()
        c.cos, c.sin, c.positions, c.parts = cos.data_ptr(), sin.data_ptr(), cos.shape[0], table
        run_draft_layer(self.lib, c)
        return out

    def norm(self, x: Tensor, w: Tensor) -> Tensor:
        """x [M, hidden] float32 contiguous, w [hidden] float32 -> RMSNorm(x) * w with the layer's epsilon."""
        out = torch.empty_like(x)
        self.lib.ss_rmsnorm(x.data_ptr(), w.data_ptr(), x.shape[0], x.shape[1], self.spec.eps, out.data_ptr())
        return out
