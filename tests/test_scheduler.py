"""The scheduler on a tiny random model, without HTTP: cancellation and timeouts of running and
waiting requests, first-come-first-served admission into a batch smaller than the load, the bounded
queue, error kinds, and error isolation (an engine exception fails the requests in flight, ends every
drafter's state and leaves the engine serving).  Most tests call ``tick`` directly, one engine round
at a time, so that every state they check is reached deterministically."""

import asyncio
import sys
import time

import pytest

from conftest import tiny_model
from specserve.drafters import Drafter, create
from specserve.engine import Engine, Request
from specserve.scheduler import ErrorKind, QueueFull, Scheduler
from specserve.server.metrics import Metrics


class Exploding(Drafter):
    """Begins sequences normally, then fails every proposal; records what it was told to end."""

    def __init__(self):
        self.begun, self.ended = [], []

    def begin(self, seq_id, *args, **kwargs):
        self.begun.append(seq_id)

    def propose(self, requests):
        raise RuntimeError("drafter exploded")

    def end(self, seq_id):
        self.ended.append(seq_id)


@pytest.fixture(scope="module")
def target():
    return tiny_model(seed=41, vocab=64)


def scheduler(target, max_batch: int, max_waiting: int = 8, **drafters) -> Scheduler:
    engine = Engine(target, {"none": create("none", target), **drafters}, max_batch=max_batch, max_len=128)
    return Scheduler(engine, max_waiting=max_waiting, metrics=Metrics())


def run_until(sched: Scheduler, cond, ticks: int = 500) -> None:
    for _ in range(ticks):
        if cond():
            return
        sched.tick()
    assert cond(), f"not done after {ticks} ticks"


def wait_for(cond, timeout=30.0):
    deadline = time.time() + timeout
    while not cond():
        assert time.time() < deadline, "timed out"
        time.sleep(0.01)


def test_cancel_running_and_waiting(target):
    sched = scheduler(target, max_batch=1)
    running = sched.submit(Request([1, 2, 3], 100), 30)
    waiting = sched.submit(Request([4, 5, 6], 5), 30)
    sched.tick()
    assert running.seq_id is not None and waiting.seq_id is None and sched.num_waiting == 1
    waiting.cancel()
    sched.tick()
    assert waiting.finished and waiting.error.kind is ErrorKind.CANCELLED and waiting.seq_id is None
    assert not running.finished and sched.num_waiting == 0
    sched.cancel(running)
    sched.tick()
    assert running.error.kind is ErrorKind.CANCELLED and running.result is None
    assert sched.engine.num_running == 0 and sched.engine.free_capacity == 1 and sched.snapshot.free_rows == 1
    assert sched.metrics.outcomes == {"cancelled": 2}
    after = sched.submit(Request([7, 8], 4), 30)                  # the freed row serves the next request
    run_until(sched, lambda: after.finished)
    assert len(after.result.tokens) == 4 and after.error is None


def test_timeout_running_and_waiting(target):
    sched = scheduler(target, max_batch=1)
    running = sched.submit(Request([1, 2, 3], 100), 30)
    sched.tick()
    late = sched.submit(Request([4, 5, 6], 5), -1.0)              # its deadline has passed while it waits
    sched.tick()
    assert late.error.kind is ErrorKind.TIMEOUT and late.seq_id is None and not running.finished
    running.deadline = time.perf_counter()                       # its deadline passes while it runs
    sched.tick()
    assert running.error.kind is ErrorKind.TIMEOUT and "timed out" in running.error.message
    assert sched.engine.num_running == 0 and sched.engine.free_capacity == 1
    assert sched.metrics.outcomes == {"timeout": 2}


def test_more_requests_than_rows_admitted_in_order_and_all_finish(target):
    sched = scheduler(target, max_batch=2)
    reqs = [Request([1 + i, 2, 3 + i], 3 + i) for i in range(5)]
    handles = [sched.submit(r, 30) for r in reqs]
    most = 0
    for _ in range(200):
        if all(h.finished for h in handles):
            break
        sched.tick()
        most = max(most, sched.num_running)
        admitted = [h.seq_id is not None for h in handles]
        assert admitted == sorted(admitted, reverse=True)         # never a later request before an earlier one
    assert all(h.error is None for h in handles) and most == 2
    ids = [h.seq_id for h in handles]
    assert ids == sorted(ids) and len(set(ids)) == 5                # admitted first come, first served
    alone = [sched.engine.generate([r])[0].tokens for r in reqs]  # batching does not change greedy output
    assert [h.result.tokens for h in handles] == alone
    assert [len(t) for t in alone] == [r.max_tokens for r in reqs]
    assert sched.metrics.outcomes == {"success": 5}


