"""Objects in S3 (and S3-compatible stores) as sources: `s3://bucket/key`.

An object is looked up (HEAD) with boto3, as megatron-core's own S3 reader
reads: the standard credential chain (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY/
AWS_SESSION_TOKEN, AWS_PROFILE, ~/.aws/config and credentials, AWS_ENDPOINT_URL,
AWS_REGION, an instance role), none of it ever written to a message. boto3 also
says where the object's bytes are (the URL it would address, path- or
virtual-host-style) and in which region requests are signed.

Its bytes are fetched by ranged GETs through libcurl (http.py), signed by libcurl
with the credentials of that same chain, asked for afresh on every request
(temporary ones are refreshed by botocore): a ranged GET through botocore costs
about ten times the CPU (benchmarks/s3_clients.py). (obstore costs about as
much, but its runtime does not survive the fork that makes the mount daemon: a
request in the forked process hangs.) Clients and libcurl handles are made per
process for the same reason.

Every GET is conditional on the ETag seen when the object was looked up
(If-Match), and its answer must carry that ETag (a store may ignore If-Match),
so an object replaced while it is read is an error, never a mix of old and new
bytes. remote.py asks again, `retries` times at most; the lookup's HEAD is
retried by botocore the same number of times, once.

No redirect is followed: a store that answers 3xx is one line naming the endpoint
and where it redirects to (botocore's own S3 region redirect, for an AWS answer
that names the bucket's region, is left to botocore, once).

Credentials the store refuses as expired are read again from the chain (a new
session: the shared credentials file, the environment, the profile), at most once
every RENEW_SECONDS, so a token renewed in the credentials file is taken without
a remount.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from mmfs.storage.base import NotThere, StorageError, StorageUnavailable
from mmfs.storage.http import BadAnswer, Endpoint, OtherVersion, Redirect
from mmfs.storage.redact import shown_url
from mmfs.storage.remote import (
    Changed,
    Overloaded,
    Permanent,
    RemoteObject,
    Throttled,
    Transient,
    register_backend,
    short,
)
from mmfs.storage.settings import StorageSettings, endpoint_problem, environment_endpoint

log = logging.getLogger(__name__)

RENEW_SECONDS = 5.0  # between two readings of the credentials the store refused as expired
# The store's answers that ask for fewer requests (S3's, and its kin's)
SLOW_DOWN = ("SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded", "TooManyRequests",
             "TooManyRequestsException", "RequestThrottled", "ServiceUnavailable")
# S3's answers to credentials that were valid once: an expired or revoked session token
EXPIRED = ("ExpiredToken", "ExpiredTokenException", "TokenRefreshRequired", "InvalidToken", "RequestExpired")
RENEW_HINT = ("if it goes on, renew them (aws_session_token in the shared credentials file, "
              "AWS_SESSION_TOKEN, or aws sso login for AWS_PROFILE)")


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


@dataclass
class Store:
    """This process's way to a store for the settings: boto3 for lookups, and the
    fetch path's connections, deadlines and credentials."""

    settings: StorageSettings
    endpoints: dict[str, Endpoint] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    renewing: threading.Lock = field(default_factory=threading.Lock)
    renewed: float | None = None  # when the credentials were last read again (time.monotonic)
    _session: Any = None
    _client: Any = None

    @property
    def session(self) -> Any:
        with self.lock:
            if self._session is None:
                boto3, botocore = _boto3()
                try:
                    self._session = boto3.session.Session()
                except botocore.exceptions.BotoCoreError as exc:  # a malformed profile, say
                    raise _setup_failed(exc) from None
            return self._session

    @property
    def client(self) -> Any:
        """boto3's client (made on first use: a mount daemon that only fetches never
        needs one, and making it costs a fraction of a second)."""
        session = self.session
        with self.lock:
            if self._client is None:
                self._client = _make_client(session, self.settings)
            return self._client

    def endpoint(self, base: str) -> Endpoint:
        with self.lock:
            made = self.endpoints.get(base)
            if made is None:
                made = self.endpoints[base] = Endpoint(base)
            return made

    def credentials(self) -> Any:
        """Frozen credentials of the chain now (None: unsigned requests)."""
        if self.settings.anonymous:
            return None
        found = self.session.get_credentials()
        return found.get_frozen_credentials() if found is not None else None

    def renew(self, refused: Any, url: str, code: str) -> bool:
        """The store refused `refused` as expired (`code`): read the credentials
        again (a new session and client), unless that was done in the last
        RENEW_SECONDS (the threads that meet the refusal together read them once).
        Whether the credentials now differ from `refused` (then ask again)."""
        with self.renewing:
            if self.credentials() != refused:
                return True  # read again by another thread meanwhile
            now = time.monotonic()
            if self.renewed is not None and now - self.renewed < RENEW_SECONDS:
                return False
            self.renewed = now
            with self.lock:
                self._session = self._client = None
            fresh = self.credentials()
        outcome = "new ones: reads go on" if fresh != refused else \
            f"the same ones: reads fail until they change (read again every {RENEW_SECONDS:g} s at most)"
        log.warning("%s: the store refused the credentials as expired (%s); read them again from the credentials "
                    "chain (shared credentials file, environment, profile): %s; %s", url, code, outcome, RENEW_HINT)
        return fresh != refused


