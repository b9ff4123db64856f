"""How remote sources are reached and cached: the config's `storage:` block, as the
process uses it. One process serves one config, so the settings are set once
(`configure`, by the config loader) and read by every remote backend."""

from __future__ import annotations

import hashlib
import ipaddress
import os
import posixpath
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

# Where the AWS chain (botocore) takes an S3 endpoint from when the config gives none,
# first found first.
ENDPOINT_ENV = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")


CREDENTIALS = ("holds credentials (user:password@): give them as AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
               "(or AWS_PROFILE), never in the URL")


def endpoint_problem(url: str) -> str | None:
    """Why `url` is not an S3 endpoint URL (http(s)://HOST[:PORT][/PATH]), or None.
    Credentials in it are refused: they would be written wherever the URL is (mmfs.json,
    logs, messages), and S3 credentials come from the AWS chain, not the URL."""
    if not url.isascii() or not url.isprintable() or any(c.isspace() for c in url):
        return "holds a character that is not printable ASCII (write a host name in its xn-- form)"
    if "@" in url:  # anywhere: a password with / ? or # puts its @ past the netloc (and the parser's
        return CREDENTIALS  # error would quote it); an S3 endpoint's path has no @
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:  # "Invalid IPv6 URL", a port out of range
        return f"is not a URL ({exc})"
    if parts.scheme not in ("http", "https"):
        return "must start with http:// or https://"
    host = parts.hostname or ""
    if parts.netloc.startswith("["):
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return "has a bracketed host that is not an IPv6 address"
    elif len(host) > 253 or not all(_LABEL.fullmatch(label) for label in host.split(".")):
        return "has no valid host name (letters, digits and -, dot-separated labels of at most 63, 253 in all)"
    if port == 0 or parts.query or parts.fragment:
        return "must be http(s)://HOST[:PORT][/PATH], without a query or fragment"
    return None


def environment_endpoint() -> tuple[str, str] | None:
    """(variable, URL) of the endpoint the environment gives S3 clients, or None."""
    for name in ENDPOINT_ENV:
        if os.environ.get(name):
            return name, os.environ[name]
    return None


def default_cache_dir() -> str:
    """The per-user cache folder: $XDG_CACHE_HOME/mmfs, else ~/.cache/mmfs."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "mmfs")


@dataclass(frozen=True)
class StorageSettings:
    endpoint_url: str | None = None  # an S3-compatible store (path-style addressing)
    region: str | None = None
    anonymous: bool = False  # unsigned requests (public buckets)
    cache_dir: str | None = None  # None: default_cache_dir()
    # bytes of cached byte ranges on disk; the daemon keeps ~300 bytes of memory per
    # range (a 4 GiB cache of 8 KiB pieces: some 100 MB)
    cache_limit: int = 4 << 30
    prefetch: int = 64 << 20  # bytes fetched ahead of the reader
    max_requests: int = 256  # in flight at once, at most (inflight.py sizes the limit under it)
    request_timeout: float = 30.0  # seconds, per request
    retries: int = 5  # per request, with backoff and jitter

    @property
    def cache_folder(self) -> str:
        return self.cache_dir or default_cache_dir()


_current = StorageSettings()
# Bytes of an object's name kept (its end: the suffixes) in the name of its local copy,
# beside the hash and a temporary suffix of a file being written
MAX_NAME_KEPT = 100


def copy_path(url: str, identity: tuple) -> str:
    """Where a local copy of a remote object (or what is derived from it) is kept:
    the cache folder's objects/, named by URL and identity (a changed object is a
    new name; processes may share the folder)."""
    tag = hashlib.sha256(f"{url}\0{identity!r}".encode()).hexdigest()[:32]
    name = posixpath.basename(url)
    while len(name.encode()) > MAX_NAME_KEPT:  # a key's last part may be 1,024 bytes; a file name 255
        name = name[1:]
    return os.path.join(current().cache_folder, "objects", f"{tag}-{name}")


def configure(settings: StorageSettings) -> None:
    global _current
    _current = settings


def current() -> StorageSettings:
    return _current

