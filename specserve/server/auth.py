"""API keys: ``Authorization: Bearer KEY`` on every ``/v1`` route (and ``/metrics`` unless public).

Keys come from ``--api-key`` (repeatable) and ``SPECSERVE_API_KEY`` (comma-separated).  A request
without a valid key gets a 401 with an OpenAI-style error body and ``WWW-Authenticate: Bearer``;
``/health`` stays open for load balancers.  Keys are compared in constant time (``hmac``), each
against every configured key, so the time taken says nothing about how much of a key was right.
"""

from __future__ import annotations

import hmac
import os

from fastapi import FastAPI, Request as HTTPRequest

from specserve.errors import SpecserveError
from specserve.server.errors import error

ENV = "SPECSERVE_API_KEY"


def api_keys(given: list[str] | None, environ: dict[str, str] | None = None) -> tuple[str, ...]:
    """The keys from the command line and the environment (empty: no authentication)."""
    env = (environ if environ is not None else os.environ).get(ENV, "")
    keys = [k.strip() for k in (given or [])] + [k.strip() for k in env.split(",") if k.strip()]
    if any(not k for k in keys):
        raise SpecserveError("--api-key must not be empty")
    if any(any(c.isspace() for c in k) for k in keys):
        raise SpecserveError("an API key must not contain whitespace")
    return tuple(dict.fromkeys(keys))


def valid(header: str | None, keys: tuple[str, ...]) -> bool:
    """Whether an ``Authorization`` header carries one of ``keys`` as a bearer token."""
    if not header or not header[:7].lower() == "bearer ":
        return False
    token = header[7:].strip().encode()
    ok = False
    for k in keys:                                   # no early exit: every key is compared
        ok |= hmac.compare_digest(token, k.encode())
    return ok


def install_auth(app: FastAPI, keys: tuple[str, ...], metrics_public: bool = False) -> None:
    """Require a key on ``/v1/...`` (and ``/metrics`` unless ``metrics_public``); nothing if no keys."""
    if not keys:
        return

    @app.middleware("http")
    async def require_key(request: HTTPRequest, call_next):
        path = request.url.path
        guarded = path == "/v1" or path.startswith("/v1/") or (path == "/metrics" and not metrics_public)
        if guarded and not valid(request.headers.get("authorization"), keys):
            resp = error(401, "missing or invalid API key (send 'Authorization: Bearer KEY')",
                         type_="invalid_request_error", headers={"WWW-Authenticate": "Bearer"})
            return resp
        return await call_next(request)
