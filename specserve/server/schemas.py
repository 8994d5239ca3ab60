"""OpenAI request bodies, validated with pydantic; field errors become 400s naming the field."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_STOP = 4            # OpenAI's limit
MAX_DRAFT = 32          # the engine's limit (specserve.engine.MAX_DRAFT)


class Speculative(BaseModel):
    """Extension: per-request speculation."""
    model_config = ConfigDict(extra="forbid", strict=True)
    drafter: str = Field(default=None, min_length=1, max_length=64)
    # draft length (tree drafters: node budget) or "auto"; absent: the drafter's configured default
    num_draft: Annotated[int, Field(ge=0, le=MAX_DRAFT)] | Literal["auto"] | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True)
    include_usage: bool = False


class _Common(BaseModel):
    # strict: "yes" is not a boolean and "2" is not a number; unknown OpenAI fields are ignored
    model_config = ConfigDict(extra="ignore", strict=True)
    model: str = Field(min_length=1, max_length=256)
    max_tokens: int | None = Field(default=None, ge=1, le=1_000_000)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=1_000_000)
    temperature: float = Field(default=1.0, ge=0.0, le=100.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0, le=1_000_000)       # extension; 0 disables
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)
    stop: str | list[str] | None = None
    n: int = Field(default=1, ge=1, le=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    speculative: Speculative | None = None

    @field_validator("stop")
    @classmethod
    def _stops(cls, v):
        stops = [v] if isinstance(v, str) else (v or [])
        if len(stops) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop strings")
        if any(not s for s in stops):
            raise ValueError("stop strings must be non-empty")
        return stops

    def stops(self) -> list[str]:
        return list(self.stop or [])


class CompletionRequest(_Common):
    prompt: str = Field(min_length=1, max_length=1_000_000)
    echo: Literal[False] = False


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    role: Literal["system", "user", "assistant"]
    content: str = Field(max_length=1_000_000)


class ChatRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1, max_length=256)
