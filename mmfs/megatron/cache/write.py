"""Writing the index cache safely: temporary names (`.tmp-<pid>@<host>@...`), one
sync for a whole build (`Batch`: stage every index's files, then `syncfs`, rename
into place with the description last, sync the folder), the removal of a dead
writer's temporaries, and the message when a folder cannot be written."""

from __future__ import annotations

import ctypes
import errno
import itertools
import logging
import os
import threading
import time
import uuid

from mmfs.errors import CacheError, descriptors_exhausted
from mmfs.megatron.cache.locks import HOST, Lock, try_lock
from mmfs.processes import pid_alive

log = logging.getLogger(__name__)

TEMP_PREFIX = ".tmp-"
STALE_TEMP_AGE = 24 * 3600.0  # a temporary file of another host older than this is dead

_TOLD: set[str] = set()  # cache folders said (once per process) to be impossible to make


_RUN = uuid.uuid4().hex[:8]  # with the pid and a count: unique, without a uuid per file
_COUNT = itertools.count()


def temp_name(folder: str, final: str) -> str:
    return os.path.join(folder, f"{TEMP_PREFIX}{os.getpid()}@{HOST}@{_RUN}.{next(_COUNT)}-"
                                f"{os.path.basename(final)}")


def clean_stale_temporaries(folder: str) -> int:
    """Remove temporary files whose writer is gone (a process of this host that
    no longer runs, or another host's file older than STALE_TEMP_AGE); returns
    how many were removed."""
    removed = 0
    try:
        entries = [e for e in os.scandir(folder) if e.name.startswith(TEMP_PREFIX)]
    except OSError:
        return 0
    now = time.time()
    for e in entries:
        pid, _, rest = e.name[len(TEMP_PREFIX):].partition("@")
        host, _, _ = rest.partition("@")
        try:
            if host == HOST and pid.isdigit():
                stale = not pid_alive(int(pid))
            else:  # another host's, or an older mmfs's name: judge by age
                stale = now - e.stat().st_mtime > STALE_TEMP_AGE
            if stale:
                os.unlink(e.path)
                removed += 1
        except OSError:
            pass
    if removed:
        log.info("%s: removed %d temporary file(s) left by killed builders", folder, removed)
    return removed


