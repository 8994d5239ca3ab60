"""The HTTP server on loopback: OpenAI client, concurrency, disconnects, bad input, a bounded load
test, timeouts, structured outputs, logprobs.

The protocol runs on a tiny random model with the toy tokenizer (``toy_tokenizer``: one token per
character; the model never ends a text of itself, so requests run to ``max_tokens``), in the fast
tier.  What depends on the real default model's text, its shipped heads or its byte-level BPE
vocabulary is marked slow and runs on the session's model (``default_target``)."""

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
from toy_tokenizer import toy_model, toy_tokenizer

from specserve.control import PrefillPolicy
from specserve.drafters.registry import drafter_class
from specserve.errors import SpecserveError
from specserve.llm import LLM
from specserve.server.app import create_app
from specserve.tokenizer import Tokenizer

MAX_BATCH = 4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """The app under uvicorn on a loopback port, in a thread; ``client``: one HTTP client for it
    (``httpx.post`` builds a client, with its TLS context, per call: some 50 ms each)."""

    def __init__(self, llm, **kw):
        import uvicorn
        self.port = _free_port()
        self.app = create_app(llm, "default", **kw)
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        self.client = httpx.Client(base_url=self.url, timeout=120)
        for _ in range(200):
            try:
                if self.client.get("/health").status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.05)
        raise RuntimeError("server did not start")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def post(self, path: str, body: dict, **kw) -> httpx.Response:
        return self.client.post(path, json=body, **kw)

    def metric(self, name: str) -> float:
        for line in self.client.get("/metrics").text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def close(self):
        self.client.close()
        self.server.should_exit = True
        self.thread.join(timeout=30)


@pytest.fixture(scope="module")
def llm():
    """As ``specserve serve`` builds it (chunked prefill and a prefix cache, smaller here), on the
    tiny model with the toy tokenizer.  Its drafters have fixed default draft lengths: ``auto`` follows
    a cost model that a model built in memory measures afresh, on a loaded machine sometimes to
    "draft nothing" (the real model's server below keeps ``auto``)."""
    return LLM(loaded=toy_model(), tokenizer=toy_tokenizer(), drafters={"ngram": {"k": 4}, "ngram-tree": {"k": 8}},
               max_batch=MAX_BATCH, max_len=2048, preload=True, prefill=PrefillPolicy(256, 5.0, 64))


@pytest.fixture(scope="module")
def server(llm):
    s = Server(llm, default_drafter="ngram", max_waiting=16)
    yield s
    s.close()


@pytest.fixture(scope="module")
def real_llm(default_target):
    """The same on the real default model, with its shipped heads."""
    return LLM(loaded=default_target, drafters=["ngram", "eagle", "medusa"], max_batch=MAX_BATCH, max_len=2048,
               preload=True, prefill=PrefillPolicy(256, 5.0, 64))


@pytest.fixture(scope="module")
def real_server(real_llm):
    s = Server(real_llm, default_drafter="ngram", max_waiting=16)
    yield s
    s.close()


def test_an_injected_tokenizer_is_used_if_it_fits_the_model(llm):
    """``LLM(tokenizer=...)`` uses the tokenizer given; one whose ids or end of text fall outside the
    model's vocabulary, or that names no end of text, is refused when the LLM is built, saying why."""
    target, tok = llm.target, toy_tokenizer()          # the module's model: its kernels are loaded already
    llm = LLM(loaded=target, tokenizer=tok, drafters=["ngram"], max_batch=1, max_len=256)
    assert llm.tokenizer is tok and llm.tokenizer.eos_ids == {63}
    ids = llm.encode("hello, world", raw=True)
    assert len(ids) == 12 and max(ids) < 64 and llm.tokenizer.decode(ids) == "hello, world"
    assert llm.encode("hi")[-1] == tok.vocab()["<|assistant|>"]               # the toy chat template
    with pytest.raises(SpecserveError, match=r"does not fit .*reaches id 127 \('<eos>'\), the model has 64 ids"):
        LLM(loaded=target, tokenizer=toy_tokenizer(128), drafters=["ngram"], max_batch=1, max_len=256)
    with pytest.raises(SpecserveError, match=r"end-of-text id\(s\) \[64\] outside the model's 64 ids"):
        LLM(loaded=target, tokenizer=Tokenizer(tok.hf, (63, 64)), max_batch=1, max_len=256)
    with pytest.raises(SpecserveError, match="names no end-of-text id"):
        LLM(loaded=target, tokenizer=Tokenizer(tok.hf, ()), max_batch=1, max_len=256)


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
        assert s.client.get("/health").status_code == 200
        assert s.client.get("/metrics").status_code == 401
        assert s.client.get("/metrics", headers={"Authorization": "Bearer sk-alpha"}).status_code == 200
    finally:
        s.close()


