"""A learned drafter's EAGLE layer as a runtime may run it in one call (``Decoder.draft_layer``).

The layer is one decoder layer over the target's features (``specserve.drafters.heads.modules``
defines it and trains it; this module only names what a runtime needs to run it).  For M entries it
reads g [M, hidden] (state inputs: fused target features, or a parent's output), the embeddings e
[M, hidden] of their tokens and their rotary positions, and writes each entry's key and value into
its sequence's buffers before attending there.  Three layouts, with these weights (``WEIGHTS``):

* ``eagle``: x = fc([norm_e(e) ; norm_g(g)]), a = attn_norm(x), the residual stream starts at x;
* ``eagle3``: a = [norm_e(e) ; norm_g(g)] (2 * hidden wide), the residual stream starts at g;
* ``decoder`` (a deeper head's layers after the first): x = g, the previous layer's output (e is
  not read), a = attn_norm(x), the residual stream starts at x;

then, in both: q, k, v = qkv(a) (rotate-half RoPE on q and k), attention of each entry over its
sequence's keys (``DraftPart``), r = residual + o(att), out = r + down(SiLU(gate) * up) with
[gate ; up] = gate_up(mlp_norm(r)).  Products are [out, in] weights; norms are [hidden] weights with
the layer's epsilon.  The final norm before the reduced LM head is the caller's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from torch import Tensor

# The weights each layout reads, by name (module docstring).
WEIGHTS = {"eagle": ("norm_e", "norm_g", "fc", "attn_norm", "qkv", "o", "mlp_norm", "gate_up", "down"),
           "eagle3": ("norm_e", "norm_g", "qkv", "o", "mlp_norm", "gate_up", "down"),
           "decoder": ("attn_norm", "qkv", "o", "mlp_norm", "gate_up", "down")}


@dataclass(frozen=True)
class DraftLayerSpec:
    layout: str                      # eagle | eagle3 | decoder
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    eps: float
    weights: dict[str, Tensor]       # WEIGHTS[layout], float32 on the CPU

    def __post_init__(self):
        if self.layout not in WEIGHTS:
            raise ValueError(f"unknown draft layer layout {self.layout!r} (one of {', '.join(WEIGHTS)})")
        missing = [n for n in WEIGHTS[self.layout] if n not in self.weights]
        if missing:
            raise ValueError(f"a {self.layout} draft layer needs the weights {', '.join(missing)}")


class DraftPart(NamedTuple):
    """One sequence's m consecutive entries of a call: its key and value buffers k, v [capacity,
    kv_heads, head_dim] (float32, contiguous), written at slots at .. at+m-1.  Entry r attends to every
    slot below n_real and, of slots n_real .. at+m-1, those ``mask`` [m, >= at+m-n_real] (bool, rows
    contiguous) marks (None: causal, every slot up to its own)."""
    k: Tensor
    v: Tensor
    at: int
    m: int
    n_real: int
    mask: Tensor | None
