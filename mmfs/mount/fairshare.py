"""The order in which the prefetcher's fetches are handed to its workers: a fair
share for every reader of a mount.

Each view (a rank's folder, a stream rank, samples/, ...) puts the files its window
wants, in the order its reader reads them; a file's tag is where it lies in what
the view's reader reads (the bytes of the view's files before it, counted from
where the reader started), and the lowest tag goes first. So the reader that has
read the least (a rank that fell behind) is served before the readers ahead of
it, and readers that keep pace take turns, each given bytes in proportion to what
it reads. A reader's tags count from the tag last handed out when it starts (or
jumps): one that starts late is not served ahead of all the others until it has
read as much as they have. What a view can have waiting is its window (at most
`prefetch` bytes), so no reader can hold the others back for longer than that.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Hashable
from typing import Any


class FairQueue:
    """Tasks of many views, handed out lowest start tag first (`get` blocks)."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, Hashable, Any]] = []  # (start tag, order put, view, task)
        self._finish: dict[Hashable, int] = {}  # each view's tag after the last file it put
        self._now = 0  # the start tag of the task last handed out
        self._order = itertools.count()
        self._cond = threading.Condition()
        self._closed = False
        self.given: dict[Hashable, int] = {}  # bytes of the tasks handed out, per view

    def put(self, view: Hashable, cost: int, task: Any) -> int:
        """Queue `task` of `view`, worth `cost` bytes; its start tag."""
        with self._cond:
            start = self._finish.get(view, self._now)
            self._finish[view] = start + cost
            heapq.heappush(self._heap, (start, next(self._order), view, (cost, task)))
            self._cond.notify()
            return start

    def get(self) -> tuple[Hashable, Any] | None:
        """The next (view, task), waiting for one; None once closed."""
        with self._cond:
            while not self._heap and not self._closed:
                self._cond.wait()
            if self._closed:
                return None
            start, _, view, (cost, task) = heapq.heappop(self._heap)
            self._now = max(self._now, start)
            self.given[view] = self.given.get(view, 0) + cost
            return view, task

    def drop(self, view: Hashable) -> list[Any]:
        """Take the view's waiting tasks out (its reader jumped): they are not counted
        as given, and its next file counts from the tag last handed out. The tasks
        taken out."""
        with self._cond:
            mine = [item[3][1] for item in self._heap if item[2] == view]
            self._heap = [item for item in self._heap if item[2] != view]
            heapq.heapify(self._heap)
            self._finish.pop(view, None)
            return mine

    def waiting(self) -> list[tuple[Hashable, Any]]:
        """The (view, task) pairs queued, in the order they would be handed out."""
        with self._cond:
            return [(item[2], item[3][1]) for item in sorted(self._heap)]

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._heap.clear()
            self._cond.notify_all()
