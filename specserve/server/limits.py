"""Limits on what a client may send: the body's size, the prompt's tokens, the tokens asked for.

The body limit is an ASGI middleware, so it holds for every way a body can arrive: a declared
``content-length`` over the limit is refused before anything is read, and a body without one (a
chunked upload) is counted as it is received and refused the moment it passes the limit.  The
token limits are the server's own (``--max-prompt-tokens``, ``--max-tokens-limit``), checked once
the prompt is tokenised; each refusal is a 400 naming the field and both numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from specserve.errors import SpecserveError
from specserve.server.errors import error


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


@dataclass(frozen=True)
class TokenLimits:
    """The server's limits on a request's tokens (None: only the context length limits them)."""
    max_prompt_tokens: int | None = None
    max_tokens_limit: int | None = None

    def __post_init__(self):
        for name in ("max_prompt_tokens", "max_tokens_limit"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise SpecserveError(f"--{name.replace('_', '-')} must be >= 1, got {value}")

    def check(self, prompt_tokens: int, prompt_field: str, max_tokens: int, max_tokens_field: str) -> None:
        """Raise SpecserveError (its param: the field) for a request past a limit."""
        if self.max_prompt_tokens is not None and prompt_tokens > self.max_prompt_tokens:
            raise SpecserveError(f"{prompt_field}: {prompt_tokens} tokens, more than this server's limit of "
                                 f"{self.max_prompt_tokens} prompt tokens", prompt_field)
        if self.max_tokens_limit is not None and max_tokens > self.max_tokens_limit:
            raise SpecserveError(f"{max_tokens_field}: {max_tokens} tokens asked for, more than this server's "
                                 f"limit of {self.max_tokens_limit}", max_tokens_field)
