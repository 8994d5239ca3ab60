"""Shared fixtures: tiny random Llama-family models that run in milliseconds."""

from __future__ import annotations

import functools
import hashlib

import pytest
import torch

from specserve.models.config import ModelConfig
from specserve.models.loader import LoadedModel, RuntimeOptions, build_model


def tiny_state_dict(cfg: ModelConfig, seed: int, scale: float = 0.5) -> dict[str, torch.Tensor]:
    """Random weights with Hugging Face names; large enough scale to give peaked distributions."""
    g = torch.Generator().manual_seed(seed)
    h, d, i = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size

    def r(*shape):
        return torch.randn(*shape, generator=g) * scale

    sd = {"model.embed_tokens.weight": r(cfg.vocab_size, h), "model.norm.weight": 1 + 0.1 * r(h)}
    if not cfg.tie_word_embeddings:
        sd["lm_head.weight"] = r(cfg.vocab_size, h)
    for layer in range(cfg.num_layers):
        p = f"model.layers.{layer}"
        sd[f"{p}.self_attn.q_proj.weight"] = r(cfg.num_heads * d, h)
        sd[f"{p}.self_attn.k_proj.weight"] = r(cfg.num_kv_heads * d, h)
        sd[f"{p}.self_attn.v_proj.weight"] = r(cfg.num_kv_heads * d, h)
        sd[f"{p}.self_attn.o_proj.weight"] = r(h, cfg.num_heads * d)
        if cfg.attention_bias:
            for n, rows in (("q", cfg.num_heads * d), ("k", cfg.num_kv_heads * d), ("v", cfg.num_kv_heads * d)):
                sd[f"{p}.self_attn.{n}_proj.bias"] = r(rows)
        if cfg.qk_norm:
            sd[f"{p}.self_attn.q_norm.weight"] = 1 + 0.1 * r(d)
            sd[f"{p}.self_attn.k_norm.weight"] = 1 + 0.1 * r(d)
        sd[f"{p}.mlp.gate_proj.weight"] = r(i, h)
        sd[f"{p}.mlp.up_proj.weight"] = r(i, h)
        sd[f"{p}.mlp.down_proj.weight"] = r(h, i)
        sd[f"{p}.input_layernorm.weight"] = 1 + 0.1 * r(h)
        sd[f"{p}.post_attention_layernorm.weight"] = 1 + 0.1 * r(h)
        if cfg.post_norms:
            sd[f"{p}.pre_feedforward_layernorm.weight"] = 1 + 0.1 * r(h)
            sd[f"{p}.post_feedforward_layernorm.weight"] = 1 + 0.1 * r(h)
    return sd


def tiny_config(vocab: int = 64, layers: int = 2, arch: str = "llama", **kw) -> ModelConfig:
    base = dict(arch=arch, vocab_size=vocab, hidden_size=32, intermediate_size=64, num_layers=layers,
                num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=512, rms_norm_eps=1e-5,
                rope_theta=10000.0, tie_word_embeddings=False, eos_token_ids=())
    base.update(kw)
    return ModelConfig(**base)


def quantized(sd: dict[str, torch.Tensor], fmt: int = 3, embed_fmt: int = 2) -> dict:
    """The same weights as GGUF blocks, as a quantized GGUF file holds them: every linear layer in
    ``fmt`` (default Q4_1), the embedding and LM head in ``embed_fmt`` (default Q8_0), norms in fp32."""
    import gguf
    from gguf import quants

    from specserve.models import native as nt

    types = {nt.Q8_0: gguf.GGMLQuantizationType.Q8_0, nt.Q4_1: gguf.GGMLQuantizationType.Q4_1,
             nt.Q4_0: gguf.GGMLQuantizationType.Q4_0, nt.Q5_0: gguf.GGMLQuantizationType.Q5_0,
             nt.Q5_1: gguf.GGMLQuantizationType.Q5_1}
    out = {}
    for name, w in sd.items():
        f = embed_fmt if ("embed" in name or "lm_head" in name) else fmt
        if w.dim() == 2 and not name.endswith("bias"):
            blocks = quants.quantize(w.numpy(), types[f])
            out[name] = nt.NativeWeight(torch.from_numpy(blocks), f, tuple(w.shape))
        else:
            out[name] = w
    return out


