"""Building blocks of the torch decoder (``llama.Transformer``): linear kernels, RMSNorm, rotary
embeddings, attention.  The default CPU runtime is the native one (``specserve/models/native``);
these modules serve ``--kernels torch`` and ``--kernels fbgemm`` (and CUDA).

Two linear kernels exist (``LINEAR_KERNELS``):

* ``torch``: ``F.linear`` in the model dtype.  Matches Hugging Face numerics (the parity test),
  but on CPU MKL picks different code paths for 1, 2-15 and 16+ rows, so a token scored in a
  1-row decoding pass and in a (k+1)-row verification pass can differ in the last bits.
* ``fbgemm``: FBGEMM's packed fp16-weight GEMM with fp32 activations (CPU only).  Every row of
  the output depends only on that row of the input, whatever the row count: batch-invariant.
  Weights are rounded to fp16 once at load time.

Two attention paths exist (``ATTENTION``):

* ``sdpa``: ``scaled_dot_product_attention``; fast, not invariant to the number of queries or keys.
* ``invariant``: queries padded to a fixed block of ``QUERY_BLOCK`` and keys split in blocks of
  ``KEY_BLOCK``; every GEMM has a fixed shape, block partial sums are accumulated by a sequential
  ``cumsum``, so appending masked keys adds exact zeros.  A query's output is bit-identical in a
  1-token decoding pass and in any verification pass of up to ``QUERY_BLOCK`` tokens, alone or
  batched.  Tree passes, and chains of up to ``VIRTUAL_MAX_TOKENS`` tokens, run every token as a
  *virtual row*: a one-query row whose keys are gathered in virtual order (the cached prefix, then
  the token's path), which is exactly the decoding pass of that token, so the same bits again at
  the price of copying each token's keys.  Longer passes (prefill) use ``sdpa``; prefill is the
  same call in plain and speculative decoding.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specserve.models.decoder import ancestor_mask

LINEAR_KERNELS = ("torch", "fbgemm")
ATTENTION = ("sdpa", "invariant")
QUERY_BLOCK = 16
KEY_BLOCK = 64
VIRTUAL_MAX_TOKENS = 80
# FBGEMM's fp16-weight GEMM is not row-invariant on AVX2-only CPUs (AMD EPYC Zen 3): the rows of a
# block of 1 or 2 at the end of a pass come from other microkernels, with other bits.  So the fbgemm
# Linear always calls it on exactly FBGEMM_ROWS rows (the last call padded with zeros): every row is
# computed by the same call shape whatever the pass's length.  The price is arithmetic on the padding
# (a decoding pass computes 6 rows) and one weight read per 6 rows of a prompt chunk.
FBGEMM_ROWS = 6


def fbgemm_available() -> bool:
    """True when this torch build has FBGEMM's fp16-weight GEMM (x86 CPU builds)."""
    try:
        packed = torch.ops.aten.fbgemm_pack_gemm_matrix_fp16(torch.zeros(8, 8))
        torch.ops.aten.fbgemm_linear_fp16_weight(torch.zeros(1, 8), packed, torch.zeros(8))
        return True
    except Exception:  # noqa: BLE001 - any failure means the kernel is unusable here
        return False


class Linear(nn.Module):
    """y = x W^T + b with the selected kernel.  weight: [out, in]."""

    def __init__(self, weight: Tensor, bias: Tensor | None, kernel: str):
        super().__init__()
        self.kernel = kernel
        self.out_features = weight.shape[0]
        if kernel == "fbgemm":
            self.packed = torch.ops.aten.fbgemm_pack_gemm_matrix_fp16(weight.float().contiguous())
            self.bias = bias.float() if bias is not None else torch.zeros(weight.shape[0])
            self.weight = None
        else:
            self.weight = weight
            self.bias = bias

    def forward(self, x: Tensor) -> Tensor:  # x: [..., in]
        if self.kernel == "fbgemm":
            rows = x.reshape(-1, x.shape[-1])
            m, pad = rows.shape[0], -rows.shape[0] % FBGEMM_ROWS
            if pad:
                rows = torch.cat([rows, rows.new_zeros(pad, rows.shape[1])])
            blocks = [torch.ops.aten.fbgemm_linear_fp16_weight(rows[i:i + FBGEMM_ROWS], self.packed, self.bias)
                      for i in range(0, rows.shape[0], FBGEMM_ROWS)]
            y = torch.cat(blocks)[:m] if blocks else rows.new_zeros(0, self.out_features)
            return y.view(*x.shape[:-1], self.out_features)
        return F.linear(x, self.weight, self.bias)


