"""``specserve bench soak``: a bounded mixed load on one HTTP server over loopback, watching for
errors and leaks.

How.  The server (``create_app`` under uvicorn, on ``--model``) runs on a thread of THIS process,
so the soak can look inside it, while C client threads send real HTTP requests (httpx) for
``--minutes`` (or ``--max-requests`` load requests).  Each client picks, seeded: a greedy completion,
a sampled one (temperature 0.8, a seed), a streamed chat read to ``data: [DONE]``, a disconnect (a
stream closed after 1-2 events), or a malformed request (bad JSON, wrong types, unknown model,
max_tokens past the context, a bad ``speculative.drafter``, ...), over a drafter drawn from the loaded
ones; half the chats share a long system prompt (the prefix cache).  Problems (kept with their
requests; ``specserve.bench.soak_requests``): a 5xx, a 4xx whose body is not
``{"error": {"message": ...}}``, a valid request refused (but a 429), a malformed one accepted, a
stream without [DONE] or with an error event, a transport error (but the deliberate disconnects).

What.  Every ``--sample-s``: elapsed, the process's RSS, requests done by type and status codes.
After ``--warmup-s`` (default min(120 s, a third of the run)) the load pauses: RSS is taken (the
growth's baseline), then per request type ``--gc-batch`` (20) sequential requests between two
``gc.collect()`` + ``gc.get_objects()`` censuses give the object growth and the types that grew most
(the suffix corpus grows by design: its growth is given beside); then the load resumes.  At the end,
drained: RSS growth since the warm-up, prefix-pool bytes/blocks and the suffix corpus (tokens, texts,
index keys) against the start, and the engine: nothing running, every KV row free, no unclaimed
result or scheduler handle, every per-sequence dict (int-keyed attributes of the controller, its
acceptance model, each drafter) empty.  Exit 1 on a problem, a non-empty engine, or RSS growth above
``--max-growth-mb`` (100).  The report is printed, and written as JSON with ``--out``.
"""

from __future__ import annotations

import collections
import gc
import json
import random
import threading
import time
from dataclasses import asdict, dataclass

import httpx

from specserve.bench.soak_requests import (CONTEXT, JSON, KINDS, TIMEOUT, WEIGHTS, judge, malformed, send_stream,
                                           valid_body)

MAX_SAMPLES = 20                            # problem samples kept in the report


@dataclass
class SoakConfig:
    """The soak's settings (``specserve bench soak``'s flags, under the same names)."""
    minutes: float
    concurrency: int
    max_requests: int | None = None
    drafters: str = "ngram,ngram-tree,suffix,lookahead,eagle,medusa"
    out: str | None = None
    warmup_s: float | None = None           # None: min(120, a third of the run)
    gc_batch: int = 20
    sample_s: float = 30.0
    max_growth_mb: float = 100.0
    max_batch: int = 4
    max_waiting: int = 64
    seed: int = 0
    model: str = "default"

    def __post_init__(self) -> None:
        if self.warmup_s is None:
            self.warmup_s = min(120.0, self.minutes * 60 / 3)

    @property
    def drafter_list(self) -> list[str]:
        return [d for d in self.drafters.split(",") if d]


