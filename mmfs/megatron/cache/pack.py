"""The index arrays of a whole config in one file, `<md5>-mmfs-pack`, beside
Megatron's own cache files (which stay as they are, for Megatron): a mount reads
its indices from this one file instead of opening tens of thousands of `.npy`
files, which on a cold node or a shared file system (Lustre, NFS) is most of its
start-up, and N nodes starting at once make N opens of it at the metadata server,
not N times 60,000.

Layout: a 64-byte head (MAGIC, version, the table's offset and length, the
table's sha256), then each array's data (64-byte aligned, smallest first: the
arrays a mount copies into memory are then one read near the start), then the
table, JSON: for each index (its cache files' path prefix) and array, its dtype,
shape, data offset in the pack, and the source `.npy` it was copied from (the
data's offset there and the file's size, mtime and inode).

Written by the open that writes the config's record (cache/resolved.py), from
the `.npy` files as loaded (each checked to be the file loaded, its header what
was loaded): kept while every source is the file it was made from, written again
(to a temporary name, synced, renamed) when one is not. A record names its pack
(path, identity, table digest); a re-open that finds the pack as named reads
the arrays from it, each checked against the pack's own table (a record that
disagrees is removed, like one that disagrees with a `.npy` header). Deleting the
pack costs only time: its folder changes, so the record is stale and the next
open writes both again."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass

from mmfs.megatron.cache.index_cache import description_hash
from mmfs.megatron.cache.npyfile import HEAD, CachedArray, FileId, file_id, open_regular, parse_npy_header
from mmfs.megatron.cache.write import temp_name, unlink_quietly

log = logging.getLogger(__name__)

MAGIC = b"MMFSPACK"
VERSION = 1
HEAD_SIZE = 64  # magic, version, table offset, table length (8 bytes each), the table's sha256
DATA_FROM = 4096
ALIGN = 64
PACK_FROM = 16  # indices of a config: with fewer, their own files cost as little
TABLE_LIMIT = 1 << 30


def name_of(prefixes: list[str]) -> str:
    """The pack's file name: the MD5 of its indices' cache paths, so that configs of
    the same indices agree on it."""
    return f"{description_hash(chr(10).join(sorted(prefixes)))}-mmfs-pack"


@dataclass(frozen=True)
class Pack:
    """A pack as read: its path, identity, table digest and table
    (prefix -> name -> [descr, shape, pack offset, source offset, source FileId])."""

    path: str
    file: FileId
    digest: str
    table: dict

    def named(self) -> list:
        """What a record keeps of it."""
        return [self.path, list(self.file), self.digest]


def _head(table_at: int, table: bytes) -> bytes:
    return (MAGIC + VERSION.to_bytes(8, "little") + table_at.to_bytes(8, "little")
            + len(table).to_bytes(8, "little") + hashlib.sha256(table).digest())


def read(path: str, expect: tuple[FileId, str] | None = None) -> Pack | None:
    """The pack at `path` when it is whole (its table's digest) and, given `expect`,
    the very file (identity, table digest) a record names; else None."""
    try:
        fd, st = open_regular(path)
    except (OSError, ValueError):
        return None
    try:
        ident = file_id(st)
        if expect is not None and ident != tuple(expect[0]):
            return None
        head = os.pread(fd, HEAD_SIZE, 0)
        if len(head) != HEAD_SIZE or head[:8] != MAGIC or int.from_bytes(head[8:16], "little") != VERSION:
            return None
        at, length = int.from_bytes(head[16:24], "little"), int.from_bytes(head[24:32], "little")
        if length > TABLE_LIMIT or at + length != st.st_size:
            return None
        raw = os.pread(fd, length, at)
        digest = hashlib.sha256(raw).hexdigest()
        if len(raw) != length or head[32:64] != bytes.fromhex(digest) or \
                (expect is not None and expect[1] != digest):
            return None
        table = json.loads(raw)
        if not isinstance(table, dict) or table.get("version") != VERSION or not isinstance(table.get("indices"), dict):
            return None
        return Pack(path, ident, digest, table["indices"])
    except (OSError, ValueError, RecursionError):
        return None
    finally:
        os.close(fd)


def _entry(a: CachedArray) -> list:
    return [a.dtype.str, list(a.shape), a.offset, list(a.file)]


def _holds(pack: Pack, indices: dict[str, dict[str, CachedArray]]) -> bool:
    """Whether the pack holds exactly these arrays, copied from these very files."""
    if sorted(pack.table) != sorted(indices):
        return False
    for prefix, arrays in indices.items():
        entry = pack.table[prefix]
        if not isinstance(entry, dict) or sorted(entry) != sorted(arrays):
            return False
        for name, a in arrays.items():
            descr, shape, _, offset, source = entry[name]
            if [descr, shape, offset, source] != _entry(a):
                return False
    return True


def ensure(folder: str, indices: dict[str, dict[str, CachedArray]]) -> Pack | None:
    """The pack of these indices (prefix -> name -> CachedArray, each in its .npy
    file) in `folder`: the one there when it holds them as they are, else one
    written now; None when it cannot be (a source not the file loaded, a folder
    that cannot take it: the record then names none, and its files are read)."""
    path = os.path.join(folder, name_of(list(indices)))
    found = read(path)
    try:
        if found is not None and _holds(found, indices):
            return found
    except (ValueError, TypeError, LookupError, AttributeError):  # a table of another shape: written again
        found = None
    try:
        return _write(path, indices, found)
    except (OSError, ValueError, TypeError, LookupError, AttributeError) as exc:
        log.debug("%s: not written (%s)", path, exc)
        return None


def _copy(a: CachedArray, to: int, at: int) -> None:
    """The data of array `a` from its .npy file (checked to be the file loaded, with
    the header loaded) into the open pack `to` at byte `at`."""
    fd, st = open_regular(a.path)
    try:
        if a.file is None or file_id(st) != a.file:
            raise ValueError(f"{a.path}: changed since it was loaded")
        head = os.pread(fd, max(a.offset, min(HEAD, st.st_size)), 0)
        if parse_npy_header(head) != (a.dtype, a.shape, a.offset):
            raise ValueError(f"{a.path}: not the header loaded")
        _copy_range(fd, to, a.nbytes, a.offset, at)
    finally:
        os.close(fd)


def _copy_range(src: int, to: int, n: int, at_src: int, at: int) -> None:
    while n:
        try:
            k = os.copy_file_range(src, to, n, at_src, at)
        except OSError:  # a file system that does not copy in the kernel
            chunk = os.pread(src, min(n, 8 << 20), at_src)
            k = os.pwrite(to, chunk, at) if chunk else 0
        if k <= 0:
            raise ValueError("a source shorter than its header says")
        n, at_src, at = n - k, at_src + k, at + k


def _write(path: str, indices: dict[str, dict[str, CachedArray]], old: Pack | None) -> Pack:
    """A new pack of `indices`; each array the old pack holds as it is now (the same
    source file, facts and bytes) is copied from it, the others from their .npy: one
    index changed costs its own files' opens, not every index's."""
    arrays = sorted(((a.nbytes, prefix, name) for prefix, named in indices.items() for name, a in named.items()))
    table: dict[str, dict] = {prefix: {} for prefix in indices}
    at = DATA_FROM
    placed = []
    for nbytes, prefix, name in arrays:
        a = indices[prefix][name]
        descr, shape, offset, source = _entry(a)
        table[prefix][name] = [descr, shape, at, offset, source]
        kept = None if old is None else old.table.get(prefix, {}).get(name)
        placed.append((a, at, kept[2] if isinstance(kept, list) and len(kept) == 5 and
                       [kept[0], kept[1], kept[3], kept[4]] == [descr, shape, offset, source] else None))
        at += -(-nbytes // ALIGN) * ALIGN
    raw = json.dumps({"version": VERSION, "indices": table}, separators=(",", ":")).encode()
    folder = os.path.dirname(path)
    tmp = temp_name(folder, path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    old_fd = None
    try:
        try:
            if old is not None and any(was is not None for _, _, was in placed):
                old_fd, st = open_regular(old.path)
                if file_id(st) != old.file:
                    raise ValueError(f"{old.path}: changed while it was read")
            for a, to, was in placed:
                if was is None:
                    _copy(a, fd, to)
                else:
                    _copy_range(old_fd, fd, a.nbytes, was, to)
            os.pwrite(fd, raw, at)
            os.pwrite(fd, _head(at, raw), 0)
            os.fsync(fd)  # a pack a record names is never torn: its bytes are served
            ident = file_id(os.fstat(fd))
        finally:
            os.close(fd)
            if old_fd is not None:
                os.close(old_fd)
        os.replace(tmp, path)
    except BaseException:
        unlink_quietly(tmp)
        raise
    if file_id(os.stat(path)) != ident:
        raise ValueError(f"{path}: written again by another process meanwhile")
    return Pack(path, ident, hashlib.sha256(raw).hexdigest(), table)
