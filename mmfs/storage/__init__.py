"""Where a dataset's bytes come from: a *source* (a local file, bytes in memory for
tests, an object in a bucket), chosen once from the path when a dataset is opened.

Every byte of a dataset is reached through `Source.read_into`; formats and readers
never open dataset files themselves. See `base.py` for the interface."""

from __future__ import annotations

from mmfs.storage import memory, msc, s3  # noqa: F401 - register mem:// (the test double), msc://, s3://
from mmfs.storage.base import NotThere, Source, StorageError, StorageUnavailable, opener_for, scheme_of  # noqa: F401
from mmfs.storage.file import FileSource
from mmfs.storage.remote import close_range_caches  # noqa: F401
from mmfs.storage.settings import copy_path  # noqa: F401


def open_source(path: str, **options) -> Source:
    """The source at `path`: a registered scheme's backend for a URL, else a local file.
    Raises StorageError naming `path` when there is nothing there to read."""
    opener = opener_for(path)
    if opener is not None:
        return opener(path, **options)
    if scheme_of(path) is not None:
        raise StorageError(f"{path}: no storage backend for {scheme_of(path)}:// URLs here")
    return FileSource(path)


def exists(path: str) -> bool:
    """Whether a source can be opened at `path` (a missing object or file: False)."""
    try:
        open_source(path)
    except StorageError:
        return False
    return True


def source_failure(path: str) -> StorageError | None:
    """Why the source at `path` cannot be opened (None: it can). StorageUnavailable
    (the store cannot be asked at all) is raised, not returned."""
    try:
        open_source(path)
    except StorageUnavailable:
        raise
    except StorageError as exc:
        return exc
    return None
