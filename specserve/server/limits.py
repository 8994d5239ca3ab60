"""Limits on what a client may send, checked before a body is read."""

from __future__ import annotations

from fastapi import FastAPI, Request as HTTPRequest

from specserve.server.errors import error


def install_body_limit(app: FastAPI, max_body_bytes: int) -> None:
    """Refuse with a 413 any request that declares a body larger than ``max_body_bytes``."""

    @app.middleware("http")
    async def limit_body(request: HTTPRequest, call_next):
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > max_body_bytes):
            return error(413, f"request body larger than {max_body_bytes} bytes")
        return await call_next(request)
