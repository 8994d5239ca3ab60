"""``specserve serve``: its flags and the command (the model loaded, the app built, uvicorn run
under the draining server, the server's log lines on stderr).  The flags' defaults are
``ServerSettings``'s; the parsed flags become one ``ServerSettings``, checked before the model loads."""

from __future__ import annotations

import argparse
import sys

from specserve.cli_args import drafter_specs, engine_args, runtime_options
from specserve.control.prefill import PrefillPolicy
from specserve.errors import SpecserveError
from specserve.server.settings import DEFAULT_MAX_TOKENS, ServerSettings, TokenLimits

MB = 2**20


def add_serve_args(v: argparse.ArgumentParser) -> None:
    d = ServerSettings()
    engine_args(v, many=True)
    v.add_argument("--host", default=d.host, help="address to listen on")
    v.add_argument("--port", type=int, default=d.port, help="port to listen on")
    v.add_argument("--max-batch", type=int, default=d.max_batch, help="sequences in the running batch (KV rows)")
    v.add_argument("--max-waiting", type=int, default=d.max_waiting, help="waiting-queue bound; beyond it: 429")
    v.add_argument("--request-timeout", type=float, default=d.request_timeout_s,
                   help="seconds before a request gets a 504")
    v.add_argument("--max-prompt-tokens", type=int, default=d.limits.max_prompt_tokens, metavar="N",
                   help="refuse (400) a prompt of more tokens (default: only the context length limits prompt "
                   "+ max_tokens)")
    v.add_argument("--max-tokens-limit", type=int, default=d.limits.max_tokens_limit, metavar="N",
                   help="refuse (400) a request asking for more tokens (max_tokens or max_completion_tokens); "
                   f"a request naming none gets min({DEFAULT_MAX_TOKENS}, N)")
    v.add_argument("--max-body-mb", type=float, default=d.max_body_bytes / MB, metavar="MB",
                   help="refuse (413) a request body larger than this, declared or chunked")
    v.add_argument("--no-request-log", action="store_true", help="do not write one JSON line per /v1 request "
                   "to stderr")
    v.add_argument("--served-model-name", default=None, help="the model name clients send (default: 'default' or the path)")
    v.add_argument("--prefill-chunk", type=int, default=d.prefill.chunk, help="most prompt tokens one engine "
                   "step takes (a multiple of 16); prompts enter the running batch in chunks")
    v.add_argument("--no-chunked-prefill", action="store_true", help="prefill every prompt whole, in one step "
                   "(running streams wait for it)")
    v.add_argument("--prefill-stall", type=float, default=d.prefill.stall, help="while streams run, a step with "
                   "prompt chunks is sized to take at most this many times a decoding step of the whole batch")
    v.add_argument("--prefix-cache-mb", type=float, default=d.prefill.prefix_cache_mb, help="memory for reusing "
                   "the KV of earlier prompts' prefixes (least recently used blocks are evicted)")
    v.add_argument("--no-prefix-cache", action="store_true", help="never reuse earlier prompts' KV")
    v.add_argument("--api-key", action="append", default=None, metavar="KEY",
                   help="require 'Authorization: Bearer KEY' on /v1 and /metrics (repeatable; also "
                   "SPECSERVE_API_KEY, comma-separated); /health stays open")
    v.add_argument("--metrics-public", action="store_true", help="serve /metrics without a key")
    v.add_argument("--shutdown-timeout", type=float, default=d.shutdown_timeout_s, metavar="SECONDS",
                   help="on SIGTERM or SIGINT: /health and new /v1 requests get 503 while running and queued "
                   "requests finish, for at most this many seconds; then what is left ends with an error "
                   "(server_shutting_down) and the process exits with status 0.  A second signal stops at "
                   "once (status 1)")
    v.add_argument("--tool-parser", default=d.tool_parser, help="the format of tool calls the model writes and the "
                   "server reads back and enforces: hermes (<tool_call> JSON: Qwen, SmolLM2, Hermes), llama3_json "
                   "(Llama 3.1-3.3), pythonic ([f(x=1)]: Llama 3.2, Gemma 3); auto: the chat template's")


def server_settings(args: argparse.Namespace, default_drafter: str) -> ServerSettings:
    """The settings the parsed flags give; raises SpecserveError, naming the flag, for one that
    cannot work."""
    from specserve.server.auth import api_keys

    keys = api_keys(args.api_key)
    limits = TokenLimits(args.max_prompt_tokens, args.max_tokens_limit)
    if not args.max_body_mb * MB >= 1:
        raise SpecserveError(f"--max-body-mb must be > 0, got {args.max_body_mb}")
    prefill = PrefillPolicy(None if args.no_chunked_prefill else args.prefill_chunk, args.prefill_stall,
                            0.0 if args.no_prefix_cache else args.prefix_cache_mb)
    return ServerSettings(host=args.host, port=args.port, max_batch=args.max_batch, max_waiting=args.max_waiting,
                          request_timeout_s=args.request_timeout, limits=limits, default_drafter=default_drafter,
                          max_body_bytes=int(args.max_body_mb * MB), api_keys=keys,
                          metrics_public=args.metrics_public, request_log=not args.no_request_log,
                          prefill=prefill, shutdown_timeout_s=args.shutdown_timeout, tool_parser=args.tool_parser)


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from specserve.llm import LLM, freeze_heap
    from specserve.models.loader import resolve_model_path
    from specserve.server.app import create_app
    from specserve.server.shutdown import DrainingServer

    specs = drafter_specs(args)
    settings = server_settings(args, specs[0].name)
    if settings.host not in ("127.0.0.1", "localhost", "::1") and not settings.api_keys:
        print(f"specserve: warning: listening on {settings.host} without --api-key: anyone who can reach the port "
              "can generate", file=sys.stderr)
    path = resolve_model_path(args.model)
    llm = LLM(args.model, runtime_options(args), drafters=specs, max_batch=settings.max_batch, max_len=args.max_len,
              preload=True, prefill=settings.prefill)
    freeze_heap()                        # before serving: what is loaded stays, out of the collector's walks
    name = args.served_model_name or ("default" if args.model == "default" else path)
    app = create_app(llm, name, settings)
    _server_logging(settings.request_log)
    server = DrainingServer(uvicorn.Config(app, host=settings.host, port=settings.port, log_level="warning"),
                            app.state.drain, settings.shutdown_timeout_s)
    server.run()          # returns after a drain (see specserve.server.shutdown); a bind failure exits 3
    return server.exit_code       # 0; 1 when a second signal cut the drain short


def _server_logging(requests: bool) -> None:
    """The server's log lines on stderr: one JSON line per request (unless turned off), and the
    engine's errors (a drafter's fault, with its traceback the first time)."""
    import logging
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    for name, level in (("specserve.requests", logging.INFO if requests else logging.WARNING),
                        ("specserve.engine", logging.WARNING)):
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        logger.setLevel(level)
        logger.propagate = False
