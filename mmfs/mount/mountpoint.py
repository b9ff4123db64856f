"""What is at a mount point (nothing, a directory, a live or a stale mount, of mmfs
or another file system), found without hanging on a dead mount; unmounting; and
clearing a stale mmfs mount, as `mmfs mount` does before it mounts there."""

from __future__ import annotations

import errno
import os
import stat
import subprocess
from dataclasses import dataclass

from mmfs.errors import MountError
from mmfs.mount.libfuse import fusermount


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


def is_mmfs_mount(fstype: str, source: str) -> bool:
    """Whether a mount (mountinfo's type and source) is mmfs's: type fuse.mmfs (its
    subtype), or the source it names ("mmfs:<config>") where a kernel shows no subtype."""
    return fstype == "fuse.mmfs" or source.startswith("mmfs:")


def clear_stale(path: str) -> bool:
    """Unmount a stale mmfs mount at `path` (its daemon gone: ENOTCONN), lazily when a
    process still holds it; whether there was one to clear. A live mount, or a stale
    one of another file system, is left alone (check_mount_point refuses it)."""
    s = mount_point_state(path)
    entry = mount_entry(os.path.realpath(path))
    if s.state != "stale" or entry is None or not is_mmfs_mount(*entry):
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



# -- unmounting ----------------------------------------------------------------


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
