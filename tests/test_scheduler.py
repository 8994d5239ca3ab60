"""The scheduler drives the engine through its methods only; an engine error fails the requests
in flight, ends every drafter's state and leaves the engine serving (tiny model, no HTTP)."""

import time

from conftest import tiny_model
from specserve.drafters import Drafter, create
from specserve.engine import Engine, Request
from specserve.scheduler import Scheduler
from specserve.server.metrics import Metrics


class Exploding(Drafter):
    """Begins sequences normally, then fails every proposal; records what it was told to end."""

    def __init__(self):
        self.begun, self.ended = [], []

    def begin(self, seq_id, prompt, sampling, max_new_tokens):
        self.begun.append(seq_id)

    def propose(self, requests):
        raise RuntimeError("drafter exploded")

    def end(self, seq_id):
        self.ended.append(seq_id)


def wait_for(cond, timeout=30.0):
    deadline = time.time() + timeout
    while not cond():
        assert time.time() < deadline, "timed out"
        time.sleep(0.01)


def test_engine_error_fails_in_flight_requests_and_ends_drafter_state():
    target = tiny_model(seed=41, vocab=64)
    boom = Exploding()
    engine = Engine(target, {"none": create("none", target), "boom": boom}, max_batch=2, max_len=128)
    metrics = Metrics()
    sched = Scheduler(engine, max_waiting=8, metrics=metrics)
    sched.start()
    try:
        handles = [sched.submit(Request([1, 2, 3, i], 10, drafter="boom", num_draft=2), 30) for i in range(3)]
        wait_for(lambda: all(h.finished for h in handles))
        assert metrics.outcomes.get("error") == 3
        assert sorted(boom.ended) == sorted(boom.begun)           # every begun sequence was ended
        assert engine.num_running == 0 and engine.free_capacity == 2
        ok = sched.submit(Request([5, 6, 7], 6), 30)                # the engine still serves
        wait_for(lambda: ok.finished)
        assert metrics.outcomes.get("success") == 1 and engine.free_capacity == 2
    finally:
        sched.stop()
