"""The fusepy adapter: kernel requests -> `Tree`, errors -> errno. Nothing else.

Why it is shaped this way (all for speed, the contents never change):

- fusepy registers a libfuse callback for every method the operations object
  has, so `Operations` defines only what mmfs answers: no flush, release,
  opendir, releasedir, fsync or access (libfuse or the kernel handle those
  without a trip into Python).
- `open` answers ENOSYS. The kernel then stops sending OPEN and RELEASE for
  files altogether and keeps their page cache across opens (the kernel's
  "no_open" mode, Linux >= 4.19), so a file read costs one LOOKUP and one READ.
- Sample files never enter Python: `NativeSamples` puts C handlers
  (native/mmfs_fuse.c) for getattr, read and readdir into fusepy's table; they
  assemble a whole sample straight into libfuse's buffer and hand every other
  path to the methods below.
- `getattr` fills the stat struct directly; `readdir` streams entries with
  offsets, so a directory of millions of entries is never built in memory.
- The mount is read-only (`ro`): the kernel refuses writes with EROFS before
  they reach mmfs; the write-like handlers below answer EROFS as well.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
from typing import Any

import fuse as fusepy

from .errors import MountError
from .latency import LatencyGuard
from .native import check, ffi, lib
from .tree import DIR_MODE, FILE_MODE, LINK_MODE, Blob, Dir, Generated, SampleView, Tree

log = logging.getLogger(__name__)

# The data never changes while mounted: let the kernel cache names, attributes
# and misses for a day.
CACHE_SECONDS = 86400

DEFAULT_OPTIONS: dict[str, Any] = {
    "ro": True,
    "default_permissions": True,  # the kernel checks 0444/0555 itself: no access() calls
    "kernel_cache": True,
    "attr_timeout": CACHE_SECONDS,
    "entry_timeout": CACHE_SECONDS,
    "negative_timeout": CACHE_SECONDS,
    "subtype": "mmfs",
}


STAT_SIZE = ctypes.sizeof(fusepy.c_stat)

# Index and token files the daemon keeps memory-mapped, at most (the smallest
# first); it reads the rest with pread, so its resident memory stays flat
# whatever the config's size. `-o map_limit_mb=N`.
DEFAULT_MAP_LIMIT_MB = 64

# The requests served in C (see native/mmfs_fuse.h), by fusepy field name.
NATIVE_HANDLERS = ("getattr", "fgetattr", "read", "readdir")


def _erofs(*_args: Any) -> None:
    raise fusepy.FuseOSError(errno.EROFS)


class Operations:
    """The operations fusepy calls for requests the subclass below does not
    take over (readlink, xattrs, statfs) and the write-like ones (EROFS)."""

    use_ns = True  # times in nanoseconds (fusepy warns otherwise)

    def __init__(self, tree: Tree) -> None:
        self.tree = tree

    def __call__(self, op: str, *args: Any) -> Any:
        return getattr(self, op)(*args)

    def _node(self, path: str) -> Any:
        node = self.tree.lookup(path)
        if node is None:
            raise fusepy.FuseOSError(errno.ENOENT)
        return node

    # Present so that fusepy registers them; MmfsFUSE implements the bodies.
    def getattr(self, path: str, fh: Any = None) -> dict[str, Any]:
        raise fusepy.FuseOSError(errno.ENOSYS)

    def open(self, path: str, flags: int) -> int:
        raise fusepy.FuseOSError(errno.ENOSYS)

    def read(self, path: str, size: int, offset: int, fh: Any) -> bytes:
        raise fusepy.FuseOSError(errno.ENOSYS)

    def readdir(self, path: str, fh: Any) -> list[str]:
        raise fusepy.FuseOSError(errno.ENOSYS)

    def readlink(self, path: str) -> str:
        target = self.tree.readlink(self._node(path))
        if target is None:
            raise fusepy.FuseOSError(errno.EINVAL)
        return target

    def getxattr(self, path: str, name: str, position: int = 0) -> bytes:
        value = self.tree.xattr(self._node(path), name)
        if value is None:
            raise fusepy.FuseOSError(errno.ENODATA)
        return value

    def listxattr(self, path: str) -> list[str]:
        return list(self.tree.xattr_names(self._node(path)))

    def statfs(self, path: str) -> dict[str, int]:
        return self.tree.statfs()

    # Everything that would change the mount.
    mknod = mkdir = unlink = rmdir = symlink = rename = link = _erofs
    chmod = chown = truncate = write = create = utimens = _erofs
    setxattr = removexattr = _erofs


class MmfsFUSE(fusepy.FUSE):
    """fusepy's FUSE with the hot paths (getattr, read, readdir, open)
    talking to the tree and to libfuse's buffers directly."""

    def __init__(self, operations: Operations, mountpoint: str, guard: LatencyGuard,
                 **kwargs: Any) -> None:
        self._tree = operations.tree
        self._touch = guard.touch
        self._uid, self._gid = os.getuid(), os.getgid()
        self._st_dir = fusepy.c_stat(st_mode=DIR_MODE)
        self._st_file = fusepy.c_stat(st_mode=FILE_MODE)
        self._st_link = fusepy.c_stat(st_mode=LINK_MODE)
        self._stat_cache: dict[Any, Any] = {}
        self._native = NativeSamples(self)
        # fusepy builds its operations table and starts libfuse in one call; the
        # stand-in below lets NativeSamples edit the table in between.
        real = fusepy._libfuse
        fusepy._libfuse = _LibfuseWithHook(real, self._native.install)
        try:
            super().__init__(operations, mountpoint, **kwargs)  # runs until unmounted
        finally:
            fusepy._libfuse = real

    def open(self, path: bytes, fip: Any) -> int:
        # ENOSYS: the kernel stops sending OPEN/RELEASE and keeps the page cache.
        return -errno.ENOSYS

    def fgetattr(self, path: bytes, buf: Any, fip: Any) -> int:
        self._touch()
        try:
            node = self._tree.lookup(path.decode("utf-8", "surrogateescape"))
            if node is None:
                return -errno.ENOENT
            a = self._tree.attr(node)
        except Exception:
            log.exception("getattr %r", path)
            return -errno.EIO
        # Every sample of a split has the same attributes: copy a ready struct.
        template = self._stat_cache.get(a)
        if template is None:
            template = self._stat_cache[a] = self._make_stat(a)
        ctypes.memmove(buf, ctypes.addressof(template), STAT_SIZE)
        return 0

    def _make_stat(self, a: Any) -> Any:
        if len(self._stat_cache) > 4096:  # documents/sequences have many sizes
            self._stat_cache.clear()
        st = fusepy.c_stat()
        st.st_mode = a.mode
        st.st_nlink = a.nlink
        st.st_size = a.size
        st.st_blocks = (a.size + 511) // 512
        st.st_blksize = 4096
        st.st_uid = self._uid
        st.st_gid = self._gid
        sec, nsec = divmod(a.mtime_ns, 1_000_000_000)
        for ts in (st.st_mtimespec, st.st_atimespec, st.st_ctimespec):
            ts.tv_sec = sec
            ts.tv_nsec = nsec
        return st

    def read(self, path: bytes, buf: Any, size: int, offset: int, fip: Any) -> int:
        self._touch()
        try:
            node = self._tree.lookup(path.decode("utf-8", "surrogateescape"))
            if isinstance(node, Generated):
                view, i = node
                if offset == 0 and isinstance(view, SampleView) and size >= view.sample_bytes:
                    # The whole sample, assembled in C into libfuse's buffer.
                    address = ctypes.addressof(buf.contents)
                    if view.read_to_address is not None:
                        view.read_to_address(i, address)
                        return view.sample_bytes
                    target = (ctypes.c_char * view.sample_bytes).from_address(address)
                    return view.read_into(i, target)
            elif not isinstance(node, Blob):
                return -errno.EISDIR if isinstance(node, Dir) else -errno.ENOENT
            data = self._tree.read(node, offset, size)
        except Exception:
            log.exception("read %r size %d offset %d", path, size, offset)
            return -errno.EIO
        n = len(data)
        if n:
            ctypes.memmove(buf, data, n)
        return n

    def readdir(self, path: bytes, buf: Any, filler: Any, offset: int, fip: Any) -> int:
        # Offsets make libfuse ask for the directory one buffer at a time:
        # entry k (0 = ".", 1 = "..") carries offset k + 1, the place to resume.
        try:
            node = self._tree.lookup(path.decode("utf-8", "surrogateescape"))
            if not isinstance(node, Dir):
                return -errno.ENOTDIR if node is not None else -errno.ENOENT
            st_dir, st_file = self._st_dir, self._st_file
            pos = offset
            while pos < 2:
                name = (b".", b"..")[pos]
                pos += 1
                if filler(buf, name, st_dir, pos):
                    return 0
            view = node.view
            if view is not None:
                # Millions of names: format them right here, one per filler call.
                fmt = view.name_format.encode()
                for i in range(pos - 2, view.count):
                    if filler(buf, fmt % i, st_file, i + 3):
                        break
                return 0
            kinds = {FILE_MODE: st_file, DIR_MODE: st_dir, LINK_MODE: self._st_link}
            for name, mode in self._tree.entries(node, pos - 2):
                pos += 1
                if filler(buf, name.encode("utf-8", "surrogateescape"), kinds[mode], pos):
                    break
            return 0
        except Exception:
            log.exception("readdir %r offset %d", path, offset)
            return -errno.EIO


