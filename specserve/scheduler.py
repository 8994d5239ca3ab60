"""Continuous batching: a bounded waiting queue, admission by free KV slots, one engine thread.

The engine is changed only by the scheduler's thread, and only through its methods (admit, step,
abort, reset, progress, take_result, snapshot, free capacity).  The one exception is ``check``, which
``submit`` calls on the caller's thread: it reads only what is fixed at construction (``max_len``,
the drafters by name, the vocabulary) and changes nothing, so a bad request is refused before it
waits.  Between two engine steps the
thread (``tick``):
1. drops cancelled and timed-out sequences (a disconnected client frees its slot within one step),
2. admits waiting requests, first come first served, while the engine has free KV rows (the fixed
   KV-memory budget: ``max_batch`` rows of ``max_len`` positions, preallocated),
3. runs one step,
4. takes the engine's snapshot for the server's gauges, then publishes each sequence's new tokens,
   and its result when it finishes, to the request's handle.

A request that fails ends with a ``RequestError`` whose ``kind`` says why (``ErrorKind``); the
server maps kinds to HTTP statuses, and metrics count them as outcomes.  A drafter's exception
costs nobody an answer (the engine falls back to plain decoding for that sequence); a failed target
pass (``PassFailed``) fails the requests of that pass (kind ``internal``, the message naming the
error) and the others go on; any other exception inside the engine fails every request in flight,
resets the engine, and the thread serves on.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import sys
import threading
import time
from dataclasses import dataclass, field

from specserve.engine import Engine, EngineSnapshot, Request, Result
from specserve.engine.faults import PassFailed
from specserve.errors import SpecserveError

SWITCH_INTERVAL_S = 0.0002
MAX_WAITING = 64        # the default bound on the waiting queue (past it: ``QueueFull``)


class ErrorKind(enum.Enum):
    """Why a request ended without a result."""
    REJECTED = "rejected"         # the engine refused it at admission (a drafter refused its prompt)
    CANCELLED = "cancelled"       # the client went away
    TIMEOUT = "timeout"           # past its deadline, waiting or running
    QUEUE_FULL = "queue_full"     # the waiting queue was at its bound (``submit`` raises QueueFull)
    INTERNAL = "internal"         # the engine failed while the request was in flight
    SHUTDOWN = "shutdown"         # the server is shutting down (refused, or unfinished at its deadline)


# the metrics' outcome label of each kind (the names /metrics has always used)
OUTCOME = {ErrorKind.REJECTED: "rejected", ErrorKind.CANCELLED: "cancelled", ErrorKind.TIMEOUT: "timeout",
           ErrorKind.QUEUE_FULL: "rejected_queue_full", ErrorKind.INTERNAL: "error",
           ErrorKind.SHUTDOWN: "shutdown"}


@dataclass(frozen=True)
class RequestError:
    """How a request failed: its kind, a message for the client, and the field at fault if any."""
    kind: ErrorKind
    message: str
    param: str | None = None


class QueueFull(Exception):
    """The waiting queue is at its bound; the client should retry later."""
    kind = ErrorKind.QUEUE_FULL


@dataclass
class Handle:
    """One request's mailbox.  Events: ("tokens", list[int]), ("done", Result), ("error", RequestError);
    for a request that asked for logprobs, ("logprobs", list[TokenLogprob]) before each "tokens" event,
    one per token.
    The handle also keeps how it ended (``result`` or ``error``), for callers without an event loop."""
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
    result: Result | None = None
    error: RequestError | None = None

    def push(self, kind: str, payload) -> None:
        if self.loop is not None and self.events is not None:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, payload))

    def cancel(self) -> None:
        """Ask the scheduler to drop this request (client gone); safe from any thread."""
        self.cancelled = True


class Scheduler:
    def __init__(self, engine: Engine, max_waiting: int = MAX_WAITING, metrics=None):
        self.engine, self.max_waiting, self.metrics = engine, max_waiting, metrics
        self.waiting: collections.deque[Handle] = collections.deque()
        self.active: dict[int, Handle] = {}
        self.snapshot: EngineSnapshot = engine.snapshot()     # retaken by the engine thread after each tick
        self._wake = threading.Condition()
        self._stop = False
        self._shutdown: str | None = None     # set by ``shutdown``: fail everything at the next tick
        self._thread = threading.Thread(target=self._run, name="specserve-engine", daemon=True)

    def start(self) -> None:
        """Hand the engine to the scheduler's thread.  The calling thread (which loaded and
        calibrated the model) gives up its compute threads, or the engine thread's passes would share
        the cores with them."""
        # Python hands its lock between threads every 5 ms by default: a busy thread elsewhere in the
        # process (the HTTP server's event loop) would then hold the engine's thread up to 5 ms at
        # each handoff (every torch call releases the lock).  Unless the user chose an interval, use 0.2 ms.
        if sys.getswitchinterval() >= 0.005:
            sys.setswitchinterval(SWITCH_INTERVAL_S)
        self.engine.release_threads()
        self._thread.start()

    def stop(self) -> None:
        with self._wake:
            self._stop = True
            self._wake.notify()
        self._thread.join(timeout=30)

    @property
    def idle(self) -> bool:
        """Nothing running and nothing waiting."""
        return not self.active and not self.waiting

    def shutdown(self, message: str = "server shutting down") -> None:
        """End every running and waiting request with kind ``shutdown``: the engine thread does it at
        its next tick (``tick`` runs it first), so no step races it."""
        with self._wake:
            self._shutdown = message
            self._wake.notify()

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
                self._count(OUTCOME[ErrorKind.QUEUE_FULL])
                raise QueueFull()
            self.waiting.append(handle)
            self._wake.notify()
        return handle

    def cancel(self, handle: Handle) -> None:
        """Drop a request whose client went away; the engine thread frees its row at its next tick."""
        handle.cancel()
        self.wake()

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
            self.tick()

    def tick(self) -> None:
        """One round of the engine thread (tests call it directly, without the thread).  A failed
        pass fails its requests; any other engine exception fails all in flight and resets the engine."""
        try:
            if self._shutdown is not None:
                self._end_all(RequestError(ErrorKind.SHUTDOWN, self._shutdown))
            self._expire_all(time.perf_counter())
            self._admit()
            self._step()
            # 4. the snapshot first: a client that reads /metrics after its answer sees the step behind it
            self.snapshot = self.engine.snapshot()
            for h in list(self.active.values()):
                self._publish(h)
        except PassFailed as e:          # the engine dropped the pass's sequences; the rest go on
            for seq_id in e.seq_ids:
                if seq_id in self.active:
                    self._fail(self.active[seq_id], RequestError(ErrorKind.INTERNAL, e.message))
            self.snapshot = self.engine.snapshot()
            for h in list(self.active.values()):
                self._publish(h)
        except Exception as e:  # noqa: BLE001 - keep serving; fail what was in flight
            for h in list(self.active.values()):
                self._fail(h, RequestError(ErrorKind.INTERNAL, f"internal engine error: {e}"))
            self.engine.reset()
            self.snapshot = self.engine.snapshot()

    def _end_all(self, err: RequestError) -> None:
        """End every request, running (their rows freed) or waiting, with ``err``."""
        for h in list(self.active.values()):
            self.engine.abort(h.seq_id)
            self._fail(h, err)
        with self._wake:
            pending, self._shutdown = list(self.waiting), None
            self.waiting.clear()
        for h in pending:
            self._fail(h, err)

    def _expire_all(self, now: float) -> None:
        """1. Cancellations and timeouts, running and waiting alike."""
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

    def _admit(self) -> None:
        """2. Admission, in arrival order, while KV rows are free."""
        while self.engine.has_capacity:
            with self._wake:
                if not self.waiting:
                    break
                h = self.waiting.popleft()
            try:
                h.seq_id = self.engine.admit(h.request)
            except SpecserveError as e:
                self._fail(h, RequestError(ErrorKind.REJECTED, str(e), e.param))
                continue
            except Exception as e:  # noqa: BLE001 - fail this request too, then let tick reset the engine
                self._fail(h, RequestError(ErrorKind.INTERNAL, f"internal engine error: {e}"))
                raise
            h.queue_s = time.perf_counter() - h.arrival
            self.active[h.seq_id] = h
            self._publish(h)

    def _step(self) -> None:
        """3. One engine step over the whole batch."""
        if not self.engine.num_running:
            return
        if self.metrics is not None:
            self.metrics.observe_batch(self.engine.num_running)
        self.engine.step()
        if self.metrics is not None and self.engine.last_step is not None:
            self.metrics.observe_step(self.engine.last_step)

    def _expire(self, h: Handle) -> None:
        """End a cancelled or timed-out request with the matching error."""
        if h.cancelled:
            self._fail(h, RequestError(ErrorKind.CANCELLED, "cancelled"))
        else:
            self._fail(h, RequestError(ErrorKind.TIMEOUT, "request timed out"))

    def _publish(self, h: Handle) -> None:
        """4. The sequence's new tokens, and its result once it has finished."""
        gen = self.engine.progress(h.seq_id)
        if gen is not None:
            if len(gen) > h.sent:
                lp = self.engine.progress_logprobs(h.seq_id)
                if lp is not None:
                    h.push("logprobs", lp[h.sent:len(gen)])
                h.push("tokens", gen[h.sent:])
                h.sent = len(gen)
            return
        result: Result | None = self.engine.take_result(h.seq_id)
        if result is None:
            return
        if len(result.tokens) > h.sent:
            if result.logprobs is not None:
                h.push("logprobs", result.logprobs[h.sent:])
            h.push("tokens", result.tokens[h.sent:])
            h.sent = len(result.tokens)
        h.finished, h.result = True, result
        del self.active[h.seq_id]
        if self.metrics is not None:
            self.metrics.observe_result(result, queue_s=h.queue_s)
        h.push("done", result)

    def _fail(self, h: Handle, err: RequestError) -> None:
        h.finished, h.error = True, err
        if h.seq_id is not None:
            self.active.pop(h.seq_id, None)
        self._count(OUTCOME[err.kind])
        h.push("error", err)

    def _count(self, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.count_outcome(outcome)
