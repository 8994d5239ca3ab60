"""The endpoints: /health, /metrics, /v1/models, /v1/completions and /v1/chat/completions."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from specserve.engine import Result
from specserve.errors import SpecserveError
from specserve.llm import LLM
from specserve.sampling import SamplingParams
from specserve.scheduler import ErrorKind, Handle, QueueFull, RequestError, Scheduler
from specserve.server.errors import API_PARAM, error, request_error
from specserve.server.logprobs import chat_logprobs, completion_logprobs
from specserve.server.metrics import Metrics
from specserve.server.requestlog import log_fields, result_fields
from specserve.server.schemas import ChatRequest, CompletionRequest
from specserve.server.settings import ServerSettings
from specserve.server.streaming import Reply, TextStream, sse
from specserve.constrain import GrammarSpec
from specserve.tools import CallFormat, CallStream, Tool, ToolChoice, read, tools_of


@dataclass(frozen=True)
class ToolPlan:
    """How a chat request's reply treats tools: the call format read back from its text, and the
    grammar that constrains it to calls (``required`` or a named function; None: ``auto``)."""
    fmt: CallFormat
    grammar: GrammarSpec | None

    @property
    def forced(self) -> bool:
        return self.grammar is not None


@dataclass(frozen=True)
class Service:
    """What the endpoints share: the model, the scheduler, the metrics and the server's settings."""
    llm: LLM
    scheduler: Scheduler
    metrics: Metrics
    model_name: str
    default_drafter: str = "none"
    settings: ServerSettings = ServerSettings()


def add_routes(app: FastAPI, svc: Service) -> None:
    @app.get("/health")
    async def health():
        return {"status": "ok", "running": svc.scheduler.num_running, "waiting": svc.scheduler.num_waiting}

    @app.get("/metrics")
    async def prometheus(request: Request):
        body, content_type = svc.metrics.render(request.headers.get("accept"))
        return Response(body, media_type=content_type)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": svc.model_name, "object": "model", "created": 0,
                                            "owned_by": "specserve"}]}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        try:
            ids = svc.llm.encode(body.prompt, raw=True)
        except SpecserveError as e:
            return error(400, str(e), "prompt")
        return await serve(svc, body, ids, log_fields(request.scope), chat=False)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request):
        try:
            tools, fmt = tools_of(body.tools or []), svc.llm.call_format(svc.settings.tool_parser)
            plan = tool_plan(body, tools, fmt)
            messages = [m.doc() for m in body.messages]
            if tools or any(m.get("tool_calls") or m["role"] == "tool" for m in messages):
                ids = svc.llm.encode_tools(messages, tools, fmt)
            else:
                ids = svc.llm.encode(messages)
        except SpecserveError as e:
            return error(400, str(e), e.param or "messages")
        except Exception as e:  # noqa: BLE001 - a template that rejects the conversation is the client's input
            return error(400, f"chat template rejected the messages: {e}", "messages")
        return await serve(svc, body, ids, log_fields(request.scope), chat=True, tools=plan)


def tool_plan(body: ChatRequest, tools: list[Tool], fmt: CallFormat) -> ToolPlan | None:
    """How the reply treats the request's ``tools`` (None: as text: no tools, or ``tool_choice:
    none``), read in ``fmt``; a choice naming no tool or one that cannot go with ``response_format``:
    SpecserveError."""
    choice = ToolChoice.of(body.tool_choice, tools)
    if choice.mode == "none":
        return None
    if not choice.forced:
        return ToolPlan(fmt, None)
    if body.response_format is not None and body.response_format.type != "text":
        raise SpecserveError(f"response_format cannot be combined with tool_choice {choice.mode!r}: the reply is "
                             "calls", "response_format")
    return ToolPlan(fmt, GrammarSpec("grammar", fmt.grammar(choice.offered(tools), body.parallel_tool_calls)))


