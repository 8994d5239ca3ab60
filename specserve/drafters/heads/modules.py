"""The learned heads' modules: an EAGLE head (one decoder layer over target features) and Medusa heads.

Both predict over a *reduced vocabulary* (FR-Spec): ``vocab_ids`` [Vr], the most frequent tokens of
the training data; their logits are the target's own LM-head rows for those tokens (frozen, not
stored with the head) applied to the head's normed output.  Outside the subset q is zero.

Terms.  Position t of a sequence has token x_t and target features f_t (computed with x_t as the
newest token; the target's distribution at t is over x_{t+1}).  Layers are named as in
``Decoder.forward``: i < L is the input of layer i, L the final normed output.

* **EAGLE** (one layer of the target's shape): the fused feature g_t = fuse(f_t) (the chosen layers
  concatenated, one linear map), and the embedding of x_{t+1}, go in; the output o_t predicts
  x_{t+2}.  Drafting deeper, the output o_t stands in for g_{t+1}, whose real features are not yet
  known.  The layer attends causally over the sequence (rotary positions as the target's).  Two
  layouts of that layer, the same inputs and outputs:

  - ``eagle`` (``EagleHead``, the shipped head's): x = fc([emb_norm(e) ; feat_norm(g)]), then a
    standard pre-norm decoder layer over x (the residual stream starts at x).
  - ``eagle3`` (``Eagle3Head``, EAGLE-3's exact layout, the one vLLM and SGLang load as
    ``LlamaForCausalLMEagle3``): q, k, v read [input_norm(e) ; hidden_norm(g)] (2 * hidden wide),
    the residual stream starts at g itself, then post_norm and the MLP; no fc.

  A **parallel** head (``parallel`` = K > 0, P-EAGLE) drafts K tokens in one pass: after the real
  entry at n - 1 (predicting x_{n+1}) come K - 1 *placeholder* entries at positions n .. n + K - 2,
  whose inputs stand for the unknown ones: the embedding of ``mask_token_id`` (the target's, frozen)
  and the state fuse(``mask_hidden``), a learned vector in the features' space [F * hidden] (vLLM's
  ``mask_hidden``); placeholder entry i (1..K-1) attends causally to the real entries and to the
  placeholders before it, and its output predicts x_{n+1+i}.

  A head of ``num_layers`` > 1 runs ``num_layers - 1`` plain pre-norm decoder layers (``DecoderLayer``,
  each with its own keys and values) after the first, the last one's output being o_t; their
  residual branches start at zero (``o`` and ``down``), so a deeper head warm-started from a
  shallower one begins as exactly that head (P-EAGLE's drafters are several layers deep: a
  placeholder entry of a second layer sees what the first made of the entries before it, where
  in one layer every placeholder reads the same inputs).

  Both expose the drafter's and the trainer's pieces: ``fused``, ``inputs`` (the layer input x),
  ``qkv`` (attention is computed outside, over whatever keys a tree allows), ``finish`` and ``norm``;
  each takes optional ``lin``, its linear maps by name (``LINEARS``) on other kernels.  What the two
  layouts differ in is ``inputs``, ``normed`` (x -> the attention's input), ``residual`` (x -> the
  residual stream's start) and ``mlp_norm``; the rest is shared.
* **Medusa**: head j (1..M) is a residual block over f^L_t whose output predicts x_{t+1+j}.

Tensors are float32 on the CPU at draft time; training (``specserve.train``) runs the same modules.
Saving, loading and the target check: ``specserve.drafters.heads.files``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specserve.models.layers import RMSNorm, apply_rope, rope_inv_freq


@dataclass
class HeadConfig:
    kind: str                           # eagle | eagle3 | medusa
    feature_layers: list[int]           # target layers read (see the module docstring)
    hidden_size: int
    num_heads: int = 0                  # eagle: the layer's attention shape (the target's)
    num_kv_heads: int = 0
    head_dim: int = 0
    intermediate_size: int = 0
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    num_medusa: int = 0                 # medusa: heads (offsets +2 .. +1+M from the pending token)
    parallel: int = 0                   # eagle, eagle3: positions one pass drafts (P-EAGLE; 0: one per pass)
    num_layers: int = 1                 # eagle, eagle3: decoder layers (the first of the layout, then plain ones)
    mask_token_id: int = 0              # parallel: the placeholder token whose (target) embedding fills a slot
    vocab_size: int = 0                 # the target's vocabulary
    target: dict = field(default_factory=dict)     # what the head was trained for (see ``target_signature``)
    training: dict = field(default_factory=dict)   # command, data and results behind the head

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)


def rotary(x: Tensor, pos: Tensor, theta: float) -> Tensor:
    """Rotate-half RoPE (the target's: ``models.layers``): x [..., T, heads, d], pos [..., T] (int) -> same shape."""
    d = x.shape[-1]
    ang = pos.to(torch.float32)[..., None] * rope_inv_freq(d, theta, None).to(x.device)    # [..., T, d/2]
    cos, sin = torch.cat([ang.cos()] * 2, -1)[..., None, :], torch.cat([ang.sin()] * 2, -1)[..., None, :]
    return apply_rope(x, cos, sin)


Linears = Mapping[str, Callable[[Tensor], Tensor]] | None    # a head's linear maps by name (None: its own)


class _OneLayer(nn.Module):
    """What every EAGLE head layer shares: attention's projections, the SiLU-gated MLP."""

    LINEARS: tuple[str, ...] = ()

    def _lin(self, lin: Linears, name: str) -> Callable[[Tensor], Tensor]:
        return lin[name] if lin is not None else getattr(self, name)

    def qkv_weight(self) -> Tensor:
        """q's and kv's weights as the one product a runtime runs [(H + 2 Hkv) d, in]."""
        return torch.cat([self.q.weight, self.kv.weight])

    def _project(self, hn: Tensor, pos: Tensor, lin: Linears) -> tuple[Tensor, Tensor, Tensor]:
        """hn [..., T, in], pos [..., T] -> q [..., T, H, d], k, v [..., T, Hkv, d] (RoPE applied)."""
        c = self.cfg
        q = self._lin(lin, "q")(hn).unflatten(-1, (c.num_heads, c.head_dim))
        k, v = self._lin(lin, "kv")(hn).unflatten(-1, (2, c.num_kv_heads, c.head_dim)).unbind(-3)
        return rotary(q, pos, c.rope_theta), rotary(k, pos, c.rope_theta), v

    def normed(self, x: Tensor) -> Tensor:
        """The layer input x -> what q, k and v are read from [..., in]."""
        raise NotImplementedError

    def residual(self, x: Tensor) -> Tensor:
        """The layer input x -> where the residual stream starts [..., hidden]."""
        raise NotImplementedError

    def qkv(self, x: Tensor, pos: Tensor, lin: Linears = None) -> tuple[Tensor, Tensor, Tensor]:
        """x [..., T, in] (the layer input), pos [..., T] -> q [..., T, H, d], k, v [..., T, Hkv, d] (RoPE applied)."""
        return self._project(self.normed(x), pos, lin)

    def finish(self, x: Tensor, att: Tensor, lin: Linears = None) -> Tensor:
        """x [..., in] (the layer input), att [..., H * d] -> the layer output o [..., hidden]."""
        return self.mlp(self.residual(x) + self._lin(lin, "o")(att), lin)

    def mlp(self, r: Tensor, lin: Linears = None) -> Tensor:
        """r [..., hidden] (the residual stream after attention) -> r + down(SiLU(gate) * up)(mlp_norm(r))."""
        a, b = self._lin(lin, "gate_up")(self.mlp_norm(r)).chunk(2, -1)
        return r + self._lin(lin, "down")(F.silu(a) * b)


class _EagleHeadBase(_OneLayer):
    """What both EAGLE layouts add to their first layer: the fusion, a parallel head's placeholder,
    the deeper layers after it."""

    def _placeholder(self, cfg: HeadConfig) -> None:
        """A parallel head's learned placeholder state, in the features' space (module docstring)."""
        if cfg.parallel:
            self.mask_hidden = nn.Parameter(torch.randn(len(cfg.feature_layers) * cfg.hidden_size) * 0.02)

    def _deeper(self, cfg: HeadConfig) -> None:
        """The plain decoder layers after the first (module docstring)."""
        if cfg.num_layers < 1:
            raise ValueError(f"an EAGLE head has at least one layer, not {cfg.num_layers}")
        self.extra = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers - 1))

    def stack(self) -> list["_OneLayer"]:
        """The head's decoder layers in order: itself (the layout's first layer), then ``extra``."""
        return [self, *self.extra]

    def placeholder_state(self, lin: Linears = None) -> Tensor:
        """The placeholder entries' state g = fuse(mask_hidden) [hidden]."""
        return self._lin(lin, "fuse")(self.mask_hidden[None])[0]

    def fused(self, feats: Tensor, lin: Linears = None) -> Tensor:
        """feats [..., F, hidden] (the configured layers, in order) -> g [..., hidden]."""
        return self._lin(lin, "fuse")(feats.flatten(-2))