def check_openai_client(server: Server, llm: LLM):
    """Completions and chat through the openai client, whole and streamed (the same text), with usage."""
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
    return r, c


def test_openai_client_completions_and_chat(server, llm):
    r, c = check_openai_client(server, llm)
    assert r.choices[0].finish_reason == "length" and c.usage.completion_tokens == 12     # the toy model never ends


@pytest.mark.slow
def test_openai_client_on_the_real_model(real_server, real_llm):
    """The same on the real model: its chat template, and streamed text cut between BPE tokens."""
    check_openai_client(real_server, real_llm)


def test_speculation_extension_and_stats(server):
    body = {"model": "default", "prompt": "a b c a b c a b c a b", "max_tokens": 16, "temperature": 0,
            "speculative": {"drafter": "ngram", "num_draft": 4}}
    r = server.post("/v1/completions", body).json()
    stats = r["speculative_stats"]
    assert stats["drafter"] == "ngram" and stats["drafted_per_depth"][0] > 0
    plain = server.post("/v1/completions", body | {"speculative": {"drafter": "none"}}).json()
    assert plain["choices"][0]["text"] == r["choices"][0]["text"]
    assert plain["speculative_stats"]["mean_accepted_length"] == 1.0


@pytest.mark.slow
@pytest.mark.parametrize("name", ["eagle", "medusa"])
def test_learned_drafters_per_request(real_server, name):
    """The shipped heads through the server: greedy (streamed) equals plain, sampling is served."""
    body = {"model": "default", "messages": [{"role": "user", "content": "List three colours."}],
            "max_tokens": 24, "temperature": 0}
    plain = real_server.post("/v1/chat/completions", body | {"speculative": {"drafter": "none"}}
                             ).json()["choices"][0]["message"]["content"]
    with real_server.client.stream("POST", "/v1/chat/completions",
                                   json=body | {"stream": True, "speculative": {"drafter": name}}) as r:
        lines = [ln[6:] for ln in r.iter_lines() if ln.startswith("data: ") and ln != "data: [DONE]"]
    text = "".join(json.loads(ln)["choices"][0]["delta"].get("content") or "" for ln in lines
                   if json.loads(ln)["choices"])
    assert text == plain
    r = real_server.post("/v1/chat/completions",
                         body | {"temperature": 0.7, "top_p": 0.9, "seed": 3, "speculative": {"drafter": name}})
    assert r.status_code == 200 and r.json()["speculative_stats"]["drafter"] == name


def check_tree_drafter_and_default_draft_lengths(server: Server, llm: LLM):
    """A preloaded tree drafter can be named per request; a request that names a drafter without
    num_draft gets that drafter's own default, and an explicit 0 stays 0."""
    body = {"model": "default", "prompt": "a b c a b c a b c a b", "max_tokens": 16, "temperature": 0}
    plain = server.post("/v1/completions", body | {"speculative": {"drafter": "none"}}).json()["choices"][0]["text"]
    tree = server.post("/v1/completions", body | {"speculative": {"drafter": "ngram-tree"}}).json()
    assert tree["choices"][0]["text"] == plain
    stats = tree["speculative_stats"]
    default = llm.default_k["ngram-tree"]
    bound = drafter_class("ngram-tree").max_auto_draft if default == "auto" else default
    assert stats["drafter"] == "ngram-tree" and 0 < stats["mean_nodes_per_step"] <= bound
    zero = server.post("/v1/completions", body | {"speculative": {"drafter": "ngram", "num_draft": 0}}).json()
    assert zero["speculative_stats"]["drafted_per_depth"] == [] and zero["choices"][0]["text"] == plain
    metrics = server.client.get("/metrics").text
    assert 'specserve_spec_accepted_steps_total{depth="1"}' in metrics and "specserve_spec_draft_nodes_total" in metrics
    if llm.engine.model.thread_choices():                     # a runtime that can change its thread count
        assert 'specserve_compute_threads_steps_total{threads="' in metrics


