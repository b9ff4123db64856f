"""How many requests a store has in flight at once: as many as the readers' demand
needs, never more than `max_requests` (the cap), fewer when the store asks for fewer.

Every attempt at a range (remote.py) takes a slot of this process's `Gate` for the
settings; at most `limit` slots are taken at once. An attempt that finds none free
waits for one: a reader's own request before the prefetch's (the prefetcher takes
its workers' slots with `background=True`), each kind in the order it came. A
thread that holds a slot already (a prefetch worker, whose fetch of its piece
takes a slot again) takes no second one.

The limit follows what it sees, as TCP's congestion window does (additive
increase, multiplicative decrease):

- Demand: while attempts wait for a slot, every answered one raises the limit by
  one (it doubles in a round trip) up to the cap; once the store has asked for
  fewer, by one per round trip (`limit` answers).
- Latency: the seconds to the first byte of each answer, as a running average, against
  the least that average was in the last 15-30 s (the store's own latency, one odd
  answer smoothed out). While the average is more than SLOWER times the least (plus
  SLACK), the store queues what it gets: the limit does not grow, and it shrinks by one
  per round trip, not below QUEUEING_FLOOR.
- Throttling: an answer that asks for fewer requests (503 SlowDown, 429) or an
  attempt that ran out of time halves the limit (not below 1), once per round trip:
  an attempt started before the last cut does not cut again.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager

START = 16  # slots at first (the cap may be lower)
SLOWER = 2.0  # the store queues when its latency is more than this times its best ...
SLACK = 0.010  # ... plus this many seconds (jitter of a fast store)
SMOOTHING = 0.1  # weight of each answer in the running latency
QUEUEING_FLOOR = 4  # the least the latency alone shrinks the limit to (a throttling store: 1)
BEST_SECONDS = 15.0  # a best latency is kept 15-30 s (the least of this span's answers and the last's)

_held = threading.local()  # depth of the slots this thread holds (a nested one takes none)


class Gate:
    """Slots for the attempts at one store, at most `limit` taken, the limit moved by
    what the answers say (module docstring)."""

    def __init__(self, cap: int, start: int = START) -> None:
        self.cap = max(1, int(cap))
        self.limit = min(start, self.cap)
        self._lock = threading.Lock()
        self._waiting: tuple[deque, deque] = (deque(), deque())  # readers' attempts, then the prefetch's
        self._grow_until = self.cap  # slow start until the store first asks for fewer
        self._round = 0  # answers since the limit last moved by a round trip's step
        self._best = (math.inf, math.inf)  # least latency of the last span, of this one
        self._started = self._span = time.monotonic()
        self.cuts = 0  # times the limit was halved (an attempt notes it when it starts)
        self.in_flight = 0
        self.peak = 0  # the most slots taken at once
        self.attempts = self.answers = self.overloads = self.waits = 0
        self.latency: float | None = None  # running average, seconds to the first byte
        self.busy = 0.0  # seconds of slots taken, summed: busy / elapsed is the mean in flight

    # -- slots ---------------------------------------------------------------------

    @contextmanager
    def slot(self, background: bool = False) -> Iterator[None]:
        """Hold a slot while the block runs (a thread holding one already takes none)."""
        depth = getattr(_held, "depth", 0)
        if depth:
            _held.depth = depth + 1
            try:
                yield
            finally:
                _held.depth = depth
            return
        self._take(background)
        since = time.monotonic()
        _held.depth = 1
        try:
            yield
        finally:
            _held.depth = 0
            self._give(time.monotonic() - since)

    def _take(self, background: bool) -> None:
        with self._lock:
            self.attempts += 1
            ahead = self._waiting[0] or (background and self._waiting[1])
            if self.in_flight < self.limit and not ahead:
                self._taken()
                return
            admitted = threading.Event()
            self._waiting[background].append(admitted)
            self.waits += 1
        admitted.wait()  # the thread that freed a slot took it for this one

    def _taken(self) -> None:
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)

    def _give(self, seconds: float) -> None:
        with self._lock:
            self.in_flight -= 1
            self.busy += seconds
            self._admit()

    def _admit(self) -> None:
        """Hand free slots to the waiting, readers first (under the lock)."""
        while self.in_flight < self.limit and (self._waiting[0] or self._waiting[1]):
            (self._waiting[0] or self._waiting[1]).popleft().set()
            self._taken()

    # -- what the answers say ------------------------------------------------------

    def answered(self, seconds: float) -> None:
        """An attempt got its answer, the first byte after `seconds`."""
        with self._lock:
            self.answers += 1
            self._note_latency(seconds)
            self._round += 1
            step = self._round >= self.limit  # a round trip's worth of answers since the last step
            if step:
                self._round = 0
            if self.queueing():
                if step and self.limit > QUEUEING_FLOOR:
                    self.limit -= 1
            elif self._waiting[0] or self._waiting[1]:  # the readers want more than the limit gives
                if self.limit < self._grow_until or step:
                    self.limit = min(self.cap, self.limit + 1)
                    self._admit()

    def overloaded(self, started_after: int) -> None:
        """An attempt (started when `cuts` was `started_after`) was told to slow down
        (503 SlowDown, 429) or ran out of time."""
        with self._lock:
            self.overloads += 1
            if started_after == self.cuts:  # not cut since it was sent
                self.cuts += 1
                self.limit = max(1, self.limit // 2)
                self._grow_until = self.limit
                self._round = 0

    def _note_latency(self, seconds: float) -> None:
        self.latency = seconds if self.latency is None else self.latency + SMOOTHING * (seconds - self.latency)
        last, this = self._best
        now = time.monotonic()
        if now - self._span >= BEST_SECONDS:  # a new span: a path that got slower for good is the new best
            last, this, self._span = this, math.inf, now
        self._best = (last, min(this, self.latency))

    @property
    def best(self) -> float | None:
        least = min(self._best)
        return None if math.isinf(least) else least

    def queueing(self) -> bool:
        """Whether the store's answers come much later than its best (it queues requests)."""
        best = self.best
        return best is not None and self.latency is not None and self.latency > SLOWER * best + SLACK

    def counters(self) -> dict:
        """What the gate did so far (the mount's counters, benchmarks)."""
        with self._lock:
            best = self.best
            return {"cap": self.cap, "limit": self.limit, "in_flight": self.in_flight, "peak": self.peak,
                    "waiting": len(self._waiting[0]) + len(self._waiting[1]), "attempts": self.attempts,
                    "answers": self.answers, "overloads": self.overloads, "cuts": self.cuts, "waits": self.waits,
                    "latency_ms": None if self.latency is None else round(1000 * self.latency, 3),
                    "best_ms": None if best is None else round(1000 * best, 3),
                    "busy_s": round(self.busy, 3), "seconds": round(time.monotonic() - self._started, 3)}


_GATES: dict[tuple, Gate] = {}
_GATES_LOCK = threading.Lock()


def gate(settings) -> Gate:
    """This process's gate for the store(s) of `settings` (a StorageSettings)."""
    key = (os.getpid(), settings)
    with _GATES_LOCK:
        found = _GATES.get(key)
        if found is None:
            found = _GATES[key] = Gate(settings.max_requests)
        return found


def counters() -> list[dict]:
    """The counters of this process's gates (one per settings used)."""
    with _GATES_LOCK:
        mine = [g for (pid, _), g in _GATES.items() if pid == os.getpid()]
    return [g.counters() for g in mine]
