"""Whether this process may make a FUSE mount at all, and if not, the one line that
names the cause and the fix.

`mmfs mount` asks before it builds anything: in a container or pod that does not
allow FUSE, libfuse's own words ("mount failed: Operation not permitted", "Invalid
argument") point nowhere useful. Only what is certain is refused here (no device, no
capability to mount, no setuid fusermount, allow_other that fuse.conf forbids);
anything else is left to libfuse, whose message `mmfs mount` then passes on.
"""

from __future__ import annotations

import errno
import os
import stat

from mmfs.mount.libfuse import fusermount

FUSE_DEVICE = "/dev/fuse"
FUSE_DEVICE_NUMBER = os.makedev(10, 229)  # misc device 229, on every Linux
FUSE_CONF = "/etc/fuse.conf"
CAP_SYS_ADMIN = 21

CONTAINER_FIX = ("in a container, run it with `--device /dev/fuse --cap-add SYS_ADMIN` (Docker, Podman; "
                 "add `--security-opt apparmor:unconfined` where AppArmor confines it); in Kubernetes, "
                 "a pod with `securityContext: {privileged: true}`, or the FUSE device from a device "
                 "plugin and `capabilities: {add: [SYS_ADMIN]}`")
IN_PROCESS = ("or read the data in-process with mmfs.loader.Mount(CONFIG) (the Megatron provider: "
              "MMFS_MOUNT=CONFIG), which needs no FUSE at all")


def _status_field(name: str, path: str = "/proc/self/status") -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key == name:
                    return value.strip()
    except OSError:
        pass
    return None


def _has_capability(field: str, cap: int = CAP_SYS_ADMIN) -> bool | None:
    """Whether capability `cap` is in the set `field` (CapEff, CapBnd) of this process;
    None when it cannot be told."""
    value = _status_field(field)
    try:
        return bool(int(value, 16) >> cap & 1) if value is not None else None
    except ValueError:
        return None


def _allows_other(conf: str = FUSE_CONF) -> bool:
    try:
        with open(conf, encoding="utf-8", errors="replace") as f:
            return any(line.split("#", 1)[0].strip() == "user_allow_other" for line in f)
    except OSError:
        return False


def why_not(fuse_options: dict | None = None, device: str = FUSE_DEVICE) -> str | None:
    """The reason this process cannot mount with FUSE (cause; fix; the way without a
    mount), or None when nothing certain stands in the way."""
    fuse_options = fuse_options or {}
    root = os.geteuid() == 0
    try:
        st = os.stat(device)
    except OSError:
        st = None
    if st is None or not stat.S_ISCHR(st.st_mode) or st.st_rdev != FUSE_DEVICE_NUMBER:
        what = "there is no FUSE device" if st is None else f"{device} is not the FUSE device"
        return (f"cannot mount: {what} ({device}); on a host, load the module (modprobe fuse); "
                f"{CONTAINER_FIX}; {IN_PROCESS}")
    if root:
        try:
            os.close(os.open(device, os.O_RDWR | os.O_CLOEXEC))
        except OSError as exc:
            if exc.errno in (errno.EPERM, errno.EACCES):
                return (f"cannot mount: {device} may not be opened here ({exc.strerror}: the container's "
                        f"device rules do not allow it); {CONTAINER_FIX}; {IN_PROCESS}")
    may_mount = _has_capability("CapEff") if root else None
    if not may_mount and _has_capability("CapBnd") is False:
        return (f"cannot mount: mounting is not permitted here (no CAP_SYS_ADMIN{'' if root else ' for fusermount'}); "
                f"{CONTAINER_FIX}; {IN_PROCESS}")
    if not root:
        tool = fusermount()  # fusermount3 for libfuse 3, fusermount for libfuse 2
        if tool is None:
            return (f"cannot mount: fusermount is not installed (a user who is not root mounts through it); "
                    f"install the fuse3 package (or fuse for libfuse 2), or mount as root; {IN_PROCESS}")
        if not os.stat(tool).st_mode & stat.S_ISUID:
            return (f"cannot mount: {tool} is not setuid root, so a user who is not root cannot mount "
                    f"with it; as root: chmod u+s {tool} (or reinstall its package), or mount as root; {IN_PROCESS}")
        if _status_field("NoNewPrivs") == "1":
            return (f"cannot mount: this process runs with no_new_privs, so the setuid {tool} cannot mount; "
                    f"start it without (Kubernetes: allowPrivilegeEscalation: true), or mount as root; "
                    f"{IN_PROCESS}")
        if "allow_other" in fuse_options and not _allows_other():
            return (f"cannot mount: -o allow_other needs `user_allow_other` in {FUSE_CONF} for a user who "
                    f"is not root; add that line (as root), or drop allow_other; {IN_PROCESS}")
    return None
