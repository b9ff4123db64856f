"""What every object-storage backend shares: an object looked up once (size and
ETag), ranged fetches asked again with backoff and jitter, a store that stopped
answering failed fast until it answers again, the process's range cache for token
bytes, and whole local copies for index files.

A backend (s3.py, msc.py) supplies a RemoteObject subclass: `_lookup` (size and
ETag, or NotThere / StorageUnavailable) and `_get_into` (one attempt at the bytes
of a range, checked against the range asked for, raising Changed, Permanent,
Transient or Overloaded); `register_backend` then makes its URL scheme openable.

How long a read can wait (docs/object-storage.md, "When the store fails"): a
request is at most `retries + 1` failed attempts, each ended at `request_timeout`
(the whole answer, for s3://), with a backoff of at most BACKOFF_MAX seconds
between two. Answers that ask for fewer requests (503 SlowDown, 429) are no
failure: they are asked again with backoff until (retries + 1) x request_timeout
has passed (throttle_bound), then the read fails, saying so. A request that used
its attempts on other transient failures (no connection, time-outs, 5xx errors,
cut or wrong answers), and was never throttled, marks the store down: from then on
a fetch fails at once, without a request, and one thread asks the store for a byte
every PROBE_SECONDS until it answers (a SlowDown is an answer); then fetches go on.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import hashlib
import logging
import os
import random
import shutil
import threading
import time
import zlib
from typing import Any, Callable

from mmfs.processes import pid_alive
from mmfs.storage.base import StorageError, StorageUnavailable, register_scheme
from mmfs.storage.file import FileSource
from mmfs.storage.inflight import gate
from mmfs.storage.rangecache import RangeCache
from mmfs.storage.redact import redact
from mmfs.storage.settings import StorageSettings, copy_path, current

log = logging.getLogger(__name__)
# The libraries' own lines (botocore's credential notes, urllib3's and MSC's retry
# warnings) stay out of the log: a failure reaches mmfs as an exception, and the
# read that it fails logs it in one line of its own.
for _chatty in ("botocore", "boto3", "urllib3", "s3transfer", "multistorageclient"):
    logging.getLogger(_chatty).setLevel(logging.CRITICAL + 1)

BACKOFF_MAX = 5.0  # seconds between two attempts, at most (before jitter of +-50 %)
PROBE_SECONDS = 1.0  # between two probes of a store that is down

def short(exc: BaseException) -> str:
    """A storage library's error message on one line, without a secret that might be
    in it (redact.py), cut to 300 characters."""
    return redact(" ".join(str(exc).split()) or type(exc).__name__)[:300]


class Changed(Exception):
    """The object is no longer the one looked up (its ETag changed); its message, if
    any, says how the store told."""


class Permanent(Exception):
    """An answer that asking again will not change (denied, gone, bad range)."""


class Transient(Exception):
    """A failure worth another try (5xx, cut connection, a wrong answer)."""


class Overloaded(Transient):
    """The store did not answer in time: worth another try, with fewer requests in
    flight (inflight.py)."""


class Throttled(Overloaded):
    """The store asked for fewer requests (503 SlowDown, 429, a throttling error code):
    fewer in flight and a longer backoff, asked again until the request's bound in time,
    never counted against `retries` nor taken for an outage (the store is there)."""


class StoreDown:
    """Whether the store of a backend and settings answers: down from the moment a
    request exhausted its attempts on transient failures, until a probe (one
    attempt at one byte, from one thread) gets an answer."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.since: str | None = None  # when it went down (a clock time for the message)
        self.reason = ""  # the last failure of the request that found it down
        self.probes = 0

    def check(self, url: str, offset: int, end: int) -> None:
        since = self.since
        if since is not None:
            raise StorageError(f"{url}: bytes {offset}..{end}: the store has not answered since {since} "
                               f"({self.reason}); reads fail until it does")

    def went_down(self, obj: RemoteObject, reason: str) -> None:
        with self._lock:
            if self.since is not None:
                return
            self.since, self.reason = time.strftime("%H:%M:%S"), reason
        # no line of its own: each read it fails says so in its own line
        threading.Thread(target=self._probe, args=(obj,), name="mmfs-store-probe", daemon=True).start()

    def _probe(self, obj: RemoteObject) -> None:
        while obj.size:
            time.sleep(PROBE_SECONDS)
            self.probes += 1
            try:
                obj._get_into(0, memoryview(bytearray(1)))
            except Throttled:
                pass  # an answer: the store is there (it asks for fewer requests)
            except Transient:
                continue
            except (Changed, Permanent):
                pass  # an answer: the store is there (the reads say what is wrong)
            break
        with self._lock:
            self.since = None
        log.info("%s: the store answers again; reads go on", obj.url)


