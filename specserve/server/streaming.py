"""Response bodies: incremental detokenisation, the completion and chunk documents, and the
server-sent events of a streamed request."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import AsyncIterator, Callable

from specserve.engine import Result
from specserve.llm import LLM, trim_at_stop
from specserve.scheduler import Handle, Scheduler
from specserve.server.errors import error_event
from specserve.server.requestlog import result_fields
from specserve.tools import CallStream, Reading, calls_of


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


def usage_of(n_prompt: int, result: Result) -> dict:
    """OpenAI's ``usage`` of a finished request (prompt tokens reused from the prefix cache included)."""
    return {"prompt_tokens": n_prompt, "completion_tokens": len(result.tokens),
            "total_tokens": n_prompt + len(result.tokens),
            "prompt_tokens_details": {"cached_tokens": result.stats.cached_tokens}}


def spec_stats(s) -> dict:
    """The ``speculative_stats`` extension of a response: what speculation did for the request."""
    return {"drafter": s.drafter, "synthetic": s.synthetic, "mean_accepted_length": s.mean_accepted_length,
            "drafted_per_depth": s.drafted_per_depth, "accepted_per_depth": s.accepted_per_depth,
            "mean_nodes_per_step": s.mean_nodes_per_step, "target_passes": s.target_passes}


def finish_reason(result: Result, calls: int = 0) -> str:
    """OpenAI's finish reason of a reply holding ``calls`` tool calls (``tool_calls`` when it ended
    by itself; cut short by the token limit, ``length`` as for text)."""
    if result.finish_reason != "stop":
        return "length"
    return "tool_calls" if calls else "stop"


@dataclass(frozen=True)
class Reply:
    """The documents of one response: a completion, or the chunks of its stream."""
    id: str
    created: int
    model: str
    chat: bool
    n_prompt: int
    echo: str = ""                # completions with ``echo``: the prompt, before the text

    def completion(self, text: str, result: Result, logprobs: dict | None = None,
                   tools: Reading | None = None) -> dict:
        """``tools``: the calls read from ``text`` (None: the reply is text)."""
        finish = finish_reason(result, len(tools.calls) if tools is not None else 0)
        message = {"role": "assistant", "content": text}
        if tools is not None and tools.calls:
            message = {"role": "assistant", "content": tools.content,
                       "tool_calls": [c.openai() for c in calls_of(tools)]}
        choice = ({"index": 0, "message": message, "logprobs": logprobs, "finish_reason": finish}
                  if self.chat else {"index": 0, "text": self.echo + text, "logprobs": logprobs,
                                     "finish_reason": finish})
        return {"id": self.id, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": [choice],
                "usage": usage_of(self.n_prompt, result), "speculative_stats": spec_stats(result.stats)}

    @property
    def chunk_object(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"

    def chunk(self, delta: str | dict | None, finish: str | None, first: bool = False, extra: dict | None = None,
              logprobs: dict | None = None) -> str:
        """One event: a text delta (chat: the role first; or a whole ``delta`` object, as a tool
        call's), or the finish reason; ``logprobs``: of the tokens since the last event."""
        if self.chat:
            d = ({"role": "assistant", "content": ""} if first else
                 delta if isinstance(delta, dict) else ({"content": delta} if delta else {}))
            choice = {"index": 0, "delta": d, "logprobs": logprobs, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": delta or "", "logprobs": logprobs, "finish_reason": finish}
        doc = {"id": self.id, "object": self.chunk_object, "created": self.created, "model": self.model,
               "choices": [choice]}
        if extra:
            doc.update(extra)
        return event(doc)

    def usage_chunk(self, result: Result) -> str:
        """``stream_options.include_usage``: a last event with no choices and the usage."""
        return event({"id": self.id, "object": self.chunk_object, "created": self.created, "model": self.model,
                      "choices": [], "usage": usage_of(self.n_prompt, result)})


def event(doc: dict) -> str:
    return f"data: {json.dumps(doc)}\n\n"


async def sse(scheduler: Scheduler, handle: Handle, stream: TextStream, reply: Reply, include_usage: bool,
              log: dict, logprobs_doc: Callable[[list], dict] | None = None,
              calls: CallStream | None = None, on_calls: Callable[[int], None] | None = None) -> AsyncIterator[str]:
    """The events of a streamed request, ``[DONE]`` last; a client gone mid-stream cancels it.
    ``log``: the request's log line, told how the stream ended; ``logprobs_doc``: turns the logprobs
    of the tokens behind an event into its ``logprobs`` (None: not asked); ``calls``: reads tool
    calls out of the text, whose deltas the events then carry; ``on_calls``: told how many calls the
    finished reply held (it logs and counts them)."""
    pending: list = []               # logprobs of tokens whose text no event has carried yet

    def deltas(text: str, final: bool = False, complete: bool = True) -> list:
        if calls is None:
            return [text] if text else []
        return calls.feed(text, final, complete)

    def take() -> dict | None:
        nonlocal pending
        doc = logprobs_doc(pending) if logprobs_doc is not None and pending else None
        pending = []
        return doc if doc and (doc.get("content") or doc.get("tokens")) else None    # an end of text alone: none

    try:
        if reply.chat:
            yield reply.chunk(None, None, first=True)
        elif reply.echo:
            yield reply.chunk(reply.echo, None)
        while True:
            kind, payload = await handle.events.get()
            if kind == "logprobs":
                pending += payload
            elif kind == "tokens":
                for delta in deltas(stream.feed(payload, final=False)):
                    yield reply.chunk(delta, None, logprobs=take())
            elif kind == "error":
                log.update(outcome=payload.kind.value, error=payload.message)
                yield event(error_event(payload))
                break
            else:
                log.update(result_fields(payload))
                for delta in deltas(stream.feed([], final=True), True, payload.finish_reason == "stop"):
                    yield reply.chunk(delta, None, logprobs=take())
                n_calls = len(calls.final.calls) if calls is not None else 0
                if calls is not None and on_calls is not None:
                    on_calls(n_calls)
                yield reply.chunk(None, finish_reason(payload, n_calls),
                                  extra={"speculative_stats": spec_stats(payload.stats)}, logprobs=take())
                if include_usage:
                    yield reply.usage_chunk(payload)
                break
        yield "data: [DONE]\n\n"
    finally:
        if not handle.finished:      # client went away mid-stream
            log.update(outcome="cancelled")
            scheduler.cancel(handle)
