"""`mmfs mount` and `mmfs umount`: checking the mount point, building the
indices, daemonising, waiting until the mount answers, unmounting.

The indices are built (or loaded from the cache) before the daemon forks, so a
config error is reported by `mmfs mount` itself (one line, exit 2) and never
leaves a mount behind. The daemon is a fork of `mmfs mount`: it inherits the
opened corpus, detaches from the terminal, logs to a file and serves until it
is unmounted (`mmfs umount`, fusermount -u, SIGINT or SIGTERM).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import gc
import hashlib
import logging
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from mmfs.errors import MmfsError, MountError
from mmfs.mount import access
from mmfs.mount.libfuse import fusermount
from mmfs.mount.options import MountOptions, parse_mount_options
from mmfs.storage import close_range_caches

log = logging.getLogger(__name__)

# How long `mmfs mount` waits for the daemon's first answer.
READY_TIMEOUT = 60.0


# -- the state of a mount point -------------------------------------------------


def _unescape_mountinfo(field: str) -> str:
    # /proc/self/mountinfo writes space, tab, newline and backslash as \ooo.
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 4 <= len(field) and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mount_entry(path: str) -> tuple[str, str] | None:
    """(file system type, source) of what is mounted at `path` ("fuse", "mmfs:demo.yaml"), or None."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    found = None
    for line in lines:
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if sep and len(fields) >= 5 and _unescape_mountinfo(fields[4]) == path:
            kind = right.split() + ["unknown", ""]
            found = (kind[0], _unescape_mountinfo(kind[1]))  # the last one wins
    return found


def mount_type(path: str) -> str | None:
    """The file system type mounted at `path` ("fuse", ...), or None."""
    entry = mount_entry(path)
    return entry[0] if entry else None


@dataclass(frozen=True)
class MountPointState:
    path: str
    state: str  # "missing" | "not-dir" | "stale" | "mounted" | "not-empty" | "empty"
    fstype: str | None = None
    reason: str | None = None  # the error a stale mount answers with


def mount_point_state(path: str) -> MountPointState:
    """What is at `path`, without hanging on or raising for a dead mount."""
    real = os.path.realpath(path)
    try:
        st = os.stat(path)
    except OSError as exc:
        if exc.errno in (errno.ENOTCONN, errno.ECONNABORTED):
            return MountPointState(path, "stale", mount_type(real), exc.strerror)
        if exc.errno == errno.ENOENT:
            return MountPointState(path, "missing")
        raise MountError(f"{path}: {exc.strerror}") from None
    fstype = mount_type(real)
    if fstype is not None or os.path.ismount(path):
        # The kernel may answer stat from its attribute cache even when the
        # daemon is dead; statfs always asks the daemon.
        try:
            os.statvfs(path)
        except OSError as exc:
            if exc.errno in (errno.ENOTCONN, errno.ECONNABORTED):
                return MountPointState(path, "stale", fstype, exc.strerror)
        return MountPointState(path, "mounted", fstype)
    if not stat.S_ISDIR(st.st_mode):
        return MountPointState(path, "not-dir")
    try:
        empty = not os.listdir(path)
    except OSError as exc:
        raise MountError(f"{path}: cannot list it ({exc.strerror})") from None
    return MountPointState(path, "empty" if empty else "not-empty")


def is_mmfs_source(source: str) -> bool:
    """Whether a mount's source (mountinfo's) is one mmfs names ("mmfs:<config>")."""
    return source.startswith("mmfs:")


def clear_stale(path: str) -> bool:
    """Unmount a stale mmfs mount at `path` (its daemon gone: ENOTCONN), lazily when a
    process still holds it; whether there was one to clear. A live mount, or a stale
    one of another file system, is left alone (check_mount_point refuses it)."""
    s = mount_point_state(path)
    entry = mount_entry(os.path.realpath(path))
    if s.state != "stale" or entry is None or not is_mmfs_source(entry[1]):
        return False
    try:
        unmount(path)
    except MountError:
        unmount(path, lazy=True)  # busy (a shell still in it, a reader's open file): detach it
    return True