def tiny_model(seed: int = 0, kernels: str = "native", attention: str = "auto", scale: float = 0.5,
               sd: dict | None = None, activations: str = "auto", kv: str = "auto", **kw) -> LoadedModel:
    """A LoadedModel around random weights (no files); ``path`` is a unique label.  kernels
    ``native-int8``: the native runtime over the weights quantized as a GGUF file holds them
    (``quantized``: Q4_1 layers, Q8_0 embedding), with int8 activations; a ``-bf16`` suffix (``native-bf16``,
    ``native-int8-bf16``): with a bf16 KV cache."""
    cfg = tiny_config(**kw)
    custom = f" weights={id(sd)}" if sd is not None else ""          # weights the caller gave
    sd = sd if sd is not None else tiny_state_dict(cfg, seed, scale)
    if kernels.endswith("-bf16"):
        kernels, kv = kernels.removesuffix("-bf16"), "bf16"
    if kernels == "native-int8":
        kernels, activations, sd = "native", "int8", quantized(sd)
    opts = RuntimeOptions("float32", "cpu", kernels, attention, activations, kv).resolve()
    model = build_model(cfg, sd, opts)
    shape = hashlib.sha1(repr(sorted(kw.items())).encode()).hexdigest()[:10]   # two shapes never share a label
    label = (f"<tiny seed={seed} scale={scale} shape={shape} kernels={opts.kernels} "
             f"activations={getattr(model, 'activations', 'f32')} kv={opts.kv}{custom}>")
    return LoadedModel(model=model, config=cfg, path=label, options=opts)


_HEADS: dict = {}


@functools.cache
def _head_root() -> str:
    """One temporary folder for every head of the process, removed at its exit."""
    import atexit
    import shutil
    import tempfile

    root = tempfile.mkdtemp(prefix="specserve-test-heads-")
    atexit.register(shutil.rmtree, root, True)
    return root


