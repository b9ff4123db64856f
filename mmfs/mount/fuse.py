"""The FUSE adapter: kernel requests -> `Tree`, errors -> errno. Nothing else.

Why it is shaped this way (all for speed, the contents never change):

- The files of every view (samples, documents, sequences; mmfs/mount/views.py)
  never enter Python: getattr, read and readdir are C handlers
  (native/mmfs_fuse.c) in the operations table, which hand every other path
  (mmfs.json, symlinks, the directories above the views) to the Python
  handlers below.
- The library is libfuse 3 or libfuse 2 (mmfs/mount/libfuse.py chooses), the
  binding mfusepy (fusepy's maintained fork, which declares both layouts of
  `struct fuse_operations`). mmfs builds the operations table itself
  (`Daemon.operations_table`) from mfusepy's declarations for the library
  loaded, puts the C handlers in, and checks the result before it mounts
  (`check_table`, mount/layouts.py): the C handlers are compiled for
  libfuse 2.9's and libfuse 3's layouts, as MFUSEPY_VERSION declares them.
  Anything else refuses to mount, in one line.
- Only what mmfs answers is in the table: no flush, release, opendir,
  releasedir, fsync or access (libfuse or the kernel handle those).
- `open` answers ENOSYS. The kernel then stops sending OPEN and RELEASE for
  files altogether and keeps their page cache across opens (the kernel's
  "no_open" mode, Linux >= 4.19), so a file read costs one LOOKUP and one READ.
  An ioctl(2) on a file (Python's open() asks isatty) reaches the daemon each
  time, whatever it answers (fs/fuse/ioctl.c keeps no "not supported" as it
  does for OPEN); a C handler answers ENOTTY and counts it.
- The daemon counts the requests it is sent (the C handlers by kind, Python's
  own by name) and its requests to a store in flight; `user.mmfs.counters` on
  the mount's root gives them (docs/mount.md).
- The mount is read-only (`ro`): the kernel refuses writes with EROFS before
  they reach mmfs; the write-like handlers below answer EROFS as well.
"""

from __future__ import annotations

import ctypes
import errno
import json
import logging
import os
import signal
from functools import partial
from typing import Any

from mmfs.errors import MmfsError, MountError, first_few
from mmfs.mount.contract import FS_SUBTYPE, REPORT, XATTR_COUNTERS
from mmfs.mount.counters import Counters
from mmfs.mount.kernel_cache import KernelCache
from mmfs.mount.latency import LatencyGuard
from mmfs.mount.layouts import MAJOR, NATIVE_HANDLERS, ConnOptions, check_table, fuse_options, native_address
from mmfs.mount.libfuse import binding, library
from mmfs.mount.options import MountOptions
from mmfs.mount.prefetch import Prefetcher
from mmfs.mount.repeats import FOLD_SECONDS, FailedReads, FoldedFailures, RepeatFilter
from mmfs.mount.tree import DIR_MODE, FILE_MODE, LINK_MODE, Dir, Tree
from mmfs.mount.views import read_failure_parts
from mmfs.native import check, ffi, lib
from mmfs.storage.inflight import gate as request_gate

mfusepy = binding()  # mfusepy, bound to the libfuse chosen (MountError if none loads)
log = logging.getLogger(__name__)


# The data never changes while mounted: let the kernel cache names, attributes
# and misses for a day.
CACHE_SECONDS = 86400
# Background requests (read-ahead, where the kernel sends it asynchronously) the
# kernel sends this mount's connection at once, and from how many on it counts the
# mount congested; its defaults, 12 and 9, would cap a node's ranks and their loader
# workers waiting on the store. This connection's only; the kernel takes more than
# /sys/module/fuse/parameters/max_user_bgreq only from root.
MAX_BACKGROUND = 128
CONGESTION_THRESHOLD = 96

