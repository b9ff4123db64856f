"""How the loader reads a mount's files: one small file system interface (read a
whole file, list a folder, read an extended attribute) with two implementations,
the kernel's (a mount, or a plain folder copy of some of its files) and the
in-process one (a config served through the C core in this process, no FUSE:
mmfs/mount/inprocess.py, imported only when the loader is given a config). Both
raise OSError as the kernel does (ENOENT, ENOTDIR, ENODATA, EIO with the reason);
the loader turns them into its one-line LoaderError."""

from __future__ import annotations

import errno
import json
import os
from typing import Any, Protocol

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


class Files(Protocol):
    """A mount's files under `root` (paths are root + "/" + the path in the mount)."""

    root: str

    def read(self, path: str) -> bytearray:
        """The whole file, in a writable buffer (so arrays over it are writable, as
        torch.from_numpy wants)."""

    def listdir(self, path: str) -> list[str]:
        """The names in a folder."""

    def getxattr(self, path: str, name: str) -> str:
        """An extended attribute of a file."""


def open_files(path: str, options: str = "") -> Files:
    """The file system of `path`: a config file is served in this process (options: those
    of `mmfs mount -o` that apply there), anything else (a mount point, a folder copy)
    is read through the kernel."""
    if os.path.isfile(path):
        from mmfs.mount.inprocess import in_process_files  # the C core: only for a config

        return in_process_files(path, options)
    if options:
        raise LoaderError(f"{path}: options ({options}) apply to a config read in this process; a mount's "
                          "are given to `mmfs mount -o`")
    return KernelFiles(path)


class KernelFiles:
    """A mount, or a plain folder copy of some of its files, read through the kernel."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.copied = copied_attributes(root)  # None for a mount

    def read(self, path: str) -> bytearray:
        with open(path, "rb", buffering=0) as f:
            buf = bytearray(os.fstat(f.fileno()).st_size)
            view, done = memoryview(buf), 0
            while done < len(buf):
                n = f.readinto(view[done:])
                if not n:
                    raise OSError(errno.EIO, f"ended after {done} of {len(buf)} bytes")
                done += n
            return buf

    def listdir(self, path: str) -> list[str]:
        return os.listdir(path)

    def getxattr(self, path: str, name: str) -> str:
        """(of a plain copy: from its table where the file has none)"""
        try:
            return os.getxattr(path, name).decode()
        except OSError:
            held = (self.copied or {}).get(os.path.relpath(path, self.root), {}).get(name)
            if held is not None:
                return held
            raise


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


def read_file(files: Files, path: str) -> bytearray:
    """files.read, its failure in one line."""
    try:
        return files.read(path)
    except OSError as exc:
        raise LoaderError(f"{path}: cannot read it: {exc.strerror or exc}") from None


def attribute(files: Files, path: str, name: str) -> str:
    """files.getxattr, its failure in one line."""
    try:
        return files.getxattr(path, name)
    except OSError as exc:
        raise LoaderError(f"{path}: cannot read its {name} attribute: {exc.strerror or exc}") from None
