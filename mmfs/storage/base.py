"""The storage seam: what every source of dataset bytes provides.

A source is one file-like object (a `.bin`, an `.idx`, a `.pbin`): its size, an
identity that changes whenever its bytes may have changed, and positional reads.
Readers hold a source, never a path; backends register a URL scheme once
(`register_scheme`) and `open_source` picks the backend from the path.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Callable, Protocol, runtime_checkable

from mmfs.errors import MmfsError


class StorageError(MmfsError):
    """A source cannot be opened or read (missing, unreadable, changed, unreachable)."""


class NotThere(StorageError):
    """Nothing at the path: no such file, no such object."""


class StorageUnavailable(StorageError):
    """Not "nothing there": the store cannot answer (unreachable, access denied, no
    such bucket, a client missing). Never taken for a missing file."""


@runtime_checkable
class Source(Protocol):
    url: str  # the path or URL as the user wrote it (names the source in every message)
    size: int  # bytes
    identity: tuple  # (size, mtime_ns, inode) for a file; (size, etag) for an object

    def read_into(self, offset: int, buffer: memoryview | bytearray) -> int:
        """Fill `buffer` with the bytes at `offset`; return how many were read (fewer
        only at the end of the source). Raises StorageError naming `url` and the byte
        range on failure, never returns bytes of a changed source."""
        ...

    def opened(self) -> AbstractContextManager:
        """A block inside which reads may share one connection or file descriptor."""
        ...


# scheme ("s3", "msc", ...) -> opener(url, options) -> Source
_OPENERS: dict[str, Callable[..., Source]] = {}


def register_scheme(scheme: str, opener: Callable[..., Source]) -> None:
    _OPENERS[scheme] = opener


def scheme_of(path: str) -> str | None:
    head, sep, _ = path.partition("://")
    return head if sep and head.isidentifier() else None


def opener_for(path: str) -> Callable[..., Source] | None:
    """The registered opener for a URL's scheme, or None for a local path."""
    scheme = scheme_of(path)
    return None if scheme is None else _OPENERS.get(scheme)

