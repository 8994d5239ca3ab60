"""The OpenAI-compatible HTTP server: /v1/models, /v1/completions, /v1/chat/completions, /health, /metrics.

Every bad input gets a 4xx with an OpenAI-style error body naming the field; nothing here may turn
a client's mistake into a 500 or affect other requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid

from fastapi import FastAPI, Request as HTTPRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from specserve.drafters.registry import AUTO
from specserve.errors import SpecserveError
from specserve.llm import LLM, trim_at_stop
from specserve.sampling import SamplingParams
from specserve.scheduler import QueueFull, Scheduler
from specserve.server.metrics import Metrics
from specserve.server.schemas import ChatRequest, CompletionRequest


# engine / sampling field names -> the request body's field names
API_PARAM = {"drafter": "speculative.drafter", "num_draft": "speculative.num_draft"}


def error(status: int, message: str, param: str | None = None, type_: str = "invalid_request_error",
          headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": type_, "param": param, "code": None}},
                        status_code=status, headers=headers)


class TextStream:
    """Incremental detokenisation that never emits text it may have to take back (a partial stop
    string, or an incomplete UTF-8 character)."""

    def __init__(self, llm: LLM, stops: list[str]):
        self.llm, self.stops, self.tokens, self.sent = llm, stops, [], 0
        self.hold = max((len(s) for s in stops), default=1) - 1

    def feed(self, tokens: list[int], final: bool) -> str:
        self.tokens += tokens
        text = self.llm.tokenizer.decode(self.tokens)
        if self.stops:
            text = trim_at_stop(text, self.stops)
        if not final:
            text = text.rstrip("\ufffd")
            text = text[: max(len(text) - self.hold, self.sent)] if self.hold else text
        delta, self.sent = text[self.sent:], max(self.sent, len(text))
        return delta


def create_app(llm: LLM, model_name: str, default_drafter: str = "none", max_waiting: int = 64, request_timeout_s: float = 600.0, max_body_bytes: int = 4 * 2**20,
               default_max_tokens: int = 256) -> FastAPI:
    metrics = Metrics()
    scheduler = Scheduler(llm.engine, max_waiting=max_waiting, metrics=metrics)
    pool = llm.engine.prefill.pool
    metrics.gauges = lambda: {"specserve_requests_running": scheduler.num_running,
                              "specserve_requests_waiting": scheduler.num_waiting,
                              "specserve_kv_rows_free": llm.engine.free_capacity} | ({
                              "specserve_prefix_cache_bytes": pool.used_bytes,
                              "specserve_prefix_cache_capacity_bytes": pool.capacity * pool.block_bytes,
                              "specserve_prefix_cache_blocks": pool.blocks} if pool is not None else {})
    if pool is not None:
        metrics.counters = lambda: {
            "specserve_prefix_cache_hit_tokens_total": ("Prompt tokens copied from the prefix cache", pool.stats.hit_tokens),
            "specserve_prefix_cache_miss_tokens_total": ("Prompt tokens looked up in the prefix cache and not found",
                                                         pool.stats.miss_tokens),
            "specserve_prefix_cache_stored_blocks_total": ("Blocks added to the prefix cache", pool.stats.stored_blocks),
            "specserve_prefix_cache_evicted_blocks_total": ("Blocks evicted (least recently used leaf first)",
                                                            pool.stats.evicted_blocks)}

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        if any(k == AUTO for k in llm.default_k.values()) or llm.engine.prefill.policy.chunk is not None:
            llm.engine.calibrate()            # the cost model, before the first request or prompt chunk needs it
        scheduler.start()
        yield
        scheduler.stop()

    app = FastAPI(title="specserve", version="0.1.0", lifespan=lifespan)
    app.state.scheduler, app.state.metrics, app.state.llm = scheduler, metrics, llm

    @app.middleware("http")
    async def limit_body(request: HTTPRequest, call_next):
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > max_body_bytes):
            return error(413, f"request body larger than {max_body_bytes} bytes")
        return await call_next(request)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        # the field path, without pydantic's union-member tags such as "constrained-int" or "literal['auto']"
        loc = [str(x) for x in first.get("loc", []) if x != "body" and (isinstance(x, int) or str(x).isidentifier())]
        param = ".".join(loc) or None
        msg = first.get("msg", "invalid request")
        if first.get("type") == "json_invalid":
            return error(400, "request body is not valid JSON")
        return error(400, f"{param or 'body'}: {msg}", param)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request, exc: StarletteHTTPException):
        return error(exc.status_code, str(exc.detail), type_="not_found_error" if exc.status_code == 404 else
                     "invalid_request_error")

    @app.exception_handler(Exception)
    async def _unexpected(request, exc: Exception):  # last resort: a bug, reported without a traceback
        return error(500, f"internal error: {type(exc).__name__}", type_="server_error")

    @app.get("/health")
    async def health():
        return {"status": "ok", "running": scheduler.num_running, "waiting": scheduler.num_waiting}

    @app.get("/metrics")
    async def prometheus():
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "specserve"}]}

    async def serve(body, prompt_ids, chat: bool):
        if body.model != model_name:
            return error(404, f"model {body.model!r} not found; this server serves {model_name!r}", "model",
                         type_="not_found_error")
        spec = body.speculative
        drafter = (spec.drafter if spec and spec.drafter else default_drafter)
        k = spec.num_draft if spec and spec.num_draft is not None else None     # None: the drafter's default
        max_tokens = body.max_completion_tokens or body.max_tokens or default_max_tokens
        seed = body.seed % (2**63) if body.seed is not None else None
        try:
            sampling = SamplingParams(body.temperature, body.top_k, body.top_p, seed)
            req = llm.request(prompt_ids, max_tokens, sampling, drafter, k, body.stops())
            handle = scheduler.submit(req, request_timeout_s, asyncio.get_running_loop())
        except SpecserveError as e:
            return error(400, str(e), API_PARAM.get(e.param, e.param))
        except QueueFull:
            metrics.count_outcome("rejected_queue_full")
            return error(429, "server busy: waiting queue is full; retry later", type_="rate_limit_error",
                         headers={"Retry-After": "1"})
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        created = int(time.time())
        stream = TextStream(llm, body.stops())
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(sse(handle, stream, rid, created, chat, len(prompt_ids), include_usage),
                                     media_type="text/event-stream")
        try:
            while True:
                kind, payload = await handle.events.get()
                if kind == "tokens":
                    stream.tokens += payload
                elif kind == "error":
                    return error(504 if "timed out" in payload else 500, payload,
                                 type_="timeout" if "timed out" in payload else "server_error")
                else:
                    result = payload
                    break
        except asyncio.CancelledError:
            handle.cancel()
            scheduler.wake()
            raise
        text = stream.feed([], final=True)
        finish = "stop" if result.finish_reason == "stop" else "length"
        usage = usage_of(len(prompt_ids), result)
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
                  if chat else {"index": 0, "text": text, "logprobs": None, "finish_reason": finish})
        return {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": created,
                "model": model_name, "choices": [choice], "usage": usage,
                "speculative_stats": spec_stats(result.stats)}

    async def sse(handle, stream: TextStream, rid, created, chat: bool, n_prompt: int, include_usage: bool):
        obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(delta: str | None, finish: str | None, first: bool = False, extra: dict | None = None) -> str:
            if chat:
                d = ({"role": "assistant", "content": ""} if first else ({"content": delta} if delta else {}))
                choice = {"index": 0, "delta": d, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": delta or "", "logprobs": None, "finish_reason": finish}
            doc = {"id": rid, "object": obj, "created": created, "model": model_name, "choices": [choice]}
            if extra:
                doc.update(extra)
            return f"data: {json.dumps(doc)}\n\n"

        try:
            if chat:
                yield chunk(None, None, first=True)
            while True:
                kind, payload = await handle.events.get()
                if kind == "tokens":
                    delta = stream.feed(payload, final=False)
                    if delta:
                        yield chunk(delta, None)
                elif kind == "error":
                    yield f"data: {json.dumps({'error': {'message': payload, 'type': 'server_error'}})}\n\n"
                    break
                else:
                    result = payload
                    delta = stream.feed([], final=True)
                    if delta:
                        yield chunk(delta, None)
                    finish = "stop" if result.finish_reason == "stop" else "length"
                    yield chunk(None, finish, extra={"speculative_stats": spec_stats(result.stats)})
                    if include_usage:
                        usage = usage_of(n_prompt, result)
                        yield f"data: {json.dumps({'id': rid, 'object': obj, 'created': created, 'model': model_name, 'choices': [], 'usage': usage})}\n\n"
                    break
            yield "data: [DONE]\n\n"
        finally:
            if not handle.finished:      # client went away mid-stream
                handle.cancel()
                scheduler.wake()

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest):
        try:
            ids = llm.encode(body.prompt, raw=True)
        except SpecserveError as e:
            return error(400, str(e), "prompt")
        return await serve(body, ids, chat=False)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest):
        try:
            ids = llm.encode([m.model_dump() for m in body.messages])
        except SpecserveError as e:
            return error(400, str(e), "messages")
        except Exception as e:  # noqa: BLE001 - a template that rejects the conversation is the client's input
            return error(400, f"chat template rejected the messages: {e}", "messages")
        return await serve(body, ids, chat=True)

    return app


def usage_of(n_prompt: int, result) -> dict:
    """OpenAI's ``usage`` of a finished request (prompt tokens reused from the prefix cache included)."""
    return {"prompt_tokens": n_prompt, "completion_tokens": len(result.tokens),
            "total_tokens": n_prompt + len(result.tokens),
            "prompt_tokens_details": {"cached_tokens": result.stats.cached_tokens}}


def spec_stats(s) -> dict:
    return {"drafter": s.drafter, "synthetic": s.synthetic, "mean_accepted_length": s.mean_accepted_length,
            "drafted_per_depth": s.drafted_per_depth, "accepted_per_depth": s.accepted_per_depth,
            "mean_nodes_per_step": s.mean_nodes_per_step, "target_passes": s.target_passes}
