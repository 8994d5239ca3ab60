"""The OpenAI-compatible HTTP server: /v1/models, /v1/completions, /v1/chat/completions, /health, /metrics.

Every bad input gets a 4xx with an OpenAI-style error body naming the field; nothing here may turn
a client's mistake into a 500 or affect other requests.  The parts: ``routes`` (the endpoints),
``streaming`` (response documents and server-sent events), ``errors`` (error bodies, the table from
a failed request's kind to its status, exception handlers), ``limits`` (the body-size middleware), ``auth`` (API keys), ``shutdown`` (draining on SIGTERM),
``gauges`` (read from the scheduler and the engine's snapshot), ``metrics``, ``schemas`` and
``settings`` (the server's settings and their defaults).
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import Any

from fastapi import FastAPI

from specserve.constrain import GrammarSpec
from specserve.llm import LLM
from specserve.scheduler import Scheduler
from specserve.server import gauges
from specserve.server.auth import install_auth
from specserve.server.errors import install_error_handlers
from specserve.server.limits import BodyLimit
from specserve.server.metrics import Metrics
from specserve.server.requestlog import RequestLog
from specserve.server.routes import Service, add_routes
from specserve.server.settings import ServerSettings
from specserve.server.shutdown import install_drain


def create_app(llm: LLM, model_name: str, settings: ServerSettings = ServerSettings(), **overrides: Any) -> FastAPI:
    """The app around ``llm``'s engine; its scheduler thread runs for the app's lifespan (the
    engine calibrated its cost model when it was built).  ``settings``: what the server runs with
    (``ServerSettings``; the app reads the fields that serve requests); ``overrides``: fields of
    ``settings`` replaced, e.g. ``max_waiting=8``.  A setting that cannot work raises
    ``SpecserveError`` before anything is built."""
    settings = replace(settings, **overrides) if overrides else settings
    llm.engine.make_resident()        # the KV budget in memory now, not page by page over hours
    llm.grammar(GrammarSpec("json_object"))   # the grammar compiler built now, not in the first request
    metrics = Metrics()
    scheduler = Scheduler(llm.engine, max_waiting=settings.max_waiting, metrics=metrics)
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
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    install_auth(app, tuple(settings.api_keys), settings.metrics_public)
    app.state.drain = install_drain(app, scheduler)     # outside auth: a draining server answers 503 to all
    install_error_handlers(app)
    app.add_middleware(RequestLog)                     # outermost of all: every response has its id
    add_routes(app, Service(llm, scheduler, metrics, model_name, settings.default_drafter or llm.default_drafter,
                            settings))
    return app