DEFAULT_OPTIONS: dict[str, Any] = {
    "ro": True,
    "default_permissions": True,  # the kernel checks 0444/0555 itself: no access() calls
    "kernel_cache": True,
    "attr_timeout": CACHE_SECONDS,
    "entry_timeout": CACHE_SECONDS,
    "negative_timeout": CACHE_SECONDS,
    "max_background": MAX_BACKGROUND,
    "congestion_threshold": CONGESTION_THRESHOLD,
    "subtype": FS_SUBTYPE,
}

STAT_SIZE = ctypes.sizeof(mfusepy.c_stat)


def _erofs(*_args: Any) -> None:
    raise mfusepy.FuseOSError(errno.EROFS)


class Operations:
    """What Python answers: readlink, xattrs, statfs, and EROFS for anything
    that would change the mount. (getattr, read and readdir of the paths the C
    handlers hand over are `Daemon` methods, on libfuse's buffers.)"""

    use_ns = True  # times in nanoseconds (mfusepy warns otherwise)

    def __init__(self, tree: Tree, counters: Counters | None = None) -> None:
        self.tree = tree
        self.counters = counters or Counters()  # the daemon's, for user.mmfs.counters on the root

    def __call__(self, op: str, *args: Any) -> Any:
        return getattr(self, op)(*args)

    def _node(self, path: str) -> Any:
        node = self.tree.lookup(path)
        if node is None:
            raise mfusepy.FuseOSError(errno.ENOENT)
        return node

    def readlink(self, path: str) -> str:
        target = self.tree.readlink(self._node(path))
        if target is None:
            raise mfusepy.FuseOSError(errno.EINVAL)
        return target

    def getxattr(self, path: str, name: str, position: int = 0) -> bytes:
        if path == "/" and name == XATTR_COUNTERS:
            counters = {**self.counters.read(), "libfuse": library().as_json()}  # the library's home
            return json.dumps(counters, sort_keys=True).encode()
        try:
            value = self.tree.xattr(self._node(path), name)
        except MmfsError as exc:  # the file cannot be read: say why, answer EIO
            log.error("getxattr %s %s: %s", path, name, exc)
            raise mfusepy.FuseOSError(errno.EIO) from None
        if value is None:
            raise mfusepy.FuseOSError(errno.ENODATA)
        return value

    def listxattr(self, path: str) -> list[str]:
        return [XATTR_COUNTERS] if path == "/" else list(self.tree.xattr_names(self._node(path)))

    def statfs(self, path: str) -> dict[str, int]:
        return self.tree.statfs()

    # Everything that would change the mount.
    mknod = mkdir = unlink = rmdir = symlink = rename = link = _erofs
    chmod = chown = truncate = write = create = utimens = _erofs
    setxattr = removexattr = _erofs


# The table entries answered by Python: mfusepy's marshalling methods (which
# call Operations) and the Daemon's own buffer-level ones.
PYTHON_HANDLERS = (
    "readlink", "open", "statfs", "getxattr", "listxattr",
    "mknod", "mkdir", "unlink", "rmdir", "symlink", "rename", "link", "chmod", "chown",
    "truncate", "write", "create", "utimens", "setxattr", "removexattr",
)