class _LibfuseWithHook:
    """fusepy's libfuse handle, except that fuse_main_real first passes the
    operations table to `hook`."""

    def __init__(self, libfuse: Any, hook: Any) -> None:
        self._libfuse = libfuse
        self._hook = hook

    def __getattr__(self, name: str) -> Any:
        return getattr(self._libfuse, name)

    def fuse_main_real(self, argc: Any, argv: Any, ops: Any, size: Any, user_data: Any) -> int:
        self._hook(ops.contents)
        return self._libfuse.fuse_main_real(argc, argv, ops, size, user_data)


class NativeSamples:
    """Serves the sample directories from C (native/mmfs_fuse.c): getattr, read
    and readdir of `/<split>/samples/...` never enter Python. Every other path
    goes to the MmfsFUSE methods, which the C handlers call as their fallback."""

    def __init__(self, fs: MmfsFUSE) -> None:
        self.fs = fs
        self._keep: list[Any] = []

    def install(self, ops: Any) -> None:
        fs, tree = self.fs, self.fs._tree
        prototypes = {field[0]: field[1] for field in fusepy.fuse_operations._fields_}
        # The Python handlers, as C function pointers the C handlers fall back to.
        python = {
            "getattr": prototypes["getattr"](lambda path, buf: fs.fgetattr(path, buf, None)),
            "fgetattr": prototypes["fgetattr"](fs.fgetattr),
            "read": prototypes["read"](fs.read),
            "readdir": prototypes["readdir"](fs.readdir),
        }
        fallback = ffi.new("mmfs_fuse_fallback *")
        for name, thunk in python.items():
            setattr(fallback, name, ffi.cast(ffi.typeof(getattr(fallback, name)),
                                             ctypes.cast(thunk, ctypes.c_void_p).value))
        dirs = [(ffi.new("char[]", f"/{name}/samples".encode()), view.split, view,
                 fs._make_stat(tree.attr(Generated(view, 0))))
                for name, view in tree.splits.items()]
        table = ffi.new("mmfs_sample_dir[]", len(dirs))
        for entry, (path, reader, view, file_stat) in zip(table, dirs):
            entry.path = path
            entry.split = reader.c
            entry.name_width = view.width
            entry.sample_bytes = view.sample_bytes
            entry.file_stat = ffi.cast("void *", ctypes.addressof(file_stat))
            entry.dir_stat = ffi.cast("void *", ctypes.addressof(fs._st_dir))
        check(lib.mmfs_fuse_configure(table, len(dirs), STAT_SIZE, fallback), "mmfs_fuse_configure")
        self._keep = [python, fallback, dirs, table]
        for name in NATIVE_HANDLERS:
            address = int(ffi.cast("uintptr_t", ffi.addressof(lib, f"mmfs_fuse_{name}")))
            setattr(ops, name, prototypes[name](address))
        log.info("sample files served in C: %s", ", ".join(f"/{name}/samples" for name in tree.splits) or "none")


