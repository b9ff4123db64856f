"""Real mounts for tests: `mmfs mount` in a subprocess, always unmounted.

`mounted(config, mountpoint)` is a context manager that runs the real CLI,
yields a `Mount` (path, daemon pid, log), and on the way out -- also when the
test failed -- unmounts (lazily if busy, also a stale mount) and waits until
the daemon process is gone, so no test leaves a mount or a daemon behind.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from mmfs.mount.libfuse import fusermount

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


HANG_GUARD = 300.0  # seconds: only a process that truly hangs takes this long, however busy the machine


def mmfs(*args: str, timeout: float = HANG_GUARD, **kwargs) -> subprocess.CompletedProcess:
    """Run the `mmfs` CLI (this checkout's) and capture its output (`timeout`: a hang guard)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, "-m", "mmfs.cli", *map(str, args)],
        capture_output=True, text=True, timeout=timeout, env=env, **kwargs,
    )


def is_mounted(path: str | os.PathLike) -> bool:
    """True for a live or a stale mount at `path`."""
    target = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == target for line in f)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for our purposes (its parent will reap it).
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def wait_for(condition, what: str, timeout: float = HANG_GUARD) -> None:
    """Wait until `condition()` holds: the event itself, looked for every 20 ms; the
    timeout only ends a test that has failed (it hangs), never a speed check."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not after {timeout:.0f} s (it hangs)"
        time.sleep(0.02)


def wait_gone(pid: int, timeout: float = HANG_GUARD) -> bool:
    """Whether process `pid` ended (False only after `timeout` seconds: it hangs)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.02)
    return False


def force_unmount(path: str | os.PathLike) -> None:
    """Unmount whatever is at `path` (live, busy or stale); never raises."""
    tool = fusermount() or "fusermount"  # fusermount3 or fusermount, as mmfs umount picks
    for args in ([tool, "-u", str(path)], [tool, "-uz", str(path)]):
        if not is_mounted(path):
            return
        subprocess.run(args, capture_output=True)
    if is_mounted(path):
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


@dataclass
class Mount:
    path: Path
    pid: int
    log: Path
    config: Path

    def file(self, rel: str) -> Path:
        return self.path / rel


def start_mount(config: str | os.PathLike, mountpoint: str | os.PathLike, *extra: str) -> Mount:
    """Run `mmfs mount`; fail the test (with its output) if it does not mount."""
    mountpoint = Path(mountpoint)
    mountpoint.mkdir(parents=True, exist_ok=True)
    log = mountpoint.parent / f"{mountpoint.name}.log"
    proc = mmfs("mount", config, mountpoint, "--log", log, *extra)
    if proc.returncode != 0:
        force_unmount(mountpoint)
        pytest.fail(f"mmfs mount failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    m = re.search(r"daemon pid (\d+)", proc.stdout)
    assert m, proc.stdout
    return Mount(mountpoint, int(m.group(1)), log, Path(config))


def stop_mount(mount: Mount) -> None:
    """Unmount and wait for the daemon to exit (its last log lines come as it ends: a
    busy machine's slow exit is waited for); kill it only if it hangs."""
    force_unmount(mount.path)
    if not wait_gone(mount.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(mount.pid, signal.SIGKILL)
        wait_gone(mount.pid, 5.0)
        force_unmount(mount.path)


@contextlib.contextmanager
def mounted(config: str | os.PathLike, mountpoint: str | os.PathLike, *extra: str) -> Iterator[Mount]:
    mount = start_mount(config, mountpoint, *extra)
    try:
        yield mount
    finally:
        stop_mount(mount)


def samples(mount: Mount) -> Path:
    return mount.path / "train" / "samples"


def read_errno(path: Path) -> int:
    """The errno of reading the file, 0 if it read."""
    try:
        path.read_bytes()
        return 0
    except OSError as exc:
        return exc.errno or -1


def stat_errno(path: str | os.PathLike) -> int:
    """The errno os.stat raises for `path`, 0 if it succeeds."""
    try:
        os.stat(path)
    except OSError as exc:
        return exc.errno or -1
    return 0


__all__ = [
    "HANG_GUARD", "Mount", "errno", "force_unmount", "is_mounted", "mmfs", "mounted", "pid_alive",
    "start_mount", "stat_errno", "stop_mount", "wait_gone",
]


def mount_in(stack: contextlib.ExitStack, config: str | os.PathLike, mountpoint: str | os.PathLike,
             *extra: str) -> Path:
    """Mount for as long as `stack` lasts (a module-scoped fixture's); the mount point."""
    return stack.enter_context(mounted(config, mountpoint, *extra)).path