def backoff(attempt: int) -> float:
    """Seconds to wait before attempt `attempt` (1, 2, ...), jitter left out."""
    return min(BACKOFF_MAX, 0.05 * 2 ** attempt)


_DOWN: dict[tuple, StoreDown] = {}
_DOWN_LOCK = threading.Lock()


def store_down(kind: type, settings: StorageSettings) -> StoreDown:
    """This process's StoreDown of a backend for the settings (one per store)."""
    key = (os.getpid(), kind, settings)
    with _DOWN_LOCK:
        return _DOWN.setdefault(key, StoreDown())


class RemoteObject:
    """One object as looked up: `size`, `etag`, and ranged fetches."""

    # whether fetch asks again itself (False: the backend's client does, counted there)
    asks_again = True
    # the store's checksum of the whole object, when it gives one we can check:
    # ("CRC32" | "SHA1" | "SHA256", base64 of the digest); set by _lookup
    checksum: tuple[str, str] | None = None

    def __init__(self, url: str, settings: StorageSettings) -> None:
        self.url = url
        self.settings = settings
        self.size, self.etag = self._lookup()
        self.identity = (self.size, self.etag)
        self.requests = 0
        self.retried = 0

    def _lookup(self) -> tuple[int, str]:
        raise NotImplementedError

    def _get_into(self, offset: int, buffer: memoryview) -> float | None:
        """One attempt: fill `buffer` with the bytes at `offset`, or raise; the
        seconds until the answer's first byte, when the backend knows them."""
        raise NotImplementedError

    def fetch(self, offset: int, buffer: memoryview) -> None:
        """Fill `buffer` with the bytes at `offset`: at most `retries + 1` attempts
        that failed, with backoff and jitter between them while the failures are
        transient; answers that ask for fewer requests (Throttled) are asked again
        besides, with backoff, until `throttle_bound` seconds have passed since the
        first attempt. Fails at once while the store is down; marks it down when its
        attempts failed without a throttling answer among them. Each attempt holds a slot of the process's
        gate for the store (inflight.py) and tells it how it went."""
        end = offset + len(buffer)
        down = store_down(type(self), self.settings)
        down.check(self.url, offset, end)
        attempts = self.settings.retries + 1 if self.asks_again else 1
        bound = throttle_bound(self.settings)
        slots = gate(self.settings)
        failed = throttled = 0
        last = ""
        started = time.monotonic()
        while True:
            try:
                self._one_attempt(slots, offset, buffer)
                return
            except Changed as exc:  # (its detail: how the store said so, when not by a 412)
                detail = f"; {exc}" if str(exc) else ""
                raise StorageError(f"{self.url}: the object changed since it was opened (its ETag "
                                   f"is no longer {self.etag}{detail}); remount to read the new one") from None
            except Permanent as exc:
                raise StorageError(f"{self.url}: bytes {offset}..{end}: {exc}") from None
            except Throttled as exc:
                throttled += 1
                last = str(exc)
                wait = backoff(throttled) * (0.5 + random.random())
                if not self.asks_again or time.monotonic() - started + wait > bound:
                    raise StorageError(
                        f"{self.url}: bytes {offset}..{end}: throttled: the store asked for fewer requests "
                        f"({last}) for {bound:g} s ({throttled} such answers; {failed} other failures); "
                        "the store is there: fewer readers, or a store with more request capacity") from None
            except Transient as exc:
                failed += 1
                last = str(exc)
                if failed >= attempts:
                    break
                wait = backoff(failed) * (0.5 + random.random())
            time.sleep(wait)
            down.check(self.url, offset, end)  # another request found it down meanwhile
            self.retried += 1
        if not throttled:  # a store that throttled this request is there, however the rest failed
            down.went_down(self, last)
        raise StorageError(f"{self.url}: bytes {offset}..{end}: {last} ({failed} attempts)")

    def _one_attempt(self, slots: Any, offset: int, buffer: memoryview) -> None:
        """One attempt, holding a slot of the gate, which it tells how it went."""
        self.requests += 1
        with slots.slot():
            cuts, sent = slots.cuts, time.monotonic()
            try:
                first_byte = self._get_into(offset, buffer)
            except Overloaded:
                slots.overloaded(cuts)
                raise
            slots.answered(time.monotonic() - sent if first_byte is None else first_byte)


def throttle_bound(settings: StorageSettings) -> float:
    """Seconds a request is asked again while the store throttles it: what a request of
    `retries + 1` attempts that time out could wait, so a read waits no longer either way."""
    return (settings.retries + 1) * settings.request_timeout


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