def parse_options(text: str) -> dict[str, Any]:
    """`-o a=b,c` -> {"a": "b", "c": True}."""
    options: dict[str, Any] = {}
    for item in filter(None, (s.strip() for s in (text or "").split(","))):
        key, sep, value = item.partition("=")
        options[key] = value if sep else True
    return options


def take_map_limit(options: dict[str, Any]) -> int:
    """Pop mmfs's `-o map_limit_mb=N` (MB of files the daemon keeps mapped)."""
    value = options.pop("map_limit_mb", DEFAULT_MAP_LIMIT_MB)
    try:
        limit = int(value)
    except (TypeError, ValueError):
        limit = -1
    if limit < 0:
        raise MountError(f"-o map_limit_mb={value}: give a whole number of megabytes (0 or more)")
    return limit


def serve(tree: Tree, mountpoint: str, options: dict[str, Any] | None = None) -> None:
    """Mount `tree` on `mountpoint` and answer requests until it is unmounted
    (fusermount -u, SIGINT, SIGTERM). Runs in the calling process.

    `options` are libfuse mount options on top of DEFAULT_OPTIONS, plus mmfs's
    own `threads` (use fusepy's multithreaded loop instead of the single
    thread, which is faster here, see README.md) and `no_low_latency` (do not
    keep idle CPUs polling while requests flow, see latency.py). `map_limit_mb`
    acts when the corpus is opened (take_map_limit) and is ignored here."""
    opts = dict(DEFAULT_OPTIONS)
    opts.update(options or {})
    threads = bool(opts.pop("threads", False))
    low_latency = not opts.pop("no_low_latency", False)
    opts.pop("map_limit_mb", None)
    opts.pop("nothreads", None)
    opts.pop("foreground", None)
    if opts.get("rw"):
        raise MountError("mmfs mounts are read-only; drop `-o rw`")
    # The source column of `mount`/`df`: "mmfs:<config file name>".
    name = os.path.basename(str(getattr(tree.corpus, "config_path", "") or "")) or "config"
    opts.setdefault("fsname", "mmfs:" + "".join(c if c.isalnum() or c in "._-" else "_" for c in name))
    placer = getattr(tree.corpus, "placer", None)
    if placer is not None:
        placer.prefault()
    ops = Operations(tree)
    log.info("serving %s (%s loop)", mountpoint, "multithreaded" if threads else "single-thread")
    guard = LatencyGuard(enabled=low_latency)
    try:
        MmfsFUSE(ops, mountpoint, guard, foreground=True, nothreads=not threads, **opts)
    except RuntimeError as exc:
        raise MountError(
            f"{mountpoint}: libfuse could not mount or serve it (code {exc}); the line "
            "libfuse printed above says why"
        ) from None
    finally:
        guard.close()
