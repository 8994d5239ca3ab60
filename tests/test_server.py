"""The HTTP server on the real default model, on loopback: OpenAI client, concurrency, disconnects,
bad input, a bounded load test, timeouts."""

import gc
import json
import random
import resource
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from specserve.drafters.registry import drafter_class
from specserve.llm import LLM
from specserve.control import PrefillPolicy
from specserve.server.app import create_app

pytestmark = pytest.mark.slow
MAX_BATCH = 4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, llm, **kw):
        import uvicorn
        self.port = _free_port()
        self.app = create_app(llm, "default", **kw)
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        for _ in range(200):
            try:
                if httpx.get(self.url + "/health").status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.05)
        raise RuntimeError("server did not start")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def metric(self, name: str) -> float:
        for line in httpx.get(self.url + "/metrics").text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def close(self):
        self.server.should_exit = True
        self.thread.join(timeout=30)


@pytest.fixture(scope="module")
def llm():
    """As ``specserve serve`` builds it: chunked prefill and a prefix cache (smaller here)."""
    return LLM("default", drafters=["ngram", "eagle", "medusa"], max_batch=MAX_BATCH, max_len=2048, preload=True,
               prefill=PrefillPolicy(256, 5.0, 64))


@pytest.fixture(scope="module")
def server(llm):
    s = Server(llm, default_drafter="ngram", max_waiting=16)
    yield s
    s.close()


def test_api_key_with_the_openai_client(llm):
    """With keys set, the openai client works with one of them and gets a 401 without; /health
    stays open; /metrics needs the key."""
    import openai
    s = Server(llm, default_drafter="ngram", api_keys=("sk-alpha", "sk-beta"))
    try:
        good = openai.OpenAI(base_url=s.url + "/v1", api_key="sk-beta", max_retries=0)
        r = good.completions.create(model="default", prompt="The capital of France is", max_tokens=4, temperature=0)
        assert r.choices[0].text and r.usage.completion_tokens == 4
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=s.url + "/v1", api_key="sk-wrong", max_retries=0).models.list()
        assert httpx.get(s.url + "/health").status_code == 200
        assert httpx.get(s.url + "/metrics").status_code == 401
        assert httpx.get(s.url + "/metrics", headers={"Authorization": "Bearer sk-alpha"}).status_code == 200
    finally:
        s.close()


