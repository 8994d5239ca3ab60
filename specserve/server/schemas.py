"""OpenAI request bodies, validated with pydantic; field errors become 400s naming the field."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from specserve.constrain import GrammarSpec
from specserve.constrain.grammar import from_response_format
from specserve.limits import MAX_DRAFT, MAX_LOGPROBS

MAX_STOP = 4            # OpenAI's limit
MAX_GRAMMAR = 100_000   # characters of a regular expression or grammar
MAX_TOOLS = 128         # OpenAI's limit on tools, and ours on the calls of a turn


class Speculative(BaseModel):
    """Extension: per-request speculation."""
    model_config = ConfigDict(extra="forbid", strict=True)
    drafter: str = Field(default=None, min_length=1, max_length=64)
    # draft length (tree drafters: node budget) or "auto"; absent: the drafter's configured default
    num_draft: Annotated[int, Field(ge=0, le=MAX_DRAFT)] | Literal["auto"] | None = None


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, populate_by_name=True)
    name: str = Field(default="response", min_length=1, max_length=64)
    description: str | None = None
    schema_: dict = Field(alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """OpenAI's ``response_format`` (``text``, ``json_object``, ``json_schema``), and the extension
    ``{"type": "regex", "regex": "..."}`` and ``{"type": "grammar", "grammar": "<EBNF>"}``."""
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["text", "json_object", "json_schema", "regex", "grammar"]
    json_schema: JsonSchemaFormat | None = None
    regex: str | None = Field(default=None, min_length=1, max_length=MAX_GRAMMAR)
    grammar: str | None = Field(default=None, min_length=1, max_length=MAX_GRAMMAR)

    def spec(self) -> GrammarSpec | None:
        """The grammar asked for (None: free text); ``from_response_format`` refuses a type without its
        field, and compilation a source it cannot parse (both ``SpecserveError``, a 400)."""
        return from_response_format(self.model_dump(by_alias=True, exclude_none=True))


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True)
    include_usage: bool = False


class _Common(BaseModel):
    # strict: "yes" is not a boolean and "2" is not a number; unknown OpenAI fields are ignored
    model_config = ConfigDict(extra="ignore", strict=True)
    model: str = Field(min_length=1, max_length=256)
    max_tokens: int | None = Field(default=None, ge=0, le=1_000_000)     # 0: only with echo and logprobs
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
    response_format: ResponseFormat | None = None
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(default=1.0, gt=0.0, le=100.0)     # extension; 1 disables

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
    echo: bool = False
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)

    def logprob_counts(self) -> tuple[int | None, int | None]:
        """(per generated token, per prompt token): the top logprobs asked for, None for none."""
        return self.logprobs, self.logprobs if self.echo else None


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["text"]
    text: str = Field(max_length=1_000_000)


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    name: str = Field(min_length=1, max_length=64)
    arguments: str = Field(max_length=1_000_000)


class ToolCall(BaseModel):
    """A call on an assistant turn of the conversation, as a reply carried it."""
    model_config = ConfigDict(extra="ignore", strict=True)
    id: str = Field(min_length=1, max_length=256)
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    """A turn: ``content`` a string or text parts; an assistant turn may carry ``tool_calls`` (then
    its content may be null), a ``tool`` turn is the result of the call ``tool_call_id``;
    ``developer`` is read as ``system``."""
    model_config = ConfigDict(extra="ignore", strict=True)
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = Field(default=None, max_length=1_000_000)
    tool_calls: list[ToolCall] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_call_id: str | None = Field(default=None, min_length=1, max_length=256)
    name: str | None = Field(default=None, max_length=64)

    @model_validator(mode="after")
    def _fields_of_role(self):
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only an assistant turn carries tool_calls")
        if self.role == "tool" and self.tool_call_id is None:
            raise ValueError("a tool turn needs tool_call_id, the id of the call it answers")
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError("content is required (null only on an assistant turn with tool_calls)")
        return self

    def doc(self) -> dict:
        """The turn as chat templates read it."""
        text = self.content if isinstance(self.content, str) or self.content is None else \
            "".join(p.text for p in self.content)
        doc = {"role": "system" if self.role == "developer" else self.role, "content": text or ""}
        if self.tool_calls:
            doc["tool_calls"] = [c.model_dump() for c in self.tool_calls]
        if self.tool_call_id is not None:
            doc["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            doc["name"] = self.name
        return doc


class ChatRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1, max_length=256)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    # tools: OpenAI's; checked whole by ``tools.tools_of`` and ``ToolChoice.of`` (400s naming the field)
    tools: list[dict] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool = True
    echo: ClassVar[bool] = False          # chat has no echo

    @model_validator(mode="after")
    def _top_needs_logprobs(self):
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self

    def logprob_counts(self) -> tuple[int | None, int | None]:
        return (self.top_logprobs or 0) if self.logprobs else None, None