def _syncfs(folder: str) -> None:
    """Flush the file system holding `folder` (one call for every staged file)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        syncfs = getattr(libc, "syncfs", None)
        if syncfs is None or syncfs(fd) != 0:
            os.sync()
    finally:
        os.close(fd)


def _fsync_dir(folder: str) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:  # some file systems cannot fsync a directory; the renames still hold
        pass
    finally:
        os.close(fd)


def file_in_the_way(folder: str) -> str | None:
    """The part of `folder`'s path that is not a folder (`folder` itself, or the first
    one above it that is a file or a broken link), or None where there is none."""
    path = os.path.abspath(folder)
    at = os.sep
    for part in path.split(os.sep):
        at = os.path.join(at, part)
        if os.path.lexists(at) and not os.path.isdir(at):
            return at
    return None


def not_a_folder(folder: str) -> str | None:
    """Where `folder` cannot be a folder because a file is in its path: in words, naming
    that file and what to do; else None."""
    blocker = file_in_the_way(folder)
    if blocker is None:
        return None
    what = "a file" if os.path.exists(blocker) else "a broken symbolic link"
    if blocker == os.path.abspath(folder):
        return f"{folder} is {what}, not a folder; set cache_dir in the config to a folder (or move the file away)"
    return (f"{blocker} (in {folder}'s path) is {what}, not a folder; set cache_dir in the config to a folder "
            "not under it, or move it away")


def told_once(folder: str) -> bool:
    """True the first time in this process a cache folder is said to be impossible to
    make (the check before a build says it; the writer then does not say it again)."""
    if folder in _TOLD:
        return False
    _TOLD.add(folder)
    return True


def write_problem(folder: str, exc: OSError) -> str:
    """What went wrong writing the cache in `folder`, and what to do, in words."""
    code = exc.errno
    text = str(exc)
    if code in (errno.EEXIST, errno.ENOTDIR) and (why := not_a_folder(folder)) is not None:
        return why
    if code == errno.ENOTDIR:  # (the file was gone by the time it was looked for)
        return (f"a part of {folder}'s path is a file, not a folder; set cache_dir in the config to a folder "
                "(or move the file away)")
    if code in (errno.ENOSPC, errno.EDQUOT) or "requested and" in text:
        return (f"no space left in {folder} (disk or quota full); free some space or set "
                "cache_dir in the config to a folder on another disk")
    limit = descriptors_exhausted(exc)
    if limit is not None:  # not the folder's fault
        return f"cannot write in {folder}: {limit}"
    if code in (errno.EACCES, errno.EPERM, errno.EROFS):
        return (f"{folder} is not writable ({exc.strerror}); set cache_dir in the config to "
                "a writable folder")
    return f"cannot write in {folder} ({exc.strerror or text}); set cache_dir in the config " \
           "to a writable folder"


class Abandoned(Exception):
    """A file was to be staged in a batch that was abandoned (the build was given up)."""


class Batch:
    """Staged index files waiting for one sync and their renames, and the build
    locks to release once they are in place (thread-safe). Once abandoned it takes
    no file: a build thread still running when the build was given up (Ctrl-C does
    not wait for it) creates nothing, and what it was writing is removed."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._staged: list[tuple[str, str]] = []  # (temporary, final)
        self._created: list[str] = []  # temporaries created and not yet renamed
        self._abandoned = False
        self._locks: list[Lock] = []
        self._warned: set[str] = set()
        self._cleaned: set[str] = set()

    def create(self, tmp: str) -> int:
        """Create temporary file `tmp` (O_EXCL) for writing, unless the batch was
        abandoned (Abandoned); creating it under the guard, abandon() never misses it."""
        with self._guard:
            if self._abandoned:
                raise Abandoned(tmp)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            self._created.append(tmp)
        return fd

    def add(self, moves: list[tuple[str, str]]) -> None:
        with self._guard:
            if not self._abandoned:
                self._staged.extend(moves)
                return
        for tmp, _ in moves:  # written after the build was given up: removed (again)
            unlink_quietly(tmp)
        raise Abandoned(moves[0][0] if moves else "")

    def lock(self, path: str) -> Lock | None:
        """try_lock(path), the lock then released at the commit (or abandon); None when
        another builder holds it; Abandoned once the batch was (taken under the guard,
        abandon() never misses it)."""
        with self._guard:
            if self._abandoned:
                raise Abandoned(path)
            lock = try_lock(path)
            if lock:
                self._locks.append(lock)
        return lock

    def first_write_in(self, folder: str) -> bool:
        with self._guard:
            first = folder not in self._cleaned
            self._cleaned.add(folder)
            return first

    def warn_once(self, folder: str, message: str) -> None:
        with self._guard:
            if folder in self._warned:
                return
            self._warned.add(folder)
        if any(folder == t or folder.startswith(t + os.sep) for t in list(_TOLD)):
            return  # the check before the build said why this folder cannot be made
        log.warning("cannot write the index cache: %s. Indices stay in memory.", message)

    def _take(self, abandon: bool = False) -> tuple[list[tuple[str, str]], list[Lock], list[str]]:
        with self._guard:
            staged, self._staged = self._staged, []
            locks, self._locks = self._locks, []
            created, self._created = self._created, []
            self._abandoned = self._abandoned or abandon
        return staged, locks, created

    def commit(self) -> None:
        """Sync once, rename every staged file into place, release the locks."""
        staged, locks, _ = self._take()
        try:
            if not staged:
                return
            folders = sorted({os.path.dirname(final) for _, final in staged})
            try:
                for folder in folders:
                    _syncfs(folder)
                for tmp, final in staged:
                    os.replace(tmp, final)
                for folder in folders:
                    _fsync_dir(folder)
            except OSError as exc:
                for tmp, _ in staged:
                    unlink_quietly(tmp)
                raise CacheError(f"cannot finish the index cache: "
                                 f"{write_problem(os.path.dirname(exc.filename or folders[0]), exc)}"
                                 ) from None
        finally:
            for lock in locks:
                lock.release()

    def abandon(self) -> None:
        """Drop staged files and those being written, release the locks, and take no
        file from now on (a build that failed or was given up)."""
        staged, locks, created = self._take(abandon=True)
        for tmp in {*created, *(tmp for tmp, _ in staged)}:
            unlink_quietly(tmp)
        for lock in locks:
            lock.release()


def unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