def range_counters() -> list[dict]:
    """The counters of this process's range caches (one per cache folder used)."""
    with _RANGES_LOCK:
        mine = [cache for folder, cache in _RANGES.items() if os.path.basename(folder) == str(os.getpid())]
    return [cache.counters() for cache in mine]


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

    def warm(self, offset: int, length: int) -> int:
        """Fetch into the range cache what of the range is neither cached nor being
        fetched, waiting for no other fetch (prefetch); the bytes fetched."""
        try:
            return range_cache(self.object.settings).warm(self._key, self.size, offset, length, self.object.fetch)
        except OSError as exc:
            raise StorageError(f"{self.url}: bytes {offset}..{offset + length}: {exc.strerror or exc}") from None

    def opened(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()


class LocalCopy(FileSource):
    """A whole object downloaded into the cache folder: read and mapped as a local
    file, named and identified as the object."""

    def __init__(self, path: str, obj: RemoteObject) -> None:
        super().__init__(path)
        self.url = obj.url
        self.identity = obj.identity


def kept_copy(obj: RemoteObject) -> LocalCopy | None:
    """The object's local copy if one of this URL and ETag is there already."""
    path = copy_path(obj.url, obj.identity)
    with contextlib.suppress(OSError):
        if os.path.getsize(path) == obj.size:
            return LocalCopy(path, obj)
    return None


def local_copy(obj: RemoteObject) -> LocalCopy:
    """The object as a file in `<cache>/objects/`, downloaded once per URL and ETag
    (written under a temporary name, then renamed: processes may share the folder)."""
    kept = kept_copy(obj)
    if kept is not None:
        return kept
    path = copy_path(obj.url, obj.identity)
    folder = os.path.dirname(path)
    tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
    try:
        os.makedirs(folder, exist_ok=True)
        for attempt in range(2):  # a copy whose checksum is not the store's: once more
            digest = _Digest(obj.checksum)
            with open(tmp, "wb") as f:
                chunk = 8 << 20
                for at in range(0, obj.size, chunk):
                    buf = bytearray(min(chunk, obj.size - at))
                    obj.fetch(at, memoryview(buf))
                    digest.update(buf)
                    f.write(buf)
            if digest.matches():
                break
            os.unlink(tmp)
            if attempt:
                raise StorageError(f"{obj.url}: the bytes fetched twice do not have the store's "
                                   f"{obj.checksum[0]} checksum; check the network path to the store")
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise StorageUnavailable(f"{obj.url}: cannot keep a copy in {folder} "
                                 f"({exc.strerror or exc}); set storage.cache_dir to a "
                                 "writable folder with room") from None
    log.info("%s: copied into %s", obj.url, path)
    return LocalCopy(path, obj)


class _Digest:
    """The checksum of bytes as they come, against the store's (None: nothing to check)."""

    def __init__(self, checksum: tuple[str, str] | None) -> None:
        self.checksum = checksum
        self.crc = 0
        self.hash = hashlib.new(checksum[0].lower()) if checksum and checksum[0] != "CRC32" else None

    def update(self, data: bytes | bytearray) -> None:
        if self.hash is not None:
            self.hash.update(data)
        elif self.checksum:
            self.crc = zlib.crc32(data, self.crc)

    def matches(self) -> bool:
        if not self.checksum:
            return True
        digest = self.hash.digest() if self.hash is not None else self.crc.to_bytes(4, "big")
        return base64.b64encode(digest).decode() == self.checksum[1]


_OPENED: dict[tuple[str, bool, StorageSettings], Any] = {}
_LOOKED_UP: dict[tuple[str, StorageSettings], RemoteObject] = {}
_OPENED_LOCK = threading.Lock()


def register_backend(scheme: str, make_object: Callable[[str, StorageSettings], RemoteObject]) -> None:
    """Make `scheme://` URLs openable: each is looked up once per process and
    settings (one HEAD); `whole=True` (an index file) gives a local copy, and so
    does a ranged open of an object whose current copy is kept already (its first
    bytes are read from disk, not fetched)."""

    def open_remote(url: str, whole: bool = False, **_options) -> Any:
        settings = current()
        key = (url, whole, settings)
        with _OPENED_LOCK:
            source = _OPENED.get(key)
            obj = _LOOKED_UP.get((url, settings))
        if source is None:
            if obj is None:
                obj = make_object(url, settings)
                with _OPENED_LOCK:
                    obj = _LOOKED_UP.setdefault((url, settings), obj)
            source = local_copy(obj) if whole else (kept_copy(obj) or RemoteSource(obj))
            with _OPENED_LOCK:
                source = _OPENED.setdefault(key, source)
        return source

    register_scheme(scheme, open_remote)