_STORES: dict[tuple, Store] = {}
_STORES_LOCK = threading.Lock()


def store(settings: StorageSettings) -> Store:
    """This process's store for the settings (a client does not survive a fork)."""
    key = (os.getpid(), settings)
    with _STORES_LOCK:
        made = _STORES.get(key)
        if made is None:
            made = _STORES[key] = Store(settings)
        return made


def client(settings: StorageSettings) -> Any:
    return store(settings).client


def _make_client(session: Any, settings: StorageSettings) -> Any:
    _, botocore = _boto3()
    from_env = environment_endpoint()
    if from_env and not settings.endpoint_url and endpoint_problem(from_env[1]):  # botocore would trace back
        raise StorageUnavailable(f"{from_env[0]}: {shown_url(from_env[1])!r} {endpoint_problem(from_env[1])}")
    options: dict[str, Any] = {
        "connect_timeout": settings.request_timeout, "read_timeout": settings.request_timeout,
        "retries": {"mode": "standard", "total_max_attempts": settings.retries + 1},
    }
    if settings.endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL"):
        options["s3"] = {"addressing_style": "path"}  # as S3-compatible stores want
    if settings.anonymous:
        options["signature_version"] = botocore.UNSIGNED
    try:
        made = session.client("s3", endpoint_url=settings.endpoint_url, region_name=settings.region,
                              config=botocore.config.Config(**options))
    except botocore.exceptions.BotoCoreError as exc:  # a malformed profile, say
        raise _setup_failed(exc) from None
    made.meta.events.register_first("needs-retry.s3", _no_redirect)  # before botocore's region redirector
    return made


class Redirected(Exception):
    """A lookup's answer was a redirect (3xx) that mmfs does not follow."""

    def __init__(self, status: int, location: str, region: str) -> None:
        super().__init__(f"HTTP {status}")
        self.status, self.location, self.region = status, location, region


def _no_redirect(response: Any = None, request_dict: Any = None, **_: Any) -> None:
    """botocore's needs-retry hook: end a request answered 3xx (Redirected). Left
    to botocore, a redirect without the bucket's region asks the bucket's region by
    a HEAD that is redirected in turn, recursively (a RecursionError). An AWS
    answer naming another region for the bucket goes on to botocore, which asks
    once more, signed for that region (at its S3 endpoint, or at the same custom
    endpoint); a second redirect ends the request."""
    http = response[0] if response else None
    if http is None or not 300 <= http.status_code < 400:
        return
    context = (request_dict or {}).get("context", {})
    region = http.headers.get("x-amz-bucket-region", "")
    if region and region != context.get("client_region") and not context.get("s3_redirected"):
        return
    raise Redirected(http.status_code, http.headers.get("Location", ""), region)


