"""Objects in S3 (and S3-compatible stores) as sources: `s3://bucket/key`.

The client is boto3, as megatron-core's own S3 reader uses: the standard
credential chain (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY/AWS_SESSION_TOKEN,
AWS_PROFILE, ~/.aws/config and credentials, AWS_ENDPOINT_URL, AWS_REGION), none
of it ever written to a message. (obstore costs a quarter of the CPU per ranged
GET, but its runtime does not survive the fork that makes the mount daemon: a
request in the forked process hangs.) Clients are made per process for the same
reason.

An object is looked up once (HEAD: its size and ETag); every later GET is
conditional on that ETag (If-Match), so an object replaced while it is read is
an error, never a mix of old and new bytes. Each body is checked against the
range asked for and fetched again, with backoff and jitter, when it is short;
botocore's standard retries cover throttling, 5xx answers and timeouts. Reads go
through a RangeCache (rangecache.py); an index file (`whole=True`) is downloaded
once into the cache folder as a local copy, keyed by its URL and ETag.
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
from typing import Any

from mmfs.storage.base import NotThere, StorageError, StorageUnavailable, register_scheme
from mmfs.storage.file import FileSource
from mmfs.storage.rangecache import RangeCache
from mmfs.storage.settings import StorageSettings, copy_path, current

log = logging.getLogger(__name__)

SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


def _boto3():
    try:
        import boto3
        import botocore
        import botocore.config
        import botocore.exceptions
    except ImportError:
        raise StorageUnavailable("s3:// datasets need boto3: pip install 'mmfs[s3]'") from None
    return boto3, botocore


def split_url(url: str) -> tuple[str, str]:
    """(bucket, key) of s3://bucket/key."""
    bucket, _, key = url[len("s3://"):].partition("/")
    if not bucket or not key:
        raise StorageError(f"{url}: not an object URL (expected s3://BUCKET/KEY)")
    return bucket, key


_CLIENTS: dict[tuple, Any] = {}
_CLIENTS_LOCK = threading.Lock()


def client(settings: StorageSettings) -> Any:
    """This process's client for the settings (a client does not survive a fork)."""
    key = (os.getpid(), settings)
    with _CLIENTS_LOCK:
        made = _CLIENTS.get(key)
        if made is None:
            made = _CLIENTS[key] = _make_client(settings)
        return made


def _make_client(settings: StorageSettings) -> Any:
    boto3, botocore = _boto3()
    logging.getLogger("botocore").setLevel(logging.WARNING)  # "Found credentials in ...", endpoints
    options: dict[str, Any] = {
        "connect_timeout": settings.request_timeout, "read_timeout": settings.request_timeout,
        "retries": {"mode": "standard", "max_attempts": settings.retries + 1},
        "max_pool_connections": settings.max_requests + 4,  # the readers' own, beside the prefetch
    }
    if settings.endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL"):
        options["s3"] = {"addressing_style": "path"}  # as S3-compatible stores want
    if settings.anonymous:
        options["signature_version"] = botocore.UNSIGNED
    try:
        return boto3.session.Session().client(
            "s3", endpoint_url=settings.endpoint_url, region_name=settings.region,
            config=botocore.config.Config(**options))
    except botocore.exceptions.BotoCoreError as exc:  # a malformed profile, say
        raise StorageUnavailable(f"cannot set up the S3 client ({_short(exc)}); check "
                                 "AWS_PROFILE and ~/.aws/config") from None


