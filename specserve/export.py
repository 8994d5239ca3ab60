"""``specserve export eagle HEAD --out DIR``: an ``eagle3`` head as the EAGLE-3 draft model vLLM and
SGLang serve (``LlamaForCausalLMEagle3``): ``config.json`` and ``model.safetensors``.  ``default``
is ``specserve/data/heads/eagle3-parallel``, the EAGLE-3 twin of the shipped parallel head (the shipped
heads are of this project's ``eagle`` layout, refused below).

What their loaders read (vLLM ``vllm/model_executor/models/llama_eagle3.py`` at 583507d1,
``v1/worker/gpu_model_runner.py`` at 4e179065, ``models/llama.py`` at e06c9ba2; SGLang
``python/sglang/srt/models/llama_eagle3.py`` at d737979c, ``models/llama.py`` at bf7a0e23):

  tensor                                         shape              from our head (``Eagle3Head``)
  fc.weight                                      [H, 3H]            fuse (blocks in ascending layer order)
  midlayer.input_layernorm.weight                [H]                input_norm (the token embedding's)
  midlayer.hidden_norm.weight                    [H]                hidden_norm (the state g's)
  midlayer.self_attn.q_proj.weight               [heads*d, 2H]      q
  midlayer.self_attn.k_proj / v_proj .weight     [kv_heads*d, 2H]   kv (k rows first)
  midlayer.self_attn.o_proj.weight               [H, heads*d]       o
  midlayer.post_attention_layernorm.weight       [H]                post_norm
  midlayer.mlp.gate_proj / up_proj .weight       [I, H]             gate_up (gate rows first)
  midlayer.mlp.down_proj.weight                  [H, I]             down
  norm.weight                                    [H]                norm
  lm_head.weight                                 [Vr, H]            the target's LM-head rows of vocab_ids
  d2t (int64)                                    [Vr]               vocab_ids - arange(Vr)
  t2d (bool)                                     [V]                in the reduced vocabulary (both skip it)
  mask_hidden (parallel heads)                   [3H]               mask_hidden (blocks in ascending layer order)

A parallel head (P-EAGLE, ``HeadConfig.parallel``) also writes ``pard_token`` and ``ptd_token_id``
(its placeholder token, which vLLM embeds with the target's table) into ``config.json``; vLLM
(``v1/spec_decode/llm_base_proposer.py``, ``llama_eagle3.py``: the parallel drafting of PR #32887,
v0.16) runs it with ``"parallel_drafting": true``: the placeholder slots take that token's
embedding and fc(``mask_hidden``) as their state, at consecutive positions after the bonus token,
attending causally, as ours do.  SGLang has no parallel drafting: it would run the head one token
per pass, which it was not trained for.

No ``embed_tokens``: both take the target's (vLLM at 583507d1 has no such parameter and would fail on
one).  Both loaders rename ``midlayer.`` and stack q/k/v and gate/up themselves.

Feature layers.  Ours (``Decoder.forward``): layer i < L is the residual stream entering decoder
layer i.  vLLM reads the top-level ``eagle_aux_hidden_state_layer_ids`` and captures
``hidden_states + residual`` before running layer id, so its ids are ours.  SGLang reads
``eagle_config.eagle_aux_hidden_state_layer_ids`` and captures before layer id + 1 ("the output of
layer id"), so its ids are ours minus one.  Both concatenate in ascending layer order, and neither
can give the embedding (i = 0: no residual yet) or the final normed output (i = L).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from specserve.errors import SpecserveError

if TYPE_CHECKING:
    from torch import Tensor

DTYPES = ("float16", "bfloat16", "float32")      # tensor types written (torch's names)
DEFAULT = "eagle3-parallel"     # what `export eagle default` writes: the shipped parallel head's EAGLE-3 twin


def refuse_unless_eagle3(cfg, where: str) -> None:
    """One line saying why a head other than ``eagle3`` cannot be exported."""
    if cfg.kind == "eagle":
        raise SpecserveError(f"the head at {where} is the `eagle` layout (fc over [embedding ; feature], then a "
                             f"standard decoder layer), not EAGLE-3's, so vLLM and SGLang cannot load it; export "
                             f"`default` (the shipped parallel head's EAGLE-3 twin) or retrain with "
                             f"`specserve train eagle --layout eagle3`")
    if cfg.kind != "eagle3":
        raise SpecserveError(f"the head at {where} is a {cfg.kind} head; only eagle3 heads export "
                             f"(`specserve train eagle --layout eagle3`)")
    if cfg.num_layers != 1:
        raise SpecserveError(f"the head at {where} has {cfg.num_layers} decoder layers; the export writes "
                             f"EAGLE-3's one-layer draft model only")


def fc_weight(fuse: Tensor, layers: list[int]) -> Tensor:
    """fuse [H, F H] with blocks in ``layers`` order -> [H, F H] with blocks in ascending layer order."""
    h = fuse.shape[0]
    order = sorted(range(len(layers)), key=lambda i: layers[i])
    return fuse.view(h, len(layers), -1)[:, order].reshape(h, -1)


def eagle3_tensors(cfg, module, vocab_ids: Tensor, lm_rows: Tensor, vocab_size: int) -> dict[str, Tensor]:
    """The draft model's tensors (module docstring's table), float32.  vocab_ids [Vr] int64,
    lm_rows [Vr, H] the target's LM-head rows of them."""
    import torch

    kv = cfg.num_kv_heads * cfg.head_dim
    inter = cfg.intermediate_size
    w = {k: v.detach().float() for k, v in module.state_dict().items()}
    m = "midlayer."
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[vocab_ids] = True
    return {
        "fc.weight": fc_weight(w["fuse.weight"], list(cfg.feature_layers)),
        m + "input_layernorm.weight": w["input_norm.weight"],
        m + "hidden_norm.weight": w["hidden_norm.weight"],
        m + "self_attn.q_proj.weight": w["q.weight"],
        m + "self_attn.k_proj.weight": w["kv.weight"][:kv],
        m + "self_attn.v_proj.weight": w["kv.weight"][kv:],
        m + "self_attn.o_proj.weight": w["o.weight"],
        m + "post_attention_layernorm.weight": w["post_norm.weight"],
        m + "mlp.gate_proj.weight": w["gate_up.weight"][:inter],
        m + "mlp.up_proj.weight": w["gate_up.weight"][inter:],
        m + "mlp.down_proj.weight": w["down.weight"],
        "norm.weight": w["norm.weight"],
        "lm_head.weight": lm_rows.float().cpu(),
        "d2t": vocab_ids.long() - torch.arange(len(vocab_ids)),
        "t2d": t2d,
    } | ({"mask_hidden": fc_weight(w["mask_hidden"][None], list(cfg.feature_layers))[0]} if cfg.parallel else {})


