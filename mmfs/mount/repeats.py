"""Repeated log lines summarised: readers retrying a read that keeps failing would
otherwise write the same line thousands of times a second (38,269 lines, 12 MB in
8 s, were seen). And a failed read is one line: the kernel asks once more for the
start of a read that failed (a page of it), which adds none."""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict

FIRST = 3  # copies of a line written as they come
EVERY = 1.0  # seconds between summaries of the copies held back
KEPT = 1024  # distinct lines remembered (the oldest are forgotten)
RETRY_SECONDS = 1.0  # a failure of a file within this of the last logged one, in its range: the retry


class RepeatFilter(logging.Filter):
    """A handler filter: the first FIRST copies of a message pass; later copies are
    counted and one line a second says how many there were."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._seen: dict[str, list] = {}  # message -> [copies, held back, last summary time]

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        now = time.monotonic()
        with self._lock:
            entry = self._seen.get(message)
            if entry is None:
                if len(self._seen) >= KEPT:
                    self._seen.pop(next(iter(self._seen)))
                self._seen[message] = [1, 0, now]
                return True
            entry[0] += 1
            if entry[0] <= FIRST:
                return True
            entry[1] += 1
            if now - entry[2] < EVERY:
                return False
            held, entry[1], entry[2] = entry[1], 0, now
        record.msg, record.args = "%s (%d times since the last such line)", (message, held)
        return True


class FailedReads:
    """Which failed reads to log: not the kernel's retry of a read just logged (the
    same file, from an offset the logged read covered, within RETRY_SECONDS)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: OrderedDict[object, tuple[int, int, float]] = OrderedDict()  # file -> (lo, hi, when)

    def first(self, file: object, offset: int, size: int) -> bool:
        now = time.monotonic()
        with self._lock:
            last = self._last.get(file)
            if last is not None and last[0] <= offset < last[1] and now - last[2] < RETRY_SECONDS:
                return False
            self._last[file] = (offset, offset + max(size, 1), now)
            self._last.move_to_end(file)
            if len(self._last) > KEPT:
                self._last.popitem(last=False)
            return True
