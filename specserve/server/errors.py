"""OpenAI-style error bodies, the one table from a scheduler's error kind to an HTTP status, and the
exception handlers that keep a client's mistake a 4xx (a bug: a 500 without a traceback)."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from specserve.scheduler import ErrorKind, RequestError

# a failed request's kind -> (HTTP status, OpenAI error type, headers)
ERROR_STATUS: dict[ErrorKind, tuple[int, str, dict | None]] = {
    ErrorKind.REJECTED: (400, "invalid_request_error", None),      # the engine refused it at admission
    ErrorKind.QUEUE_FULL: (429, "rate_limit_error", {"Retry-After": "1"}),
    ErrorKind.TIMEOUT: (504, "timeout", None),
    ErrorKind.CANCELLED: (499, "cancelled", None),                 # the client has gone: nobody reads it
    ErrorKind.INTERNAL: (500, "server_error", None),
    ErrorKind.SHUTDOWN: (503, "server_shutting_down", {"Retry-After": "5"}),
}

# engine / sampling field names -> the request body's field names
API_PARAM = {"drafter": "speculative.drafter", "num_draft": "speculative.num_draft"}


def error(status: int, message: str, param: str | None = None, type_: str = "invalid_request_error",
          headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": type_, "param": param, "code": None}},
                        status_code=status, headers=headers)


def request_error(err: RequestError) -> JSONResponse:
    """The response to a request that the scheduler ended with an error."""
    status, type_, headers = ERROR_STATUS[err.kind]
    return error(status, err.message, API_PARAM.get(err.param, err.param), type_, headers)


def error_event(err: RequestError) -> dict:
    """The same error as a streamed event's body (the status line has been sent already)."""
    return {"error": {"message": err.message, "type": ERROR_STATUS[err.kind][1]}}


def install_error_handlers(app: FastAPI) -> None:
    """Validation errors -> 400 naming the field; HTTP errors keep their status; anything else -> 500."""
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(StarletteHTTPException, _http)
    app.add_exception_handler(Exception, _unexpected)


async def _invalid(request, exc: RequestValidationError) -> JSONResponse:
    first = exc.errors()[0] if exc.errors() else {}
    # the field path, without pydantic's union-member tags such as "constrained-int" or "literal['auto']"
    loc = [str(x) for x in first.get("loc", []) if x != "body" and (isinstance(x, int) or str(x).isidentifier())]
    param = ".".join(loc) or None
    msg = first.get("msg", "invalid request")
    if first.get("type") == "json_invalid":
        return error(400, "request body is not valid JSON")
    return error(400, f"{param or 'body'}: {msg}", param)


async def _http(request, exc: StarletteHTTPException) -> JSONResponse:
    return error(exc.status_code, str(exc.detail), type_="not_found_error" if exc.status_code == 404 else
                 "invalid_request_error")


async def _unexpected(request, exc: Exception) -> JSONResponse:  # last resort: a bug, reported without a traceback
    return error(500, f"internal error: {type(exc).__name__}", type_="server_error")
