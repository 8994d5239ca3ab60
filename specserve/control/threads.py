"""How many compute threads a pass should use, from measured pass times."""

from __future__ import annotations

from specserve.averages import decayed
from specserve.control.config import DEFAULTS, ControllerConfig


class ThreadGovernor:
    """How many compute threads the runtime should use, from measured pass times.

    On a machine shared with other busy programs, threads that must meet at every kernel run at the
    pace of the one whose core is taken: two threads can then be much slower than one (BENCHMARKS.md,
    section 7, "A shared CPU", in benchmarks/history/sections-6-11.md).  The governor keeps, for each
    thread count, a decayed average of measured over calibrated pass time, uses the count with the
    lowest, and now and then runs one step with the other count to notice when the machine changed
    (rarely when the other was much worse, since each such step costs; its numbers are
    ``ControllerConfig``'s ``thread_*``).
    Threads never change the numerics (see the native kernels), only the speed.
    """

    def __init__(self, choices: tuple[int, ...], config: ControllerConfig = DEFAULTS):
        self.choices, self.config = choices, config
        self.ratio: dict[int, float | None] = {n: None for n in choices}
        self.current = choices[0]
        self.steps = 0
        self.switches = 0
        self._exploring: int | None = None     # the count a look at the other is running with
        self._left = 0                         # steps of that look still to run
        self._skip = False                     # the look's first pass pays for the switch: not counted

    def next(self) -> int:
        """The thread count for the next step."""
        self.steps += 1
        others = [n for n in self.choices if n != self.current]
        if not others:
            return self.current
        if self._left:
            self._left -= 1
            return self._exploring
        other = min(others, key=lambda n: self.ratio[n] if self.ratio[n] is not None else 0.0)
        mine, theirs = self.ratio[self.current], self.ratio[other]
        gap = 1.0 if theirs is None or not mine else theirs / mine
        # a much worse option is looked at rarely, unless it is the default: a machine that became
        # free again should get all its cores back soon.  A look runs ``thread_burst`` passes and counts
        # only the last: the first pass after a change of thread count wakes or parks threads, and would
        # make every look at the other count seem slower than it is
        c = self.config
        rare = gap > c.thread_rare_gap and self.current == self.choices[0]
        every = c.thread_look_every * (c.thread_rare if rare else 1)
        if self.steps % every:
            return self.current
        self._exploring, self._left, self._skip = other, c.thread_burst - 1, c.thread_burst > 1
        return other

    def observe(self, threads: int, ratio: float) -> None:
        """A step ran with ``threads`` and took ``ratio`` times its calibrated time."""
        if threads not in self.ratio or ratio <= 0:
            return
        if self._skip and threads == self._exploring:
            self._skip = False
            return
        old = self.ratio[threads]
        w = self.config.thread_weight if threads == self.current else 1.0   # a rare look at the other: take it as is
        self.ratio[threads] = decayed(old, ratio, w)
        known = {n: r for n, r in self.ratio.items() if r is not None}
        best = min(known, key=known.get)
        # (the current count may not be measured yet: steps that carry prompt chunks are not observed)
        switch = self.config.thread_switch
        if best != self.current and self.current in known and known[best] < known[self.current] * switch:
            self.current = best
            self.switches += 1