def check_mount_point(path: str, allow_nonempty: bool = False) -> None:
    """Raise MountError unless `path` is an empty directory nothing is mounted on."""
    s = mount_point_state(path)
    if s.state == "empty" or (s.state == "not-empty" and allow_nonempty):
        return
    if s.state == "missing":
        raise MountError(f"{path}: no such directory; create it first (mkdir -p {path})")
    if s.state == "not-dir":
        raise MountError(f"{path}: not a directory; mount on an empty directory")
    if s.state == "stale":
        raise MountError(
            f"{path}: a stale mount left by an mmfs daemon that is no longer running "
            f"({s.reason or 'Transport endpoint is not connected'}); clear it with "
            f"`mmfs umount {path}`, then mount again"
        )
    if s.state == "mounted":
        what = f"a {s.fstype} file system" if s.fstype else "a file system"
        hint = f"`mmfs umount {path}`" if (s.fstype or "").startswith("fuse") else "umount"
        raise MountError(
            f"{path}: already a mount point ({what} is mounted there); unmount it first "
            f"with {hint}, or choose another directory"
        )
    raise MountError(
        f"{path}: the directory is not empty; mmfs mounts on an empty directory (choose "
        "an empty one, or pass `-o nonempty` to hide its contents while mounted)"
    )


# -- mount ---------------------------------------------------------------------

def default_log_path(mountpoint: str) -> str:
    """~/.local/state/mmfs/<mount dir name>-<hash of its path>.log"""
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "state"
    )
    digest = hashlib.sha1(mountpoint.encode()).hexdigest()[:8]
    name = os.path.basename(mountpoint.rstrip("/")) or "root"
    return os.path.join(state, "mmfs", f"{name}-{digest}.log")


def _log_tail(path: str, lines: int = 20) -> list[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return [line.rstrip() for line in f.readlines()[-lines:] if line.strip()]
    except OSError:
        return []


def _why_it_exited(log_path: str) -> str:
    """The daemon's last message, after what libfuse itself printed (lines that
    are not the daemon's own, e.g. "fuse: unknown option `bogus'")."""
    tail = _log_tail(log_path)
    ours = [line for line in tail if _LOG_LINE.match(line)]
    libfuse = [line for line in tail if not _LOG_LINE.match(line) and not line.startswith(" ")]
    last = _LOG_LINE.sub("", ours[-1]) if ours else "no message"
    return "; ".join(libfuse[-3:] + [last])


# The start of the daemon's own log lines (the format _daemon_main sets).
_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d [\d:,]+ mmfs\[\d+\] [A-Z]+ ")


def _daemon_main(tree: Any, mountpoint: str, options: MountOptions, log_fd: int, level: int) -> int:
    """Body of the forked daemon: detach, log to the file, serve."""
    from mmfs.mount.fuse import serve

    os.setsid()  # no controlling terminal: a closed terminal or Ctrl-C does not reach us
    os.chdir("/")  # do not keep the caller's directory busy
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(devnull)
    os.close(log_fd)
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s mmfs[%(process)d] %(levelname)s %(message)s"))
    root.addHandler(handler)
    root.setLevel(level)
    log.info("serving %s on %s", tree.corpus.config_path, mountpoint)
    try:
        serve(tree, mountpoint, options)
    except MmfsError as exc:
        log.error("%s", exc)
        return 2
    except BaseException:  # a bug: keep the traceback in the log
        log.exception("the daemon failed")
        return 1
    log.info("unmounted %s; exiting", mountpoint)
    return 0


def spawn_daemon(
    tree: Any, mountpoint: str, options: MountOptions, log_path: str, level: int = logging.INFO
) -> int:
    """Fork a daemon serving `tree` on `mountpoint`; return its pid."""
    try:
        os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
        log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    except OSError as exc:
        raise MountError(
            f"{log_path}: cannot write the daemon log ({exc.strerror}); pass --log FILE"
        ) from None
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = _daemon_main(tree, mountpoint, options, log_fd, level)
        finally:
            close_range_caches()  # os._exit runs no atexit handler
            logging.shutdown()
            os._exit(code)
    os.close(log_fd)
    return pid


def wait_until_mounted(mountpoint: str, pid: int, log_path: str, timeout: float = READY_TIMEOUT,
                       hint: str = "") -> None:
    """Return once `mountpoint` answers (its mmfs.json can be stat'ed);
    MountError if the daemon dies first (with `hint` after its reason) or does not
    answer in time."""
    probe = os.path.join(mountpoint, "mmfs.json")
    deadline = time.monotonic() + timeout
    delay = 0.002
    while True:
        done, _status = os.waitpid(pid, os.WNOHANG)
        if done:
            raise MountError(f"{mountpoint}: the mmfs daemon exited before the mount answered: "
                             f"{_why_it_exited(log_path)}{hint} (log: {log_path})")
        if os.path.ismount(mountpoint):
            try:
                os.stat(probe)
                return
            except OSError:
                pass
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGTERM)
            raise MountError(
                f"{mountpoint}: the mmfs daemon (pid {pid}) did not answer within "
                f"{timeout:.0f} s; it was stopped (log: {log_path})"
            )
        time.sleep(delay)
        delay = min(delay * 2, 0.01)  # a stat is cheap; the user is waiting