def redirect_message(endpoint: str, status: int, location: str, region: str = "") -> str:
    """Why a redirect is refused, and what to set instead."""
    where = shown_url(location) if location else "no Location"
    fix = f"set storage.region (or AWS_REGION) to {region}" if region else \
        "set storage.endpoint_url (or AWS_ENDPOINT_URL) to the store's own address"
    return (f"the store at {shown_url(endpoint)} answered HTTP {status}, a redirect to {where}; mmfs "
            f"follows no redirect (credentials go to the endpoint only): {fix}")


def _setup_failed(exc: BaseException) -> StorageUnavailable:
    return StorageUnavailable(f"cannot set up the S3 client ({short(exc)}); check "
                              "AWS_PROFILE and ~/.aws/config")


def _code(exc: BaseException) -> str:
    """The S3 error code of a ClientError ("404", "NoSuchKey", ...), else ""."""
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


class S3Object(RemoteObject):
    """One object: HEAD once, then ranged GETs conditional on its ETag."""

    def __init__(self, url: str, settings: StorageSettings) -> None:
        self.bucket, self.key = split_url(url)
        super().__init__(url, settings)
        # where boto3 would send a GET of the object, and the region it would sign for
        address = urlsplit(client(settings).generate_presigned_url(
            "get_object", Params={"Bucket": self.bucket, "Key": self.key}, ExpiresIn=60))
        self.base = f"{address.scheme}://{address.netloc}"
        self.path = address.path
        scope = parse_qs(address.query).get("X-Amz-Credential", ["////"])[0].split("/")
        self.scope = (scope[2] or "us-east-1", scope[3] or "s3")

    def _lookup(self) -> tuple[int, str]:
        try:
            return self._head()
        except Redirected as exc:
            asked = client(self.settings).meta.endpoint_url
            raise StorageUnavailable(f"{self.url}: {redirect_message(asked, exc.status, exc.location, exc.region)}"
                                     ) from None

    def _head(self) -> tuple[int, str]:
        _, botocore = _boto3()
        try:
            meta = client(self.settings).head_object(Bucket=self.bucket, Key=self.key, ChecksumMode="ENABLED")
            self.checksum = _whole_checksum(meta)
            return int(meta["ContentLength"]), meta.get("ETag") or ""
        except botocore.exceptions.ClientError as exc:
            if _code(exc) == "400":  # a HEAD's answer has no body: ask a byte to learn why
                exc = self._why_refused(exc)
            if _code(exc) not in ("404", "NoSuchKey", "NotFound"):
                raise _unavailable(self.url, exc) from None
        except botocore.exceptions.BotoCoreError as exc:
            raise _unavailable(self.url, exc) from None
        try:
            client(self.settings).head_bucket(Bucket=self.bucket)
        except botocore.exceptions.ClientError as exc:
            if _code(exc) in ("404", "NoSuchBucket", "NotFound"):
                where = shown_url(client(self.settings).meta.endpoint_url)  # the one asked, wherever it came from
                raise StorageUnavailable(f"{self.url}: no bucket {self.bucket} at {where}; check the "
                                         "URL (and storage.endpoint_url or AWS_ENDPOINT_URL)") from None
        except botocore.exceptions.BotoCoreError:
            pass
        raise NotThere(f"{self.url}: no such object in bucket {self.bucket}")

    def _why_refused(self, exc: BaseException) -> BaseException:
        """The error of a GET of the object's first byte (with the S3 error code that
        a HEAD's answer lacks, such as ExpiredToken), else `exc`."""
        _, botocore = _boto3()
        try:
            client(self.settings).get_object(Bucket=self.bucket, Key=self.key, Range="bytes=0-0")
        except botocore.exceptions.ClientError as answer:
            return answer
        except botocore.exceptions.BotoCoreError:
            pass
        return exc

    def _get_into(self, offset: int, buffer: memoryview) -> float:
        here = store(self.settings)
        for again in (False, True):  # again: with credentials read anew
            try:
                found = here.credentials()
            except Exception as exc:  # a refresh that failed (an instance role unreachable, say)
                raise Transient(f"no credentials: {short(exc)}") from None
            status, code = self._attempt(here, found, offset, buffer)
            if status == 206:
                return here.endpoint(self.base).first_byte()
            if code not in EXPIRED or again or found is None or not self._renewed(here, found, code):
                break
        if status == 412 or code == "PreconditionFailed":
            raise Changed()
        if status in (429, 503) or code in SLOW_DOWN:
            raise Throttled(f"{code} (HTTP {status})")
        if code in EXPIRED:
            raise Permanent(f"{code} (HTTP {status}): the store refused the credentials as expired; they are "
                            f"read again every {RENEW_SECONDS:g} s at most while it does; {RENEW_HINT}")
        failure = Permanent if status in (400, 401, 403, 404, 416) else Transient
        raise failure(f"{code} (HTTP {status})")

    def _renewed(self, here: Store, refused: Any, code: str) -> bool:
        try:
            return here.renew(refused, self.url, code)
        except Exception as exc:  # a credentials file being rewritten, say: asked again after a backoff
            raise Transient(f"{code}, and the credentials read again: {short(exc)}") from None

    def _attempt(self, here: Store, found: Any, offset: int, buffer: memoryview) -> tuple[int, str]:
        sign = None if found is None else (*self.scope, found.access_key, found.secret_key, found.token)
        try:
            return here.endpoint(self.base).get_range(self.path, [], offset, buffer, self.settings.request_timeout,
                                                      sign, if_match=self.etag)
        except OtherVersion as exc:  # a store that ignored If-Match
            raise Changed(f"the store answered ETag {exc.etag}") from None
        except Redirect as exc:
            raise Permanent(redirect_message(self.base, exc.status, exc.location)) from None
        except TimeoutError as exc:  # the deadline: a store this slow gets fewer requests
            raise Overloaded(short(exc)) from None
        except (BadAnswer, OSError) as exc:  # a wrong range, a cut connection
            raise Transient(short(exc)) from None