def eagle3_config(cfg, target_config, draft_vocab: int, dtype: str, source: str) -> dict:
    """``config.json`` for vLLM's and SGLang's ``LlamaForCausalLMEagle3`` (module docstring)."""
    layers = sorted(cfg.feature_layers)
    return {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1,
        "hidden_size": cfg.hidden_size, "target_hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size, "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim, "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_norm_eps, "rope_theta": cfg.rope_theta, "rope_scaling": None,
        "max_position_embeddings": target_config.max_position_embeddings,
        "vocab_size": target_config.vocab_size, "draft_vocab_size": draft_vocab,
        "eagle_aux_hidden_state_layer_ids": layers,                               # vLLM: ours
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in layers],   # SGLang: ours - 1
                         "use_aux_hidden_state": True},
        "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False,
        "norm_before_residual": False, "torch_dtype": dtype,
        "specserve": {"head": source, "feature_layers": list(cfg.feature_layers),
                      "training_command": cfg.training.get("command", ""), "parallel": cfg.parallel},
    } | ({"pard_token": cfg.mask_token_id, "ptd_token_id": cfg.mask_token_id} if cfg.parallel else {})


def export_eagle3(head_dir: str | Path, out_dir: str | Path, target, dtype: str = "float16") -> Path:
    """Write ``head_dir``'s eagle3 head for ``target`` (a LoadedModel: its LM-head rows and shape)
    to ``out_dir`` as ``config.json`` + ``model.safetensors``; returns ``out_dir``."""
    import torch
    from safetensors.torch import save_file

    from specserve.drafters.heads.files import check_eagle3_layers, check_target, load_head

    if dtype not in DTYPES:
        raise SpecserveError(f"--dtype takes {', '.join(DTYPES)}, got {dtype!r}")
    cfg, module, vocab_ids = load_head(head_dir)
    refuse_unless_eagle3(cfg, str(head_dir))
    check_target(cfg, target, str(head_dir))
    check_eagle3_layers(cfg.feature_layers, target.config.num_layers)
    rows = target.model.weight_rows("lm_head", vocab_ids)
    tensors = eagle3_tensors(cfg, module, vocab_ids, rows, target.config.vocab_size)
    tensors = {k: (v.to(getattr(torch, dtype)) if v.is_floating_point() else v).contiguous()
               for k, v in tensors.items()}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    conf = eagle3_config(cfg, target.config, len(vocab_ids), dtype, str(head_dir))
    (out / "config.json").write_text(json.dumps(conf, indent=1))
    return out


