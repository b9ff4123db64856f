"""`mmfs mount` and `mmfs umount`: checking the mount point (mountpoint.py: a
stale mmfs mount there is cleared) and that FUSE is allowed (access.py), building
the indices, daemonising, waiting until the mount answers, unmounting.

The indices are built (or loaded from the cache) before the daemon forks, so a
config error is reported by `mmfs mount` itself (one line, exit 2) and never
leaves a mount behind. The daemon is a fork of `mmfs mount`: it inherits the
opened corpus, detaches from the terminal, logs to a file and serves until it
is unmounted (`mmfs umount`, fusermount -u, SIGINT or SIGTERM).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import logging
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from mmfs.errors import MmfsError, MountError
from mmfs.mount import access
from mmfs.mount.mountpoint import check_mount_point, clear_stale, unmount
from mmfs.mount.options import MountOptions, parse_mount_options
from mmfs.storage import close_range_caches

log = logging.getLogger(__name__)

# How long `mmfs mount` waits for the daemon's first answer.
READY_TIMEOUT = 60.0


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
    from mmfs.megatron.epochs import corpus_warnings, say
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
    say(corpus_warnings(tree.corpus))  # a run read past its data: said before the daemon goes
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
