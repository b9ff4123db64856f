"""What differs between libfuse 2 and libfuse 3 for mmfs: where the C handlers go in
each library's `struct fuse_operations` (and the check that they are there), the
`-o` options each takes, and the connection options libfuse 3 leaves to the file
system's init (max_background, congestion_threshold, ...: libfuse 2 took them as
mount options). The library itself is chosen in mount/libfuse.py."""

from __future__ import annotations

import ctypes
from importlib import metadata
from typing import Any

from mmfs.errors import MountError
from mmfs.mount.libfuse import binding, library
from mmfs.native import ffi, lib

# The mfusepy release whose `fuse_operations` the C handlers are installed in
# (pinned in pyproject.toml), and where libfuse 2.9 and libfuse 3 have those
# handlers in their `struct fuse_operations` on a 64-bit Linux (field k at byte
# 8 k; offsetof against each library's fuse.h), with the C function for each.
MFUSEPY_VERSION = "3.1.1"
NATIVE_LAYOUTS = {
    2: {"getattr": (0, "mmfs_fuse_getattr"), "read": (15 * 8, "mmfs_fuse_read"),
        "readdir": (26 * 8, "mmfs_fuse_readdir"), "fgetattr": (34 * 8, "mmfs_fuse_fgetattr"),
        "ioctl": (39 * 8, "mmfs_fuse_ioctl")},
    3: {"getattr": (0, "mmfs_fuse3_getattr"), "read": (13 * 8, "mmfs_fuse_read"),
        "readdir": (24 * 8, "mmfs_fuse3_readdir"), "ioctl": (34 * 8, "mmfs_fuse_ioctl")},
}
MAJOR = library().major
NATIVE_HANDLERS = {name: offset for name, (offset, _) in NATIVE_LAYOUTS[MAJOR].items()}


# libfuse 3.12 and later run at most `max_threads` workers (default 10) in the
# multithreaded loop; libfuse 2's had no cap. mmfs asks libfuse 3 for as many as the
# kernel may send in the background (MAX_BACKGROUND, mount/fuse.py) and as many
# readers again beside them: a node's ranks and loader workers, waiting on a store.
LIBFUSE3_MAX_THREADS = 256


def fuse_options(options: dict[str, Any], major: int | None = None, minor: int | None = None) -> list[str]:
    """The `-o` list for libfuse `major`.`minor` (the loaded one by default): libfuse 3 has
    no `nonempty` (it mounts over a non-empty folder anyway; mmfs checks the folder
    itself, mount/lifecycle.py) and from 3.12 on takes `max_threads`; the rest is
    passed as given."""
    major = major or MAJOR
    minor = minor if minor is not None else library().minor
    if major == 3 and minor >= 12 and "max_threads" not in options:
        options = {**options, "max_threads": LIBFUSE3_MAX_THREADS}
    out = []
    for key, value in options.items():
        if major == 3 and key == "nonempty":
            continue
        if isinstance(value, bool):
            if value:
                out.append(key)
        else:
            out.append(f"{key}={value}")
    return out


def native_address(name: str, major: int | None = None) -> int:
    """The address of the C handler for table entry `name` of libfuse `major`'s table."""
    symbol = NATIVE_LAYOUTS[major or MAJOR][name][1]
    return int(ffi.cast("uintptr_t", ffi.addressof(lib, symbol)))


def check_table(table: Any, mfusepy_version: str | None = None, major: int | None = None) -> None:
    """Refuse (MountError, one line) unless `table` holds the C handlers where the
    loaded libfuse (2 or 3) looks for them: the pinned mfusepy, the layout it
    declares, the addresses."""
    major = major or MAJOR
    version = mfusepy_version or metadata.version("mfusepy")
    fix = f"reinstall it: pip install 'mfusepy=={MFUSEPY_VERSION}'"
    if version != MFUSEPY_VERSION:
        raise MountError(f"mfusepy {version} is installed, but mmfs's C handlers are built for "
                         f"mfusepy {MFUSEPY_VERSION}'s operations tables; {fix}")
    layout = NATIVE_LAYOUTS[major]
    if ctypes.sizeof(type(table)) < max(offset for offset, _ in layout.values()) + 8:
        raise MountError(f"mfusepy's libfuse {major} declarations do not match this platform; {fix}")
    for name, (offset, _symbol) in layout.items():
        field = getattr(type(table), name, None)
        declared = field.offset if field is not None else None
        address = ctypes.cast(getattr(table, name), ctypes.c_void_p).value if field is not None else None
        if declared != offset or address != native_address(name, major):
            raise MountError(f"the libfuse {major} operations table does not hold mmfs's C handler for "
                             f"{name} (at byte {declared}, expected {offset}); {fix}")


class _FuseArgs(ctypes.Structure):  # struct fuse_args (fuse_opt.h), the same in 2 and 3
    _fields_ = [("argc", ctypes.c_int), ("argv", ctypes.POINTER(ctypes.c_char_p)), ("allocated", ctypes.c_int)]


class ConnOptions:
    """libfuse 3's connection options out of a command line: `take(args)` parses and
    removes them (libfuse's fuse_parse_conn_info_opts; its main would refuse them as
    unknown) and returns the rest; `apply(conn)`, from the table's init, sets them on
    the connection (fuse_apply_conn_info_opts). With libfuse 2 both pass through:
    its main takes them itself."""

    def __init__(self) -> None:
        self._opts: int | None = None
        self._args: _FuseArgs | None = None

    def take(self, args: list[str]) -> list[bytes]:
        encoded = [a.encode() for a in args]
        if MAJOR == 2:
            return encoded
        libfuse = binding()._libfuse
        libfuse.fuse_parse_conn_info_opts.restype = ctypes.c_void_p
        libfuse.fuse_parse_conn_info_opts.argtypes = [ctypes.POINTER(_FuseArgs)]
        argv = (ctypes.c_char_p * (len(encoded) + 1))(*encoded, None)
        self._args = _FuseArgs(len(encoded), ctypes.cast(argv, ctypes.POINTER(ctypes.c_char_p)), 0)
        self._keep = argv
        self._opts = libfuse.fuse_parse_conn_info_opts(ctypes.byref(self._args))
        if not self._opts:
            raise MountError(f"libfuse {library().version} refused a connection option in "
                             f"`{' '.join(args[1:])}` (its own message above says which)")
        return [self._args.argv[i] for i in range(self._args.argc)]

    def apply(self, conn: Any) -> None:
        if self._opts:
            libfuse = binding()._libfuse
            libfuse.fuse_apply_conn_info_opts.restype = None
            libfuse.fuse_apply_conn_info_opts.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
            libfuse.fuse_apply_conn_info_opts(self._opts, ctypes.cast(conn, ctypes.c_void_p))
