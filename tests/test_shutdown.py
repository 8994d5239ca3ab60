"""Graceful shutdown of ``specserve serve``, end to end: the real CLI in a subprocess on loopback,
real signals.  One server start per scenario: (1) a drain that lets 16 accepted streams (8 running,
8 waiting) finish in full while /health and new requests get 503; (2) a deadline that ends long
requests with ``server_shutting_down``; (3) a second signal that stops at once.  Signals reach a
process, so these are subprocesses (the full tier); the flag check runs in process, through ``main()``."""

import json
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

from specserve.cli import main

CLI = [sys.executable, "-m", "specserve.cli"]
MAX_BATCH = 8
PREFIX_CACHE_MB = "16"      # 22 blocks of the default model; the default 1 GiB is made resident at start
REFUSAL = {"error": {"message": "server is shutting down", "type": "server_shutting_down", "param": None,
                     "code": None}}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    """``specserve serve`` in a subprocess, its stderr in a file."""

    def __init__(self, tmp_path, *flags: str):
        self.port = _free_port()
        self.log_path = tmp_path / f"serve-{self.port}.stderr"
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(CLI + ["serve", "--port", str(self.port), "--max-batch", str(MAX_BATCH),
                                                "--max-len", "1024", "--prefix-cache-mb", PREFIX_CACHE_MB,
                                                *flags],
                                         stdout=subprocess.DEVNULL, stderr=log)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.stderr()}")
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError("server did not start")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stderr(self) -> str:
        return self.log_path.read_text()

    def health(self) -> httpx.Response:
        return httpx.get(self.url + "/health", timeout=10)

    def wait_until(self, cond, timeout: float, what: str):
        """Poll /health until ``cond(response)``; the last response."""
        end = time.monotonic() + timeout
        while True:
            r = self.health()
            if cond(r):
                return r
            assert time.monotonic() < end, f"timed out waiting for {what}; last /health: {r.status_code} {r.text}"
            time.sleep(0.05)

    def wait_exit(self, timeout: float) -> tuple[int, float]:
        """The exit status and how long it took from now."""
        t0 = time.monotonic()
        rc = self.proc.wait(timeout)
        return rc, time.monotonic() - t0

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)


@pytest.fixture
def serve(tmp_path):
    started = []

    def start(*flags: str) -> Served:
        started.append(Served(tmp_path, *flags))
        return started[-1]
    yield start
    for s in started:
        s.kill()


class Stream(threading.Thread):
    """One streamed completion (usage included) read to its end in a thread."""

    def __init__(self, url: str, prompt: str, max_tokens: int, stream: bool = True):
        super().__init__(daemon=True)
        self.url, self.stream = url, stream
        self.body = {"model": "default", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                     "stream": stream, "stream_options": {"include_usage": True} if stream else None}
        self.accepted = threading.Event()        # the response's status line has arrived
        self.status: int | None = None
        self.lines: list[str] = []
        self.failure: Exception | None = None
        self.start()

    def run(self) -> None:
        try:
            with httpx.stream("POST", self.url + "/v1/completions", json=self.body, timeout=120) as r:
                self.status = r.status_code
                self.accepted.set()
                if not self.stream:
                    self.lines.append(r.read().decode())
                    return
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        self.lines.append(line[len("data: "):])
        except httpx.HTTPError as e:
            self.failure = e
        finally:
            self.accepted.set()

    @property
    def docs(self) -> list[dict]:
        return [json.loads(x) for x in self.lines if x != "[DONE]"]

    @property
    def done(self) -> bool:
        return bool(self.lines) and self.lines[-1] == "[DONE]"

    def finish_reason(self) -> str | None:
        return next((c["finish_reason"] for d in self.docs for c in d.get("choices", []) if c["finish_reason"]), None)

    def completion_tokens(self) -> int | None:
        return next((d["usage"]["completion_tokens"] for d in self.docs if d.get("usage")), None)

    def error_types(self) -> list[str]:
        return [d["error"]["type"] for d in self.docs if "error" in d]


def _counting(i: int) -> str:
    """A prompt that greedy decoding continues without an end of text."""
    return f"Counting from {i * 10}: " + ", ".join(str(i * 10 + j) for j in range(4)) + ","


def _join(streams: list[Stream], timeout: float) -> None:
    end = time.monotonic() + timeout
    for s in streams:
        s.join(max(0.0, end - time.monotonic()))
    assert not any(s.is_alive() for s in streams), "some streams did not end"


