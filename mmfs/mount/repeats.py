"""Repeated log lines summarised: readers retrying a read that keeps failing would
otherwise write the same line thousands of times a second (38,269 lines, 12 MB in
8 s, were seen). A failed read is one line: the kernel asks once more for the
start of a read that failed (a page of it), which adds none. And reads that fail
the same way (a store down for 30 s failed 1,237 reads of 4 readers) are folded:
the first in full, then one line an interval with how many more there were."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

FIRST = 3  # copies of a line written as they come
EVERY = 1.0  # seconds between summaries of the copies held back
KEPT = 1024  # distinct lines remembered (the oldest are forgotten)
RETRY_SECONDS = 1.0  # a failure of a file within this of the last logged one, in its range: the retry
FOLD_SECONDS = 10.0  # failed reads of one cause: one line per this many seconds (-o log_fold)
_NUMBER = re.compile(r"\d+")


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


def cause(detail: str) -> str:
    """What failed reads of one cause share: the failure's words with every number
    masked (byte ranges, offsets, a clock time differ from read to read; why not)."""
    return _NUMBER.sub("#", detail)


class FoldedFailures:
    """Failed reads folded by cause (see `cause`): the first read that fails a way
    is written in full; the others of that cause are counted, and when `interval`
    seconds have passed since, one line says how many there were (and the last of
    them). A cause with no failure for an interval is written in full again when it
    comes back. interval 0: every failed read in full. `clock` and `timer` (a
    thread that writes the counts when they are due, not only at the next failure
    or at `close`) are for the tests."""

    def __init__(self, emit: Callable[[str], None], interval: float = FOLD_SECONDS,
                 clock: Callable[[], float] = time.monotonic, timer: bool = True) -> None:
        self.emit = emit
        self.interval = interval
        self.clock = clock
        self._timer = timer
        self._lock = threading.Lock()
        self._due = threading.Condition(self._lock)
        self._open: dict[str, list] = {}  # cause -> [window start, reads counted, last line]
        self._thread: threading.Thread | None = None
        self._closed = False

    def failed(self, line: str, detail: str) -> None:
        """A read failed (`line`, its log line; `detail`, why)."""
        if self.interval <= 0:
            self.emit(line)
            return
        key = cause(detail)
        with self._lock:
            lines = self._take_due(self.clock())
            window = self._open.get(key)
            if window is not None:
                window[1] += 1
                window[2] = line
            else:
                self._open[key] = [self.clock(), 0, line]
                lines.append(line)
                self._start_timer()
        for out in lines:
            self.emit(out)

    def flush(self) -> None:
        """Write the counts that are due."""
        with self._lock:
            lines = self._take_due(self.clock())
        for out in lines:
            self.emit(out)

    def close(self) -> None:
        """Write every count held (the mount ends)."""
        with self._lock:
            self._closed = True
            lines = self._take_due(None)
            self._due.notify_all()
        for out in lines:
            self.emit(out)

    def _take_due(self, now: float | None) -> list[str]:
        """The count lines of the windows that ended by `now` (None: all); a window
        that counted reads goes on, one that counted none is closed (under the lock)."""
        lines = []
        for key, (start, count, last) in list(self._open.items()):
            if now is not None and now - start < self.interval:
                continue
            if count:
                seconds = (now if now is not None else self.clock()) - start
                lines.append(f"{count:,} more read{'s' if count > 1 else ''} failed the same way in the last "
                             f"{seconds:.{0 if seconds >= 10 else 1}f} s (the last: {last})")
                self._open[key] = [now if now is not None else self.clock(), 0, last]
            else:
                del self._open[key]
        if now is None:
            self._open.clear()
        return lines

    def _start_timer(self) -> None:
        if self._timer and self._thread is None and not self._closed:
            self._thread = threading.Thread(target=self._tick, name="mmfs-log-fold", daemon=True)
            self._thread.start()

    def _tick(self) -> None:
        """Write each count when its interval ends."""
        while True:
            with self._lock:
                if self._closed:
                    return
                now = self.clock()
                starts = [start for start, _, _ in self._open.values()]
                wait = min(starts) + self.interval - now if starts else self.interval
                if wait > 0:
                    self._due.wait(wait)
                    continue
                lines = self._take_due(now)
            for out in lines:
                self.emit(out)
