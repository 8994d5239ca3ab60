"""What the soak (``specserve bench soak``) sends and how it judges each answer: well-formed
requests of every kind, malformed ones the server must refuse, and the problems a response can show."""

from __future__ import annotations

import json
import random

import httpx

KINDS = ("greedy", "sampled", "stream", "disconnect", "malformed")
WEIGHTS = (3, 3, 3, 2, 2)                   # how often a client picks each kind
PROMPTS = ("Write one sentence about the number {n}.", "The capital of France is", "Count from {n} to {m}:",
           "Translate 'good morning {n}' into French.", "a b c a b c a b c {n} a b c", "def fib(n):  # {n}",
           "Explain in one line why {n} is even or odd.", "Summarise: the cat sat on mat number {n}.")
SYSTEM = " ".join(f"Rule {i}: answer briefly and cite the rule number." for i in range(24))
TIMEOUT, JSON = httpx.Timeout(180.0), {"content-type": "application/json"}
CONTEXT = 2048                              # the soak server's context length (positions per KV row)


def valid_body(kind: str, rng: random.Random, drafter: str) -> tuple[str, dict]:
    """(path, body) of a well-formed request of ``kind`` over ``drafter``."""
    chat = kind in ("stream", "disconnect") or rng.random() < 0.5
    text = rng.choice(PROMPTS).format(n=rng.randrange(10**6), m=rng.randrange(10**6))
    system = [{"role": "system", "content": SYSTEM}] if rng.random() < 0.5 else []
    body: dict = {"model": "default", "max_tokens": rng.randint(8, 48), "speculative": {"drafter": drafter}}
    body |= {"messages": system + [{"role": "user", "content": text}]} if chat else {"prompt": text}
    sampled = kind == "sampled" or (kind != "greedy" and rng.random() < 0.5)
    body |= {"temperature": 0.8, "seed": rng.randrange(2**31)} if sampled else {"temperature": 0}
    if kind in ("stream", "disconnect"):          # a disconnect: long enough to be cut off mid-generation
        body |= {"stream": True} | ({"max_tokens": rng.randint(64, 256)} if kind == "disconnect" else {})
    return ("/v1/chat/completions" if chat else "/v1/completions"), body


def malformed(rng: random.Random, drafter: str, loaded: str, not_loaded: list[str]) -> tuple[str, str, str, bytes]:
    """(what, method, path, raw body) of a request the server must refuse with a JSON 4xx."""
    path, body = valid_body("greedy", rng, drafter)
    text = json.dumps(body)
    n = rng.randrange(10**6)
    past = rng.choice([CONTEXT, 2 * CONTEXT])                  # any prompt + CONTEXT tokens exceeds the context
    cases = [("invalid JSON", text[:-rng.randint(1, 12)]), ("body not an object", "[1, 2, 3]"),
             ("empty body", ""), ("max_tokens wrong type", body | {"max_tokens": "ten"}),
             ("temperature wrong type", body | {"temperature": "hot"}), ("stream wrong type", body | {"stream": "yes"}),
             ("seed wrong type", body | {"seed": 1.5}), ("unknown model", body | {"model": f"nope-{n}"}),
             ("max_tokens past the context", body | {"max_tokens": past}),
             ("max_tokens negative", body | {"max_tokens": -n}),
             ("unknown drafter", body | {"speculative": {"drafter": f"bogus-{n}"}}),
             ("empty drafter", body | {"speculative": {"drafter": ""}}),
             ("num_draft out of range", body | {"speculative": {"drafter": loaded, "num_draft": 99}}),
             ("missing prompt", {k: v for k, v in body.items() if k not in ("prompt", "messages")}),
             ("unknown route", body)]
    if not_loaded:
        cases.append(("drafter not loaded", body | {"speculative": {"drafter": rng.choice(not_loaded)}}))
    what, doc = rng.choice(cases)
    path = "/v1/nope" if what == "unknown route" else path
    return what, "POST", path, (doc if isinstance(doc, str) else json.dumps(doc)).encode()


def judge(r: httpx.Response, expect_ok: bool) -> str | None:
    """The problem with a complete response, if any."""
    if r.status_code >= 500:
        return "5xx"
    try:
        doc = r.json()
    except ValueError:
        doc = None
    if r.status_code >= 400:
        err = doc.get("error") if isinstance(doc, dict) else None
        if not isinstance(err, dict) or not isinstance(err.get("message"), str):
            return "non_json_4xx"
        return "valid_request_refused" if expect_ok and r.status_code != 429 else None
    if not expect_ok:
        return "malformed_accepted"
    return None if isinstance(doc, dict) and doc.get("choices") else "bad_200_body"


def send_stream(client: httpx.Client, url: str, raw: bytes, stop_after: int) -> tuple[int, str | None, str]:
    """Read a stream to its end (``stop_after`` 0), or close it after ``stop_after`` events:
    (status, problem or None, the text kept as evidence)."""
    with client.stream("POST", url, content=raw, headers=JSON) as r:
        if r.status_code != 200:
            r.read()
            return r.status_code, judge(r, True), r.text[:500]
        events, done = 0, False
        for line in r.iter_lines():
            done = done or line == "data: [DONE]"
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            events += 1
            try:
                doc = json.loads(line[6:])
            except ValueError:
                return 200, "stream_event_not_json", line[:500]
            if not isinstance(doc, dict) or "error" in doc:
                return 200, "stream_error_event", line[:500]
            if stop_after and events >= stop_after:
                return 200, None, ""                   # leaving the block drops the connection
        return 200, None if done else "stream_without_done", ""
