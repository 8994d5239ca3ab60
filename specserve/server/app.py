"""The OpenAI-compatible HTTP server: /v1/models, /v1/completions, /v1/chat/completions, /health, /metrics.

Every bad input gets a 4xx with an OpenAI-style error body naming the field; nothing here may turn
a client's mistake into a 500 or affect other requests.  The parts: ``routes`` (the endpoints),
``streaming`` (response documents and server-sent events), ``errors`` (error bodies, the table from
a failed request's kind to its status, exception handlers), ``limits`` (the body-size middleware), ``auth`` (API keys), ``shutdown`` (draining on SIGTERM),
``gauges`` (read from the scheduler and the engine's snapshot), ``metrics`` and ``schemas``.
"""

from __future__ import annotations

import contextlib

from fastapi import FastAPI

from specserve.constrain import GrammarSpec
from specserve.llm import LLM
from specserve.scheduler import Scheduler
from specserve.server import gauges
from specserve.server.auth import install_auth
from specserve.server.errors import install_error_handlers
from specserve.errors import SpecserveError
from specserve.server.limits import BodyLimit, TokenLimits
from specserve.server.metrics import Metrics
from specserve.server.requestlog import RequestLog
from specserve.server.routes import Service, add_routes
from specserve.server.shutdown import install_drain


def create_app(llm: LLM, model_name: str, default_drafter: str | None = None, max_waiting: int = 64,
               request_timeout_s: float = 600.0, max_body_bytes: int = 4 * 2**20,
               default_max_tokens: int | None = None, api_keys: tuple[str, ...] = (), metrics_public: bool = False,
               limits: TokenLimits = TokenLimits()) -> FastAPI:
    """The app around ``llm``'s engine; its scheduler thread runs for the app's lifespan (the
    engine calibrated its cost model when it was built).  ``api_keys``: required as bearer tokens
    on ``/v1`` (and ``/metrics`` unless ``metrics_public``); none: no authentication.
    ``default_max_tokens``: for a request that names none (default: 256, within ``limits``);
    ``default_drafter``: for a request that names none (default: ``llm.default_drafter``)."""
    cap = limits.max_tokens_limit
    if default_max_tokens is None:
        default_max_tokens = min(256, cap or 256)
    elif cap is not None and default_max_tokens > cap:
        raise SpecserveError(f"the default max_tokens ({default_max_tokens}) exceeds --max-tokens-limit ({cap})")
    if max_body_bytes < 1:
        raise SpecserveError(f"the body limit must be >= 1 byte, got {max_body_bytes}")
    llm.engine.make_resident()        # the KV budget in memory now, not page by page over hours
    llm.grammar(GrammarSpec("json_object"))   # the grammar compiler built now, not in the first request
    metrics = Metrics()
    scheduler = Scheduler(llm.engine, max_waiting=max_waiting, metrics=metrics)
    metrics.gauges = lambda: gauges.gauges(scheduler)
    metrics.counters = lambda: gauges.counters(scheduler)
    metrics.labelled_counters = lambda: gauges.labelled_counters(scheduler)

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        scheduler.start()
        yield
        scheduler.stop()

    app = FastAPI(title="specserve", version="0.1.0", lifespan=lifespan)
    app.state.scheduler, app.state.metrics, app.state.llm = scheduler, metrics, llm
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    install_auth(app, tuple(api_keys), metrics_public)
    app.state.drain = install_drain(app, scheduler)     # outside auth: a draining server answers 503 to all
    install_error_handlers(app)
    app.add_middleware(RequestLog)                     # outermost of all: every response has its id
    add_routes(app, Service(llm, scheduler, metrics, model_name, default_drafter or llm.default_drafter, request_timeout_s,
                            default_max_tokens, limits))
    return app