class SoakServer:
    """The model, its engine and the app, served by uvicorn on a thread of this process (127.0.0.1)."""

    def __init__(self, model: str, drafters: list[str], max_batch: int, max_waiting: int):
        import uvicorn

        from specserve.control import PrefillPolicy
        from specserve.llm import LLM
        from specserve.server.app import create_app
        self.llm = LLM(model, drafters=drafters, max_batch=max_batch, max_len=CONTEXT, preload=True,
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
        status, problem, text, base = None, None, "", self.srv.url
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


def rss_mib() -> float:
    """This process's resident memory in MiB (psutil where installed, else Linux's /proc)."""
    try:
        import psutil
        rss = psutil.Process().memory_info().rss
    except ImportError:
        import os
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return round(rss / 2**20, 1)


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
    """One sample: elapsed, RSS, requests done and statuses since the last sample (printed)."""
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


def warm_up_measurement(load: Load, start: float, gc_batch: int) -> dict:
    """The load paused and drained: RSS (the growth's baseline) and the object census per type."""
    load.pause()
    load.srv.settle()
    gc.collect()
    warm = {"elapsed_s": round(time.monotonic() - start, 1), "rss_mib": rss_mib()}
    print(f"# warm-up at {warm['elapsed_s']} s, RSS {warm['rss_mib']} MiB: objects per type", flush=True)
    warm["objects"] = object_growth(load, gc_batch)
    return warm


def drive(load: Load, cfg: SoakConfig) -> tuple[list[dict], dict]:
    """The load, a sample row every period, and the warm-up measurement (load paused), until the
    deadline or the request budget; returns the rows and the warm-up measurement."""
    start = time.monotonic()
    deadline, next_sample, warm, rows, prev = start + cfg.minutes * 60, start + cfg.sample_s, None, [], [{}, {}]
    threads = [threading.Thread(target=load.client, args=(i,), daemon=True) for i in range(cfg.concurrency)]
    print(f"{'elapsed':>8} {'rss_MiB':>8} " + " ".join(f"{k:>10}" for k in KINDS) + "  status", flush=True)
    for t in threads:
        t.start()
    while True:
        now = time.monotonic()
        finished = now >= deadline or not any(t.is_alive() for t in threads)
        if warm is None and (now - start >= cfg.warmup_s or finished):
            warm = warm_up_measurement(load, start, cfg.gc_batch)
            if finished:
                load.stop.set()
            load.resume()
        if finished or time.monotonic() >= next_sample:
            rows.append(sample_row(load, start, prev))
            next_sample = max(next_sample + cfg.sample_s, time.monotonic() + 1)
        if finished:
            break
        time.sleep(0.1)
    load.stop.set()
    for t in threads:
        t.join(timeout=300)
    return rows, warm


def failures(report: dict, problems: collections.Counter, max_growth_mb: float) -> list[str]:
    """Why the soak fails, if it does: problems, a non-empty engine, an overfull suffix index, RSS growth."""
    fails = [f"{k}: {v}" for k, v in problems.items()]
    fails += [] if report["engine_end"]["empty"] else ["engine not empty at the end"]
    end = report["pools"]["end"]      # the suffix index: at most one entry per corpus token
    fails += ([f"suffix index {end['suffix_index_entries']} entries > corpus {end['suffix_corpus_tokens']} tokens"]
              if end.get("suffix_index_entries", 0) > end.get("suffix_corpus_tokens", 0) else [])
    growth = report["rss_mib"]["growth"]
    return fails + ([f"RSS grew {growth} MiB > {max_growth_mb}"] if growth > max_growth_mb else [])


def summarise(load: Load, cfg: SoakConfig, rows: list, warm: dict, start_pools: dict, rss_start: float) -> dict:
    """The report, drained: totals, RSS, objects, pools, the engine's state, and the failures."""
    drained = load.srv.settle()
    gc.collect()
    end_rss, codes = rss_mib(), {int(k): v for k, v in load.status.items() if k != "transport"}
    totals = {"requests": sum(load.done.values()), "by_type": dict(load.done),
              "status": dict(sorted(load.status.items())), "5xx": sum(v for k, v in codes.items() if k >= 500),
              "4xx": sum(v for k, v in codes.items() if k // 100 == 4), "4xx_not_json": load.problems["non_json_4xx"],
              "transport_errors": load.problems["transport"], "problems": dict(load.problems),
              "problem_samples": load.samples}
    report = {"config": asdict(cfg) | {"drafters_loaded": load.drafters}, "samples": rows, "totals": totals,
              "rss_mib": {"start": rss_start, "warm": warm["rss_mib"], "end": end_rss, "warm_at_s": warm["elapsed_s"],
                          "growth": round(end_rss - warm["rss_mib"], 1)},
              "objects_per_type": warm["objects"], "pools": {"start": start_pools, "end": pools(load.srv)},
              "engine_end": engine_state(load.srv) | {"drained": drained}}
    report["failures"] = failures(report, load.problems, cfg.max_growth_mb)
    report["ok"] = not report["failures"]
    return report


def run_soak(cfg: SoakConfig) -> int:
    """The soak of the module docstring: 0 when it passed, 1 when it failed."""
    from specserve.drafters.registry import available
    t0 = time.monotonic()
    srv = SoakServer(cfg.model, cfg.drafter_list, cfg.max_batch, cfg.max_waiting)
    try:
        not_loaded = sorted(set(available()) - set(srv.engine.drafters))     # for the malformed requests
        load = Load(srv, cfg.concurrency, cfg.max_requests, cfg.seed, not_loaded)
        print(f"# server up in {time.monotonic() - t0:.1f} s on {srv.url}; drafters {load.drafters}", flush=True)
        gc.collect()
        start_pools, rss_start = pools(srv), rss_mib()
        rows, warm = drive(load, cfg)
        report = summarise(load, cfg, rows, warm, start_pools, rss_start)
    finally:
        srv.close()
    keys = ("totals", "rss_mib", "pools", "engine_end")
    print("\n" + "\n".join(f"{key}: {json.dumps(report[key])}" for key in keys))
    for kind, o in report["objects_per_type"].items():
        print(f"objects {kind}: {json.dumps(o)}")
    print("OK" if report["ok"] else "FAILED: " + "; ".join(report["failures"]), flush=True)
    if cfg.out:
        with open(cfg.out, "w") as f:
            json.dump(report, f, indent=2)
    return 0 if report["ok"] else 1