class Daemon(mfusepy.FUSE):
    """mfusepy's request marshalling with mmfs's own operations table.

    mfusepy's FUSE.__init__ builds a table and starts libfuse in one call, with
    no say over the table; mmfs does not call it. `serve` builds the table
    (`operations_table`), checks it and runs libfuse's loop itself."""

    def __init__(self, operations: Operations, fold_seconds: float = FOLD_SECONDS) -> None:  # (not FUSE's)
        self.operations = operations
        self.raw_fi = False
        self.encoding = "utf-8"
        self.errors = "surrogateescape"
        self.use_ns = True
        self._FUSE__critical_exception = None  # mfusepy's _wrapper records failures here
        self._tree = operations.tree
        self._stats: dict[Any, Any] = {}
        self._keep: list[Any] = []
        self._failed = FailedReads()
        self.failures = FoldedFailures(log.error, fold_seconds)  # closed when the mount ends
        self._counters = operations.counters
        self._kernel = KernelCache()
        self._tree.report.on_made = lambda: self._kernel.forget_root_entry(REPORT)

    # -- the table ---------------------------------------------------------------

    def operations_table(self) -> mfusepy.fuse_operations:
        """The libfuse operations table: the C handlers for the views, Python
        for the rest; every C handler's Python fallback kept alive here."""
        table = mfusepy.fuse_operations()
        prototypes = {field[0]: field[1] for field in mfusepy.fuse_operations._fields_}
        for name in PYTHON_HANDLERS:
            # mfusepy's marshalling for this library: name_fuse_3 / name_fuse_2 where they differ
            method = getattr(self, f"{name}_fuse_{MAJOR}", None) or getattr(self, name)
            handler = prototypes[name](partial(self._counted, name, method))
            setattr(table, name, handler)
            self._keep.append(handler)
        # What the C handlers hand over to, in libfuse 2's shapes (mmfs_fuse.h) whichever
        # library: readdir's filler as the loaded library declares it.
        filler = prototypes["readdir"]._argtypes_[2]
        python = {
            "getattr": ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)(
                lambda path, buf: self.fgetattr(path, buf, None)),
            "fgetattr": ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p)(
                self.fgetattr),
            "read": prototypes["read"](self.read),
            "readdir": ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, filler,
                                        ctypes.c_int64, ctypes.c_void_p)(self.readdir),
        }
        python["read_failed"] = ctypes.CFUNCTYPE(
            ctypes.c_int, ctypes.c_int32, ctypes.c_int64, ctypes.c_int64, ctypes.c_size_t, ctypes.c_int64,
        )(self.read_failed)
        fallback = ffi.new("mmfs_fuse_fallback *")
        for name, thunk in python.items():
            setattr(fallback, name, ffi.cast(ffi.typeof(getattr(fallback, name)),
                                             ctypes.cast(thunk, ctypes.c_void_p).value))
        registry = self._tree.registry
        check(lib.mmfs_fuse_configure(registry.c, len(registry), os.getuid(), os.getgid(),
                                      STAT_SIZE, fallback), "mmfs_fuse_configure")
        self._keep += [python, fallback, registry]
        self._tree.streams.on_change = lambda views, used: check(
            lib.mmfs_fuse_set_dynamic(views.c, len(views), used), "mmfs_fuse_set_dynamic")
        for name in NATIVE_HANDLERS:
            setattr(table, name, prototypes[name](native_address(name)))
        return table

    def _counted(self, name: str, handler: Any, *args: Any) -> int:
        self._counters.count(name)
        return self._wrapper(handler, *args)

    # -- what the C handlers hand over: paths outside the views, failed reads ----

    def open(self, path: bytes, fip: Any) -> int:
        # ENOSYS: the kernel stops sending OPEN/RELEASE and keeps the page cache.
        return -errno.ENOSYS

    def fgetattr(self, path: bytes, buf: Any, fip: Any) -> int:
        self._kernel.learn_channel()
        try:
            node = self._tree.lookup(path.decode("utf-8", "surrogateescape"))
            if node is None:
                return -errno.ENOENT
            a = self._tree.attr(node)
        except MmfsError as exc:
            log.error("%s (getattr)", exc)
            return -errno.EIO
        except Exception:
            log.exception("getattr %r", path)
            return -errno.EIO
        template = self._stats.get(a)
        if template is None:
            template = self._stats[a] = self._make_stat(a)
        ctypes.memmove(buf, ctypes.addressof(template), STAT_SIZE)
        return 0

    def _make_stat(self, a: Any) -> Any:
        st = mfusepy.c_stat()
        st.st_mode = a.mode
        st.st_nlink = a.nlink
        st.st_size = a.size
        st.st_blocks = (a.size + 511) // 512
        st.st_blksize = 4096
        st.st_uid = os.getuid()
        st.st_gid = os.getgid()
        sec, nsec = divmod(a.mtime_ns, 1_000_000_000)
        for ts in (st.st_mtimespec, st.st_atimespec, st.st_ctimespec):
            ts.tv_sec = sec
            ts.tv_nsec = nsec
        return st

    def read_failed(self, view: int, file: int, rc: int, size: int, offset: int) -> int:
        """A view's file the C handler could not read, handed over once: one log
        line (the C core's own account of the file, byte and reason, with a fetch's
        own error, and which sample or document it was; none for the kernel's
        retry of a read just logged; folded with the reads that failed the same
        way), EIO."""
        try:
            where, why = read_failure_parts(self._tree.registry.views[view], file, rc)
            if self._failed.first((view, file), offset, size):
                self.failures.failed(f"{where}{why} (a read of {size} bytes at {offset})", why)
        except Exception:  # never 0 (end of file) for a failed read
            log.exception("read of file %d of view %d failed (code %d)", file, view, rc)
        return -errno.EIO

    def read(self, path: bytes, buf: Any, size: int, offset: int, fip: Any) -> int:
        name = path.decode("utf-8", "surrogateescape")
        try:
            node = self._tree.lookup(name)
            if isinstance(node, Dir):
                return -errno.EISDIR
            if node is None:
                return -errno.ENOENT
            data = self._tree.read(node, offset, size)
        except MmfsError as exc:  # a view's file that cannot be read: say why (once, see read_failed)
            if self._failed.first(name, offset, size):
                self.failures.failed(f"{exc} (a read of {size} bytes at {offset})", str(exc))
            return -errno.EIO
        except Exception:
            log.exception("read %s (%d bytes at %d)", name, size, offset)
            return -errno.EIO
        if data:
            ctypes.memmove(buf, data, len(data))
        return len(data)

    def readdir(self, path: bytes, buf: Any, filler: Any, offset: int, fip: Any) -> int:
        # Entry k (0 = ".", 1 = "..") carries offset k + 1, the place to resume.
        try:
            node = self._tree.lookup(path.decode("utf-8", "surrogateescape"))
            if not isinstance(node, Dir):
                return -errno.ENOTDIR if node is not None else -errno.ENOENT
            kinds = {mode: mfusepy.c_stat(st_mode=mode) for mode in (FILE_MODE, DIR_MODE, LINK_MODE)}
            flags = (0,) if MAJOR == 3 else ()  # libfuse 3's filler takes fuse_fill_dir_flags
            pos = offset
            while pos < 2:
                pos += 1
                if filler(buf, (b".", b"..")[pos - 1], kinds[DIR_MODE], pos, *flags):
                    return 0
            for name, mode in self._tree.entries(node, pos - 2):
                pos += 1
                if filler(buf, name.encode("utf-8", "surrogateescape"), kinds[mode], pos, *flags):
                    break
            return 0
        except Exception:
            log.exception("readdir %r offset %d", path, offset)
            return -errno.EIO

    # -- running -------------------------------------------------------------------

    def serve(self, mountpoint: str, foreground_args: list[str], options: dict[str, Any]) -> None:
        table = self.operations_table()
        check_table(table)
        log.info("%s", library().describe())
        # The splits' views first: the datasets' own (two a dataset) would fill the line.
        paths = sorted((v.path for v in self._tree.registry.views), key=lambda p: p.startswith("/datasets/"))
        log.info("served in C: %s", first_few(paths) or "nothing")
        conn = ConnOptions()
        args = conn.take(["mmfs", *foreground_args, "-o", ",".join(fuse_options(options)), mountpoint])
        if MAJOR == 3:  # the connection options libfuse 3's main leaves to init; its signals
            prototype = dict(f[:2] for f in mfusepy.fuse_operations._fields_)["init"]
            table.init = prototype(lambda conn_info, config: _init3(conn, conn_info))
            self._keep += [table.init, conn]
        argv = (ctypes.c_char_p * len(args))(*args)
        # libfuse installs its SIGINT/SIGTERM handlers (which unmount) only over
        # the default ones; Python's own SIGINT handler would keep it from that.
        previous = signal.signal(signal.SIGINT, signal.SIG_DFL)
        try:
            err = mfusepy._libfuse.fuse_main_real(len(args), argv, ctypes.pointer(table),
                                                 ctypes.c_size_t(ctypes.sizeof(table)), None)
        finally:
            signal.signal(signal.SIGINT, previous)
            for sig in (signal.SIGTERM, signal.SIGHUP):  # as libfuse leaves them (3: mmfs's watcher is there)
                signal.signal(sig, signal.SIG_DFL)
        if err == LIBFUSE3_LOOP_ERROR and MAJOR == 3 and lib.mmfs_fuse_signal():
            log.info("signal %d: unmounting", lib.mmfs_fuse_signal())  # libfuse 3 unmounted; not a failure
            err = 0
        if err:
            raise MountError(f"{mountpoint}: libfuse could not mount or serve it (code {err}; "
                             "its own message says why)")