class RMSNorm(nn.Module):
    """x * rsqrt(mean(x^2) + eps) * weight over the last dimension: the normalisation in float32, the
    product with the weight in x's dtype (Hugging Face's Llama order; on float32 the operations of
    ``F.rms_norm``, in its order).  ``weight``: a loaded tensor (a target's norm, kept as given), or a
    size (a trainable weight of ones, as a drafter head's; its state_dict key is ``weight``)."""

    def __init__(self, weight: Tensor | int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(weight)) if isinstance(weight, int) else weight
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:  # x: [..., dim]
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None) -> Tensor:
    """Inverse frequencies [head_dim // 2], with Llama 3 scaling when configured (as Hugging Face's
    parameters, or as GGUF's per-frequency divisors ``freq_factors``)."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if scaling is None:
        return inv
    if scaling.get("rope_type") == "freq_factors":
        return inv / torch.tensor(scaling["factors"], dtype=torch.float32)
    factor = scaling["factor"]
    low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
    old_len = scaling.get("original_max_position_embeddings", 8192)
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope_tables(inv_freq: Tensor, length: int) -> tuple[Tensor, Tensor]:
    """cos, sin tables [length, head_dim] in float32, Hugging Face layout (halves concatenated)."""
    pos = torch.arange(length, dtype=torch.float32)
    freqs = torch.outer(pos, inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def rope_tables_by_base(cfg, length: int) -> dict[float, tuple[Tensor, Tensor]]:
    """Contiguous (cos, sin) tables [length, head_dim] for every rotary base ``cfg`` (a ModelConfig)
    uses in some layer (Gemma 3: one for its windowed layers, one for the global ones).  The
    configured scaling applies to the base ``rope_theta`` only."""
    tables: dict[float, tuple[Tensor, Tensor]] = {}
    for theta in sorted({cfg.layer_rope_theta(i) for i in range(cfg.num_layers)}):
        scaling = cfg.rope_scaling if theta == cfg.rope_theta else None
        cos, sin = rope_tables(rope_inv_freq(cfg.head_dim, theta, scaling), length)
        tables[theta] = (cos.contiguous(), sin.contiguous())
    return tables


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate-half RoPE: x [..., D] (the torch runtime's [B, H, T, D]); cos, sin broadcast to x ([B, 1, T, D])."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def sdpa_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """q: [B, H, T, D]; k, v: [B, Hkv, S, D]; mask: [B, 1, T, S] bool (True = attend)."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=q.shape[1] != k.shape[1])


def invariant_attention_bias(q_pos: Tensor, groups: int, s_used: int, dtype: torch.dtype) -> Tensor:
    """Additive mask for ``invariant_attention``.

    q_pos: [B, QUERY_BLOCK] absolute positions of the (padded) queries.
    Returns [B, 1, S/KEY_BLOCK, groups*QUERY_BLOCK, KEY_BLOCK]: 0 where key <= query, -inf elsewhere.
    """
    n = s_used // KEY_BLOCK
    k_pos = torch.arange(s_used, device=q_pos.device).view(n, KEY_BLOCK)
    qp = q_pos.repeat(1, groups)                                   # [B, groups*QB], group-major
    future = k_pos[None, None, :, None, :] > qp[:, None, None, :, None]
    return torch.zeros(future.shape, dtype=dtype, device=q_pos.device).masked_fill_(future, float("-inf"))


def invariant_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor) -> Tensor:
    """Batch-invariant attention over fixed-shape blocks.

    q: [B, H, T, D] with T <= QUERY_BLOCK; k, v: [B, Hkv, S, D] with S a multiple of KEY_BLOCK;
    bias: from ``invariant_attention_bias``.  Returns [B, H, T, D].
    """
    b, h, t, d = q.shape
    hkv, s = k.shape[1], k.shape[2]
    groups, n = h // hkv, s // KEY_BLOCK
    if t < QUERY_BLOCK:
        q = torch.cat([q, q.new_zeros(b, h, QUERY_BLOCK - t, d)], dim=2)
    qg = q.reshape(b, hkv, 1, groups * QUERY_BLOCK, d)            # heads sharing a kv head, stacked
    kb = k.reshape(b, hkv, n, KEY_BLOCK, d)
    vb = v.reshape(b, hkv, n, KEY_BLOCK, d)
    scores = torch.matmul(qg, kb.transpose(-1, -2)).mul_(d ** -0.5).add_(bias)  # [b,hkv,n,M,KB]
    scores = scores.sub_(scores.amax(dim=(2, 4), keepdim=True)).exp_()
    num = torch.matmul(scores, vb).cumsum_(2)[:, :, -1]           # [b, hkv, M, d], blocks in order
    den = scores.sum(-1).cumsum_(2)[:, :, -1]                     # [b, hkv, M]
    out = (num / den.unsqueeze(-1)).reshape(b, h, QUERY_BLOCK, d)
    return out[:, :, :t]


def virtual_key_slots(start: Tensor, parents: Tensor | None, depth: Tensor) -> Tensor:
    """Cache slots of each token's keys in virtual order, for ``invariant_attention`` per token.

    start: [B] prefix lengths; parents: [B, T] (None: a chain); depth: [B, T].
    Returns [B, T, S'] with S' a multiple of KEY_BLOCK: virtual key v of token (b, t) is slot v for
    v < start[b], then the slot of its depth-(v - start[b]) ancestor (itself last), then slot 0
    (masked: beyond the token's position).  Example: start 2, parents [-1, 0, 0] -> token 2's
    keys are slots [0, 1, 2, 4, 0, ...].
    """
    bsz, t = depth.shape
    dev = depth.device
    if parents is None:
        parents = (torch.arange(t, device=dev) - 1)[None].expand(bsz, t)
    anc = ancestor_mask(parents)                                               # [B, T, T]
    # path[b, t, e]: the ancestor of t at depth e (scatter each ancestor u to column depth[u])
    col = torch.where(anc, depth[:, None, :], t)                               # [B, T, T]
    src = torch.arange(t, device=dev).expand(bsz, t, t)
    path = torch.zeros(bsz, t, t + 1, dtype=torch.long, device=dev).scatter_(2, col, src)[..., :t]
    s_v = int((start[:, None] + depth).max()) + 1
    s_v = -(-s_v // KEY_BLOCK) * KEY_BLOCK
    v = torch.arange(s_v, device=dev)[None, None, :]                           # [1, 1, S']
    rel = v - start[:, None, None]                                             # [B, 1, S']
    on_path = (rel >= 0) & (rel <= depth[:, :, None])                          # [B, T, S']
    path_slot = start[:, None, None] + path.gather(2, rel.clamp(0, t - 1).expand(bsz, t, s_v))
    return torch.where(rel < 0, v, torch.where(on_path, path_slot, 0))
