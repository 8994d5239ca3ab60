"""The Llama-family decoder on the native CPU kernels (``kernels=native``).

Implements the decoder protocol (``specserve.models.decoder``) like ``llama.Transformer``, on a
different runtime: weights stay in the blocks they were stored in (GGUF blocks; fp32 for float
checkpoints), activations are int8 (block weights repacked for integer products in the file's own
bits, ``packed.py``) or fp32 (``activations``; Q4_0 / Q5_0 then run as the Q8_0 blocks that hold them
exactly), and a whole pass is one call
into the C++ kernels (``ss_forward``, forward.cpp) over buffers allocated once per pass.  Every
kernel is batch-invariant by construction (see the header of simd.h), so one token's logits are
bit-identical however many tokens, rows or cache slots share its pass, for decoding, verification
and prompt prefill alike: a prompt prefilled whole, in chunks of any size, or beside other
sequences' decoding leaves the same bits in the cache.
"""

from __future__ import annotations

import copy
import ctypes
import dataclasses
import threading
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from torch import Tensor, nn

from specserve.limits import NO_LIMIT
from specserve.models.config import ModelConfig
from specserve.models.decoder import PARTS, ForwardOutput, Layout, OnCpu, PartTimer, logit_rows
from specserve.models.gguf_file import release_mapped
from specserve.models.kv_cache import KVCache
from specserve.models.draft_layer import DraftLayerSpec
from specserve.models.layers import KEY_BLOCK, rope_tables_by_base
from specserve.models.native.abi import MAX_TREE_TOKENS, SsLayer, SsPass, run_pass
from specserve.models.native.build import library
from specserve.models.native.draft_layer import NativeDraftLayer
from specserve.models.native.formats import F16, Q4_0, Q5_0, BlockWeight, NativeWeight
from specserve.models.native.kernels import linear, move_slots
from specserve.models.native.packed import ACTIVATIONS, FusedParts, PackedWeight, fuse, packable, quantize_q8_0

MAX_HEAD_DIM = 256
# The KV cache's element types (``kv``): fp32, or bf16 (half the bytes attention reads; keys and values
# rounded to bf16 when written, read back exactly; see layer_ops.cpp).  The kernels' code for each.
KV_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}
KV_CODES = {"f32": 0, "bf16": 1}
SCRATCH_KEPT = 64          # passes of at most this many tokens reuse their scratch buffers


def as_native(w: "Tensor | NativeWeight") -> NativeWeight:
    """A weight as the kernels read it: GGUF blocks as they are, float tensors as fp32 rows."""
    return w if isinstance(w, NativeWeight) else NativeWeight.from_float(w)


def for_float_activations(w: "NativeWeight | FusedParts") -> NativeWeight:
    """A weight as the fp32-activation kernels run it: Q4_0 and Q5_0 blocks as the Q8_0 blocks that
    hold them exactly (the same bits out; why the wider blocks: BENCHMARKS.md, section 11, in
    benchmarks/history/sections-6-11.md), fused parts of different formats as one.  (The int8
    kernels read each format's own bits.)"""
    if isinstance(w, FusedParts):
        return w.as_float(for_float_activations)
    return w.as_q8_0() if isinstance(w, NativeWeight) and w.fmt in (Q4_0, Q5_0) else w


def _f32(t: Tensor) -> Tensor:
    return t.detach().to(torch.float32).contiguous()


def _ptr(t: Tensor | None) -> int | None:
    """A tensor's address for the kernels (None: a null pointer)."""
    return t.data_ptr() if t is not None else None


@dataclass
class _Pass:
    """One pass as the kernels take it: int64 index tensors and fp32 buffers, allocated once."""
    m: int                        # tokens in the pass (N)
    bsz: int                      # sequences (B)
    tok: Tensor                   # [N] token ids
    rows: Tensor                  # [B] cache rows
    start: Tensor                 # [B] first slot of each sequence's tokens
    offsets: Tensor               # [B+1] sequence b owns tokens offsets[b] .. offsets[b+1]-1
    seq_of: Tensor                # [N] each token's sequence
    pos: Tensor                   # [N] rotary positions (start + depth)
    parents: Tensor | None        # [N] parent within the sequence (-1: a root); None: chains
    pick: Tensor | None           # [n] flat indices of the tokens whose logits are wanted; None: all
    x: Tensor                     # [N, hidden] the residual stream
    hbuf: Tensor                  # [N, hidden] normed input of each sublayer
    qkv: Tensor                   # [N, (H + 2 Hkv) D]
    q: Tensor                     # [N, H D] rotated queries
    att: Tensor                   # [N, H D] attention output
    gu: Tensor                    # [N, 2 inter] fused gate/up
    act: Tensor                   # [N, inter]
    logits: Tensor                # [n or N, V]
    wanted: dict[int, Tensor]     # layer -> [N, hidden] features asked for