def test_openai_client_completions_and_chat(server, llm):
    import openai
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    assert [m.id for m in client.models.list().data] == ["default"]
    r = client.completions.create(model="default", prompt="The capital of France is", max_tokens=10, temperature=0)
    assert r.choices[0].text and r.usage.completion_tokens == 10
    assert r.usage.prompt_tokens == len(llm.encode("The capital of France is", raw=True))
    assert r.usage.total_tokens == r.usage.prompt_tokens + 10
    pieces = [c.choices[0].text for c in client.completions.create(
        model="default", prompt="The capital of France is", max_tokens=10, temperature=0, stream=True) if c.choices]
    assert "".join(pieces) == r.choices[0].text
    c = client.chat.completions.create(model="default", messages=[{"role": "user", "content": "Say hello."}],
                                       max_tokens=12, temperature=0)
    assert c.choices[0].message.role == "assistant" and c.choices[0].message.content
    chunks = list(client.chat.completions.create(model="default", messages=[{"role": "user", "content": "Say hello."}],
                                                 max_tokens=12, temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == c.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == c.usage.completion_tokens
    assert chunks[-2].choices[0].finish_reason in ("stop", "length")


def test_speculation_extension_and_stats(server):
    body = {"model": "default", "prompt": "a b c a b c a b c a b", "max_tokens": 16, "temperature": 0,
            "speculative": {"drafter": "ngram", "num_draft": 4}}
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=120).json()
    stats = r["speculative_stats"]
    assert stats["drafter"] == "ngram" and stats["drafted_per_depth"][0] > 0
    plain = httpx.post(server.url + "/v1/completions", json=body | {"speculative": {"drafter": "none"}}, timeout=120).json()
    assert plain["choices"][0]["text"] == r["choices"][0]["text"]
    assert plain["speculative_stats"]["mean_accepted_length"] == 1.0


@pytest.mark.parametrize("name", ["eagle", "medusa"])
def test_learned_drafters_per_request(server, name):
    """The shipped heads through the server: greedy (streamed) equals plain, sampling is served."""
    body = {"model": "default", "messages": [{"role": "user", "content": "List three colours."}],
            "max_tokens": 24, "temperature": 0}
    plain = httpx.post(server.url + "/v1/chat/completions", json=body | {"speculative": {"drafter": "none"}},
                       timeout=120).json()["choices"][0]["message"]["content"]
    with httpx.stream("POST", server.url + "/v1/chat/completions", timeout=120,
                      json=body | {"stream": True, "speculative": {"drafter": name}}) as r:
        lines = [ln[6:] for ln in r.iter_lines() if ln.startswith("data: ") and ln != "data: [DONE]"]
    text = "".join(json.loads(ln)["choices"][0]["delta"].get("content") or "" for ln in lines
                   if json.loads(ln)["choices"])
    assert text == plain
    r = httpx.post(server.url + "/v1/chat/completions", timeout=120,
                   json=body | {"temperature": 0.7, "top_p": 0.9, "seed": 3, "speculative": {"drafter": name}})
    assert r.status_code == 200 and r.json()["speculative_stats"]["drafter"] == name


def test_tree_drafter_and_default_draft_lengths(server, llm):
    """A preloaded tree drafter can be named per request; a request that names a drafter without
    num_draft gets that drafter's own default, and an explicit 0 stays 0."""
    body = {"model": "default", "prompt": "a b c a b c a b c a b", "max_tokens": 16, "temperature": 0}
    plain = httpx.post(server.url + "/v1/completions", json=body | {"speculative": {"drafter": "none"}},
                       timeout=120).json()["choices"][0]["text"]
    tree = httpx.post(server.url + "/v1/completions", json=body | {"speculative": {"drafter": "ngram-tree"}},
                      timeout=120).json()
    assert tree["choices"][0]["text"] == plain
    stats = tree["speculative_stats"]
    default = llm.default_k["ngram-tree"]
    bound = drafter_class("ngram-tree").max_auto_draft if default == "auto" else default
    assert stats["drafter"] == "ngram-tree" and 0 < stats["mean_nodes_per_step"] <= bound
    zero = httpx.post(server.url + "/v1/completions", json=body | {"speculative": {"drafter": "ngram", "num_draft": 0}},
                      timeout=120).json()
    assert zero["speculative_stats"]["drafted_per_depth"] == [] and zero["choices"][0]["text"] == plain
    metrics = httpx.get(server.url + "/metrics").text
    assert 'specserve_spec_accepted_steps_total{depth="1"}' in metrics and "specserve_spec_draft_nodes_total" in metrics
    if llm.engine.model.thread_choices():                     # a runtime that can change its thread count
        assert 'specserve_compute_threads_steps_total{threads="' in metrics


def test_server_default_draft_length_is_its_own(llm):
    """A server whose default drafter was configured with k = 0 serves k = 0 for it, and each other
    drafter's own default for requests that name that drafter."""
    from specserve.drafters import DrafterSpec
    other = LLM(loaded=llm.target, drafters=[DrafterSpec("ngram", num_draft=0)], max_batch=1, max_len=1024,
                preload=True)
    s = Server(other, default_drafter="ngram")
    try:
        body = {"model": "default", "prompt": "a b c a b c a b c a b", "max_tokens": 12, "temperature": 0}
        r = httpx.post(s.url + "/v1/completions", json=body, timeout=120).json()
        assert r["speculative_stats"]["drafted_per_depth"] == []
        r = httpx.post(s.url + "/v1/completions", json=body | {"speculative": {"drafter": "ngram-tree"}},
                       timeout=120).json()
        assert r["speculative_stats"]["drafted_per_depth"] != []
    finally:
        s.close()


def test_stop_strings(server):
    r = httpx.post(server.url + "/v1/completions", json={"model": "default", "prompt": "1, 2, 3, 4,", "max_tokens": 30,
                                                         "temperature": 0, "stop": [" 7"]}, timeout=120).json()
    assert r["choices"][0]["finish_reason"] == "stop" and " 7" not in r["choices"][0]["text"]


def test_sixteen_concurrent_greedy_requests_match_alone_even_when_a_drafter_fails(server, monkeypatch):
    prompts = [f"Write one sentence about the number {i}." for i in range(16)]

    def ask(p):
        return httpx.post(server.url + "/v1/chat/completions", timeout=300, json={
            "model": "default", "messages": [{"role": "user", "content": p}], "max_tokens": 16, "temperature": 0,
        }).json()["choices"][0]["message"]["content"]

    alone = [ask(p) for p in prompts]
    with ThreadPoolExecutor(16) as pool:
        together = list(pool.map(ask, prompts))
    assert together == alone
    # the drafter raises for one of the 16: every answer is still the same, and the fault is counted
    llm = server.app.state.llm
    drafter, bad = llm.engine.drafters["ngram"], set()
    begin, propose = drafter.begin, drafter.propose

    def faulty_begin(seq_id, prompt, *args):
        if "number 7." in llm.tokenizer.decode(prompt):
            bad.add(seq_id)
        return begin(seq_id, prompt, *args)

    def faulty_propose(requests):
        if any(r.seq_id in bad for r in requests):
            raise RuntimeError("injected drafter fault")
        return propose(requests)

    faults0 = server.metric("specserve_drafter_faults_total")
    monkeypatch.setattr(drafter, "begin", faulty_begin)
    monkeypatch.setattr(drafter, "propose", faulty_propose)
    with ThreadPoolExecutor(16) as pool:
        assert list(pool.map(ask, prompts)) == alone
    assert len(bad) == 1 and server.metric("specserve_drafter_faults_total") == faults0 + 1


def test_shared_system_prompt_is_reused_exactly_and_counted(server):
    system = " ".join(f"Rule {i}: answer briefly and cite the rule number." for i in range(40))
    hits0 = server.metric("specserve_prefix_cache_hit_tokens_total")

    def ask(user):
        r = httpx.post(server.url + "/v1/chat/completions", timeout=300, json={
            "model": "default", "max_tokens": 12, "temperature": 0,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]}).json()
        return r["choices"][0]["message"]["content"], r["usage"]

    first, u1 = ask("What is rule 3?")
    again, u2 = ask("What is rule 3?")
    other, u3 = ask("What is rule 7?")
    assert u1["prompt_tokens"] > 400 and again == first
    assert u2["prompt_tokens_details"]["cached_tokens"] >= u1["prompt_tokens"] - 16
    assert u3["prompt_tokens_details"]["cached_tokens"] >= u1["prompt_tokens"] - 32
    assert server.metric("specserve_prefix_cache_hit_tokens_total") - hits0 >= u2["prompt_tokens_details"]["cached_tokens"]
    assert 0 < server.metric("specserve_prefix_cache_bytes") <= server.metric("specserve_prefix_cache_capacity_bytes")
    assert server.metric("specserve_prefill_steps_total") > 0
    # the same answer as a server that reuses nothing (a cold start)
    cold = Server(LLM(loaded=server.app.state.llm.target, max_batch=1, max_len=2048,
                      prefill=PrefillPolicy(None, 2.0, 0)))
    try:
        r = httpx.post(cold.url + "/v1/chat/completions", timeout=300, json={
            "model": "default", "max_tokens": 12, "temperature": 0,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": "What is rule 7?"}]}).json()
        assert r["choices"][0]["message"]["content"] == other
        assert r["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    finally:
        cold.close()


def test_disconnect_mid_stream_frees_the_sequence(server):
    before = server.metric('specserve_requests_total{outcome="cancelled"}')
    with httpx.stream("POST", server.url + "/v1/chat/completions", timeout=60, json={
            "model": "default", "messages": [{"role": "user", "content": "Tell me a long story."}],
            "max_tokens": 500, "temperature": 0, "stream": True}) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i > 4:
                break
    for _ in range(100):
        if server.metric("specserve_requests_running") == 0 and server.metric("specserve_kv_rows_free") == MAX_BATCH:
            break
        time.sleep(0.1)
    assert server.metric("specserve_requests_running") == 0
    assert server.metric("specserve_kv_rows_free") == MAX_BATCH
    assert server.metric('specserve_requests_total{outcome="cancelled"}') == before + 1


BAD = [
    ("/v1/completions", b"{not json", None),
    ("/v1/completions", json.dumps({"prompt": "x"}).encode(), "model"),
    ("/v1/completions", json.dumps({"model": "default"}).encode(), "prompt"),
    ("/v1/completions", json.dumps({"model": "default", "prompt": ""}).encode(), "prompt"),
    ("/v1/completions", json.dumps({"model": "default", "prompt": "x", "max_tokens": -1}).encode(), "max_tokens"),
    ("/v1/completions", json.dumps({"model": "default", "prompt": "x", "max_tokens": "ten"}).encode(), "max_tokens"),
    ("/v1/completions", json.dumps({"model": "default", "prompt": "x", "temperature": -0.5}).encode(), "temperature"),
    ("/v1/completions", json.dumps({"model": "default", "prompt": "x", "top_p": 0}).encode(), "top_p"),
    ("/v1/completions", json.dumps({"model": "default", "prompt": "x", "top_p": 1.5}).encode(), "top_p"),
    ("/v1/completions", json.dumps({"model": "default", "prompt": "x", "n": 2}).encode(), "n"),
    ("/v1/completions", json.dumps({"model": "nope", "prompt": "x"}).encode(), "model"),
    ("/v1/completions", json.dumps({"model": "default", "prompt": "x", "max_tokens": 5000}).encode(), "max_tokens"),
    ("/v1/completions", json.dumps({"model": "default", "prompt": "word " * 3000}).encode(), "max_tokens"),
    ("/v1/completions", json.dumps({"model": "default", "prompt": "x", "speculative": {"drafter": "oracle"}}).encode(),
     "speculative.drafter"),                                            # known, but not loaded by this server
    ("/v1/completions", json.dumps({"model": "default", "prompt": "x", "speculative": {"drafter": "bogus"}}).encode(),
     "speculative.drafter"),
    ("/v1/completions", json.dumps({"model": "default", "prompt": "x", "speculative": {"num_draft": -3}}).encode(),
     "speculative.num_draft"),
    ("/v1/chat/completions", json.dumps({"model": "default", "messages": []}).encode(), "messages"),
    ("/v1/chat/completions", json.dumps({"model": "default", "messages": [{"role": "robot", "content": "x"}]}).encode(),
     "messages.0.role"),
    ("/v1/chat/completions", json.dumps({"model": "default", "messages": "hi"}).encode(), "messages"),
    ("/v1/completions", json.dumps([1, 2, 3]).encode(), None),
]


@pytest.mark.parametrize("path,body,param", BAD)
def test_bad_input_gets_4xx_naming_the_field(server, path, body, param):
    r = httpx.post(server.url + path, content=body, headers={"content-type": "application/json"}, timeout=60)
    assert 400 <= r.status_code < 500, r.text
    err = r.json()["error"]
    assert err["message"] and (param is None or err["param"] == param), err


def test_oversized_body_is_413(server):
    r = httpx.post(server.url + "/v1/completions", content=b"x" * (5 * 2**20), headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_generated_bad_inputs(server):
    """300 bodies from a seeded generator: each valid body with one field set to a value of the wrong
    type or out of range.  Every one must get a 4xx, and the server must keep serving."""
    rng = random.Random(0)
    invalid = {"model": [None, 3, "", ["default"]], "prompt": [None, 5, "", {"a": 1}],
               "max_tokens": [0, -5, "x", 1.5, [1], 10**9], "temperature": [-1, "hot", [0.5], None],
               "top_p": [0, -0.1, 1.01, "x", None], "top_k": [-1, "x", 0.5], "seed": ["s", 1.5, 2**70],
               "stop": [5, [""], ["a"] * 20, [1, 2]], "n": [0, 2, "1"], "stream": ["yes", [True], 3],
               "speculative": [{"num_draft": 99}, {"drafter": ""}, {"drafter": "x", "k": 1}, "ngram", 7]}
    for _ in range(300):
        body = {"model": "default", "prompt": "hello", "max_tokens": 4}
        field = rng.choice(sorted(invalid))
        body[field] = rng.choice(invalid[field])
        r = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
        assert 400 <= r.status_code < 500, (body, r.status_code, r.text)
    assert httpx.post(server.url + "/v1/completions", timeout=60, json={
        "model": "default", "prompt": "hello", "max_tokens": 2}).status_code == 200


def test_bounded_load_only_documented_429s_and_memory_returns(server):
    """200 requests at concurrency 32 against 4 KV rows and 16 waiting places: every answer is a 200 or a
    429 with Retry-After; afterwards nothing is running and resident memory is back near its start."""
    gc.collect()
    start_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    codes = []

    def hit(i):
        r = httpx.post(server.url + "/v1/completions", timeout=120, json={
            "model": "default", "prompt": f"Number {i}:", "max_tokens": 3, "temperature": 0})
        if r.status_code == 429:
            assert r.headers.get("retry-after") == "1"
        return r.status_code

    with ThreadPoolExecutor(32) as pool:
        codes = list(pool.map(hit, range(200)))
    assert set(codes) <= {200, 429} and codes.count(200) >= 8
    for _ in range(100):
        if server.metric("specserve_requests_running") == 0 and server.metric("specserve_requests_waiting") == 0:
            break
        time.sleep(0.1)
    assert server.metric("specserve_kv_rows_free") == MAX_BATCH
    gc.collect()
    # ru_maxrss is the peak (KiB): the load must not have grown the process by more than 300 MiB
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - start_rss < 300 * 1024


def test_request_timeout_is_504(llm):
    from specserve.llm import LLM
    other = LLM(loaded=llm.target, max_batch=1, max_len=1024)
    s = Server(other, request_timeout_s=0.3)
    try:
        r = httpx.post(s.url + "/v1/chat/completions", timeout=60, json={
            "model": "default", "messages": [{"role": "user", "content": "Tell me a long story."}],
            "max_tokens": 400, "temperature": 0})
        assert r.status_code == 504 and "timed out" in r.json()["error"]["message"]
        assert httpx.get(s.url + "/health").json()["running"] == 0
    finally:
        s.close()


def test_bench_endpoint_against_our_server(server, tmp_path):
    """``specserve bench --endpoint`` over streaming requests: every request completes and greedy text
    is the same with and without speculation, at each concurrency level."""
    from specserve.bench.runner import BenchConfig, run_endpoint_bench

    cfg = BenchConfig(methods=[], groups=["qa", "translation"], per_group=2, max_tokens=8, out=str(tmp_path),
                      concurrency=[1, 2])
    doc = run_endpoint_bench(cfg, server.url + "/v1", "default", ["none", "ngram:k=4"])
    assert len(doc["endpoint"]) == 4
    for row in doc["endpoint"]:
        assert row["completed"] == row["requests"] == 4
        assert row["same_text_as_baseline"] == 4
        assert row["ttft_s"]["p50"] > 0 and row["output_tok_s"] > 0
    assert "| ngram:k=4 | 2 |" in (tmp_path / "report.md").read_text()


def test_structured_outputs_logprobs_echo_and_penalties(server, llm):
    """response_format on both endpoints (valid JSON under the schema, the same greedy text with and
    without speculation), logprobs with top_logprobs, echo scoring the prompt with max_tokens 0,
    penalties, and a 400 naming the field for an invalid schema, regex or missing part."""
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                               "unit": {"enum": ["celsius", "fahrenheit"]}},
              "required": ["city", "unit"], "additionalProperties": False}
    rf = {"type": "json_schema", "json_schema": {"name": "w", "schema": schema, "strict": True}}
    chat = {"model": "default", "messages": [{"role": "user", "content": "Weather in Oslo, in celsius, as JSON."}],
            "max_tokens": 60, "temperature": 0, "response_format": rf, "logprobs": True, "top_logprobs": 2}
    texts = []
    for drafter in ("none", "ngram"):
        r = httpx.post(server.url + "/v1/chat/completions", json=chat | {"speculative": {"drafter": drafter}}, timeout=60)
        assert r.status_code == 200
        choice = r.json()["choices"][0]
        doc = json.loads(choice["message"]["content"])
        assert set(doc) == {"city", "unit"} and doc["unit"] in ("celsius", "fahrenheit")
        content = choice["logprobs"]["content"]
        assert content and all(len(c["top_logprobs"]) == 2 and c["logprob"] <= 0 for c in content)
        texts.append((choice["message"]["content"], [c["logprob"] for c in content]))
    assert texts[0] == texts[1]
    comp = {"model": "default", "prompt": "Hi", "max_tokens": 20, "temperature": 0,
            "response_format": {"type": "regex", "regex": "(yes|no)"}}
    r = httpx.post(server.url + "/v1/completions", json=comp, timeout=60)
    assert r.status_code == 200 and r.json()["choices"][0]["text"] in ("yes", "no")
    score = {"model": "default", "prompt": "The capital of France is Paris", "max_tokens": 0, "echo": True,
             "logprobs": 1}
    r = httpx.post(server.url + "/v1/completions", json=score, timeout=60)
    lp = r.json()["choices"][0]["logprobs"]
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == score["prompt"]
    assert lp["token_logprobs"][0] is None and all(v <= 0 for v in lp["token_logprobs"][1:])
    assert "".join(lp["tokens"]) == score["prompt"] and len(lp["text_offset"]) == len(lp["tokens"])
    pen = {"model": "default", "prompt": "a a a a a a", "max_tokens": 12, "temperature": 0}
    free = httpx.post(server.url + "/v1/completions", json=pen, timeout=60).json()["choices"][0]["text"]
    penalised = httpx.post(server.url + "/v1/completions", json=pen | {"frequency_penalty": 2.0,
                                                                       "repetition_penalty": 1.5}, timeout=60)
    assert penalised.status_code == 200 and penalised.json()["choices"][0]["text"] != free
    for bad in ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "bogus"}}},
                {"type": "regex", "regex": "(ab"}, {"type": "regex"}):
        r = httpx.post(server.url + "/v1/completions", json=comp | {"response_format": bad}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == "response_format", r.text
        assert "\n" not in r.json()["error"]["message"]
    r = httpx.post(server.url + "/v1/completions", json=comp | {"max_tokens": 0}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