def open_tree(config: str, options: MountOptions, progress: bool = False, freeze: bool = False) -> Any:
    """The mount's Tree of a config, opened as `mmfs mount` opens it (the daemon serves
    it through FUSE; mmfs/mount/inprocess.py in the calling process). freeze: it lives
    as long as the process."""
    from mmfs.megatron import open_corpus_for_serving
    from mmfs.mount.tree import Tree

    def made() -> Any:
        corpus = open_corpus_for_serving(config, progress=progress, map_limit_mb=options.map_limit_mb,
                                         open_files=options.open_files, freeze=freeze)
        return Tree(corpus)

    if not freeze:
        return made()
    # The corpus and tree live as long as the daemon: the collector need not walk their
    # objects, neither while they are made (its passes over the readers' and tree's
    # hundreds of thousands were a quarter of the mount at 10,000 datasets) nor after
    # (nor touch their pages after the fork): paused, then what was made is frozen.
    gc.disable()
    try:
        return made()
    finally:
        gc.freeze()
        gc.enable()


def mount_command(args: argparse.Namespace) -> int:
    """`mmfs mount CONFIG MOUNTPOINT [-f] [-o OPTIONS] [--log FILE]`."""
    from mmfs.mount.fuse import serve

    mountpoint = os.path.abspath(args.mountpoint)
    options = parse_mount_options(args.options)
    quiet = bool(getattr(args, "quiet", False))
    # A mount left by a daemon that is gone (a requeued job's node, a killed job): cleared.
    if clear_stale(mountpoint):
        print(f"mmfs: cleared a stale mmfs mount on {mountpoint} (its daemon was gone)", file=sys.stderr)
    check_mount_point(mountpoint, allow_nonempty=options.nonempty)
    # Where FUSE is not allowed (a container, a pod), say why and what to change before building.
    why = access.why_not(options.fuse)
    if why is not None:
        raise MountError(why)
    tree = open_tree(args.config, options, progress=not quiet, freeze=True)
    # Someone may have mounted there while the indices were built.
    check_mount_point(mountpoint, allow_nonempty=options.nonempty)

    # libfuse's own words are passed on; the options are worth a look only when some were given.
    hint = f"; check the -o options ({args.options})" if options.fuse else ""
    if args.foreground:
        log.info("serving %s on %s; Ctrl-C or `mmfs umount %s` unmounts", args.config, mountpoint, mountpoint)
        try:
            serve(tree, mountpoint, options)
        except MountError as exc:
            raise MountError(f"{exc}{hint if 'libfuse' in str(exc) else ''}") from None
        return 0

    log_path = os.path.abspath(args.log or default_log_path(mountpoint))
    level = logging.getLogger().getEffectiveLevel()
    pid = spawn_daemon(tree, mountpoint, options, log_path, level)
    try:
        wait_until_mounted(mountpoint, pid, log_path, hint=hint)
    except KeyboardInterrupt:  # Ctrl-C while waiting: leave nothing behind
        os.kill(pid, signal.SIGTERM)
        raise
    if not quiet:
        print(f"mmfs: mounted {args.config} on {mountpoint} (daemon pid {pid}, log {log_path})")
    if getattr(args, "program", False):
        _end_now()
    return 0