def _whole_checksum(meta: dict) -> tuple[str, str] | None:
    """The object's checksum of its whole bytes that a HEAD gave, of a kind the
    standard library computes (CRC32C and CRC64NVME are not checked), or None. A
    checksum of parts (a multipart upload's, "...-N") is not the bytes'."""
    if meta.get("ChecksumType", "FULL_OBJECT") != "FULL_OBJECT":
        return None
    for kind in ("SHA256", "SHA1", "CRC32"):
        value = meta.get(f"Checksum{kind}")
        if value and "-" not in value:
            return kind, value
    return None


def _unavailable(url: str, exc: BaseException) -> StorageUnavailable:
    code = _code(exc)
    name = type(exc).__name__
    if code in EXPIRED:
        return StorageUnavailable(f"{url}: the store refused the credentials: {code} ({short(exc)}); renew "
                                  "them (a new AWS_SESSION_TOKEN, or aws sso login for AWS_PROFILE) and try again")
    if code in ("403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch") or \
            name in ("NoCredentialsError", "PartialCredentialsError"):
        return StorageUnavailable(f"{url}: access denied or no credentials ({short(exc)}); set "
                                  "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE, or "
                                  "storage.anonymous for a public bucket")
    return StorageUnavailable(f"{url}: cannot reach the object store ({short(exc)}); check "
                              "storage.endpoint_url (or AWS_ENDPOINT_URL) and the network")


register_backend("s3", S3Object)
