"""Tool calling over HTTP: ``tools``, ``tool_choice`` and ``parallel_tool_calls`` on the chat
endpoint, replies with ``tool_calls`` whole and streamed, follow-ups with tool results, bad input as
400s naming the field, and the official openai client.

The protocol runs on a tiny random model with a toy tokenizer of 110 ids (every character of the
call syntaxes is one token; its template has no tool support, so the fallback prompt is used) for
each call format; the real default model (SmolLM2, Hermes-style calls) runs in the slow tier, with
every drafter against plain decoding."""

import json

import jsonschema
import pytest
from test_server import Server
from test_tools import assemble
from toy_tokenizer import toy_model, toy_tokenizer

from specserve.control import PrefillPolicy
from specserve.drafters import available
from specserve.llm import LLM

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16},
                                            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
           "required": ["city"], "additionalProperties": False}
EMAIL = {"type": "object", "properties": {"to": {"type": "string", "maxLength": 24},
                                          "body": {"type": "string", "maxLength": 40}},
         "required": ["to", "body"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The forecast for a city.",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "send_email", "description": "Send an email.",
                                           "parameters": EMAIL}}]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Oslo?"}]


@pytest.fixture(scope="module")
def toy_llm():
    return LLM(loaded=toy_model(vocab=110), tokenizer=toy_tokenizer(110), drafters={"ngram": {"k": 4},
               "ngram-tree": {"k": 8}}, max_batch=4, max_len=2048, prefill=PrefillPolicy(256, 5.0, 64))


@pytest.fixture(scope="module", params=["hermes", "llama3_json", "pythonic"])
def server(request, toy_llm):
    s = Server(toy_llm, default_drafter="ngram", tool_parser=request.param)
    s.format = request.param
    yield s
    s.close()


def chat(server, **kw) -> dict:
    body = {"model": "default", "messages": ASK, "tools": TOOLS, "max_tokens": 200, "temperature": 0} | kw
    r = server.post("/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    return r.json()


def streamed(server, **kw) -> tuple[list[dict], str]:
    body = {"model": "default", "messages": ASK, "tools": TOOLS, "max_tokens": 200, "temperature": 0,
            "stream": True} | kw
    deltas, finish = [], None
    with server.client.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                choice = json.loads(line[6:])["choices"][0]
                deltas.append(choice["delta"])
                finish = choice["finish_reason"] or finish
    return deltas[1:], finish                   # the first delta names the role


def calls_of(doc: dict) -> list[tuple[str, str]]:
    return [(c["function"]["name"], c["function"]["arguments"]) for c in doc["choices"][0]["message"]["tool_calls"]]


def test_required_and_named_calls_parse_validate_and_stream_the_same(server):
    """``required`` and a named function: the reply is calls (finish_reason tool_calls) whose
    arguments validate against their schema, the same with every drafter (greedy), and the stream's
    deltas add up to exactly the same calls.  Without parallel calls there is exactly one."""
    for choice, parallel in (("required", True), ("required", False),
                             ({"type": "function", "function": {"name": "send_email"}}, False)):
        replies = [chat(server, tool_choice=choice, parallel_tool_calls=parallel,
                        speculative={"drafter": d}) for d in ("none", "ngram", "ngram-tree")]
        calls = calls_of(replies[0])
        assert all(calls_of(r) == calls for r in replies[1:])
        msg = replies[0]["choices"][0]
        assert msg["finish_reason"] in ("tool_calls", "length") and msg["message"]["content"] is None
        assert calls and (parallel or len(calls) == 1 and msg["finish_reason"] == "tool_calls")
        whole = calls if msg["finish_reason"] == "tool_calls" else calls[:-1]    # cut short: the last one is partial
        for name, args in whole:
            jsonschema.validate(json.loads(args), SCHEMAS[name])
        if isinstance(choice, dict):
            assert {name for name, _ in calls} == {"send_email"}
        ids = [c["id"] for c in msg["message"]["tool_calls"]]
        assert len(set(ids)) == len(ids) and all(i.startswith("call_") for i in ids)
        deltas, finish = streamed(server, tool_choice=choice, parallel_tool_calls=parallel)
        assert assemble(deltas) == (None, calls) and finish == msg["finish_reason"]


def test_tool_replies_are_counted_on_metrics(server):
    """/metrics counts replies that could call tools, by what they held, and the calls in them,
    streamed or not; a request without tools counts in neither."""
    before = (server.metric('specserve_tool_replies_total{kind="calls"}'),
              server.metric('specserve_tool_replies_total{kind="text"}'), server.metric("specserve_tool_calls_total"))
    n = len(calls_of(chat(server, tool_choice="required", parallel_tool_calls=False)))
    streamed(server, tool_choice="required", parallel_tool_calls=False)
    chat(server, max_tokens=4)                              # auto: the toy model writes text
    chat(server, max_tokens=4, tools=None)                  # no tools: not a tool reply
    after = (server.metric('specserve_tool_replies_total{kind="calls"}'),
             server.metric('specserve_tool_replies_total{kind="text"}'), server.metric("specserve_tool_calls_total"))
    assert (after[0] - before[0], after[1] - before[1], after[2] - before[2]) == (2, 1, 2 * n)


def test_a_conversation_with_calls_and_results_goes_on(server):
    first = chat(server, tool_choice="required", parallel_tool_calls=False)
    call = first["choices"][0]["message"]["tool_calls"][0]
    follow = ASK + [first["choices"][0]["message"], {"role": "tool", "tool_call_id": call["id"], "content": "7 degrees"},
                    {"role": "user", "content": [{"type": "text", "text": "Thanks. "}, {"type": "text", "text": "Bye."}]}]
    r = chat(server, messages=follow, max_tokens=8, tool_choice="none")
    assert r["choices"][0]["finish_reason"] == "length" and r["choices"][0]["message"]["content"]
    assert "tool_calls" not in r["choices"][0]["message"]
    # the call and its result are in the prompt: it is longer than the question's
    assert r["usage"]["prompt_tokens"] > first["usage"]["prompt_tokens"] + len("7 degrees")


def test_auto_lets_the_model_write_text(server):
    """The random model writes no call of itself: under ``auto`` (the default with tools) its text
    is the content, as it would be without tools, finish_reason ``length``."""
    r = chat(server, max_tokens=12)
    assert r["choices"][0]["finish_reason"] == "length" and len(r["choices"][0]["message"]["content"]) >= 1
    deltas, finish = streamed(server, max_tokens=12)
    assert assemble(deltas)[0] == r["choices"][0]["message"]["content"] and finish == "length"


BAD = [
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                                                                           "properties": "x"}}}]},
     "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]},
     "tools[0].function.parameters"),
    ({"tools": [{"type": "code_interpreter"}]}, "tools[0]"),
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": None, "tool_choice": "required"}, "tool_choice"),
    ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages.0"),
    ({"messages": [{"role": "user", "content": None}]}, "messages.0"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": [{"id": "c", "type": "function",
                                                                    "function": {"name": "f", "arguments": "{}"}}]}]},
     "messages.0"),
]