def _end_now() -> None:
    """End `mmfs mount` once the daemon answers, its output flushed, without freeing
    the corpus and tree object by object (the daemon has its own copy): at 10,000
    datasets half a second of CPU before the command returns."""
    close_range_caches()  # what atexit would run (os._exit runs no handler)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# -- umount --------------------------------------------------------------------


def unmount(mountpoint: str, lazy: bool = False) -> None:
    """Unmount an mmfs (or any FUSE) mount, live or stale."""
    mountpoint = os.path.abspath(mountpoint)
    s = mount_point_state(mountpoint)
    if s.state not in ("mounted", "stale"):
        raise MountError(f"{mountpoint}: nothing is mounted there")
    if s.fstype is not None and not s.fstype.startswith("fuse"):
        raise MountError(
            f"{mountpoint}: a {s.fstype} file system is mounted there, not mmfs; use umount"
        )
    tool = fusermount()  # fusermount3 or fusermount, the one of the libfuse mmfs serves with
    if tool:
        cmd = [tool, "-uz" if lazy else "-u", mountpoint]
    elif os.geteuid() == 0:
        cmd = ["umount", "-l", mountpoint] if lazy else ["umount", mountpoint]
    else:
        raise MountError("neither fusermount3 nor fusermount is installed; install the `fuse3` package "
                         "(apt-get install fuse3)")
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        why = (proc.stderr or proc.stdout).strip().splitlines()
        why_text = why[-1] if why else f"exit code {proc.returncode}"
        if "busy" in why_text.lower():
            raise MountError(
                f"{mountpoint}: busy (a process has a file or its working directory in it); "
                f"close it, or detach now with `mmfs umount --lazy {mountpoint}`"
            )
        raise MountError(f"{mountpoint}: {' '.join(cmd[:2])} failed: {why_text}")


def umount_command(args: argparse.Namespace) -> int:
    """`mmfs umount MOUNTPOINT [--lazy]`."""
    unmount(args.mountpoint, lazy=args.lazy)
    if not getattr(args, "quiet", False):
        print(f"mmfs: unmounted {os.path.abspath(args.mountpoint)}")
    return 0


@contextlib.contextmanager
def temporary_mount(config: str, options: str = "") -> Iterator[tuple[str, int]]:
    """Mount `config` (as `mmfs mount` does, with `-o options`) in a temporary
    directory; yields (mount point, daemon pid) and unmounts afterwards (for
    benchmarks)."""
    mount_options = parse_mount_options(options)
    tree = open_tree(config, mount_options, progress=True)
    tmp = tempfile.mkdtemp(prefix="mmfs-bench-")
    mount = os.path.join(tmp, "mnt")
    os.mkdir(mount)
    log_path = os.path.join(tmp, "daemon.log")
    pid = spawn_daemon(tree, mount, mount_options, log_path)
    try:
        wait_until_mounted(mount, pid, log_path)
        yield mount, pid
    finally:
        try:
            unmount(mount)
        except MmfsError as exc:
            log.warning("%s", exc)
        os.waitpid(pid, 0)
        shutil.rmtree(tmp, ignore_errors=True)