def _short(exc: BaseException) -> str:
    """An error's message on one line, without a secret that might be in it."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    for name in SECRET_ENV:
        secret = os.environ.get(name)
        if secret:
            text = text.replace(secret, "***")
    return text[:300]


def _code(exc: BaseException) -> str:
    """The S3 error code of a ClientError ("404", "NoSuchKey", ...), else ""."""
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


class S3Object:
    """One object: its size and ETag as looked up, and conditional ranged GETs."""

    def __init__(self, url: str, settings: StorageSettings) -> None:
        self.url = url
        self.settings = settings
        self.bucket, self.key = split_url(url)
        meta = self._head()
        self.size = int(meta["ContentLength"])
        self.etag = meta.get("ETag") or ""
        self.identity = (self.size, self.etag)
        self.requests = 0
        self.retried = 0

    def _head(self) -> dict:
        _, botocore = _boto3()
        try:
            return client(self.settings).head_object(Bucket=self.bucket, Key=self.key)
        except botocore.exceptions.ClientError as exc:
            if _code(exc) not in ("404", "NoSuchKey", "NotFound"):
                raise _unavailable(self.url, exc) from None
        except botocore.exceptions.BotoCoreError as exc:
            raise _unavailable(self.url, exc) from None
        try:
            client(self.settings).head_bucket(Bucket=self.bucket)
        except botocore.exceptions.ClientError as exc:
            if _code(exc) in ("404", "NoSuchBucket", "NotFound"):
                where = self.settings.endpoint_url or "AWS S3"
                raise StorageUnavailable(f"{self.url}: no bucket {self.bucket} at {where}; check "
                                         "the URL (and storage.endpoint_url or AWS_ENDPOINT_URL)") from None
        except botocore.exceptions.BotoCoreError:
            pass
        raise NotThere(f"{self.url}: no such object in bucket {self.bucket}")

    def fetch(self, offset: int, buffer: memoryview) -> None:
        """Fill `buffer` with the bytes at `offset`: a conditional ranged GET, again
        with backoff and jitter while the body comes back short or broken."""
        _, botocore = _boto3()
        n = len(buffer)
        end = offset + n
        last = ""
        for attempt in range(self.settings.retries + 1):
            if attempt:
                self.retried += 1
                time.sleep(min(5.0, 0.05 * 2 ** attempt) * (0.5 + random.random()))
            try:
                self.requests += 1
                answer = client(self.settings).get_object(
                    Bucket=self.bucket, Key=self.key, Range=f"bytes={offset}-{end - 1}", IfMatch=self.etag)
                body = answer["Body"].read()
            except botocore.exceptions.ClientError as exc:
                code = _code(exc)
                if code in ("PreconditionFailed", "412"):
                    raise StorageError(f"{self.url}: the object changed since it was opened (its "
                                       f"ETag is no longer {self.etag}); remount to read the new "
                                       "one") from None
                last = f"{code}: {_short(exc)}"
                if code in ("403", "AccessDenied", "404", "NoSuchKey", "NoSuchBucket", "InvalidRange"):
                    break  # not transient
                continue
            except (botocore.exceptions.BotoCoreError, OSError) as exc:
                last = _short(exc)  # a cut connection, a timeout, a broken body
                continue
            if len(body) == n:
                buffer[:] = body
                return
            last = f"short body: {len(body)} of {n} bytes"
        raise StorageError(f"{self.url}: bytes {offset}..{end}: {last}")


def _unavailable(url: str, exc: BaseException) -> StorageUnavailable:
    code = _code(exc)
    name = type(exc).__name__
    if code in ("403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch") or \
            name in ("NoCredentialsError", "PartialCredentialsError"):
        return StorageUnavailable(f"{url}: access denied or no credentials ({_short(exc)}); set "
                                  "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE, or "
                                  "storage.anonymous for a public bucket")
    return StorageUnavailable(f"{url}: cannot reach the object store ({_short(exc)}); check "
                              "storage.endpoint_url (or AWS_ENDPOINT_URL) and the network")


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
            cache = _RANGES[folder] = RangeCache(folder, settings.cache_limit)
            atexit.register(cache.close)
        return cache


def _remove_dead(root: str) -> None:
    """The range folders of processes that are gone."""
    with contextlib.suppress(OSError):
        for name in os.listdir(root):
            if name.isdigit() and not _alive(int(name)):
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class S3Source:
    """An object read by ranges through this process's range cache."""

    def __init__(self, obj: S3Object) -> None:
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

    def __init__(self, path: str, obj: S3Object) -> None:
        super().__init__(path)
        self.url = obj.url
        self.identity = obj.identity


def local_copy(obj: S3Object) -> LocalCopy:
    """The object as a file in `<cache>/objects/`, downloaded once per URL and ETag
    (written under a temporary name, then renamed: processes may share the folder)."""
    path = copy_path(obj.url, obj.identity)
    folder = os.path.dirname(path)
    with contextlib.suppress(OSError):
        if os.path.getsize(path) == obj.size:
            return LocalCopy(path, obj)
    try:
        os.makedirs(folder, exist_ok=True)
        tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
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


def open_s3(url: str, whole: bool = False, **_options) -> Any:
    """The source of an s3:// URL: looked up once per process; `whole`: a local copy."""
    settings = current()
    key = (url, whole, settings)
    with _OPENED_LOCK:
        source = _OPENED.get(key)
    if source is None:
        obj = S3Object(url, settings)
        source = local_copy(obj) if whole else S3Source(obj)
        with _OPENED_LOCK:
            source = _OPENED.setdefault(key, source)
    return source


register_scheme("s3", open_s3)
