"""Bytes in memory as a source: the test double of every reader (register it under
`mem://` names with `put`), and how a format describes arrays it parsed into memory."""

from __future__ import annotations

import contextlib

import numpy as np

from mmfs.storage.base import StorageError, register_scheme

_STORE: dict[str, "MemorySource"] = {}


class MemorySource:
    """An array's bytes. `array` is the array itself (readers that can use memory as it
    is, the C core among them, take it without a copy)."""

    def __init__(self, url: str, data) -> None:
        self.url = url
        self.array = np.ascontiguousarray(np.frombuffer(data, np.uint8) if isinstance(
            data, (bytes, bytearray, memoryview)) else data)
        self.size = self.array.nbytes
        self.identity = (self.size, id(self.array))

    def read_into(self, offset: int, buffer) -> int:
        view = memoryview(buffer).cast("B")
        raw = memoryview(self.array).cast("B")
        chunk = raw[offset : offset + len(view)]
        view[: len(chunk)] = chunk
        return len(chunk)

    def opened(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def map(self) -> np.ndarray:
        return self.array.view(np.uint8).reshape(-1) if self.size else np.zeros(0, np.uint8)


def put(url: str, data: bytes) -> MemorySource:
    """Store `data` under a `mem://` URL (tests: a dataset without a file)."""
    source = _STORE[url] = MemorySource(url, data)
    return source


def forget(url: str) -> None:
    _STORE.pop(url, None)


def _open(url: str, **_options) -> MemorySource:
    try:
        return _STORE[url]
    except KeyError:
        raise StorageError(f"{url}: no such object in memory") from None


register_scheme("mem", _open)