def add_parser(sub) -> None:
    e = sub.add_parser("export", help="write a trained head in the layout another server loads")
    esub = e.add_subparsers(dest="what", required=True, parser_class=type(e))
    g = esub.add_parser("eagle", help="an eagle3 head as an EAGLE-3 draft model for vLLM and SGLang "
                                      "(LlamaForCausalLMEagle3)")
    g.add_argument("head", help="the head folder (config.json, head.safetensors) of `specserve train eagle "
                                "--layout eagle3`, or 'default': the EAGLE-3 twin of the parallel head shipped for "
                                "the default model (the shipped heads themselves are of this project's layout)")
    g.add_argument("--out", required=True, help="folder for config.json and model.safetensors")
    g.add_argument("--model", default="default", help="the target the head was trained for (its LM-head rows "
                   "of the reduced vocabulary are written with the head)")
    g.add_argument("--dtype", default="float16", choices=DTYPES, help="tensor type written")


def cmd_export(args: argparse.Namespace) -> int:
    import sys

    from specserve.drafters.heads.files import read_config
    from specserve.drafters.heads.runtime import shipped_head
    from specserve.models.loader import load_model

    head = str(shipped_head(DEFAULT) if args.head == "default" else Path(args.head))
    if not (Path(head) / "config.json").exists():
        raise SpecserveError(f"no head at {head} (a head folder holds config.json and head.safetensors)")
    refuse_unless_eagle3(read_config(head), head)                 # before loading the target
    out = export_eagle3(head, args.out, load_model(args.model), args.dtype)
    k = read_config(head).parallel
    if k:
        print(f"P-EAGLE draft model (EAGLE-3 layout, {k} tokens per pass) written to {out}: serve it with vLLM "
              f"--speculative-config '{{\"method\": \"eagle3\", \"model\": \"{out}\", \"num_speculative_tokens\": {k}, "
              f"\"parallel_drafting\": true}}' (SGLang has no parallel drafting)", file=sys.stderr)
        return 0
    print(f"EAGLE-3 draft model written to {out}: serve it with vLLM "
          f"--speculative-config '{{\"method\": \"eagle3\", \"model\": \"{out}\", \"num_speculative_tokens\": 3}}' "
          f"or SGLang --speculative-algorithm EAGLE3 --speculative-draft-model-path {out}", file=sys.stderr)
    return 0