class _PreNormLayer(_OneLayer):
    """A standard pre-norm decoder layer of the target's shape over x [..., hidden]: attn_norm, q, kv,
    o, then ffn_norm and the gated MLP, the residual stream starting at x.  The ``eagle`` layout's
    layer (after its fc) and the plain layers of a deeper head (``DecoderLayer``)."""

    def _pre_norm_layer(self, cfg: HeadConfig) -> None:
        h = cfg.hidden_size
        self.attn_norm, self.ffn_norm = RMSNorm(h, cfg.rms_norm_eps), RMSNorm(h, cfg.rms_norm_eps)
        self.q = nn.Linear(h, cfg.num_heads * cfg.head_dim, bias=False)
        self.kv = nn.Linear(h, 2 * cfg.num_kv_heads * cfg.head_dim, bias=False)
        self.o = nn.Linear(cfg.num_heads * cfg.head_dim, h, bias=False)
        self.gate_up = nn.Linear(h, 2 * cfg.intermediate_size, bias=False)
        self.down = nn.Linear(cfg.intermediate_size, h, bias=False)

    def layer_weights(self) -> dict[str, Tensor]:
        """The layer's weights by the names a runtime's one-call layer reads (``models.draft_layer``)."""
        return {"attn_norm": self.attn_norm.weight, "qkv": self.qkv_weight(),
                "o": self.o.weight, "mlp_norm": self.ffn_norm.weight, "gate_up": self.gate_up.weight,
                "down": self.down.weight}

    def normed(self, x: Tensor) -> Tensor:
        return self.attn_norm(x)

    def residual(self, x: Tensor) -> Tensor:
        return x

    @property
    def mlp_norm(self) -> nn.Module:
        return self.ffn_norm