def test_full_queue_raises_queue_full(target):
    sched = scheduler(target, max_batch=1, max_waiting=2)
    handles = [sched.submit(Request([1, 2, 3], 4), 30) for _ in range(2)]
    with pytest.raises(QueueFull) as e:
        sched.submit(Request([1, 2, 3], 4), 30)
    assert e.value.kind is ErrorKind.QUEUE_FULL
    assert sched.num_waiting == 2 and sched.metrics.outcomes == {"rejected_queue_full": 1}
    run_until(sched, lambda: all(h.finished for h in handles))   # the queued ones are still served
    assert all(h.result is not None for h in handles)


def test_events_are_tokens_then_the_result(target):
    """Through the engine thread: the tokens events add up to the result's tokens, and come before it."""
    sched = scheduler(target, max_batch=2)
    loop = asyncio.new_event_loop()
    sched.start()
    try:
        async def events(handle):
            out = []
            while not out or out[-1][0] == "tokens":
                out.append(await handle.events.get())
            return out

        async def both():
            hs = [sched.submit(Request([1, 2, 3], 9), 30, loop), sched.submit(Request([3, 2, 1], 6), 30, loop)]
            return hs, [await events(h) for h in hs]

        handles, got = loop.run_until_complete(asyncio.wait_for(both(), 30))
    finally:
        sched.stop()
        loop.close()
    for h, evs in zip(handles, got):
        assert [kind for kind, _ in evs[:-1]] == ["tokens"] * (len(evs) - 1) and evs[-1] == ("done", h.result)
        assert [t for _, toks in evs[:-1] for t in toks] == h.result.tokens


def test_start_sets_a_short_switch_interval_unless_chosen(target):
    before = sys.getswitchinterval()
    try:
        for chosen, expected in ((0.005, 0.0002), (0.001, 0.001)):
            sys.setswitchinterval(chosen)
            sched = scheduler(target, max_batch=1)
            sched.start()
            sched.stop()
            assert sys.getswitchinterval() == pytest.approx(expected)
    finally:
        sys.setswitchinterval(before)


def test_a_drafter_that_always_raises_costs_no_answer(target):
    """Every proposal raises: every request still succeeds, by plain decoding, and its drafter state
    was ended."""
    boom = Exploding()
    sched = scheduler(target, max_batch=2, boom=boom)
    sched.start()
    try:
        handles = [sched.submit(Request([1, 2, 3, i], 10, drafter="boom", num_draft=2), 30) for i in range(3)]
        plain = [sched.submit(Request([1, 2, 3, i], 10), 30) for i in range(3)]
        wait_for(lambda: all(h.finished for h in handles + plain))
        assert [h.result.tokens for h in handles] == [h.result.tokens for h in plain]
        assert all(h.result.stats.drafter_faults == 1 for h in handles)
        assert sorted(boom.ended) == sorted(boom.begun) and len(boom.begun) == 3
        assert sched.engine.snapshot().drafter_faults == {"boom": 3}
    finally:
        sched.stop()


class FailingPass:
    """The target model; its next pass raises once ``armed``."""

    def __init__(self, model):
        self.model, self.armed = model, False

    def __getattr__(self, name):
        return getattr(self.model, name)

    def __call__(self, *args, **kwargs):
        if self.armed:
            self.armed = False
            raise RuntimeError("pass exploded")
        return self.model(*args, **kwargs)


def test_a_failed_pass_fails_its_requests_and_the_next_ones_are_served(target):
    sched = scheduler(target, max_batch=2)
    engine = sched.engine
    engine.model = model = FailingPass(engine.model)
    handles = [sched.submit(Request([1, 2, 3, i], 10), 30) for i in range(2)]
    run_until(sched, lambda: all(engine.progress(h.seq_id) for h in handles if h.seq_id is not None)
              and all(h.seq_id is not None for h in handles))
    model.armed = True
    run_until(sched, lambda: all(h.finished for h in handles))
    assert all(h.error.kind is ErrorKind.INTERNAL and h.error.message == "target pass failed: RuntimeError: "
               "pass exploded" for h in handles)
    assert engine.num_running == 0 and engine.free_capacity == 2
    ok = sched.submit(Request([5, 6, 7], 6), 30)
    run_until(sched, lambda: ok.finished)
    assert ok.error is None and len(ok.result.tokens) == 6


def test_an_engine_error_outside_the_pass_fails_all_in_flight_and_resets(target):
    boom = Exploding()
    sched = scheduler(target, max_batch=2, boom=boom)
    engine = sched.engine
    handles = [sched.submit(Request([1, 2, 3, i], 10, drafter="boom", num_draft=2), 30) for i in range(3)]
    real = engine.controller.plan
    engine.controller.plan = lambda slots: (_ for _ in ()).throw(RuntimeError("controller exploded"))
    run_until(sched, lambda: all(h.finished for h in handles[:2]))
    assert all(h.error.kind is ErrorKind.INTERNAL and "controller exploded" in h.error.message for h in handles[:2])
    assert engine.num_running == 0 and sorted(boom.ended) == sorted(boom.begun)
    engine.controller.plan = real
    run_until(sched, lambda: handles[2].finished)                 # the waiting one is served after the reset
    assert handles[2].error is None and len(handles[2].result.tokens) == 10