class _Layer:
    """One decoder block's weights."""

    def __init__(self, cfg: ModelConfig, sd: dict, i: int):
        p = f"model.layers.{i}"
        a = f"{p}.self_attn"
        self.attn_norm = _f32(sd[f"{p}.input_layernorm.weight"])
        self.qkv = fuse([as_native(sd[f"{a}.{n}_proj.weight"]) for n in "qkv"])
        self.qkv_bias = (torch.cat([_f32(sd[f"{a}.{n}_proj.bias"]) for n in "qkv"])
                         if cfg.attention_bias else None)
        self.q_norm = _f32(sd[f"{a}.q_norm.weight"]) if cfg.qk_norm else None
        self.k_norm = _f32(sd[f"{a}.k_norm.weight"]) if cfg.qk_norm else None
        self.o = as_native(sd[f"{a}.o_proj.weight"])
        if cfg.post_norms:         # Gemma 3: norms after attention and MLP too
            self.post_attn_norm = _f32(sd[f"{p}.post_attention_layernorm.weight"])
            self.ffn_norm = _f32(sd[f"{p}.pre_feedforward_layernorm.weight"])
            self.post_ffn_norm = _f32(sd[f"{p}.post_feedforward_layernorm.weight"])
        else:
            self.post_attn_norm = self.post_ffn_norm = None
            self.ffn_norm = _f32(sd[f"{p}.post_attention_layernorm.weight"])
        m = f"{p}.mlp"
        self.gate_up = fuse([as_native(sd[f"{m}.gate_proj.weight"]), as_native(sd[f"{m}.up_proj.weight"])])
        self.down = as_native(sd[f"{m}.down_proj.weight"])
        self.window = cfg.layer_window(i)
        self.gelu = cfg.activation == "gelu_tanh"
        self.cos = self.sin = None            # the layer's rotary tables (set by the model: shared per base)

    def weights(self) -> list[NativeWeight]:
        return [self.qkv, self.o, self.gate_up, self.down]

    def entry(self) -> SsLayer:
        """This layer as ss_forward reads it: pointers into tensors that this layer keeps referenced."""
        return SsLayer(attn_norm=self.attn_norm.data_ptr(), qkv=self.qkv.data.data_ptr(), qkv_fmt=self.qkv.fmt,
                       qkv_bias=_ptr(self.qkv_bias), q_norm=_ptr(self.q_norm), k_norm=_ptr(self.k_norm),
                       o=self.o.data.data_ptr(), o_fmt=self.o.fmt, ffn_norm=self.ffn_norm.data_ptr(),
                       gate_up=self.gate_up.data.data_ptr(), gate_up_fmt=self.gate_up.fmt,
                       down=self.down.data.data_ptr(), down_fmt=self.down.fmt,
                       post_attn_norm=_ptr(self.post_attn_norm), post_ffn_norm=_ptr(self.post_ffn_norm),
                       cos=self.cos.data_ptr(), sin=self.sin.data_ptr(), window=self.window, act=int(self.gelu))

    def pack(self) -> None:
        """Repack every block weight for int8 activations (float weights keep float math); the pages of
        blocks read in place from a file's map are let go once packed."""
        for name in ("qkv", "o", "gate_up", "down"):
            w = getattr(self, name)
            if packable(w):
                setattr(self, name, PackedWeight.pack(w))
                for part in (w.parts if isinstance(w, FusedParts) else [w]):
                    release_mapped(part)

    def for_float_activations(self) -> None:
        for name in ("qkv", "o", "gate_up", "down"):
            setattr(self, name, for_float_activations(getattr(self, name)))