# What libfuse 3's main returns when its loop ended with an error, a signal included.
LIBFUSE3_LOOP_ERROR = 8


def _init3(conn: ConnOptions, conn_info: Any) -> None:
    """libfuse 3's init: the connection options, and the signal watcher (mmfs_fuse.h)."""
    conn.apply(conn_info)
    lib.mmfs_fuse_watch_signals()


def view_finder(tree: Tree):
    """A view's path -> (registry, view): the mount's own views, then the stream
    layouts held."""
    registry = tree.registry

    def find(path: str):
        view = registry.by_path.get(path)
        return (registry, view) if view is not None else tree.streams.find_view(path)

    return find


def serve(tree: Tree, mountpoint: str, options: MountOptions | None = None) -> None:
    """Mount `tree` on `mountpoint` and answer requests until it is unmounted
    (fusermount3 -u / fusermount -u, SIGINT, SIGTERM). Runs in the calling process.

    `options.fuse` are libfuse mount options on top of DEFAULT_OPTIONS;
    `map_limit_mb` acted when the corpus was opened."""
    options = options or MountOptions()
    for handler in logging.getLogger().handlers:
        handler.addFilter(RepeatFilter())
    opts = dict(DEFAULT_OPTIONS)
    opts.update(options.fuse)
    # The source column of `mount`/`df`: "mmfs:<config file name>".
    name = os.path.basename(str(getattr(tree.corpus, "config_path", "") or "")) or "config"
    opts.setdefault("fsname", "mmfs:" + "".join(c if c.isalnum() or c in "._-" else "_" for c in name))
    placer = getattr(tree.corpus, "placer", None)
    if placer is not None:
        placer.load()  # in this process: copies of the small index arrays, no maps
    threads = options.threads
    if threads is None:
        threads = bool(getattr(tree.corpus, "remote", False))
    log.info("serving %s (%s loop)", mountpoint, "multithreaded" if threads else "single-thread")
    guard = LatencyGuard(enabled=options.low_latency)
    prefetcher = None
    if getattr(tree.corpus, "remote", False):
        storage = tree.corpus.config.storage
        prefetcher = Prefetcher(view_finder(tree), storage.prefetch, storage.max_requests,
                                budget=storage.cache_limit // 2, slots=request_gate(storage))
        prefetcher.start()
    daemon = Daemon(Operations(tree), options.log_fold)
    try:
        daemon.serve(mountpoint, ["-f"] + ([] if threads else ["-s"]), opts)
    finally:
        daemon.failures.close()
        tree.close()
        guard.close()
        if prefetcher is not None:
            prefetcher.stop()
