"""The server's limits, request ids and request log, in process (a tiny model with the toy
tokenizer, a small engine): a chunked upload past the body limit, the token limits' 400s naming the
field and both numbers, OpenAI's four stop strings, X-Request-Id taken or made and echoed, one JSON
log line per request."""

import json
import logging

import pytest
from fastapi.testclient import TestClient
from toy_tokenizer import toy_model, toy_tokenizer

from specserve.errors import SpecserveError
from specserve.llm import LLM
from specserve.server.app import create_app
from specserve.server.limits import TokenLimits

BODY_LIMIT = 2000


@pytest.fixture(scope="module")
def llm():
    """The toy model never ends a text of itself: every request runs to its max_tokens."""
    return LLM(loaded=toy_model(), tokenizer=toy_tokenizer(), drafters=["ngram"], max_batch=2, max_len=512,
               preload=True)


@pytest.fixture(scope="module")
def client(llm):
    app = create_app(llm, "default", default_drafter="ngram", max_body_bytes=BODY_LIMIT,
                     limits=TokenLimits(max_prompt_tokens=40, max_tokens_limit=16))
    with TestClient(app) as c:
        yield c


def completion(**kw) -> dict:
    return {"model": "default", "prompt": "Count to five:", "max_tokens": 4, "temperature": 0} | kw


def chunks(data: bytes, size: int = 100):
    for i in range(0, len(data), size):
        yield data[i:i + size]


def test_a_chunked_upload_is_limited_too(client):
    small = json.dumps(completion()).encode()
    big = json.dumps(completion(prompt="x " * BODY_LIMIT)).encode()
    r = client.post("/v1/completions", content=chunks(small), headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text                      # chunked, under the limit: served
    r = client.post("/v1/completions", content=chunks(big), headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["message"] == f"request body larger than {BODY_LIMIT} bytes"
    r = client.post("/v1/completions", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413                              # declared: refused before reading
    assert client.post("/v1/completions", json=completion()).status_code == 200   # and the server serves on


def test_token_limits_name_the_field_and_both_numbers(client, llm):
    long = "one two three four five six seven eight nine ten " * 6
    n = len(llm.encode(long, raw=True))
    r = client.post("/v1/completions", json=completion(prompt=long))
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "prompt" and f"{n} tokens" in err["message"]
    assert "limit of 40" in err["message"]
    r = client.post("/v1/chat/completions", json={"model": "default", "messages": [{"role": "user", "content": long}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    for field in ("max_tokens", "max_completion_tokens"):
        r = client.post("/v1/completions", json=completion(**{field: 17}))
        err = r.json()["error"]
        assert r.status_code == 400 and err["param"] == field
        assert "17 tokens" in err["message"] and "limit of 16" in err["message"]
    body = completion()
    del body["max_tokens"]                                    # none named: min(256, the limit)
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 16      # the toy model runs to it


def test_token_limits_are_inclusive(client, llm):
    """A prompt of exactly --max-prompt-tokens and max_tokens of exactly --max-tokens-limit are
    served; one more of either is refused."""
    at, over = "x " * 20, "x " * 20 + "x"
    assert (len(llm.encode(at, raw=True)), len(llm.encode(over, raw=True))) == (40, 41)
    assert client.post("/v1/completions", json=completion(prompt=at)).status_code == 200
    assert client.post("/v1/completions", json=completion(prompt=over)).status_code == 400
    assert client.post("/v1/completions", json=completion(max_tokens=16)).status_code == 200
    assert client.post("/v1/completions", json=completion(max_tokens=17)).status_code == 400


def test_at_most_four_stop_strings(client):
    assert client.post("/v1/completions", json=completion(stop=["a", "b", "c", "d"])).status_code == 200
    r = client.post("/v1/completions", json=completion(stop=["a", "b", "c", "d", "e"]))
    assert r.status_code == 400 and r.json()["error"]["param"] == "stop"


def test_request_ids_are_taken_or_made_and_echoed(client):
    r = client.post("/v1/completions", json=completion(), headers={"x-request-id": "trace-42.a:b_c"})
    assert r.headers["x-request-id"] == "trace-42.a:b_c"
    made = {client.post("/v1/completions", json=completion(model="nope"), headers=h).headers["x-request-id"]
            for h in ({}, {"x-request-id": "has space"}, {"x-request-id": "x" * 129})}
    assert len(made) == 3 and all(len(m) == 32 and int(m, 16) >= 0 for m in made)   # fresh ones, also on 4xx
    assert "x-request-id" in client.post("/v1/completions", content=b"x" * (BODY_LIMIT + 1)).headers


def test_one_json_log_line_per_request(client, caplog):
    with caplog.at_level(logging.INFO, logger="specserve.requests"):
        client.post("/v1/completions", json=completion(), headers={"x-request-id": "plain-1"})
        with client.stream("POST", "/v1/completions", json=completion(stream=True),
                           headers={"x-request-id": "stream-1"}) as r:
            assert r.status_code == 200 and "[DONE]" in "".join(r.iter_text())
        client.post("/v1/completions", json=completion(max_tokens=99), headers={"x-request-id": "bad-1"})
        client.get("/health")                                 # health checks are not logged
    lines = {d["request_id"]: d for d in (json.loads(r.getMessage()) for r in caplog.records
                                          if r.name == "specserve.requests")}
    assert set(lines) == {"plain-1", "stream-1", "bad-1"}
    for rid in ("plain-1", "stream-1"):
        line = lines[rid]
        assert line["outcome"] == "success" and line["status"] == 200 and line["drafter"] == "ngram"
        assert line["output_tokens"] == 4 and line["prompt_tokens"] > 0 and line["drafter_faults"] == 0
        assert {"cached_tokens", "ttft_s", "mean_accepted_length", "seconds"} <= set(line)
    assert lines["bad-1"]["status"] == 400 and lines["bad-1"]["outcome"] == "refused"


def test_limits_are_checked_when_the_app_is_built(llm):
    with pytest.raises(SpecserveError, match="must be >= 1"):
        TokenLimits(max_prompt_tokens=0)
    with pytest.raises(SpecserveError, match="exceeds --max-tokens-limit"):
        create_app(llm, "default", default_max_tokens=100, limits=TokenLimits(max_tokens_limit=50))


def test_a_chunked_body_is_counted_in_total_not_chunk_by_chunk():
    """BodyLimit alone, over ASGI: three chunks of 40 bytes, each under a 100-byte limit, are refused
    once their total passes it (the third read raises the 413); two chunks (80 bytes) pass."""
    import asyncio

    from starlette.exceptions import HTTPException

    from specserve.server.limits import BodyLimit

    async def run(chunks: int) -> int:
        read = 0

        async def app(scope, receive, send):
            nonlocal read
            while True:
                message = await receive()
                read += len(message.get("body", b""))
                if not message.get("more_body"):
                    return

        messages = [{"type": "http.request", "body": b"x" * 40, "more_body": i < chunks - 1} for i in range(chunks)]

        async def receive():
            return messages.pop(0)

        await BodyLimit(app, max_bytes=100)({"type": "http", "headers": []}, receive, None)
        return read

    assert asyncio.run(run(2)) == 80
    with pytest.raises(HTTPException) as refused:
        asyncio.run(run(3))
    assert refused.value.status_code == 413