def test_bad_shutdown_timeout_is_one_line_error(capsys):
    """Refused before the model loads: status 2, one line on stderr, no traceback."""
    assert main(["serve", "--shutdown-timeout", "-1"]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specserve: error: --shutdown-timeout must be >= 0"), err


@pytest.mark.slow
def test_sigterm_drains_running_and_waiting_requests(serve):
    """16 accepted streams (8 running, 8 waiting) finish in full after SIGTERM; meanwhile /health
    and new /v1 requests get 503; then the process exits 0.  (A generous timeout: on two busy CPUs
    the drain takes 15-25 s.)"""
    s = serve("--shutdown-timeout", "120")
    streams = [Stream(s.url, _counting(i), 48) for i in range(2 * MAX_BATCH)]
    for st in streams:
        assert st.accepted.wait(60) and st.status == 200, st.failure
    s.wait_until(lambda r: r.json() == {"status": "ok", "running": 8, "waiting": 8}, 30, "8 running, 8 waiting")
    s.proc.send_signal(signal.SIGTERM)
    r = s.wait_until(lambda r: r.status_code == 503, 5, "/health 503")
    doc = r.json()
    assert doc["status"] == "shutting down" and doc["running"] + doc["waiting"] > 0, doc
    refused = httpx.post(s.url + "/v1/completions", json={"model": "default", "prompt": "hi", "max_tokens": 4},
                         timeout=10)
    assert refused.status_code == 503 and refused.headers.get("retry-after")
    assert refused.json() == REFUSAL
    assert httpx.get(s.url + "/v1/models", timeout=10).status_code == 503
    _join(streams, 90)
    for st in streams:
        assert st.failure is None and st.status == 200 and st.done, (st.failure, st.lines[-3:])
        assert st.error_types() == [] and st.finish_reason() == "length" and st.completion_tokens() == 48
    rc, waited = s.wait_exit(60)
    assert rc == 0
    err = s.stderr()
    assert "specserve: shutting down: 8 running, 8 waiting; waiting up to 120 s" in err, err
    assert "drained in" in err and "Traceback" not in err


@pytest.mark.slow
def test_deadline_ends_what_is_left_with_an_error(serve):
    """--shutdown-timeout 1: long requests, streamed (running and waiting) or not, end with
    server_shutting_down; SIGINT too exits 0, within a few seconds."""
    s = serve("--shutdown-timeout", "1")
    streams = [Stream(s.url, _counting(i), 900) for i in range(MAX_BATCH + 1)]
    plain = Stream(s.url, _counting(99), 900, stream=False)
    for st in streams:
        assert st.accepted.wait(60) and st.status == 200, st.failure
    s.wait_until(lambda r: r.json()["running"] + r.json()["waiting"] == MAX_BATCH + 2, 30, "10 requests queued")
    s.proc.send_signal(signal.SIGINT)
    rc, waited = s.wait_exit(20)
    assert rc == 0 and waited < 8, (rc, waited)
    _join(streams + [plain], 10)
    for st in streams:
        assert st.failure is None and st.done, (st.failure, st.lines[-3:])
        assert st.error_types() == ["server_shutting_down"] and st.finish_reason() is None
    assert plain.status == 503 and json.loads(plain.lines[0])["error"]["type"] == "server_shutting_down"
    err = s.stderr()
    assert "waiting up to 1 s" in err and "shutdown timeout (1 s)" in err and "Traceback" not in err, err


@pytest.mark.slow
def test_second_signal_stops_at_once(serve):
    """A second SIGTERM during a 30 s drain: the process exits (status 1) within a few seconds and
    no client is left hanging."""
    s = serve()
    streams = [Stream(s.url, _counting(i), 900) for i in range(4)]
    for st in streams:
        assert st.accepted.wait(60) and st.status == 200, st.failure
    s.proc.send_signal(signal.SIGTERM)
    s.wait_until(lambda r: r.status_code == 503, 5, "/health 503")
    time.sleep(0.5)
    assert s.proc.poll() is None, "the first signal should drain, not exit"
    s.proc.send_signal(signal.SIGTERM)
    rc, waited = s.wait_exit(20)
    assert rc == 1 and waited < 6, (rc, waited)
    _join(streams, 10)
    assert all(st.finish_reason() is None for st in streams)
    err = s.stderr()
    assert "second signal: stopping now" in err and "Traceback" not in err, err