async def serve(svc: Service, body: CompletionRequest | ChatRequest, prompt_ids: list[int], log: dict, chat: bool,
                tools: ToolPlan | None = None):
    """Queue the request and answer it: one completion document, or a stream of events.  ``log``:
    the fields of the request's log line (``requestlog``), filled in on the way; ``tools``: the
    reply's tool calls are read from its text (and constrained to them when forced)."""
    if body.model != svc.model_name:
        return error(404, f"model {body.model!r} not found; this server serves {svc.model_name!r}", "model",
                     type_="not_found_error")
    wants_logprobs = body.logprob_counts()[0] is not None
    if body.stream and body.echo and wants_logprobs:
        return error(400, "echo with logprobs is answered whole: set stream to false", "stream")
    handle = submit(svc, body, prompt_ids, log, chat, tools.grammar if tools else None)
    if isinstance(handle, JSONResponse):
        return handle
    def counted(calls: int) -> None:           # a reply that could call tools: its calls, logged and counted
        log.update(tool_calls=calls)
        svc.metrics.observe_tools(calls)

    echo = body.prompt if body.echo else ""
    reply = Reply(("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24], int(time.time()), svc.model_name,
                  chat, len(prompt_ids), echo)
    stream = TextStream(svc.llm, body.stops())
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        doc = None
        if wants_logprobs:
            doc = (lambda lps: chat_logprobs(svc.llm, lps)) if chat else (lambda lps: completion_logprobs(svc.llm, lps))
        calls = CallStream(tools.fmt, tools.forced) if tools else None
        return StreamingResponse(sse(svc.scheduler, handle, stream, reply, include_usage, log, doc, calls,
                                     counted), media_type="text/event-stream")
    outcome = await wait(svc.scheduler, handle)
    if isinstance(outcome, RequestError):
        log.update(outcome=outcome.kind.value, error=outcome.message)
        return request_error(outcome)
    log.update(result_fields(outcome))
    if chat:
        lps = chat_logprobs(svc.llm, outcome.logprobs)
    else:
        lps = completion_logprobs(svc.llm, outcome.logprobs, prompt_ids if body.echo else None, outcome.prompt_logprobs)
    text = stream.feed(outcome.tokens, final=True)
    reading = read(tools.fmt, text, True, tools.forced, outcome.finish_reason == "stop") if tools else None
    if reading is not None:
        counted(len(reading.calls))
    return reply.completion(text, outcome, lps, reading)


def submit(svc: Service, body: CompletionRequest | ChatRequest, prompt_ids: list[int], log: dict,
           chat: bool, calls: GrammarSpec | None = None) -> Handle | JSONResponse:
    """The engine request of a body, queued; a 400 naming the field it cannot serve (a server limit
    included), or a 429 if full.  ``calls``: the grammar of the tool calls the reply must be."""
    spec = body.speculative
    drafter = spec.drafter if spec and spec.drafter else svc.default_drafter
    k = spec.num_draft if spec and spec.num_draft is not None else None     # None: the drafter's default
    max_tokens = next((v for v in (body.max_completion_tokens, body.max_tokens) if v is not None),
                      svc.settings.fallback_max_tokens)
    max_field = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
    seed = body.seed % (2**63) if body.seed is not None else None
    log.update(drafter=drafter, prompt_tokens=len(prompt_ids), max_tokens=max_tokens)
    try:
        svc.settings.limits.check(len(prompt_ids), "messages" if chat else "prompt", max_tokens, max_field)
        sampling = SamplingParams(body.temperature, body.top_k, body.top_p, seed, body.presence_penalty,
                                  body.frequency_penalty, body.repetition_penalty)
        grammar = calls or (body.response_format.spec() if body.response_format is not None else None)
        logprobs, prompt_logprobs = body.logprob_counts()
        req = svc.llm.request(prompt_ids, max_tokens, sampling, drafter, k, body.stops(), grammar, logprobs,
                              prompt_logprobs)
        return svc.scheduler.submit(req, svc.settings.request_timeout_s, asyncio.get_running_loop())
    except SpecserveError as e:
        param = "tools" if calls is not None and e.param == "response_format" else API_PARAM.get(e.param, e.param)
        return error(400, str(e), param)
    except QueueFull:
        return request_error(RequestError(ErrorKind.QUEUE_FULL, "server busy: waiting queue is full; retry later"))


async def wait(scheduler: Scheduler, handle: Handle) -> Result | RequestError:
    """The request's result or error; a client that goes away first cancels it."""
    try:
        while True:
            kind, payload = await handle.events.get()
            if kind not in ("tokens", "logprobs"):
                return payload
    except asyncio.CancelledError:
        scheduler.cancel(handle)
        raise
