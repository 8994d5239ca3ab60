"""Soak test of the HTTP server: a bounded mixed load over loopback, watching for errors and leaks.

How.  The server (the default model, ``create_app`` under uvicorn) runs on a thread of THIS process,
so the script can look inside it, while C client threads send real HTTP requests (httpx) for
``--minutes`` (or ``--max-requests`` load requests).  Each client picks, seeded: a greedy completion,
a sampled one (temperature 0.8, a seed), a streamed chat read to ``data: [DONE]``, a disconnect (a
stream closed after 1-2 events), or a malformed request (bad JSON, wrong types, unknown model,
max_tokens past the context, a bad ``speculative.drafter``, ...), over a drafter drawn from the loaded
ones; half the chats share a long system prompt (the prefix cache).  Problems (kept with their
requests): a 5xx, a 4xx whose body is not ``{"error": {"message": ...}}``, a valid request refused
(but a 429), a malformed one accepted, a stream without [DONE] or with an error event, a transport
error (but the deliberate disconnects).

What.  Every ``--sample-s``: elapsed, the process's RSS (psutil), requests done by type and status
codes.  After ``--warmup-s`` (default min(120 s, a third of the run)) the load pauses: RSS is taken
(the growth's baseline), then per request type ``--gc-batch`` (20) sequential requests between two
``gc.collect()`` + ``gc.get_objects()`` censuses give the object growth and the types that grew most
(the suffix corpus grows by design: its growth is given beside); then the load resumes.  At the end,
drained: RSS growth since the warm-up, prefix-pool bytes/blocks and the suffix corpus (tokens, texts,
index keys) against the start, and the engine: nothing running, every KV row free, no unclaimed
result or scheduler handle, every per-sequence dict (int-keyed attributes of the controller, its
acceptance model, each drafter) empty.  Exit 1 on a problem, a non-empty engine, or RSS growth above
``--max-growth-mb`` (100).  The report is printed, and written as JSON with ``--out``.
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import random
import sys
import threading
import time

import httpx
import psutil

KINDS = ("greedy", "sampled", "stream", "disconnect", "malformed")
WEIGHTS = (3, 3, 3, 2, 2)
PROMPTS = ("Write one sentence about the number {n}.", "The capital of France is", "Count from {n} to {m}:",
           "Translate 'good morning {n}' into French.", "a b c a b c a b c {n} a b c", "def fib(n):  # {n}",
           "Explain in one line why {n} is even or odd.", "Summarise: the cat sat on mat number {n}.")
SYSTEM = " ".join(f"Rule {i}: answer briefly and cite the rule number." for i in range(24))
TIMEOUT, JSON, MAX_SAMPLES = httpx.Timeout(180.0), {"content-type": "application/json"}, 20   # problem samples kept


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, required=True)
    p.add_argument("--concurrency", type=int, required=True)
    p.add_argument("--max-requests", type=int, default=None, help="stop the load after this many requests")
    p.add_argument("--drafters", default="ngram,ngram-tree,suffix,lookahead,eagle,medusa",
                   help="loaded besides none and the cheap ones; the first is the server's default")
    p.add_argument("--out", default=None, help="write the JSON report here")
    p.add_argument("--warmup-s", type=float, default=None, help="default: min(120, a third of the run)")
    p.add_argument("--gc-batch", type=int, default=20, help="requests per type in the object census")
    for flag, kind, default in (("--sample-s", float, 30.0), ("--max-growth-mb", float, 100.0),
                                ("--max-batch", int, 4), ("--max-waiting", int, 64), ("--seed", int, 0)):
        p.add_argument(flag, type=kind, default=default)
    a = p.parse_args(argv)
    a.warmup_s = min(120.0, a.minutes * 60 / 3) if a.warmup_s is None else a.warmup_s
    return a


class SoakServer:
    """The model, its engine and the app, served by uvicorn on a thread of this process (127.0.0.1)."""

    def __init__(self, drafters: list[str], max_batch: int, max_waiting: int):
        import uvicorn
        from specserve.control import PrefillPolicy
        from specserve.llm import LLM
        from specserve.server.app import create_app
        self.llm = LLM("default", drafters=drafters, max_batch=max_batch, max_len=2048, preload=True,
                       prefill=PrefillPolicy(256, 5.0, 64))
        self.engine, self.max_batch = self.llm.engine, max_batch
        self.app = create_app(self.llm, "default", default_drafter=drafters[0] if drafters else "none",
                              max_waiting=max_waiting)
        self.scheduler = self.app.state.scheduler
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=0, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started and self.thread.is_alive():
            time.sleep(0.05)
        if not self.server.started:
            raise RuntimeError("server did not start")
        self.url = f"http://127.0.0.1:{self.server.servers[0].sockets[0].getsockname()[1]}"

    def settle(self, timeout_s: float = 60.0) -> bool:
        """Wait until nothing is running or waiting (a disconnect is dropped at the next tick)."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if not self.scheduler.num_running and not self.scheduler.num_waiting and not self.engine.num_running:
                return True
            time.sleep(0.05)
        return False

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