class NativeTransformer(OnCpu, nn.Module):
    """A Llama-family decoder on the native kernels.  ``sd`` uses Hugging Face parameter names;
    values are float tensors or ``NativeWeight`` blocks (from a GGUF file)."""

    kernel = "native"
    attention = "native"
    invariant_tokens = NO_LIMIT       # every kernel is invariant, whatever the pass holds

    def __init__(self, cfg: ModelConfig, sd: dict, activations: str = "auto", kv: str = "f32"):
        super().__init__()
        if activations not in ACTIVATIONS:
            raise ValueError(f"unknown activations {activations!r}; choose from {', '.join(ACTIVATIONS)}")
        if kv not in KV_DTYPES:
            raise ValueError(f"unknown kv {kv!r}; choose from {', '.join(KV_DTYPES)}")
        self.kv = kv
        if cfg.head_dim % 8 or cfg.head_dim > MAX_HEAD_DIM:
            raise ValueError(f"native kernels need head_dim a multiple of 8 and <= {MAX_HEAD_DIM}, got {cfg.head_dim}")
        if cfg.hidden_size % 8 or cfg.intermediate_size % 8:
            raise ValueError("native kernels need hidden_size and intermediate_size multiples of 8")
        self.lib = library()
        self.config = cfg
        self.embed = as_native(sd["model.embed_tokens.weight"])
        self.activations = self._choose_activations(activations, sd)
        self.layers = []
        for i in range(cfg.num_layers):           # each layer packed as it is built: the file's blocks
            layer = _Layer(cfg, sd, i)            # and their packed copy are held at once one layer at a time
            layer.pack() if self.activations == "int8" else layer.for_float_activations()
            self.layers.append(layer)
        self.norm = _f32(sd["model.norm.weight"])
        self.lm_head = self.embed if cfg.tie_word_embeddings else as_native(sd["lm_head.weight"])
        self._set_head()
        self.positions = cfg.max_position_embeddings + 2 * KEY_BLOCK
        tables = rope_tables_by_base(cfg, self.positions)       # one pair per rotary base, shared by its layers
        for i, layer in enumerate(self.layers):
            layer.cos, layer.sin = tables[cfg.layer_rope_theta(i)]
        self.set_timer(None)
        self._weights = self._table()
        self._scratch: dict[tuple[int, int], dict[str, Tensor]] = {}    # (thread, m) -> a pass's scratch

    def _table(self) -> ctypes.Array:
        """Every layer's weights as ss_forward's table of SsLayer [L] (the tensors stay referenced by
        self.layers, so the pointers stay valid)."""
        return (SsLayer * len(self.layers))(*[layer.entry() for layer in self.layers])

    @staticmethod
    def _choose_activations(activations: str, sd: dict) -> str:
        """int8 over block weights unless ``f32`` was asked for; ``int8`` on a model whose layers have
        no block weights is refused (nothing would change)."""
        blocks = any(".layers." in name and packable(w) for name, w in sd.items())
        if activations == "f32" or (activations == "auto" and not blocks):
            return "f32"
        if not blocks:
            raise ValueError("activations=int8 needs quantized (GGUF block) weights; this model's are float")
        return "int8"

    def _set_head(self) -> None:
        """The output matrix as the activations run it (tied to the embedding: one packed copy serves
        both, its rows read back exactly)."""
        if self.activations == "f32":
            self.lm_head = for_float_activations(self.lm_head)
        elif packable(self.lm_head):
            tied = self.lm_head is self.embed
            source, self.lm_head = self.lm_head, PackedWeight.pack(self.lm_head)
            if tied:
                self.embed = self.lm_head
            release_mapped(source)

    def layer_subset(self, keep: list[int]) -> "NativeTransformer":
        """A decoder that runs only layers ``keep`` (in order) of this one, sharing every weight."""
        view = copy.copy(self)
        view.config = dataclasses.replace(self.config, num_layers=len(keep))
        view.layers = [self.layers[i] for i in keep]
        view._weights = view._table()
        view._scratch = {}
        view.set_timer(None)
        return view

    def thread_choices(self) -> tuple[int, ...]:
        """All cores, or one: threads only decide which outputs are computed together, never the bits."""
        cores = int(self.lib.ss_default_threads())
        return (cores, 1) if cores > 1 else (1,)

    def set_threads(self, n: int) -> int:
        """Compute threads for later passes (0: the default, one per core); returns the number in use."""
        return int(self.lib.ss_set_threads(n))

    def release_threads(self) -> bool:
        """End the calling thread's pool of compute threads (see the protocol); True if it was ended."""
        return self.lib.ss_release_threads() == 0

    def weight_rows(self, which: str, ids: Tensor) -> Tensor:
        w = {"embed": self.embed, "lm_head": self.lm_head}[which]
        idx = ids.to(torch.int64).contiguous()
        out = torch.empty(idx.numel(), w.shape[1])
        self.lib.ss_embed(idx.data_ptr(), idx.numel(), w.data.data_ptr(), w.fmt, w.shape[1], out.data_ptr())
        return out

    def weight_bytes(self) -> int:
        """Bytes of weights one decoding pass reads."""
        ws = [w for layer in self.layers for w in layer.weights()] + [self.lm_head]
        return sum(w.nbytes for w in ws)

    def new_cache(self, rows: int, max_len: int, slack: int = 64) -> KVCache:
        cfg = self.config
        return KVCache(cfg.num_layers, rows, cfg.num_kv_heads, max_len, cfg.head_dim,
                       KV_DTYPES[self.kv], "cpu", block=KEY_BLOCK, slack=slack, zeroed=False, move_slots=move_slots)

    def set_timer(self, timer: PartTimer | None) -> None:
        """Time later passes by part into ``timer`` (None: stop timing): ss_forward times its own kernel
        calls, the same calls as untimed, so the same bits."""
        self._timer = timer

    def matmul(self, weight: Tensor, bias: Tensor | None = None) -> Callable[[Tensor], Tensor]:
        """y = x W^T (+ b) on the native kernels (see the protocol): weight [out, in] as ``head_block``
        converts it; bias [out] in fp32."""
        w = self.head_block(weight)
        b = bias.detach().to("cpu", torch.float32).contiguous() if bias is not None else None
        return lambda x: linear(x.to(torch.float32).contiguous(), w, b)             # [M, in] -> [M, out]

    def head_block(self, weight: Tensor) -> BlockWeight:
        """A drafter head's weight [out, in] as the kernels run it: Q8_0 blocks on the int8 kernels when
        this model runs int8 activations (and in is a multiple of 32), else float16 blocks against fp32
        activations."""
        w32 = weight.detach().to("cpu", torch.float32)
        if self.activations == "int8" and weight.shape[1] % 32 == 0:
            return PackedWeight.pack(quantize_q8_0(w32))
        return NativeWeight.from_float(w32, F16)

    def draft_layer(self, spec: DraftLayerSpec) -> NativeDraftLayer | None:
        """``spec``'s layer in one native call per head call (see the protocol), its products as
        ``matmul``'s; None where the kernels' row widths do not divide its sizes (hidden, head_dim and
        the intermediate size multiples of 8)."""
        if any(n % 8 for n in (spec.hidden, spec.head_dim, spec.intermediate)):
            return None
        return NativeDraftLayer(spec, self.head_block)

    @torch.inference_mode()
    def forward(self, tokens: Tensor, cache: KVCache, rows: list[int], start: list[int], *,
                lengths: list[int] | None = None, parents: Tensor | None = None, last_only: bool = False,
                features: tuple[int, ...] = (), logits_for: list[int] | None = None) -> ForwardOutput:
        """One pass (layout: ``specserve.models.decoder``), chain, tree or ragged: the whole pass in
        one foreign call (``ss_forward``), which also times its parts while a timer is set."""
        lay = Layout.of(tokens, lengths, parents)
        pick = logit_rows(lengths, last_only, logits_for)
        if last_only:
            pick = lay.offsets[1:] - 1                                              # each row's last token
        self._check_fits(lay, start, cache)
        p = self._new_pass(tokens, lay, rows, start, pick, features)
        seconds = (ctypes.c_double * len(PARTS))() if self._timer is not None else None
        self._run(p, cache, seconds)
        if seconds is not None:
            for part, t in zip(PARTS, seconds):
                self._timer.seconds[part] += t
        return self._output(p.logits, p.wanted, lengths is not None, len(lay.lengths),
                            1 if last_only else max(lay.lengths))

    def _check_fits(self, lay: Layout, start: list[int], cache: KVCache) -> None:
        """Refuse a pass past the cache or the rotary tables, on a cache of another element type than
        ``kv``, or with a tree longer than the kernels hold."""
        longest = max(lay.lengths)
        if max(s + n for s, n in zip(start, lay.lengths)) > min(cache.capacity, self.positions):
            raise ValueError(f"positions up to {max(start) + longest} exceed cache capacity {cache.capacity}")
        if cache.k[0].dtype != KV_DTYPES[self.kv]:
            raise ValueError(f"this model runs kv={self.kv}: its KV cache holds {KV_DTYPES[self.kv]}, "
                             f"not {cache.k[0].dtype} (use new_cache)")
        if lay.parents is not None and longest > MAX_TREE_TOKENS:
            raise ValueError(f"a tree pass holds at most {MAX_TREE_TOKENS} tokens per sequence, got {longest}")

    def _new_pass(self, tokens: Tensor, lay: Layout, rows: list[int], start: list[int],
                  pick: "np.ndarray | list[int] | None", features: tuple[int, ...]) -> _Pass:
        """The pass's index tensors for the kernels and its buffers, allocated once (``pick``: the
        flat indices of the tokens whose logits are wanted, None: all)."""
        cfg = self.config
        m, hid = int(lay.offsets[-1]), cfg.hidden_size
        start_t = torch.tensor(start, dtype=torch.int64)
        pos = (start_t.numpy()[lay.seq_of] + lay.depth).astype(np.int64)              # rotary positions [N]
        pos_t, offsets_t, seq_of_t = (torch.from_numpy(np.ascontiguousarray(a)) for a in (pos, lay.offsets, lay.seq_of))
        pick_t = torch.as_tensor(np.asarray(pick, dtype=np.int64)) if pick is not None else None
        n_logits = len(pick_t) if pick_t is not None else m
        return _Pass(
            m=m, bsz=len(lay.lengths), tok=tokens.reshape(-1).to(torch.int64).contiguous(),
            rows=torch.tensor(rows, dtype=torch.int64), start=start_t, offsets=offsets_t, seq_of=seq_of_t, pos=pos_t,
            parents=torch.from_numpy(lay.parents) if lay.parents is not None else None, pick=pick_t,
            **self._work(m), logits=torch.empty(n_logits, self.lm_head.shape[0]),
            wanted={i: torch.empty(m, hid) for i in features if i <= cfg.num_layers})

    def _work(self, m: int) -> dict[str, Tensor]:
        """The pass's scratch buffers for m tokens (x .. act of ``_Pass``).  A decoding-sized pass's
        (m <= SCRATCH_KEPT) are kept for the calling thread's next pass of that size: only ss_forward
        reads or writes them, and every entry is written before it is read.  The results (logits,
        features) are new for every pass, since callers keep them."""
        key = (threading.get_ident(), m)
        if key in self._scratch:
            return self._scratch[key]
        cfg = self.config
        hid, h, hkv, d, inter = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size
        work = dict(x=torch.empty(m, hid), hbuf=torch.empty(m, hid), qkv=torch.empty(m, (h + 2 * hkv) * d),
                    q=torch.empty(m, h * d), att=torch.empty(m, h * d), gu=torch.empty(m, 2 * inter),
                    act=torch.empty(m, inter))
        if m <= SCRATCH_KEPT:
            if len(self._scratch) >= 16:
                self._scratch.clear()
            self._scratch[key] = work
        return work

    def _run(self, p: _Pass, cache: KVCache, seconds: "ctypes.Array | None") -> None:
        """The whole pass in one foreign call: the Python lock is taken once (see forward.cpp);
        seconds: [len(PARTS)] each part's seconds added, or None: untimed."""
        cfg = self.config
        feats = torch.tensor([p.wanted[i].data_ptr() if i in p.wanted else 0 for i in range(cfg.num_layers + 1)],
                             dtype=torch.int64) if p.wanted else None                # [L+1] destinations
        run_pass(self.lib, SsPass.new(
            L=cfg.num_layers, M=p.m, hid=cfg.hidden_size, inter=cfg.intermediate_size, H=cfg.num_heads,
            Hkv=cfg.num_kv_heads, D=cfg.head_dim, R=cache.k_all.shape[1], C=cache.capacity, B=p.bsz,
            V=self.lm_head.shape[0], n_logits=len(p.pick) if p.pick is not None else -1,
            eps=float(cfg.rms_norm_eps), scale=float(cfg.head_dim ** -0.5), embed_scale=float(cfg.embed_scale),
            tokens=p.tok.data_ptr(), rows=p.rows.data_ptr(), start=p.start.data_ptr(), offsets=p.offsets.data_ptr(),
            seq_of=p.seq_of.data_ptr(), pos=p.pos.data_ptr(), parent=_ptr(p.parents), logit_rows=_ptr(p.pick),
            x=p.x.data_ptr(), hbuf=p.hbuf.data_ptr(), qkv=p.qkv.data_ptr(), q=p.q.data_ptr(), att=p.att.data_ptr(),
            gu=p.gu.data_ptr(), act=p.act.data_ptr(), kc=cache.k_all.data_ptr(), vc=cache.v_all.data_ptr(),
            kv=KV_CODES[self.kv],
            embed=self.embed.data.data_ptr(), embed_fmt=self.embed.fmt, norm=self.norm.data_ptr(),
            head=self.lm_head.data.data_ptr(), head_fmt=self.lm_head.fmt, logits=p.logits.data_ptr(),
            feats=_ptr(feats), layers=self._weights, part_seconds=seconds))

    def _output(self, logits: Tensor, feats: dict[int, Tensor], ragged: bool, bsz: int, t: int) -> ForwardOutput:
        """Flat [N, ...] results for a ragged pass, [B, T, ...] otherwise."""
        if ragged:
            return ForwardOutput(logits=logits, features=feats)
        hid = self.config.hidden_size
        return ForwardOutput(logits=logits.view(bsz, t, self.lm_head.shape[0]),
                             features={k: v.view(bsz, -1, hid) for k, v in feats.items()})
