"""``specserve serve``: its flags and the command (the model loaded, the app built, uvicorn run
under the draining server, the server's log lines on stderr)."""

from __future__ import annotations

import argparse
import sys

from specserve.cli_args import drafter_specs, engine_args, runtime_options
from specserve.errors import SpecserveError


def add_serve_args(v: argparse.ArgumentParser) -> None:
    engine_args(v, many=True)
    v.add_argument("--host", default="127.0.0.1", help="address to listen on")
    v.add_argument("--port", type=int, default=8000, help="port to listen on")
    v.add_argument("--max-batch", type=int, default=16, help="sequences in the running batch (KV rows)")
    v.add_argument("--max-waiting", type=int, default=64, help="waiting-queue bound; beyond it: 429")
    v.add_argument("--request-timeout", type=float, default=600.0, help="seconds before a request gets a 504")
    v.add_argument("--max-prompt-tokens", type=int, default=None, metavar="N", help="refuse (400) a prompt of "
                   "more tokens (default: only the context length limits prompt + max_tokens)")
    v.add_argument("--max-tokens-limit", type=int, default=None, metavar="N", help="refuse (400) a request "
                   "asking for more tokens (max_tokens or max_completion_tokens); a request naming none gets "
                   "min(256, N)")
    v.add_argument("--max-body-mb", type=float, default=4.0, metavar="MB", help="refuse (413) a request body "
                   "larger than this, declared or chunked")
    v.add_argument("--no-request-log", action="store_true", help="do not write one JSON line per /v1 request "
                   "to stderr")
    v.add_argument("--served-model-name", default=None, help="the model name clients send (default: 'default' or the path)")
    v.add_argument("--prefill-chunk", type=int, default=256, help="most prompt tokens one engine step takes "
                   "(a multiple of 16); prompts enter the running batch in chunks")
    v.add_argument("--no-chunked-prefill", action="store_true", help="prefill every prompt whole, in one step "
                   "(running streams wait for it)")
    v.add_argument("--prefill-stall", type=float, default=5.0, help="while streams run, a step with prompt chunks "
                   "is sized to take at most this many times a decoding step of the whole batch")
    v.add_argument("--prefix-cache-mb", type=float, default=1024, help="memory for reusing the KV of earlier "
                   "prompts' prefixes (least recently used blocks are evicted)")
    v.add_argument("--no-prefix-cache", action="store_true", help="never reuse earlier prompts' KV")
    v.add_argument("--api-key", action="append", default=None, metavar="KEY",
                   help="require 'Authorization: Bearer KEY' on /v1 and /metrics (repeatable; also "
                   "SPECSERVE_API_KEY, comma-separated); /health stays open")
    v.add_argument("--metrics-public", action="store_true", help="serve /metrics without a key")
    v.add_argument("--shutdown-timeout", type=float, default=30.0, metavar="SECONDS",
                   help="on SIGTERM or SIGINT: /health and new /v1 requests get 503 while running and queued "
                   "requests finish, for at most this many seconds; then what is left ends with an error "
                   "(server_shutting_down) and the process exits with status 0.  A second signal stops at "
                   "once (status 1)")


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from specserve.control import PrefillPolicy
    from specserve.llm import LLM, freeze_heap
    from specserve.models.loader import resolve_model_path
    from specserve.server.app import create_app
    from specserve.server.auth import api_keys
    from specserve.server.limits import TokenLimits
    from specserve.server.shutdown import DrainingServer

    specs = drafter_specs(args)
    if not 1 <= args.port <= 65535:
        raise SpecserveError(f"--port must be in [1, 65535], got {args.port}")
    if args.max_batch < 1 or args.max_waiting < 0:
        raise SpecserveError("--max-batch must be >= 1 and --max-waiting >= 0")
    if not args.shutdown_timeout >= 0:
        raise SpecserveError(f"--shutdown-timeout must be >= 0, got {args.shutdown_timeout}")
    keys = api_keys(args.api_key)
    limits = TokenLimits(args.max_prompt_tokens, args.max_tokens_limit)
    if not args.max_body_mb * 2**20 >= 1:
        raise SpecserveError(f"--max-body-mb must be > 0, got {args.max_body_mb}")
    if args.host not in ("127.0.0.1", "localhost", "::1") and not keys:
        print(f"specserve: warning: listening on {args.host} without --api-key: anyone who can reach the port "
              "can generate", file=sys.stderr)
    path = resolve_model_path(args.model)
    prefill = PrefillPolicy(None if args.no_chunked_prefill else args.prefill_chunk, args.prefill_stall,
                            0.0 if args.no_prefix_cache else args.prefix_cache_mb)
    prefill.check()
    llm = LLM(args.model, runtime_options(args), drafters=specs, max_batch=args.max_batch, max_len=args.max_len,
              preload=True, prefill=prefill)
    freeze_heap()                        # before serving: what is loaded stays, out of the collector's walks
    name = args.served_model_name or ("default" if args.model == "default" else path)
    app = create_app(llm, name, default_drafter=specs[0].name, max_waiting=args.max_waiting,
                     request_timeout_s=args.request_timeout, api_keys=keys, metrics_public=args.metrics_public,
                     max_body_bytes=int(args.max_body_mb * 2**20), limits=limits)
    _server_logging(not args.no_request_log)
    server = DrainingServer(uvicorn.Config(app, host=args.host, port=args.port, log_level="warning"),
                            app.state.drain, args.shutdown_timeout)
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
