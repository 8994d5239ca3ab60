"""Continuous batching: a bounded waiting queue, admission by free KV slots, one engine thread.

The engine is touched only by the scheduler's thread, and only through its methods (check, admit,
step, abort, reset, progress, take_result, free capacity).  Between two engine steps the thread:
1. drops cancelled and timed-out sequences (a disconnected client frees its slot within one step),
2. admits waiting requests while the engine has free KV rows (the fixed KV-memory budget:
   ``max_batch`` rows of ``max_len`` positions, preallocated), 3. runs one step, 4. publishes each
sequence's new tokens, and its result when it finishes, to the request's handle.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from dataclasses import dataclass, field

from specserve.engine import Engine, Request, Result
from specserve.errors import SpecserveError


class QueueFull(Exception):
    """The waiting queue is at its bound; the client should retry later."""


@dataclass
class Handle:
    """One request's mailbox.  Events: ("tokens", list[int]), ("done", Result), ("error", str)."""
    request: Request
    deadline: float
    loop: asyncio.AbstractEventLoop | None = None
    events: asyncio.Queue | None = None
    arrival: float = field(default_factory=time.perf_counter)
    seq_id: int | None = None
    queue_s: float = 0.0          # waiting time before admission
    sent: int = 0
    cancelled: bool = False
    finished: bool = False

    def push(self, kind: str, payload) -> None:
        if self.loop is not None and self.events is not None:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, payload))

    def cancel(self) -> None:
        """Ask the scheduler to drop this request (client gone); safe from any thread."""
        self.cancelled = True


class Scheduler:
    def __init__(self, engine: Engine, max_waiting: int = 64, metrics=None):
        self.engine, self.max_waiting, self.metrics = engine, max_waiting, metrics
        self.waiting: collections.deque[Handle] = collections.deque()
        self.active: dict[int, Handle] = {}
        self._wake = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="specserve-engine", daemon=True)

    def start(self) -> None:
        """Hand the engine to the scheduler's thread.  The calling thread (which loaded and
        calibrated the model) gives up its compute threads, or the engine thread's passes would share
        the cores with them."""
        self.engine.release_threads()
        self._thread.start()

    def stop(self) -> None:
        with self._wake:
            self._stop = True
            self._wake.notify()
        self._thread.join(timeout=30)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.active)

    def submit(self, request: Request, timeout_s: float, loop: asyncio.AbstractEventLoop | None = None) -> Handle:
        """Queue a checked request; raises SpecserveError if it cannot be served, QueueFull if full."""
        self.engine.check(request)
        handle = Handle(request, time.perf_counter() + timeout_s, loop, asyncio.Queue() if loop else None)
        with self._wake:
            if len(self.waiting) >= self.max_waiting:
                raise QueueFull()
            self.waiting.append(handle)
            self._wake.notify()
        return handle

    def wake(self) -> None:
        with self._wake:
            self._wake.notify()

    # ------------------------------------------------------------------ engine thread
    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._stop and not self.waiting and not self.active:
                    self._wake.wait(timeout=1.0)
                if self._stop:
                    break
            try:
                self._tick()
            except Exception as e:  # noqa: BLE001 - keep serving; fail what was in flight
                for h in list(self.active.values()):
                    self._finish_error(h, f"internal engine error: {e}")
                self.engine.reset()

    def _tick(self) -> None:
        now = time.perf_counter()
        # 1. cancellations and timeouts, running and waiting alike
        for h in list(self.active.values()):
            if h.cancelled or now > h.deadline:
                self.engine.abort(h.seq_id)
                self._expire(h)
        with self._wake:
            pending = [h for h in self.waiting if h.cancelled or now > h.deadline]
            for h in pending:
                self.waiting.remove(h)
        for h in pending:
            self._expire(h)
        # 2. admission while KV rows are free
        while self.engine.has_capacity:
            with self._wake:
                if not self.waiting:
                    break
                h = self.waiting.popleft()
            try:
                h.seq_id = self.engine.admit(h.request)
            except SpecserveError as e:
                self._finish_error(h, str(e), outcome="rejected")
                continue
            except Exception as e:  # noqa: BLE001 - fail this request too, then let _run reset the engine
                self._finish_error(h, f"internal engine error: {e}")
                raise
            h.queue_s = time.perf_counter() - h.arrival
            self.active[h.seq_id] = h
            self._publish(h)
        # 3. one engine step over the whole batch
        if self.engine.num_running:
            if self.metrics is not None:
                self.metrics.observe_batch(self.engine.num_running)
            self.engine.step()
            if self.metrics is not None and self.engine.last_step is not None:
                self.metrics.observe_step(self.engine.last_step)
        # 4. publish new tokens and results
        for h in list(self.active.values()):
            self._publish(h)

    def _expire(self, h: Handle) -> None:
        """End a cancelled or timed-out request with the matching error and outcome."""
        if h.cancelled:
            self._finish_error(h, "cancelled", outcome="cancelled")
        else:
            self._finish_error(h, "request timed out", outcome="timeout")

    def _publish(self, h: Handle) -> None:
        gen = self.engine.progress(h.seq_id)
        if gen is not None:
            if len(gen) > h.sent:
                h.push("tokens", gen[h.sent:])
                h.sent = len(gen)
            return
        result: Result | None = self.engine.take_result(h.seq_id)
        if result is None:
            return
        if len(result.tokens) > h.sent:
            h.push("tokens", result.tokens[h.sent:])
            h.sent = len(result.tokens)
        h.finished = True
        del self.active[h.seq_id]
        if self.metrics is not None:
            self.metrics.observe_result(result, queue_s=h.queue_s)
        h.push("done", result)

    def _finish_error(self, h: Handle, message: str, outcome: str = "error") -> None:
        h.finished = True
        if h.seq_id is not None:
            self.active.pop(h.seq_id, None)
        if self.metrics is not None:
            self.metrics.count_outcome(outcome)
        h.push("error", message)
