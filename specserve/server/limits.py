"""Limits on what a client may send: the body's size, the prompt's tokens, the tokens asked for.

The body limit is an ASGI middleware, so it holds for every way a body can arrive: a declared
``content-length`` over the limit is refused before anything is read, and a body without one (a
chunked upload) is counted as it is received and refused the moment it passes the limit.  The
token limits are the server's own (``--max-prompt-tokens``, ``--max-tokens-limit``), checked once
the prompt is tokenised; each refusal is a 400 naming the field and both numbers.  ``TokenLimits``
is defined with the server's other settings (``settings``) and re-exported here.
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from specserve.server.errors import error
from specserve.server.settings import TokenLimits

__all__ = ["BodyLimit", "TokenLimits"]


class BodyLimit:
    """Refuse with a 413 any request whose body is, or declares itself, larger than ``max_bytes``."""

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            await self.refusal()(scope, receive, send)
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:     # an HTTPException: the app's handler answers 413
                    raise HTTPException(413, self.message)
            return message

        await self.app(scope, counted, send)

    @property
    def message(self) -> str:
        return f"request body larger than {self.max_bytes} bytes"

    def refusal(self):
        return error(413, self.message)

