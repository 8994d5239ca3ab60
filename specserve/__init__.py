"""specserve: exact speculative decoding for Llama-family models, served on CPU kernels of its own.

Layers, arrows pointing down only (ARCHITECTURE.md says what each owns; docs/layout.md lists the
modules)::

    cli, cli_args, server/, bench/, export   the command line, the OpenAI-compatible HTTP server, the
                                             benchmark and advisor, a head exported for other servers
    llm, tokenizer, tools/                   text in, text out: tokenizer, chat template, stop strings,
                                             drafters by name; tool calls (formats, grammars, replies)
    scheduler                                continuous batching: a bounded queue, admission, one engine thread
    engine/                                  sequences, the KV cache's rows, a step's numbered phases
    control/  verify/  drafters/  train/     sizes and costs (one ``ControllerConfig``) | verification (pure
                                             math) | proposals, the learned heads | training the heads
    sampling, constrain/, prefix_cache,      the logits' shaping (temperature, grammars, penalties), the
    stats                                    prefix pool, a step's timers and the request counters
    models/                                  config, loading (GGUF, HF), the decoder protocol, the runtimes
                                             (native C++ kernels, torch), the KV cache
    limits, trees, averages, host, errors    the rules every layer shares; they import nothing of specserve

``data/`` holds the shipped prompts, workloads and trained heads.
"""

__version__ = "0.1.0"
