"""What every object-storage backend shares: an object looked up once (size and
ETag), ranged fetches retried with backoff and jitter and checked for length, the
process's range cache for token bytes, and whole local copies for index files.

A backend (s3.py, msc.py) supplies a RemoteObject subclass: `_lookup` (size and
ETag, or NotThere / StorageUnavailable) and `_get` (the bytes of a range, raising
Changed, Permanent or Transient); `register_backend` then makes its URL scheme
openable.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import random
import shutil
import threading
import time
from typing import Any, Callable

from mmfs.processes import pid_alive
from mmfs.storage.base import StorageError, StorageUnavailable, register_scheme
from mmfs.storage.file import FileSource
from mmfs.storage.rangecache import RangeCache
from mmfs.storage.redact import redact
from mmfs.storage.settings import StorageSettings, copy_path, current

log = logging.getLogger(__name__)
# The clients' own INFO lines ("Found credentials in ...", endpoints) are not the user's
for _chatty in ("botocore", "multistorageclient"):
    logging.getLogger(_chatty).setLevel(logging.WARNING)

def short(exc: BaseException) -> str:
    """A storage library's error message on one line, without a secret that might be
    in it (redact.py), cut to 300 characters."""
    return redact(" ".join(str(exc).split()) or type(exc).__name__)[:300]


class Changed(Exception):
    """The object is no longer the one looked up (its ETag changed)."""


class Permanent(Exception):
    """An answer that asking again will not change (denied, gone, bad range)."""


class Transient(Exception):
    """A failure worth another try (throttled, 5xx, timeout, cut connection)."""


class RemoteObject:
    """One object as looked up: `size`, `etag`, and ranged fetches."""

    def __init__(self, url: str, settings: StorageSettings) -> None:
        self.url = url
        self.settings = settings
        self.size, self.etag = self._lookup()
        self.identity = (self.size, self.etag)
        self.requests = 0
        self.retried = 0

    def _lookup(self) -> tuple[int, str]:
        raise NotImplementedError

    def _get(self, offset: int, n: int) -> bytes:
        raise NotImplementedError

    def fetch(self, offset: int, buffer: memoryview) -> None:
        """Fill `buffer` with the bytes at `offset`, asking again with backoff and
        jitter while the answer is a transient failure or a body of the wrong size."""
        n = len(buffer)
        end = offset + n
        last = ""
        for attempt in range(self.settings.retries + 1):
            if attempt:
                self.retried += 1
                time.sleep(min(5.0, 0.05 * 2 ** attempt) * (0.5 + random.random()))
            self.requests += 1
            try:
                body = self._get(offset, n)
            except Changed:
                raise StorageError(f"{self.url}: the object changed since it was opened (its ETag "
                                   f"is no longer {self.etag}); remount to read the new one") from None
            except Permanent as exc:
                last = str(exc)
                break
            except Transient as exc:
                last = str(exc)
                continue
            if len(body) == n:
                buffer[:] = body
                return
            last = f"short body: {len(body)} of {n} bytes"
        raise StorageError(f"{self.url}: bytes {offset}..{end}: {last}")


_RANGES: dict[str, RangeCache] = {}
_RANGES_LOCK = threading.Lock()


def range_cache(settings: StorageSettings) -> RangeCache:
    """This process's range cache in the settings' cache folder (its own subfolder:
    which ranges a data file holds is known only to the process that wrote it)."""
    root = os.path.join(settings.cache_folder, "ranges")
    folder = os.path.join(root, str(os.getpid()))
    with _RANGES_LOCK:
        cache = _RANGES.get(folder)
        if cache is None:
            _remove_dead(root)
            try:
                cache = _RANGES[folder] = RangeCache(folder, settings.cache_limit)
            except OSError as exc:  # not "no dataset": the cache folder is the problem
                raise StorageUnavailable(f"{settings.cache_folder}: cannot keep fetched ranges there "
                                         f"({exc.strerror or exc}); set storage.cache_dir to a writable "
                                         "folder with room") from None
            atexit.register(cache.close)
        return cache


def close_range_caches() -> None:
    """Remove this process's range folders now (also registered atexit; a forked
    daemon ends with os._exit, which runs no atexit handler, so it calls this)."""
    with _RANGES_LOCK:
        mine = [f for f in _RANGES if os.path.basename(f) == str(os.getpid())]
        for folder in mine:
            _RANGES.pop(folder).close()


def _remove_dead(root: str) -> None:
    """The range folders of processes that are gone."""
    with contextlib.suppress(OSError):
        for name in os.listdir(root):
            if name.isdigit() and not pid_alive(int(name)):
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)


class RemoteSource:
    """An object read by ranges through this process's range cache."""

    def __init__(self, obj: RemoteObject) -> None:
        self.object = obj
        self.url = obj.url
        self.size = obj.size
        self.identity = obj.identity
        self._key = f"{obj.url}\0{obj.etag}"

    def read_into(self, offset: int, buffer) -> int:
        try:  # the cache of this process (a forked daemon makes its own)
            return range_cache(self.object.settings).read(
                self._key, self.size, offset, memoryview(buffer).cast("B"), self.object.fetch)
        except OSError as exc:
            raise StorageError(f"{self.url}: bytes {offset}..{offset + len(buffer)}: "
                               f"{exc.strerror or exc}") from None

    def opened(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()


class LocalCopy(FileSource):
    """A whole object downloaded into the cache folder: read and mapped as a local
    file, named and identified as the object."""

    def __init__(self, path: str, obj: RemoteObject) -> None:
        super().__init__(path)
        self.url = obj.url
        self.identity = obj.identity


def local_copy(obj: RemoteObject) -> LocalCopy:
    """The object as a file in `<cache>/objects/`, downloaded once per URL and ETag
    (written under a temporary name, then renamed: processes may share the folder)."""
    path = copy_path(obj.url, obj.identity)
    folder = os.path.dirname(path)
    with contextlib.suppress(OSError):
        if os.path.getsize(path) == obj.size:
            return LocalCopy(path, obj)
    tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
    try:
        os.makedirs(folder, exist_ok=True)
        with open(tmp, "wb") as f:
            chunk = 8 << 20
            for at in range(0, obj.size, chunk):
                buf = bytearray(min(chunk, obj.size - at))
                obj.fetch(at, memoryview(buf))
                f.write(buf)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise StorageUnavailable(f"{obj.url}: cannot keep a copy in {folder} "
                                 f"({exc.strerror or exc}); set storage.cache_dir to a "
                                 "writable folder with room") from None
    log.info("%s: copied into %s", obj.url, path)
    return LocalCopy(path, obj)


_OPENED: dict[tuple[str, bool, StorageSettings], Any] = {}
_OPENED_LOCK = threading.Lock()


def register_backend(scheme: str, make_object: Callable[[str, StorageSettings], RemoteObject]) -> None:
    """Make `scheme://` URLs openable: each is looked up once per process and
    settings; `whole=True` (an index file) gives a local copy."""

    def open_remote(url: str, whole: bool = False, **_options) -> Any:
        settings = current()
        key = (url, whole, settings)
        with _OPENED_LOCK:
            source = _OPENED.get(key)
        if source is None:
            obj = make_object(url, settings)
            source = local_copy(obj) if whole else RemoteSource(obj)
            with _OPENED_LOCK:
                source = _OPENED.setdefault(key, source)
        return source

    register_scheme(scheme, open_remote)
