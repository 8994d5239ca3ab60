"""Graceful shutdown of ``specserve serve``: stop taking work, let what was accepted finish, exit.

The sequence of events:

1. The first SIGTERM or SIGINT reaches ``DrainingServer.handle_exit`` (uvicorn installs it for both,
   in the main thread, which also runs the event loop).  The handler only sets flags and schedules
   ``DrainingServer._drain`` on the server's loop: ``Drain.begin`` marks the drain and its deadline
   (``--shutdown-timeout`` seconds ahead).
2. From then on ``DrainMiddleware`` answers ``/health`` with 503 ``{"status": "shutting down",
   "running": n, "waiting": m}`` and every new ``/v1`` request with 503 ``server_shutting_down`` and
   ``Retry-After`` (``/metrics`` stays served).  uvicorn closes its listening socket only once
   ``should_exit`` is set, so during the drain clients and load balancers get these 503s rather than
   refused connections.  Requests already accepted, running or queued, go on as usual.
3. The drain waits until the scheduler is idle and no HTTP request the app accepted is still in
   progress (the middleware counts them, so the last events of a stream have been sent too), or
   until the deadline; one line on stderr says when it starts and one when it ends.
4. At the deadline, ``Scheduler.shutdown`` ends what is left with kind ``shutdown`` at the engine
   thread's next tick: a stream gets an error event (type ``server_shutting_down``), a non-streamed
   request a 503.  Those answers get ``SEND_GRACE_S`` to go out.
5. ``should_exit``: uvicorn closes the listening socket and idle connections, gives open responses
   at most ``SEND_GRACE_S`` (``timeout_graceful_shutdown``), runs the app's lifespan shutdown (the
   scheduler's thread stops), and ``serve`` returns: ``exit_code`` 0.

A second signal, at any point of the drain, stops at once: the scheduler ends what is left (streams
get an error event, if it goes out within ``FORCE_SETTLE_S``; connections still open after that
are dropped), uvicorn skips waiting for connections (``force_exit``), the lifespan's shutdown
stops the scheduler's thread after its current step, and ``exit_code`` is 1 (some requests were
cut short).  Should the process not be gone ``FORCE_EXIT_S`` later, a watchdog ends it with
``os._exit(1)``.

uvicorn's own handler records every signal and re-raises it once ``serve`` returns, so that the
process dies of it (SIGTERM: status -15; SIGINT: KeyboardInterrupt).  This one does not: the
process exits with the status ``cmd_serve`` returns.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time

import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from specserve.scheduler import ErrorKind, RequestError, Scheduler
from specserve.server.errors import request_error

POLL_S = 0.05           # how often the drain looks at the scheduler and the requests in progress
SEND_GRACE_S = 5.0      # after the deadline: time for the error answers (and any response) to go out
FORCE_EXIT_S = 5.0      # after a second signal: the watchdog's os._exit(1)
FORCE_SETTLE_S = 1.0    # after a second signal: time for the error answers to go out
DROP_WAIT_S = 1.0       # then for the tasks of the connections dropped to end
REFUSED = "server is shutting down"
DEADLINE = "server is shutting down: request unfinished at the shutdown deadline"
STOPPED = "server stopped"


def log(line: str) -> None:
    print(f"specserve: {line}", file=sys.stderr, flush=True)


class Drain:
    """The drain's state, shared by the middleware (which refuses new work while ``draining`` and
    counts the requests in progress) and the server (which starts and ends it)."""

    def __init__(self, scheduler: Scheduler):
        self.scheduler = scheduler
        self.draining = False
        self.forced = False
        self.started: float | None = None
        self.deadline: float | None = None
        self.in_flight = 0      # HTTP requests handed to the app and not yet answered in full

    def begin(self, timeout_s: float) -> None:
        self.started = time.monotonic()
        self.deadline = self.started + timeout_s
        self.draining = True

    @property
    def quiet(self) -> bool:
        """Nothing running or waiting, and every accepted request answered."""
        return self.scheduler.idle and self.in_flight == 0

    def health(self) -> JSONResponse:
        return JSONResponse({"status": "shutting down", "running": self.scheduler.num_running,
                             "waiting": self.scheduler.num_waiting}, status_code=503)


class DrainMiddleware:
    """Pure ASGI: while draining, 503 for ``/health`` and for new ``/v1`` requests; always, the
    count of HTTP requests in progress."""

    def __init__(self, app, drain: Drain):
        self.app, self.drain = app, drain

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.drain.draining:
            path = scope["path"]
            if path == "/health":
                await self.drain.health()(scope, receive, send)
                return
            if path == "/v1" or path.startswith("/v1/"):
                await request_error(RequestError(ErrorKind.SHUTDOWN, REFUSED))(scope, receive, send)
                return
        self.drain.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.drain.in_flight -= 1


def install_drain(app: FastAPI, scheduler: Scheduler) -> Drain:
    """The app's drain state, its middleware installed (outermost of the app's own: install it last)."""
    drain = Drain(scheduler)
    app.add_middleware(DrainMiddleware, drain=drain)
    return drain


class DrainingServer(uvicorn.Server):
    """A ``uvicorn.Server`` whose first SIGTERM/SIGINT drains ``drain`` for up to ``timeout_s``
    seconds before exiting, and whose second stops at once (``exit_code`` 1)."""

    def __init__(self, config: uvicorn.Config, drain: Drain, timeout_s: float):
        super().__init__(config)
        if config.timeout_graceful_shutdown is None:     # never wait forever for a client that stalls
            config.timeout_graceful_shutdown = int(SEND_GRACE_S)
        self.drain, self.timeout_s = drain, timeout_s
        self.exit_code = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None

    async def serve(self, sockets=None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    async def shutdown(self, sockets=None) -> None:
        """uvicorn's; after a second signal, ``_settle`` and the lifespan's shutdown too (uvicorn
        skips it under ``force_exit``: the lifespan task, cancelled by ``asyncio.run`` instead, would
        log a traceback, and the scheduler's thread would go on stepping).  Stopping that thread
        takes one engine step."""
        await super().shutdown(sockets)
        if self.force_exit:
            await self._settle()
            await self.lifespan.shutdown()

    async def _settle(self) -> None:
        """After a second signal: ``FORCE_SETTLE_S`` for the scheduler's error answers to go out; then
        the connections still open are dropped (their clients see them close, their tasks end as
        a disconnect does rather than being cancelled by ``asyncio.run`` with a traceback each)."""
        end = time.monotonic() + FORCE_SETTLE_S
        while not self.drain.quiet and time.monotonic() < end:
            await asyncio.sleep(POLL_S)
        for conn in list(self.server_state.connections):
            transport = getattr(conn, "transport", None)
            if transport is not None:
                transport.close()
        end = time.monotonic() + DROP_WAIT_S
        while self.server_state.tasks and time.monotonic() < end:
            await asyncio.sleep(POLL_S)

    def handle_exit(self, sig, frame) -> None:
        """The signal handler: it runs in the main thread between two bytecodes of the event loop,
        so it only sets flags and hands the work to the loop (no logging, no locks here)."""
        if not self.drain.draining and not self.should_exit:
            self.drain.begin(self.timeout_s)
            self._call_soon(self._start_drain)
        elif not self.drain.forced:      # a third signal: the watchdog is already running
            self.drain.forced = True
            self.exit_code = 1
            self.force_exit = self.should_exit = True
            self._call_soon(self._stop_now)

    def _call_soon(self, fn) -> None:
        if self._loop is None:           # before serve: nothing to drain
            self.should_exit = True
            return
        try:
            self._loop.call_soon_threadsafe(fn)
        except RuntimeError:             # the loop has closed: serve is over
            pass

    def _start_drain(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._drain())

    def _stop_now(self) -> None:
        s = self.drain.scheduler
        log(f"second signal: stopping now ({s.num_running} running, {s.num_waiting} waiting end with an error)")
        s.shutdown(STOPPED)
        watchdog = threading.Timer(FORCE_EXIT_S, os._exit, (1,))
        watchdog.daemon = True           # it dies with the process; it fires only if exiting hangs
        watchdog.start()

    async def _drain(self) -> None:
        d, s = self.drain, self.drain.scheduler
        log(f"shutting down: {s.num_running} running, {s.num_waiting} waiting; waiting up to {self.timeout_s:g} s")
        try:
            while not d.quiet and not d.forced and time.monotonic() < d.deadline:
                await asyncio.sleep(POLL_S)
            if d.forced:
                return
            if d.quiet:
                log(f"drained in {time.monotonic() - d.started:.1f} s: every request finished; exiting")
                return
            log(f"shutdown timeout ({self.timeout_s:g} s): {s.num_running} running, {s.num_waiting} waiting "
                "end with an error; exiting")
            await self._end_rest()
        finally:
            self.should_exit = True

    async def _end_rest(self) -> None:
        """Past the deadline: end what the scheduler holds (again, should a request slip in between
        the route and the queue) and give the answers ``SEND_GRACE_S`` to go out."""
        d, s = self.drain, self.drain.scheduler
        end = time.monotonic() + SEND_GRACE_S
        while not d.quiet and not d.forced and time.monotonic() < end:
            if not s.idle:
                s.shutdown(DEADLINE)
            await asyncio.sleep(POLL_S)