class DecoderLayer(_PreNormLayer):
    """A plain pre-norm decoder layer: a deeper EAGLE head's layers after the first (module
    docstring); its input x is the previous layer's output."""

    LINEARS = ("q", "kv", "o", "gate_up", "down")

    def __init__(self, cfg: HeadConfig):
        super().__init__()
        self.cfg = cfg
        self._pre_norm_layer(cfg)
        nn.init.zeros_(self.o.weight)          # the residual branches start at zero: the layer starts
        nn.init.zeros_(self.down.weight)       # as the identity

    def draft_weights(self) -> dict[str, Tensor]:
        return self.layer_weights()


class EagleHead(_PreNormLayer, _EagleHeadBase):
    """fuse -> [embedding ; fused feature] -> fc -> one pre-norm decoder layer -> norm (-> reduced LM head)."""

    LINEARS = ("fuse", "fc", "q", "kv", "o", "gate_up", "down")

    def __init__(self, cfg: HeadConfig):
        super().__init__()
        h = cfg.hidden_size
        self.cfg = cfg
        self.fuse = nn.Linear(len(cfg.feature_layers) * h, h, bias=False)
        self.emb_norm, self.feat_norm = RMSNorm(h, cfg.rms_norm_eps), RMSNorm(h, cfg.rms_norm_eps)
        self.fc = nn.Linear(2 * h, h, bias=False)
        self._pre_norm_layer(cfg)
        self.norm = RMSNorm(h, cfg.rms_norm_eps)
        self._placeholder(cfg)
        self._deeper(cfg)

    def draft_weights(self) -> dict[str, Tensor]:
        """The layer's weights by the names a runtime's one-call layer reads (``models.draft_layer``)."""
        return {"norm_e": self.emb_norm.weight, "norm_g": self.feat_norm.weight, "fc": self.fc.weight,
                **self.layer_weights()}

    def inputs(self, g: Tensor, emb: Tensor, lin: Linears = None) -> Tensor:
        """g, emb [..., hidden] -> the layer's input x [..., hidden]."""
        return self._lin(lin, "fc")(torch.cat([self.emb_norm(emb), self.feat_norm(g)], -1))


