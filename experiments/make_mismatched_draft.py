"""Write a draft model that rarely agrees with the target: random weights, the default model's
vocabulary and tokenizer (so the draft-model drafter accepts it), 2 small layers.

    .venv/bin/python experiments/make_mismatched_draft.py results/mismatched-draft
    .venv/bin/specserve bench --methods none,draft-model:model=results/mismatched-draft ...
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from specserve.models.loader import load_model
from specserve.tokenizer import load_tokenizer


def main(out: str) -> None:
    target = load_model("default")
    vocab, hidden, inter, layers, heads, kv = target.config.vocab_size, 64, 128, 2, 4, 2
    g = torch.Generator().manual_seed(0)

    def r(*shape):
        return torch.randn(*shape, generator=g) * 0.5

    sd = {"model.embed_tokens.weight": r(vocab, hidden), "model.norm.weight": torch.ones(hidden)}
    d = hidden // heads
    for i in range(layers):
        p = f"model.layers.{i}"
        sd |= {f"{p}.self_attn.q_proj.weight": r(heads * d, hidden), f"{p}.self_attn.k_proj.weight": r(kv * d, hidden),
               f"{p}.self_attn.v_proj.weight": r(kv * d, hidden), f"{p}.self_attn.o_proj.weight": r(hidden, heads * d),
               f"{p}.mlp.gate_proj.weight": r(inter, hidden), f"{p}.mlp.up_proj.weight": r(inter, hidden),
               f"{p}.mlp.down_proj.weight": r(hidden, inter), f"{p}.input_layernorm.weight": torch.ones(hidden),
               f"{p}.post_attention_layernorm.weight": torch.ones(hidden)}
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in sd.items()}, str(path / "model.safetensors"))
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab,
              "hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": layers,
              "num_attention_heads": heads, "num_key_value_heads": kv, "max_position_embeddings": 8192,
              "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": True,
              "bos_token_id": 1, "eos_token_id": 2}
    (path / "config.json").write_text(json.dumps(config, indent=1))
    load_tokenizer(target).hf.save_pretrained(str(path))
    print(f"wrote {path}: random {layers}-layer draft, vocabulary {vocab}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "results/mismatched-draft")