class Load:
    """The clients' gate, request budget and tally.  Each client holds its own lock during a request:
    ``pause`` closes the gate and takes every lock, so it returns once no load request is in flight."""

    def __init__(self, srv: SoakServer, clients: int, max_requests: int | None, seed: int, not_loaded: list[str]):
        self.srv, self.seed, self.left, self.not_loaded = srv, seed, max_requests, not_loaded
        self.drafters = sorted(srv.engine.drafters)
        self.open, self.stop, self.lock = threading.Event(), threading.Event(), threading.Lock()
        self.locks = [threading.Lock() for _ in range(clients)]
        self.open.set()
        self.done, self.status, self.problems = collections.Counter(), collections.Counter(), collections.Counter()
        self.samples: list[dict] = []

    def take(self) -> bool:
        with self.lock:
            self.left = None if self.left is None else self.left - 1
            return not self.stop.is_set() and (self.left is None or self.left >= 0)

    def pause(self) -> None:
        self.open.clear()
        for lock in self.locks:
            lock.acquire()

    def resume(self) -> None:
        for lock in self.locks:
            lock.release()
        self.open.set()

    def client(self, i: int) -> None:
        rng = random.Random(self.seed * 1009 + i)
        with httpx.Client(timeout=TIMEOUT) as client:
            while self.open.wait() and self.take():
                with self.locks[i]:
                    self.run_one(client, rng.choices(KINDS, WEIGHTS)[0], rng)

    def run_one(self, client: httpx.Client, kind: str, rng: random.Random, drafter: str | None = None) -> None:
        """One request of ``kind`` (over ``drafter``, default a random loaded one), judged and counted."""
        status, problem, text, detail, base = None, None, "", {}, self.srv.url
        drafter = drafter or rng.choice(self.drafters)
        if kind == "malformed":
            what, method, path, raw = malformed(rng, drafter, self.drafters[0], self.not_loaded)
        else:
            (path, body), what, method = valid_body(kind, rng, drafter), kind, "POST"
            raw = json.dumps(body).encode()
        detail = {"what": what, "path": path, "body": raw[:300].decode(errors="replace")}
        try:
            if kind in ("stream", "disconnect"):
                stop_after = rng.randint(1, 2) if kind == "disconnect" else 0
                status, problem, text = send_stream(client, base + path, raw, stop_after)
            else:
                r = client.request(method, base + path, content=raw, headers=JSON)
                status, problem, text = r.status_code, judge(r, kind != "malformed"), r.text[:500]
        except httpx.TransportError as e:
            problem, text = "transport", repr(e)
        with self.lock:
            self.done[kind] += 1
            self.status[str(status) if status is not None else "transport"] += 1
            if problem:
                self.problems[problem] += 1
                if len(self.samples) < MAX_SAMPLES:
                    self.samples.append({"kind": kind, "problem": problem, "status": status, "response": text} | detail)


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
    cases = [("invalid JSON", text[:-rng.randint(1, 12)]), ("body not an object", "[1, 2, 3]"),
             ("empty body", ""), ("max_tokens wrong type", body | {"max_tokens": "ten"}),
             ("temperature wrong type", body | {"temperature": "hot"}), ("stream wrong type", body | {"stream": "yes"}),
             ("seed wrong type", body | {"seed": 1.5}), ("unknown model", body | {"model": f"nope-{n}"}),
             ("max_tokens past the context", body | {"max_tokens": rng.choice([2048, 4096])}),   # any prompt + 2048 > 2048
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
    """Read a stream to its end (``stop_after`` 0), or close it after ``stop_after`` events."""
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


def rss_mib() -> float:
    return round(psutil.Process().memory_info().rss / 2**20, 1)


def census() -> collections.Counter:
    gc.collect()
    return collections.Counter(type(o).__name__ for o in gc.get_objects())


def object_growth(load: Load, n: int) -> dict:
    """Per type: live objects before and after ``n`` sequential requests of that type (load paused),
    the drafters in turn; one request of the type first, outside the census."""
    out, srv, rng = {}, load.srv, random.Random(load.seed + 7)
    with httpx.Client(timeout=TIMEOUT) as client:
        for kind in KINDS:
            load.run_one(client, kind, rng)
            srv.settle()
            corpus0, before = pools(srv).get("suffix_corpus_tokens", 0), census()
            for i in range(n):
                load.run_one(client, kind, rng, load.drafters[i % len(load.drafters)])
            srv.settle()
            after = census()
            n0, n1, grown = sum(before.values()), sum(after.values()), dict((after - before).most_common(5))
            out[kind] = {"before": n0, "after": n1, "growth": n1 - n0, "top_types": grown,
                         "suffix_corpus_tokens_added": pools(srv).get("suffix_corpus_tokens", 0) - corpus0}
    return out


def pools(srv: SoakServer) -> dict:
    """The prefix pool's use and the suffix drafter's corpus size (what grows with served requests)."""
    from specserve.drafters.suffix import SuffixDrafter
    pool, out = srv.engine.prefixes.pool, {}
    if pool is not None:
        out |= {"prefix_bytes": pool.used_bytes, "prefix_blocks": pool.blocks, "prefix_capacity_blocks": pool.capacity}
    for idx in (d.index for d in srv.engine.drafters.values() if isinstance(d, SuffixDrafter)):
        out |= {"suffix_corpus_tokens": idx.tokens, "suffix_corpus_texts": len(idx.docs),
                "suffix_index_keys": len(idx.long), "suffix_index_entries": sum(map(len, idx.long.values())),
                "suffix_max_tokens": idx.max_tokens}
    return out


def engine_state(srv: SoakServer) -> dict:
    """What must be empty once the load has stopped and the engine drained."""
    e, sched, c = srv.engine, srv.scheduler, srv.engine.controller
    owners = {"controller": c, "controller.acceptance": c.acceptance} | {n: d for n, d in e.drafters.items()}
    per_seq = {f"{label}.{attr}": len(v) for label, obj in owners.items()
               for attr, v in getattr(obj, "__dict__", {}).items()
               if isinstance(v, dict) and all(isinstance(k, int) for k in v)}
    state = {"running": e.num_running, "free_kv_rows": e.free_capacity, "max_batch": srv.max_batch,
             "unclaimed_results": len(getattr(e, "_finished", {})), "scheduler_active": len(sched.active),
             "scheduler_waiting": sched.num_waiting, "per_sequence_dicts_checked": sorted(per_seq),
             "per_sequence_left": {k: v for k, v in per_seq.items() if v}}
    state["empty"] = state["free_kv_rows"] == srv.max_batch and not any(state[k] for k in (
        "running", "unclaimed_results", "scheduler_active", "scheduler_waiting", "per_sequence_left"))
    return state


def sample_row(load: Load, start: float, prev: list) -> dict:
    with load.lock:
        done, status = load.done.copy(), load.status.copy()
    row = {"elapsed_s": round(time.monotonic() - start, 1), "rss_mib": rss_mib(),
           "done": {k: done[k] - prev[0].get(k, 0) for k in KINDS},
           "status": {k: v - prev[1].get(k, 0) for k, v in sorted(status.items()) if v > prev[1].get(k, 0)},
           "running": load.srv.scheduler.num_running, "waiting": load.srv.scheduler.num_waiting}
    prev[:] = [done, status]
    print(f"{row['elapsed_s']:>8} {row['rss_mib']:>8} " + " ".join(f"{row['done'][k]:>10}" for k in KINDS)
          + "  " + json.dumps(row["status"]), flush=True)
    return row


def drive(load: Load, args) -> tuple[list[dict], dict]:
    """The load, a sample row every period, and the warm-up measurement (load paused), until the
    deadline or the request budget; returns the rows and the warm-up measurement."""
    start = time.monotonic()
    deadline, next_sample, warm, rows, prev = start + args.minutes * 60, start + args.sample_s, None, [], [{}, {}]
    threads = [threading.Thread(target=load.client, args=(i,), daemon=True) for i in range(args.concurrency)]
    print(f"{'elapsed':>8} {'rss_MiB':>8} " + " ".join(f"{k:>10}" for k in KINDS) + "  status", flush=True)
    for t in threads:
        t.start()
    while True:
        now = time.monotonic()
        finished = now >= deadline or not any(t.is_alive() for t in threads)
        if warm is None and (now - start >= args.warmup_s or finished):
            load.pause()
            load.srv.settle()
            gc.collect()
            warm = {"elapsed_s": round(time.monotonic() - start, 1), "rss_mib": rss_mib()}
            print(f"# warm-up at {warm['elapsed_s']} s, RSS {warm['rss_mib']} MiB: objects per type", flush=True)
            warm["objects"] = object_growth(load, args.gc_batch)
            if finished:
                load.stop.set()
            load.resume()
        if finished or time.monotonic() >= next_sample:
            rows.append(sample_row(load, start, prev))
            next_sample = max(next_sample + args.sample_s, time.monotonic() + 1)
        if finished:
            break
        time.sleep(0.1)
    load.stop.set()
    for t in threads:
        t.join(timeout=300)
    return rows, warm


def summarise(load: Load, args, rows: list, warm: dict, start_pools: dict, rss_start: float) -> dict:
    """The report, drained: totals, RSS, objects, pools, the engine's state, and the failures."""
    drained = load.srv.settle()
    gc.collect()
    end_rss, codes = rss_mib(), {int(k): v for k, v in load.status.items() if k != "transport"}
    totals = {"requests": sum(load.done.values()), "by_type": dict(load.done),
              "status": dict(sorted(load.status.items())), "5xx": sum(v for k, v in codes.items() if k >= 500),
              "4xx": sum(v for k, v in codes.items() if k // 100 == 4), "4xx_not_json": load.problems["non_json_4xx"],
              "transport_errors": load.problems["transport"], "problems": dict(load.problems),
              "problem_samples": load.samples}
    report = {"config": vars(args) | {"drafters_loaded": load.drafters}, "samples": rows, "totals": totals,
              "rss_mib": {"start": rss_start, "warm": warm["rss_mib"], "end": end_rss, "warm_at_s": warm["elapsed_s"],
                          "growth": round(end_rss - warm["rss_mib"], 1)},
              "objects_per_type": warm["objects"], "pools": {"start": start_pools, "end": pools(load.srv)},
              "engine_end": engine_state(load.srv) | {"drained": drained}}
    fails = [f"{k}: {v}" for k, v in load.problems.items()]
    fails += [] if report["engine_end"]["empty"] else ["engine not empty at the end"]
    end = report["pools"]["end"]      # the suffix index: at most one entry per corpus token
    fails += ([f"suffix index {end['suffix_index_entries']} entries > corpus {end['suffix_corpus_tokens']} tokens"]
              if end.get("suffix_index_entries", 0) > end.get("suffix_corpus_tokens", 0) else [])
    growth = report["rss_mib"]["growth"]
    fails += [f"RSS grew {growth} MiB > {args.max_growth_mb}"] if growth > args.max_growth_mb else []
    report["failures"], report["ok"] = fails, not fails
    return report


def main(argv=None) -> int:
    from specserve.drafters.registry import available
    args, t0 = parse_args(argv), time.monotonic()
    srv = SoakServer([d for d in args.drafters.split(",") if d], args.max_batch, args.max_waiting)
    not_loaded = sorted(set(available()) - set(srv.engine.drafters))     # for the malformed requests
    load = Load(srv, args.concurrency, args.max_requests, args.seed, not_loaded)
    print(f"# server up in {time.monotonic() - t0:.1f} s on {srv.url}; drafters {load.drafters}", flush=True)
    gc.collect()
    start_pools, rss_start = pools(srv), rss_mib()
    rows, warm = drive(load, args)
    report = summarise(load, args, rows, warm, start_pools, rss_start)
    srv.close()
    keys = ("totals", "rss_mib", "pools", "engine_end")
    print("\n" + "\n".join(f"{key}: {json.dumps(report[key])}" for key in keys))
    for kind, o in report["objects_per_type"].items():
        print(f"objects {kind}: {json.dumps(o)}")
    print("OK" if report["ok"] else "FAILED: " + "; ".join(report["failures"]), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
