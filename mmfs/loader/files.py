"""Reading a mount's files from a training process: whole files, extended attributes
(or, in a plain folder copy, the table that holds them), and the loader's error."""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from mmfs.errors import MmfsError


class LoaderError(MmfsError):
    """The mount (or the question asked of it) does not fit: one line, what to do."""


# In a plain folder copy of some of a mount's files (for a machine without FUSE, see
# mmfs/adapters/megatron_copy.py): the extended attributes those files had on the
# mount, {path relative to the folder: {name: value}}, read where a file has none.
COPIED_ATTRIBUTES = "mmfs-attributes.json"


def whole(name: str, value: Any) -> int:
    """An id or count argument: an int (a bool is not one), at least 0."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise LoaderError(f"{name} must be a whole number, got {value!r} ({type(value).__name__})")
    if value < 0:
        raise LoaderError(f"{name} must be 0 or more, got {value}")
    return int(value)


def read_file(path: str) -> bytearray:
    """The whole file, in a writable buffer (so arrays over it are writable, as
    torch.from_numpy wants)."""
    try:
        with open(path, "rb", buffering=0) as f:
            buf = bytearray(os.fstat(f.fileno()).st_size)
            view, done = memoryview(buf), 0
            while done < len(buf):
                n = f.readinto(view[done:])
                if not n:
                    raise LoaderError(f"{path}: ended after {done} of {len(buf)} bytes")
                done += n
            return buf
    except OSError as exc:
        raise LoaderError(f"{path}: cannot read it: {exc.strerror or exc}") from None


def copied_attributes(folder: str) -> dict[str, dict[str, str]] | None:
    """A plain folder copy's table of attributes, or None (a mount has none)."""
    path = os.path.join(folder, COPIED_ATTRIBUTES)
    try:
        with open(path, encoding="utf-8") as f:
            table = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise LoaderError(f"{path}: cannot read it: {exc}") from None
    if not isinstance(table, dict):
        raise LoaderError(f"{path}: not a mapping of file paths to their attributes; copy the folder again")
    return table


def attribute(root: str, copied: dict[str, dict[str, str]] | None, path: str, name: str) -> str:
    """An extended attribute of a file under root (of a plain copy: from its table
    where the file has none)."""
    try:
        return os.getxattr(path, name).decode()
    except OSError as exc:
        held = (copied or {}).get(os.path.relpath(path, root), {}).get(name)
        if held is not None:
            return held
        raise LoaderError(f"{path}: cannot read its {name} attribute: {exc.strerror or exc}") from None
