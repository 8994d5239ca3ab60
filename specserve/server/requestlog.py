"""Request ids and the one structured log line per request.

``RequestLog`` is the outermost ASGI middleware: it takes the request's ``X-Request-Id`` (1 to 128
characters of letters, digits and ``-_.:``; anything else is replaced) or makes one, echoes it on
the response, and when the response's last byte has been sent writes one JSON line to the
``specserve.requests`` logger: the id, method, path, status and seconds, and what the endpoint
added on the way (``log_fields``): the drafter, prompt, cached and output tokens, time to first token,
mean accepted length, drafter faults, and the outcome (``success``, or why it failed).  A
streamed response's line is written when its stream ends, so it carries the stream's outcome.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("specserve.requests")

_VALID_ID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")


def request_id(given: bytes | None) -> str:
    """The client's id if it is a valid one, else a new one."""
    if given is not None:
        text = given.decode("latin-1")
        if _VALID_ID.fullmatch(text):
            return text
    return uuid.uuid4().hex


def log_fields(scope: Scope) -> dict:
    """The fields of the request's log line, for the endpoint to fill in (kept in the ASGI scope)."""
    return scope.setdefault("state", {}).setdefault("log", {})


def result_fields(result) -> dict:
    """What a finished request's log line says about its generation."""
    s = result.stats
    return {"outcome": "success", "finish_reason": result.finish_reason, "output_tokens": len(result.tokens),
            "cached_tokens": s.cached_tokens, "ttft_s": round(s.ttft_s, 4),
            "mean_accepted_length": round(s.mean_accepted_length, 3), "drafter_faults": s.drafter_faults}


class RequestLog:
    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = request_id(dict(scope["headers"]).get(b"x-request-id"))
        state = scope.setdefault("state", {})
        state["request_id"] = rid
        start, status, written = time.perf_counter(), [0], [False]

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                message["headers"] = list(message.get("headers", [])) + [(b"x-request-id", rid.encode())]
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                written[0] = True
                self.write(scope, rid, status[0], time.perf_counter() - start)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            if not written[0]:        # the client went away mid-response, or the app raised
                self.write(scope, rid, status[0], time.perf_counter() - start, complete=False)

    @staticmethod
    def write(scope: Scope, rid: str, status: int, seconds: float, complete: bool = True) -> None:
        """The request's line (only for the API's routes: not for health checks and scrapes)."""
        if not log.isEnabledFor(logging.INFO) or not str(scope.get("path", "")).startswith("/v1/"):
            return
        line = {"request_id": rid, "method": scope.get("method"), "path": scope.get("path"), "status": status,
                "seconds": round(seconds, 4)}
        line.update(scope.get("state", {}).get("log", {}))
        if "outcome" not in line:
            line["outcome"] = "refused" if status >= 400 else ("success" if complete else "incomplete")
        log.info(json.dumps(line, separators=(",", ":")))
