"""Which libfuse a mount uses, and the binding for it: the one place that chooses.

libfuse 3 (`libfuse3.so.3`, what Ubuntu 22.04/24.04 and Debian 12 install with
`fuse3`) is preferred; libfuse 2 (`libfuse.so.2`) where 3 does not load.
`MMFS_LIBFUSE` forces one: `3`, `2`, or the path of a libfuse library file. A
library "loads" when dlopen(3) takes it, so a file the linker cache still names
but that is gone or not a library counts as absent.

The binding is mfusepy (fusepy's maintained fork, ISC), which declares both
layouts of `struct fuse_operations`; it loads the library named by
FUSE_LIBRARY_PATH when first imported, so mmfs sets that to its choice first
(mfusepy alone would prefer libfuse 2) and checks that it took it.

Each library has its own setuid helper, `fusermount3` for libfuse 3 and
`fusermount` for libfuse 2; `fusermount()` names the one to unmount with.
"""

from __future__ import annotations

import ctypes
import logging
import os
import shutil
import sys
from dataclasses import dataclass
from functools import cache
from types import ModuleType

from mmfs.errors import MountError

log = logging.getLogger(__name__)

ENV = "MMFS_LIBFUSE"
SONAMES = {3: "libfuse3.so.3", 2: "libfuse.so.2"}  # in the order preferred
TOOLS = {3: "fusermount3", 2: "fusermount"}
PACKAGES = {3: "fuse3 (Debian/Ubuntu: apt-get install fuse3)",
            2: "libfuse2 (Debian: apt-get install libfuse2; Ubuntu 24.04: libfuse2t64)"}


@dataclass(frozen=True)
class Library:
    major: int
    version: str  # "3.14.0" (libfuse 3 says its release) or "2.9" (libfuse 2: major.minor only)
    name: str  # what was opened: a soname or the path MMFS_LIBFUSE gave
    path: str  # the file the dynamic linker took

    @property
    def minor(self) -> int:
        return int(self.version.split(".")[1])

    @property
    def fusermount(self) -> str:
        return TOOLS[self.major]

    def describe(self) -> str:
        """The one line a mount says about it (`mmfs mount -v`, the daemon's log)."""
        return f"libfuse {self.version} ({self.path}; unmounts with {self.fusermount})"

    def as_json(self) -> dict[str, object]:
        """What user.mmfs.counters gives under "libfuse"."""
        return {"major": self.major, "version": self.version, "path": self.path, "fusermount": self.fusermount}


def _open(name: str) -> tuple[ctypes.CDLL | None, str]:
    try:
        return ctypes.CDLL(name), ""
    except OSError as exc:
        return None, str(exc)


def _loaded_path(handle: ctypes.CDLL, name: str) -> str:
    """The file the linker mapped for `handle` (from /proc/self/maps), or `name`."""
    want = os.path.basename(name).split(".so")[0] + ".so"
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            for line in maps:
                path = line.split(maxsplit=5)[-1].strip()
                if os.path.basename(path).startswith(want):
                    return path
    except OSError:
        pass
    return name


def _describe(handle: ctypes.CDLL, name: str, forced: str) -> Library:
    try:
        number = handle.fuse_version()
    except AttributeError:
        raise MountError(f"{ENV}={forced}: {name} is not a libfuse library (it has no fuse_version); "
                         f"give 2, 3 or a libfuse file") from None
    major, minor = (number // 10, number % 10) if number < 100 else (number // 100, number % 100)
    if major not in SONAMES:
        raise MountError(f"{name} is libfuse {major}.{minor}; mmfs serves with libfuse 2 or 3")
    version = f"{major}.{minor}"
    if major == 3:
        handle.fuse_pkgversion.restype = ctypes.c_char_p
        version = handle.fuse_pkgversion().decode()
    return Library(major, version, name, _loaded_path(handle, name))


@cache
def library() -> Library:
    """The libfuse this process serves with (MountError, one line, if none loads)."""
    lib = _choose()
    log.debug("%s", lib.describe())  # `mmfs mount -v`; the daemon logs it at INFO (mount/fuse.py)
    return lib


def _choose() -> Library:
    forced = os.environ.get(ENV, "").strip()
    if forced and forced not in ("2", "3") and os.sep not in forced:
        raise MountError(f"{ENV}={forced}: give 3, 2 or the path of a libfuse library file")
    if os.sep in forced:
        handle, why = _open(forced)
        if handle is None:
            raise MountError(f"{ENV}={forced}: cannot load it ({why}); give 3, 2, a libfuse file, or unset it")
        return _describe(handle, forced, forced)
    majors = [int(forced)] if forced else list(SONAMES)
    tried = []
    for major in majors:
        handle, why = _open(SONAMES[major])
        if handle is not None:
            return _describe(handle, SONAMES[major], forced)
        tried.append(f"{SONAMES[major]}: {why}")
    if forced:
        raise MountError(f"{ENV}={forced}: libfuse {forced} does not load ({tried[0]}); install "
                         f"{PACKAGES[int(forced)]} or unset {ENV}")
    raise MountError(f"no libfuse loads ({'; '.join(tried)}); install {PACKAGES[3]}, or {PACKAGES[2]}")


def binding() -> ModuleType:
    """mfusepy, bound to `library()` (imported on first call)."""
    lib = library()
    if "mfusepy" not in sys.modules:
        os.environ["FUSE_LIBRARY_PATH"] = lib.name
    import mfusepy

    if mfusepy.fuse_version_major != lib.major:
        raise MountError(f"mfusepy was loaded with libfuse {mfusepy.fuse_version_major} before mmfs chose "
                         f"libfuse {lib.major}; import mmfs.mount.libfuse's binding() before mfusepy")
    return mfusepy


def fusermount() -> str | None:
    """The path of the helper to unmount with: the one of the library mmfs serves with
    (either helper unmounts any FUSE mount, so the other where it is missing, and the
    libfuse 3 one first where no library loads); None if neither is installed."""
    try:
        majors = [library().major]
    except MountError:
        majors = []
    for major in majors + [m for m in SONAMES if m not in majors]:
        path = shutil.which(TOOLS[major])
        if path:
            return path
    return None
