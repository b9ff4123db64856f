"""Build locks of the index cache: one builder per index, on one host or many
sharing the cache folder (NFSv3+ and Lustre honour O_CREAT|O_EXCL).

A lock is a file `<md5>-<Class>-<split>.lock` beside the index's files (or
`<md5>-indices.lock` for a claim of several, see builder.assign_locks), created
with O_EXCL and holding the builder's host, pid and start time. Its holder
touches it every HEARTBEAT seconds. A waiter takes a lock over when it is stale:
its holder is on this host and dead, or (any host) it was not touched for
STALE_AFTER seconds of the waiter's own watch (no clocks are compared). A waiter
that waits longer than WAIT_TIMEOUT stops with a message naming the lock file.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat as stat_module
import threading
import time

from mmfs.errors import CacheError
from mmfs.processes import pid_alive

log = logging.getLogger(__name__)

HEARTBEAT = 5.0
STALE_AFTER = 120.0  # above NFS attribute caching (up to 60 s)
WAIT_TIMEOUT = 6 * 3600.0
HOST = os.uname().nodename  # socket.gethostname(), without importing socket

EMPTY_GRACE = 5.0  # seconds a lock file may be empty while its builder writes it


def read_owner(path: str) -> dict | None:
    """The lock's {host, pid, start}, or None if it is gone or unreadable."""
    try:
        with open(path, encoding="utf-8") as f:
            owner = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}
    return owner if isinstance(owner, dict) else {}


def dead_here(owner: dict | None) -> bool:
    """True when the owner is a process of this host that no longer runs."""
    return bool(owner) and owner.get("host") == HOST and isinstance(owner.get("pid"), int) \
        and not pid_alive(owner["pid"])


class Lock:
    """A held build lock (release() removes its file)."""

    def __init__(self, path: str, stat: os.stat_result) -> None:
        self.path = path
        self._ino = (stat.st_dev, stat.st_ino)

    def touch(self) -> None:
        try:
            os.utime(self.path)
        except OSError:
            pass

    def release(self) -> None:
        try:
            st = os.stat(self.path)
            if (st.st_dev, st.st_ino) == self._ino:  # never remove a successor's lock
                os.unlink(self.path)
        except OSError:
            pass
        _HEARTBEAT.discard(self)


class _Heartbeat:
    """One daemon thread per process touching every held lock."""

    def __init__(self) -> None:
        self._locks: set[Lock] = set()
        self._guard = threading.Lock()
        self._thread: threading.Thread | None = None

    def add(self, lock: Lock) -> None:
        with self._guard:
            self._locks.add(lock)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="mmfs-lock-heartbeat",
                                                daemon=True)
                self._thread.start()

    def discard(self, lock: Lock) -> None:
        with self._guard:
            self._locks.discard(lock)

    def _run(self) -> None:
        while True:
            time.sleep(HEARTBEAT)
            with self._guard:
                locks = list(self._locks)
            for lock in locks:
                lock.touch()


_HEARTBEAT = _Heartbeat()


def try_lock(path: str) -> Lock | None:
    """Take the lock if its file does not exist; else None (even when its holder is
    dead: wait_unlocked judges that, so that a builder passing over thousands of
    held locks reads none of them). OSError when the folder is not writable."""
    if os.path.lexists(path):  # a lookup; O_CREAT would lock the folder to find out
        return None
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return None
    try:
        os.write(fd, json.dumps({"host": HOST, "pid": os.getpid(),
                                 "start": time.time()}).encode())
        stat = os.fstat(fd)
    except OSError:  # a full disk: no empty lock file left for others to wait on
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    os.close(fd)
    lock = Lock(path, stat)
    _HEARTBEAT.add(lock)
    return lock


def _remove_if_unchanged(path: str, seen: os.stat_result | None = None) -> None:
    try:
        st = os.stat(path)
        if seen is None or (st.st_ino, st.st_mtime_ns) == (seen.st_ino, seen.st_mtime_ns):
            os.unlink(path)
    except OSError:
        pass


def wait_unlocked(path: str, stale_after: float | None = None,
                  timeout: float | None = None) -> None:
    """Return once the lock file is gone, or was stale and has been removed."""
    stale_after = STALE_AFTER if stale_after is None else stale_after
    timeout = WAIT_TIMEOUT if timeout is None else timeout
    start = time.monotonic()
    pause = 0.02
    seen: tuple | None = None
    seen_since = start
    while True:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return
        if not stat_module.S_ISREG(st.st_mode):
            raise CacheError(f"{path}: not a file (a directory or special file) where mmfs keeps "
                             "a build lock; remove it and run again")
        now = time.monotonic()
        key = (st.st_ino, st.st_mtime_ns)
        if key != seen:
            seen, seen_since = key, now
        owner = read_owner(path)
        if owner is None:
            return
        if not owner and time.time() - st.st_mtime > EMPTY_GRACE:
            # A builder writes its owner right after creating the file: an empty or
            # unreadable lock is one whose write failed (a full disk), not a builder.
            log.warning("%s: names no builder; taking the lock over", path)
            _remove_if_unchanged(path, st)
            return
        if dead_here(owner):
            log.warning("%s: its builder (pid %s on %s) is gone; taking the lock over",
                        path, owner.get("pid"), owner.get("host"))
            _remove_if_unchanged(path, st)
            return
        if now - seen_since > stale_after:
            log.warning("%s: stale lock (builder pid %s on %s, not refreshed for %.0f s); "
                        "taking the lock over", path, owner.get("pid"), owner.get("host"),
                        now - seen_since)
            _remove_if_unchanged(path, st)
            return
        if now - start > timeout:
            raise CacheError(
                f"{path}: waited {now - start:.0f} s for the builder holding this lock "
                f"(pid {owner.get('pid')} on {owner.get('host')}); if no mmfs build runs "
                "there any more, delete the lock file and run again"
            )
        time.sleep(pause)
        pause = min(pause * 1.5, 0.5)