def test_tree_drafter_and_default_draft_lengths(server, llm):
    assert llm.default_k["ngram-tree"] == 8
    check_tree_drafter_and_default_draft_lengths(server, llm)


@pytest.mark.slow
def test_tree_drafter_and_auto_draft_length_on_the_real_model(real_server, real_llm):
    """The same with the preloaded tree drafter's default ``auto`` (the real model's measured costs)."""
    assert real_llm.default_k["ngram-tree"] in (None, "auto")
    check_tree_drafter_and_default_draft_lengths(real_server, real_llm)


def test_server_default_draft_length_is_its_own(llm):
    """A server whose default drafter was configured with k = 0 serves k = 0 for it, and each other
    drafter's own default for requests that name that drafter."""
    from specserve.drafters import DrafterSpec
    other = LLM(loaded=llm.target, tokenizer=llm.tokenizer, drafters=[DrafterSpec("ngram", num_draft=0),
                                                                      DrafterSpec("ngram-tree", num_draft=6)],
                max_batch=1, max_len=1024, preload=True)
    s = Server(other, default_drafter="ngram")
    try:
        body = {"model": "default", "prompt": "a b c a b c a b c a b", "max_tokens": 12, "temperature": 0}
        r = s.post("/v1/completions", body).json()
        assert r["speculative_stats"]["drafted_per_depth"] == []
        r = s.post("/v1/completions", body | {"speculative": {"drafter": "ngram-tree"}}).json()
        assert r["speculative_stats"]["drafted_per_depth"] != [] and r["speculative_stats"]["mean_nodes_per_step"] <= 6
    finally:
        s.close()


def test_stop_strings_end_the_text(server):
    """A stop string ends the text just before it (finish_reason stop), whole and streamed; one that
    never appears changes nothing."""
    body = {"model": "default", "prompt": "1, 2, 3, 4,", "max_tokens": 30, "temperature": 0}
    free = server.post("/v1/completions", body).json()["choices"][0]["text"]
    stop = free[12:14]
    cut = free[:free.index(stop)]
    r = server.post("/v1/completions", body | {"stop": [stop, "@@"]}).json()["choices"][0]
    assert r["finish_reason"] == "stop" and r["text"] == cut and stop not in r["text"]
    with server.client.stream("POST", "/v1/completions", json=body | {"stop": [stop], "stream": True}) as s:
        events = [json.loads(ln[6:]) for ln in s.iter_lines() if ln.startswith("data: ") and ln != "data: [DONE]"]
    assert "".join(e["choices"][0]["text"] for e in events) == cut
    assert events[-1]["choices"][0]["finish_reason"] == "stop"
    r = server.post("/v1/completions", body | {"stop": ["@@"]}).json()["choices"][0]    # no "@" in the toy vocabulary
    assert r["finish_reason"] == "length" and r["text"] == free


@pytest.mark.slow
def test_stop_strings_on_the_real_model(real_server):
    r = real_server.post("/v1/completions", {"model": "default", "prompt": "1, 2, 3, 4,", "max_tokens": 30,
                                             "temperature": 0, "stop": [" 7"]}).json()
    assert r["choices"][0]["finish_reason"] == "stop" and " 7" not in r["choices"][0]["text"]


