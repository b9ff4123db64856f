"""Bytes derived from a resolved record alone (a mount's mmfs.json: megabytes of
JSON about ten thousand datasets), kept beside the record: a re-open whose record
is the very file they were made from (its size, mtime and inode) and that asks with
the same key takes them instead of deriving them again. Anything that makes the
record stale (the config, a dataset, a cache folder, mmfs itself) or shows it a
liar writes or removes it: another file, so the bytes are made anew."""

from __future__ import annotations

import json
import logging
import os

from mmfs.megatron.cache.npyfile import FileId, file_id, open_regular
from mmfs.megatron.cache.write import temp_name, unlink_quietly

log = logging.getLogger(__name__)

LIMIT = 1 << 30


def path_of(record_path: str, name: str) -> str:
    return f"{os.path.splitext(record_path)[0]}.{name}"


def _record_is(record_path: str, record_file: FileId) -> bool:
    try:
        return file_id(os.stat(record_path)) == record_file
    except (OSError, ValueError):
        return False


def _header(record_file: FileId, key: str) -> bytes:
    return json.dumps({"record": list(record_file), "key": key}).encode() + b"\n"


def read(record_path: str, record_file: FileId, name: str, key: str) -> bytes | None:
    """The bytes kept beside the record as `name` for `key`, while the record is the
    file `record_file` they were derived from; else None."""
    try:
        fd, _ = open_regular(path_of(record_path, name))
    except (OSError, ValueError):
        return None
    try:
        with os.fdopen(os.dup(fd), "rb") as f:
            raw = f.read(LIMIT)
    except OSError:
        return None
    finally:
        os.close(fd)
    header = _header(record_file, key)
    if not raw.startswith(header) or not _record_is(record_path, record_file):
        return None
    return raw[len(header):]


def write(record_path: str, record_file: FileId, name: str, key: str, body: bytes) -> None:
    """Keep `body` beside the record (while it is still the file `record_file`); a
    folder that cannot take it only costs the next re-open its time."""
    if not _record_is(record_path, record_file):
        return  # removed (a liar) or written again since: derived from nothing kept
    path = path_of(record_path, name)
    tmp = temp_name(os.path.dirname(path), path)
    try:
        with open(tmp, "wb") as f:
            f.write(_header(record_file, key) + body)
        os.replace(tmp, path)
    except OSError as exc:
        unlink_quietly(tmp)
        log.debug("%s: not written (%s)", path, exc)
