"""Where FUSE is not allowed, `mmfs mount` says so in one line that names the cause and
what to change (and that mmfs.loader.Mount(CONFIG) reads without a mount), exit 2, no
traceback, nothing mounted. Each case is made for real: the device hidden in a private
mount namespace, the capability dropped (capsh), and as a user who is not root
(setpriv): no fusermount, one that is not setuid, no_new_privs, allow_other that
/etc/fuse.conf does not allow."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from golden_cases import write_case_config
from mount_fixtures import ROOT, force_unmount, is_mounted

IN_PROCESS = "mmfs.loader.Mount(CONFIG)"
CONTAINER = "--device /dev/fuse --cap-add SYS_ADMIN"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the cases are made as root")


@pytest.fixture()
def place():
    """A config and an empty mount point a user who is not root can reach."""
    top = Path(tempfile.mkdtemp(prefix="mmfs-access-", dir="/tmp"))
    try:
        top.chmod(0o755)
        config = write_case_config("p1_single_u16", top / "case")
        (top / "mnt").mkdir(mode=0o777)
        (top / "mnt").chmod(0o777)
        yield config, top / "mnt", top
    finally:
        force_unmount(top / "mnt")
        shutil.rmtree(top, ignore_errors=True)


def _mount_command(config, mnt, *options: str) -> str:
    return " ".join([sys.executable, "-m", "mmfs.cli", "mount", str(config), str(mnt), *options])


def _run(shell: str, env: dict | None = None, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    full = dict(os.environ, PYTHONPATH=str(ROOT))
    full.update(env or {})
    shell_argv = ["-c", shell] if prefix[:1] == ("capsh",) else ["/bin/sh", "-c", shell]  # capsh runs bash itself
    return subprocess.run([*prefix, *shell_argv], capture_output=True, text=True, env=full, timeout=300)


def _one_line(proc: subprocess.CompletedProcess, mnt: Path, *words: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for word in (IN_PROCESS, *words):
        assert word in lines[0], lines[0]
    assert "check the -o options" not in lines[0]
    assert not is_mounted(mnt) and not os.listdir(mnt)
    return lines[0]


@pytest.mark.parametrize("instead", ["nothing", "a regular file", "another device"])
def test_no_fuse_device(place, instead):
    """/dev/fuse absent or covered, in a private mount namespace (a container without
    the device: a /dev of its own, with /dev/null)."""
    config, mnt, top = place
    if instead == "nothing":
        hide = "mount -t tmpfs none /dev && mknod -m 666 /dev/null c 1 3"
    else:
        cover = "/dev/null"
        if instead == "a regular file":
            cover = str(top / "empty")
            Path(cover).write_bytes(b"")
        hide = f"mount --bind {cover} /dev/fuse"
    proc = _run(f"{hide} && exec {_mount_command(config, mnt)}", prefix=("unshare", "-m"))
    line = _one_line(proc, mnt, "/dev/fuse", CONTAINER, "Kubernetes")
    assert ("there is no FUSE device" if instead == "nothing" else "is not the FUSE device") in line


def test_no_cap_sys_admin(place):
    """Root without CAP_SYS_ADMIN (Docker's default): mounting is not permitted."""
    if shutil.which("capsh") is None:
        pytest.skip("capsh (libcap2-bin) is not installed")
    config, mnt, _ = place
    proc = _run(f"exec {_mount_command(config, mnt)}", prefix=("capsh", "--drop=cap_sys_admin", "--"))
    line = _one_line(proc, mnt, "CAP_SYS_ADMIN", CONTAINER, "privileged")
    assert "not permitted" in line


def _as_nobody(config, mnt, *options: str, path: str | None = None, no_new_privs: bool = False):
    """`mmfs mount` as a user who is not root: in a user namespace of its own (uid 65534
    there), so it still reads this Python wherever it is installed."""
    prefix = [shutil.which("unshare"), "--user"]
    if no_new_privs:
        prefix += [shutil.which("setpriv"), "--no-new-privs"]
    env = {"HOME": "/tmp", "PYTHONDONTWRITEBYTECODE": "1"}
    if path is not None:
        env["PATH"] = path
    return _run(f"exec {_mount_command(config, mnt, *options)}", env=env, prefix=tuple(prefix))


def test_no_fusermount_for_a_user(place):
    config, mnt, top = place
    (top / "bin").mkdir()
    line = _one_line(_as_nobody(config, mnt, path=str(top / "bin")), mnt, "fusermount is not installed")
    assert "fuse3" in line


def test_fusermount_not_setuid(place):
    config, mnt, top = place
    tool = shutil.which("fusermount3") or shutil.which("fusermount")
    if tool is None:
        pytest.skip("no fusermount here")
    (top / "bin").mkdir()
    shutil.copy(tool, top / "bin" / os.path.basename(tool))
    (top / "bin" / os.path.basename(tool)).chmod(0o755)  # not setuid
    line = _one_line(_as_nobody(config, mnt, path=str(top / "bin")), mnt, "not setuid root")
    assert "chmod u+s" in line


def test_no_new_privs(place):
    config, mnt, _ = place
    if not os.stat(shutil.which("fusermount3") or shutil.which("fusermount") or "/").st_mode & 0o4000:
        pytest.skip("fusermount here is not setuid")
    _one_line(_as_nobody(config, mnt, no_new_privs=True), mnt, "no_new_privs", "allowPrivilegeEscalation")


def test_allow_other_without_user_allow_other(place):
    config, mnt, _ = place
    with open("/etc/fuse.conf") if os.path.exists("/etc/fuse.conf") else open(os.devnull) as f:
        if any(line.split("#")[0].strip() == "user_allow_other" for line in f):
            pytest.skip("/etc/fuse.conf allows allow_other here")
    if not os.stat(shutil.which("fusermount3") or shutil.which("fusermount") or "/").st_mode & 0o4000:
        pytest.skip("fusermount here is not setuid")
    proc = _as_nobody(config, mnt, "-o", "allow_other")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    line, = proc.stderr.strip().splitlines()
    assert "user_allow_other" in line and "/etc/fuse.conf" in line and IN_PROCESS in line


def test_what_libfuse_says_is_passed_on_with_the_options_hint_only_when_given(place):
    """A refusal the checks cannot foresee (here: a user namespace, where the setuid bit
    of fusermount does not apply): libfuse's own words, in one last line; "check the
    -o options" only when -o gave libfuse something."""
    config, mnt, _ = place
    for options, hinted in (((), False), (("-o", "fsname=x"), True)):
        proc = _as_nobody(config, mnt, "-q", *options)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        line = proc.stderr.strip().splitlines()[-1]
        assert "fusermount" in line and "not permitted" in line, line
        assert ("check the -o options" in line) == hinted, line
        assert not is_mounted(mnt)
