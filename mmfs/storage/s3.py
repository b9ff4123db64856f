"""Objects in S3 (and S3-compatible stores) as sources: `s3://bucket/key`.

The client is boto3, as megatron-core's own S3 reader uses: the standard
credential chain (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY/AWS_SESSION_TOKEN,
AWS_PROFILE, ~/.aws/config and credentials, AWS_ENDPOINT_URL, AWS_REGION), none
of it ever written to a message. (obstore costs a quarter of the CPU per ranged
GET, but its runtime does not survive the fork that makes the mount daemon: a
request in the forked process hangs.) Clients are made per process for the same
reason.

Every GET is conditional on the ETag seen when the object was looked up
(If-Match), so an object replaced while it is read is an error, never a mix of
old and new bytes. botocore's standard retries cover throttling, 5xx answers and
timeouts; remote.py retries broken and short bodies.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from mmfs.storage.base import NotThere, StorageError, StorageUnavailable
from mmfs.storage.redact import shown_url
from mmfs.storage.remote import Changed, Permanent, RemoteObject, Transient, register_backend, short
from mmfs.storage.settings import StorageSettings, endpoint_problem, environment_endpoint


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
    from_env = environment_endpoint()
    if from_env and not settings.endpoint_url and endpoint_problem(from_env[1]):  # botocore would trace back
        raise StorageUnavailable(f"{from_env[0]}: {shown_url(from_env[1])!r} {endpoint_problem(from_env[1])}")
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
        raise StorageUnavailable(f"cannot set up the S3 client ({short(exc)}); check "
                                 "AWS_PROFILE and ~/.aws/config") from None


def _code(exc: BaseException) -> str:
    """The S3 error code of a ClientError ("404", "NoSuchKey", ...), else ""."""
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


class S3Object(RemoteObject):
    """One object: HEAD once, then ranged GETs conditional on its ETag."""

    def __init__(self, url: str, settings: StorageSettings) -> None:
        self.bucket, self.key = split_url(url)
        super().__init__(url, settings)

    def _lookup(self) -> tuple[int, str]:
        _, botocore = _boto3()
        try:
            meta = client(self.settings).head_object(Bucket=self.bucket, Key=self.key)
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

    def _get(self, offset: int, n: int) -> bytes:
        _, botocore = _boto3()
        try:
            answer = client(self.settings).get_object(
                Bucket=self.bucket, Key=self.key, Range=f"bytes={offset}-{offset + n - 1}",
                IfMatch=self.etag)
            return answer["Body"].read()
        except botocore.exceptions.ClientError as exc:
            code = _code(exc)
            if code in ("PreconditionFailed", "412"):
                raise Changed() from None
            failure = Permanent if code in ("403", "AccessDenied", "404", "NoSuchKey", "NoSuchBucket",
                                            "InvalidRange") else Transient
            raise failure(f"{code}: {short(exc)}") from None
        except (botocore.exceptions.BotoCoreError, OSError) as exc:
            raise Transient(short(exc)) from None  # a cut connection, a timeout, a broken body


# S3's answers to credentials that were valid once: an expired or revoked session token
EXPIRED = ("ExpiredToken", "ExpiredTokenException", "TokenRefreshRequired", "InvalidToken", "RequestExpired")


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
