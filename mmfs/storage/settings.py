"""How remote sources are reached and cached: the config's `storage:` block, as the
process uses it. One process serves one config, so the settings are set once
(`configure`, by the config loader) and read by every remote backend."""

from __future__ import annotations

import hashlib
import os
import posixpath
from dataclasses import dataclass


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
    max_requests: int = 16  # in flight at once
    request_timeout: float = 30.0  # seconds, per request
    retries: int = 5  # per request, with backoff and jitter

    @property
    def cache_folder(self) -> str:
        return self.cache_dir or default_cache_dir()


_current = StorageSettings()


def copy_path(url: str, identity: tuple) -> str:
    """Where a local copy of a remote object (or what is derived from it) is kept:
    the cache folder's objects/, named by URL and identity (a changed object is a
    new name; processes may share the folder)."""
    tag = hashlib.sha256(f"{url}\0{identity!r}".encode()).hexdigest()[:32]
    return os.path.join(current().cache_folder, "objects", f"{tag}-{posixpath.basename(url)}")


def configure(settings: StorageSettings) -> None:
    global _current
    _current = settings


def current() -> StorageSettings:
    return _current

