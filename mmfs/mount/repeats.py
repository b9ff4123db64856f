"""Repeated log lines summarised: readers retrying a read that keeps failing would
otherwise write the same line thousands of times a second (38,269 lines, 12 MB in
8 s, were seen)."""

from __future__ import annotations

import logging
import threading
import time

FIRST = 3  # copies of a line written as they come
EVERY = 1.0  # seconds between summaries of the copies held back
KEPT = 1024  # distinct lines remembered (the oldest are forgotten)


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