def tiny_head(kind: str, target: LoadedModel, layers: list[int] | None = None, seed: int = 0, parallel: int = 0,
              head_layers: int = 1) -> str:
    """An untrained head (random EAGLE layer of either layout, ``eagle`` or ``eagle3``; random Medusa
    blocks) for ``target`` over a reduced
    vocabulary of its first three quarters of tokens, saved in a temporary folder (removed when the process exits) whose path is returned.
    ``parallel``: an EAGLE head drafting that many tokens per pass (placeholder token 1); ``head_layers``:
    an EAGLE head of that many decoder layers (the later ones random, not the identity they train from).
    Every norm's weight is random around 1, so a norm read in another's place shows."""
    import tempfile

    from specserve.drafters.heads import build, new_config, save_head
    from specserve.models.layers import RMSNorm

    key = (kind, target.path, tuple(layers or ()), seed, parallel, head_layers)
    if key not in _HEADS:
        n = target.config.num_layers
        default = {"eagle": [1, n], "eagle3": [1, n // 2, n - 1], "medusa": [n]}[kind]     # eagle3: n >= 4
        cfg = new_config(kind, target, layers or default, num_medusa=3 if kind == "medusa" else 0)
        cfg.parallel, cfg.mask_token_id = parallel, 1 if parallel else 0
        cfg.num_layers = head_layers
        torch.manual_seed(seed)
        module = build(cfg)
        for layer in getattr(module, "extra", ()):
            layer.o.reset_parameters()                              # a random layer, not the identity
            layer.down.reset_parameters()
        for m in module.modules():
            if isinstance(m, RMSNorm):                              # norms told apart (not all ones)
                torch.nn.init.normal_(m.weight, mean=1.0, std=0.3)
        if parallel:
            torch.nn.init.normal_(module.mask_hidden, std=1.0)      # a placeholder state of the features' scale
        if kind == "medusa":
            for b in module.blocks:
                torch.nn.init.normal_(b.weight, std=0.3)
        d = tempfile.mkdtemp(prefix=f"{kind}-", dir=_head_root())
        save_head(d, cfg, module, torch.arange(target.config.vocab_size * 3 // 4))   # a reduced vocabulary
        _HEADS[key] = d
    return _HEADS[key]


def prompt_features(target: LoadedModel, prompt: list[int], layers: tuple[int, ...]) -> dict:
    """The target's features of every prompt position (what the engine hands a drafter after the prefill)."""
    if not layers:
        return {}
    cache = target.model.new_cache(1, len(prompt) + 8)
    out = target.model(torch.tensor([prompt]), cache, [0], [0], features=layers)
    return {layer: f[0] for layer, f in out.features.items()}


GRAMMAR_PIECES = (list('{}":,[]0123456789abcdefghijklmnopqrstuvwxyz ')
                  + ['{"', '":', '","', '"}', 'ab', 'na', 'me', 'name', 'age', '":"', 'xy', 'cd', '12', '00', 'ok', 'no',
                     'er', 'th'])
TINY_SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                                "age": {"type": "integer", "maximum": 999},
                                                "ok": {"type": "boolean"}},
               "required": ["name", "age", "ok"], "additionalProperties": False}


@pytest.fixture(scope="session")
def grammar_vocab():
    """The tiny grammar vocabulary of 64 tokens: (compiler, pieces, piece -> token id)."""
    comp, pieces = grammar_compiler(64)
    return comp, pieces, {p: i for i, p in enumerate(pieces)}


def grammar_compiler(vocab: int = 64):
    """A grammar compiler over a tiny model's ``vocab`` tokens, as text pieces (characters of JSON,
    some longer pieces); the last token is the end of text, ``vocab - 1``."""
    from specserve.constrain import GrammarCompiler

    pieces = GRAMMAR_PIECES[:vocab - 1]
    pieces += [f"<x{i}>" for i in range(vocab - 1 - len(pieces))] + ["<eos>"]
    return GrammarCompiler.from_vocab(pieces, [vocab - 1]), pieces


# ---- the two tiers --------------------------------------------------------------------------------
# ``bash scripts/test.sh --fast`` runs every test not marked ``slow``, and sets SPECSERVE_FAST_TIER.
# In that tier a real model or a subprocess is a mistake in the test's marking (it would make the
# inner loop slow), so both fail loudly instead; ``smoke`` marks the one subprocess test it keeps.

def _fast_tier_guard(what: str):
    def refuse(*args, **kwargs):
        raise AssertionError(f"the fast tier runs no {what}: mark this test `slow` (or `smoke`)")
    return refuse


@pytest.fixture(scope="session", autouse=True)
def _first_loads():
    """What asks a subprocess the first time it loads, loaded once before any test's guard is up,
    whichever test happens to come first: the native kernel library (the compiler's version), and
    matplotlib's font list (``fc-list``, on a machine where it has no font cache yet)."""
    from specserve.models import native

    native.unavailable_reason()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.font_manager  # noqa: F401 - builds the font cache once
    except ImportError:
        pass


@pytest.fixture(autouse=True)
def _fast_tier(request, monkeypatch):
    import os

    if request.node.get_closest_marker("slow") or request.node.get_closest_marker("smoke"):
        yield
        return
    if os.environ.get("SPECSERVE_FAST_TIER") == "1":
        import subprocess

        from specserve.models import loader

        for name in list(loader.NAMED_MODELS):
            monkeypatch.setitem(loader.NAMED_MODELS, name, _fast_tier_guard(f"real model ({name})"))
        monkeypatch.setattr(subprocess.Popen, "__init__", _fast_tier_guard("subprocess"))
    yield


# ---- the real models, loaded once per session -----------------------------------------------------

@pytest.fixture(scope="session")
def default_target():
    """The default model (SmolLM2-135M-Instruct, int8 native runtime), loaded once for every module."""
    from specserve.models.loader import load_model

    return load_model("default")


@pytest.fixture(scope="session")
def default_tokenizer(default_target):
    from specserve.tokenizer import load_tokenizer

    return load_tokenizer(default_target)


@pytest.fixture(scope="session")
def gemma_target():
    """Gemma 3 270M (Q4_K_M), loaded once."""
    from specserve.models.loader import load_model

    return load_model("gemma3-270m")


def pytest_collection_modifyitems(config, items):
    import os

    if os.environ.get("SPECSERVE_FAST_TIER") != "1":
        return
    real = {"default_target", "default_tokenizer", "gemma_target"}
    for item in items:
        if not item.get_closest_marker("slow") and real & set(getattr(item, "fixturenames", ())):
            raise pytest.UsageError(f"{item.nodeid} uses a real model but is not marked slow")
