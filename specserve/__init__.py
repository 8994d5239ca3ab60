"""specserve: exact speculative decoding for Llama-family models.

Layers, arrows pointing down only::

    cli / server / bench          user-facing entry points
    llm                           text in, text out: tokenizer, chat template, stop strings
    engine                        the speculative loop in numbered phases; owns KV rollback
    drafters/ verify sampling     proposal, pure verification math, shared logits processing
    models/                       config, loading (HF directory, GGUF), the decoder, KV cache
"""

__version__ = "0.1.0"