class Eagle3Head(_EagleHeadBase):
    """EAGLE-3's layout (vLLM's and SGLang's ``LlamaForCausalLMEagle3``): fuse -> g; attention over
    [input_norm(embedding) ; hidden_norm(g)] with g as the residual; post_norm, MLP; norm.

    Its layer input x [..., 2 * hidden] is [input_norm(e) ; g]: the normed embedding and the raw
    state, which ``qkv`` norms and ``finish`` takes as the residual.  The output o (before ``norm``)
    is what vLLM calls the pre-norm hidden state, fed back as the next draft step's g."""

    LINEARS = ("fuse", "q", "kv", "o", "gate_up", "down")

    def __init__(self, cfg: HeadConfig):
        super().__init__()
        h = cfg.hidden_size
        self.cfg = cfg
        self.fuse = nn.Linear(len(cfg.feature_layers) * h, h, bias=False)                # vLLM's fc
        self.input_norm, self.hidden_norm = RMSNorm(h, cfg.rms_norm_eps), RMSNorm(h, cfg.rms_norm_eps)
        self.q = nn.Linear(2 * h, cfg.num_heads * cfg.head_dim, bias=False)
        self.kv = nn.Linear(2 * h, 2 * cfg.num_kv_heads * cfg.head_dim, bias=False)      # k rows first
        self.o = nn.Linear(cfg.num_heads * cfg.head_dim, h, bias=False)
        self.post_norm = RMSNorm(h, cfg.rms_norm_eps)
        self.gate_up = nn.Linear(h, 2 * cfg.intermediate_size, bias=False)               # gate rows first
        self.down = nn.Linear(cfg.intermediate_size, h, bias=False)
        self.norm = RMSNorm(h, cfg.rms_norm_eps)
        self._placeholder(cfg)
        self._deeper(cfg)

    def draft_weights(self) -> dict[str, Tensor]:
        """The layer's weights by the names a runtime's one-call layer reads (``models.draft_layer``)."""
        return {"norm_e": self.input_norm.weight, "norm_g": self.hidden_norm.weight,
                "qkv": self.qkv_weight(), "o": self.o.weight,
                "mlp_norm": self.post_norm.weight, "gate_up": self.gate_up.weight, "down": self.down.weight}

    def inputs(self, g: Tensor, emb: Tensor, lin: Linears = None) -> Tensor:
        """g, emb [..., hidden] -> the layer's input x = [input_norm(emb) ; g] [..., 2 * hidden]."""
        return torch.cat([self.input_norm(emb), g], -1)

    def normed(self, x: Tensor) -> Tensor:
        h = self.cfg.hidden_size
        return torch.cat([x[..., :h], self.hidden_norm(x[..., h:])], -1)

    def residual(self, x: Tensor) -> Tensor:
        return x[..., self.cfg.hidden_size:]

    @property
    def mlp_norm(self) -> nn.Module:
        return self.post_norm


class MedusaHeads(nn.Module):
    """M residual blocks h + SiLU(W h + b) over the final normed feature."""

    def __init__(self, cfg: HeadConfig):
        super().__init__()
        self.cfg = cfg
        self.blocks = nn.ModuleList(nn.Linear(cfg.hidden_size, cfg.hidden_size) for _ in range(cfg.num_medusa))
        for b in self.blocks:
            nn.init.zeros_(b.weight)          # start as the target's own head (Medusa's initialisation)
            nn.init.zeros_(b.bias)

    def forward(self, f: Tensor) -> Tensor:
        """f [..., hidden] -> [..., M, hidden], block j predicting x_{t+2+j} (j from 0)."""
        return torch.stack([f + F.silu(b(f)) for b in self.blocks], -2)


MODULES: dict[str, type[nn.Module]] = {"eagle": EagleHead, "eagle3": Eagle3Head,     # HeadConfig.kind -> module
                                       "medusa": MedusaHeads}


def build(cfg: HeadConfig) -> nn.Module:
    """A new (untrained) head module of ``cfg.kind``."""
    if cfg.kind not in MODULES:
        raise ValueError(f"unknown head kind {cfg.kind!r}")
    return MODULES[cfg.kind](cfg)
