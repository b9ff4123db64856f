"""A small read-only FUSE file system (fusepy) that serves a folder's files with inode
numbers at and above 2^63, as rclone and other FUSE and network file systems hand
out: the first file of the folder (sorted) gets 2^64 - 1, each other file or folder
the next number down, in the order first seen. A file replaced in the folder (a new
inode there) gets a new number here, as it would on such a file system.

    python big_inode_fs.py SOURCE MOUNTPOINT     # foreground; fusermount -u ends it

`serving(source, mountpoint)` runs it for a test and unmounts afterwards.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

from mmfs.mount.libfuse import binding

TOP = (1 << 64) - 1  # the largest inode number stat can give


# mfusepy, bound to the libfuse mmfs chose: imported any other way first, it would bind
# libfuse 2 for every mount of the test process after it.
fuse = binding()


class BigInodes(fuse.Operations):
    """The operations: a passthrough of `source`, read-only, with big inode numbers."""

    use_ns = True  # times in nanoseconds

    def __init__(self, source: str) -> None:
        self.source = os.path.realpath(source)
        self.numbers: dict[tuple[int, int], int] = {}
        self.lock = threading.Lock()
        for folder, dirs, files in os.walk(self.source):
            dirs.sort()
            for name in sorted(files):
                self._number(os.lstat(os.path.join(folder, name)))

    def _number(self, st: os.stat_result) -> int:
        with self.lock:
            return self.numbers.setdefault((st.st_dev, st.st_ino), TOP - len(self.numbers))

    def _path(self, path: str) -> str:
        return os.path.join(self.source, path.lstrip("/"))

    def getattr(self, path: str, fh=None) -> dict:
        st = os.lstat(self._path(path))
        out = {key: getattr(st, key) for key in ("st_mode", "st_nlink", "st_size", "st_uid", "st_gid")}
        for key in ("atime", "mtime", "ctime"):
            out[f"st_{key}"] = getattr(st, f"st_{key}_ns")
        out["st_ino"] = self._number(st)
        return out

    def readdir(self, path: str, fh) -> list:
        # Each entry with its inode number (with use_ino, a number of 0 hides the entry).
        names = [".", *sorted(os.listdir(self._path(path)))]
        return [(name, self.getattr(os.path.join(path, name)), 0) for name in names]

    def readlink(self, path: str) -> str:
        return os.readlink(self._path(path))

    def open(self, path: str, flags: int) -> int:
        if flags & (os.O_WRONLY | os.O_RDWR):
            raise OSError(errno.EROFS, "read-only")
        return os.open(self._path(path), os.O_RDONLY)

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        return os.pread(fh, size, offset)

    def release(self, path: str, fh: int) -> int:
        os.close(fh)
        return 0

    def statfs(self, path: str) -> dict:
        sv = os.statvfs(self._path(path))
        return {key: getattr(sv, key) for key in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail",
                                                   "f_files", "f_ffree", "f_favail", "f_namemax")}


def main(source: str, mountpoint: str) -> None:
    # No attribute or name caching: a file replaced in the folder is seen at once
    # (a test waits for no timeout).
    fuse.FUSE(BigInodes(source), mountpoint, foreground=True, ro=True, use_ino=True, fsname="bigino",
              attr_timeout=0, entry_timeout=0, negative_timeout=0)


@contextlib.contextmanager
def serving(source: str | os.PathLike, mountpoint: str | os.PathLike) -> Iterator[Path]:
    """Serve `source` at `mountpoint` (created) while the block runs; then unmount."""
    from mount_fixtures import force_unmount, is_mounted, wait_for, wait_gone

    mountpoint = Path(mountpoint)
    mountpoint.mkdir(parents=True, exist_ok=True)
    log = mountpoint.parent / f"{mountpoint.name}.log"  # a file: a pipe nobody reads would fill and block it
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, __file__, str(source), str(mountpoint)],
                                stdout=out, stderr=out)
    try:
        wait_for(lambda: is_mounted(mountpoint) or proc.poll() is not None, "the big-inode file system mounts")
        assert proc.poll() is None, log.read_text()
        yield mountpoint
    finally:
        force_unmount(mountpoint)
        if not wait_gone(proc.pid, 30):
            proc.kill()
        proc.wait()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