def test_sixteen_concurrent_greedy_requests_match_alone_even_when_a_drafter_fails(server, monkeypatch):
    prompts = [f"Write one sentence about the number {i}." for i in range(16)]

    def ask(p):
        return server.post("/v1/chat/completions", {
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
    system = " ".join(f"Rule {i}: answer briefly and cite the rule number." for i in range(10))
    hits0 = server.metric("specserve_prefix_cache_hit_tokens_total")

    def ask(s, user):
        r = s.post("/v1/chat/completions", {
            "model": "default", "max_tokens": 12, "temperature": 0,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]}).json()
        return r["choices"][0]["message"]["content"], r["usage"]

    first, u1 = ask(server, "What is rule 3?")
    again, u2 = ask(server, "What is rule 3?")
    other, u3 = ask(server, "What is rule 7?")
    assert u1["prompt_tokens"] > 400 and again == first
    assert u2["prompt_tokens_details"]["cached_tokens"] >= u1["prompt_tokens"] - 16
    assert u3["prompt_tokens_details"]["cached_tokens"] >= u1["prompt_tokens"] - 32
    assert server.metric("specserve_prefix_cache_hit_tokens_total") - hits0 >= u2["prompt_tokens_details"]["cached_tokens"]
    assert 0 < server.metric("specserve_prefix_cache_bytes") <= server.metric("specserve_prefix_cache_capacity_bytes")
    assert server.metric("specserve_prefill_steps_total") > 0
    # the same answer as a server that reuses nothing (a cold start)
    llm = server.app.state.llm
    cold = Server(LLM(loaded=llm.target, tokenizer=llm.tokenizer, max_batch=1, max_len=2048,
                      prefill=PrefillPolicy(None, 2.0, 0)))
    try:
        text, usage = ask(cold, "What is rule 7?")
        assert text == other and usage["prompt_tokens_details"]["cached_tokens"] == 0
    finally:
        cold.close()


def test_disconnect_mid_stream_frees_the_sequence(server):
    before = server.metric('specserve_requests_total{outcome="cancelled"}')
    with server.client.stream("POST", "/v1/chat/completions", json={
            "model": "default", "messages": [{"role": "user", "content": "Tell me a long story."}],
            "max_tokens": 1900, "temperature": 0, "stream": True}) as r:
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
    r = server.client.post(path, content=body, headers={"content-type": "application/json"})
    assert 400 <= r.status_code < 500, r.text
    err = r.json()["error"]
    assert err["message"] and (param is None or err["param"] == param), err


def test_oversized_body_is_413(server):
    r = server.client.post("/v1/completions", content=b"x" * (5 * 2**20), headers={"content-type": "application/json"})
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
        r = server.post("/v1/completions", body)
        assert 400 <= r.status_code < 500, (body, r.status_code, r.text)
    assert server.post("/v1/completions", {"model": "default", "prompt": "hello", "max_tokens": 2}).status_code == 200


def test_bounded_load_only_documented_429s_and_memory_returns(server):
    """200 requests at concurrency 32 against 4 KV rows and 16 waiting places: every answer is a 200 or a
    429 with Retry-After; afterwards nothing is running and resident memory is back near its start."""
    gc.collect()
    start_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    codes = []

    def hit(i):
        r = server.post("/v1/completions", {"model": "default", "prompt": f"Number {i}:", "max_tokens": 3,
                                            "temperature": 0})
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


def test_a_full_waiting_queue_is_429_with_retry_after(server, monkeypatch):
    """What the load test may or may not meet, made certain: with no waiting place left, a request on
    either endpoint (streamed or not) is a 429 with Retry-After and a rate-limit error, and counted."""
    refused0 = server.metric('specserve_requests_total{outcome="rejected_queue_full"}')
    monkeypatch.setattr(server.app.state.scheduler, "max_waiting", 0)
    for path, body in (("/v1/completions", {"prompt": "hello"}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hello"}], "stream": True})):
        r = server.post(path, {"model": "default", "max_tokens": 2} | body)
        assert r.status_code == 429 and r.headers.get("retry-after") == "1", r.text
        assert r.json()["error"]["type"] == "rate_limit_error" and "queue is full" in r.json()["error"]["message"]
    assert server.metric('specserve_requests_total{outcome="rejected_queue_full"}') == refused0 + 2
    monkeypatch.undo()
    assert server.post("/v1/completions", {"model": "default", "prompt": "hello", "max_tokens": 2}).status_code == 200


def test_request_timeout_is_504(llm):
    other = LLM(loaded=llm.target, tokenizer=llm.tokenizer, max_batch=1, max_len=2048)
    s = Server(other, request_timeout_s=0.3)
    try:
        r = s.post("/v1/chat/completions", {
            "model": "default", "messages": [{"role": "user", "content": "Tell me a long story."}],
            "max_tokens": 2000, "temperature": 0})
        assert r.status_code == 504 and "timed out" in r.json()["error"]["message"]
        assert s.client.get("/health").json()["running"] == 0
    finally:
        s.close()


def test_bench_endpoint_against_our_server(server, tmp_path, monkeypatch):
    """``specserve bench --endpoint`` over streaming requests: every request completes and greedy text
    is the same with and without speculation, at each concurrency level."""
    import platform

    from specserve.bench.runner import BenchConfig, run_endpoint_bench

    monkeypatch.setattr(platform, "platform", lambda *a, **k: "test")   # it runs `uname -p`: no subprocess here

    cfg = BenchConfig(methods=[], groups=["qa", "translation"], per_group=2, max_tokens=8, out=str(tmp_path),
                      concurrency=[1, 2])
    doc = run_endpoint_bench(cfg, server.url + "/v1", "default", ["none", "ngram:k=4"])
    assert len(doc["endpoint"]) == 4
    for row in doc["endpoint"]:
        assert row["completed"] == row["requests"] == 4
        assert row["same_text_as_baseline"] == 4
        assert row["ttft_s"]["p50"] > 0 and row["output_tok_s"] > 0
    assert "| ngram:k=4 | 2 |" in (tmp_path / "report.md").read_text()


def check_echo_scoring(server: Server, prompt: str):
    """echo with logprobs and max_tokens 0 scores the prompt: its text back, a null logprob first, the
    tokens spelling it."""
    score = {"model": "default", "prompt": prompt, "max_tokens": 0, "echo": True, "logprobs": 1}
    r = server.post("/v1/completions", score)
    lp = r.json()["choices"][0]["logprobs"]
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == score["prompt"]
    assert lp["token_logprobs"][0] is None and all(v <= 0 for v in lp["token_logprobs"][1:])
    assert "".join(lp["tokens"]) == score["prompt"] and len(lp["text_offset"]) == len(lp["tokens"])


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
        r = server.post("/v1/chat/completions", chat | {"speculative": {"drafter": drafter}})
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
    r = server.post("/v1/completions", comp)
    assert r.status_code == 200 and r.json()["choices"][0]["text"] in ("yes", "no")
    check_echo_scoring(server, "the capital of france is paris")      # the toy vocabulary has no capitals
    pen = {"model": "default", "prompt": "a a a a a a", "max_tokens": 12, "temperature": 0}
    free = server.post("/v1/completions", pen).json()["choices"][0]["text"]
    penalised = server.post("/v1/completions", pen | {"frequency_penalty": 2.0, "repetition_penalty": 1.5})
    assert penalised.status_code == 200 and penalised.json()["choices"][0]["text"] != free
    for bad in ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "bogus"}}},
                {"type": "regex", "regex": "(ab"}, {"type": "regex"}):
        r = server.post("/v1/completions", comp | {"response_format": bad})
        assert r.status_code == 400 and r.json()["error"]["param"] == "response_format", r.text
        assert "\n" not in r.json()["error"]["message"]
    r = server.post("/v1/completions", comp | {"max_tokens": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"


@pytest.mark.slow
def test_echo_scoring_on_the_real_model(real_server):
    """Echo's tokens spell the prompt with the real byte-level BPE vocabulary too (spaces inside tokens)."""
    check_echo_scoring(real_server, "The capital of France is Paris")