@pytest.mark.parametrize("extra, param", BAD)
def test_bad_tool_input_gets_400_naming_the_field(server, extra, param):
    body = {"model": "default", "messages": ASK, "tools": TOOLS, "max_tokens": 4} | extra
    r = server.post("/v1/chat/completions", body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and "\n" not in err["message"], err


def test_openai_client_with_tools_streaming_and_a_follow_up(server):
    """The official client: a required call, the same call streamed (the client's chunk objects put
    together), and the follow-up turn carrying the tool's result."""
    import openai
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    r = client.chat.completions.create(model="default", messages=ASK, tools=TOOLS, tool_choice="required",
                                       parallel_tool_calls=False, max_tokens=200, temperature=0)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and len(msg.tool_calls) == 1
    call = msg.tool_calls[0]
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    parts: dict[int, list[str]] = {}
    for chunk in client.chat.completions.create(model="default", messages=ASK, tools=TOOLS, tool_choice="required",
                                                parallel_tool_calls=False, max_tokens=200, temperature=0,
                                                stream=True):
        for tc in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            p = parts.setdefault(tc.index, ["", ""])
            p[0] += tc.function.name or ""
            p[1] += tc.function.arguments or ""
    assert parts == {0: [call.function.name, call.function.arguments]}
    follow = client.chat.completions.create(
        model="default", tools=TOOLS, max_tokens=6, temperature=0,
        messages=ASK + [msg.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": call.id, "content": "7C"}])
    assert follow.choices[0].message.content and follow.choices[0].finish_reason == "length"


# -- the real default model -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def real_tools_llm(default_target):
    drafters = [d for d in available() if d not in ("none", "oracle", "draft-model")]
    return LLM(loaded=default_target, drafters=drafters, max_batch=4, max_len=2048,
               prefill=PrefillPolicy(256, 5.0, 64))


@pytest.mark.slow
def test_real_model_calls_are_exact_under_every_drafter(real_tools_llm):
    """SmolLM2 (Hermes-style calls through the fallback prompt): a required and a named call parse
    and validate, every drafter's reply is plain decoding's token for token, and the stream adds up
    to the same calls; the openai client reads them."""
    import openai
    s = Server(real_tools_llm, default_drafter="none")
    try:
        for choice in ("required", {"type": "function", "function": {"name": "send_email"}}):
            ask = [{"role": "user", "content": "Email bob@example.com that the weather in Oslo is fine."}]
            base = chat(s, messages=ask, tool_choice=choice, parallel_tool_calls=False, max_tokens=120)
            calls = calls_of(base)
            assert len(calls) == 1 and base["choices"][0]["finish_reason"] == "tool_calls"
            jsonschema.validate(json.loads(calls[0][1]), SCHEMAS[calls[0][0]])
            for d in available():
                if d in ("none", "oracle", "draft-model"):
                    continue
                other = chat(s, messages=ask, tool_choice=choice, parallel_tool_calls=False, max_tokens=120,
                             speculative={"drafter": d})
                assert calls_of(other) == calls, d
            deltas, finish = streamed(s, messages=ask, tool_choice=choice, parallel_tool_calls=False, max_tokens=120,
                                      speculative={"drafter": "auto"})
            assert assemble(deltas) == (None, calls) and finish == "tool_calls"
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)
        r = client.chat.completions.create(model="default", messages=ASK, tools=TOOLS, tool_choice="required",
                                           max_tokens=120, temperature=0, parallel_tool_calls=False)
        assert r.choices[0].message.tool_calls[0].function.name in SCHEMAS
    finally:
        s.close()
