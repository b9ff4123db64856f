"""libfuse 3 and libfuse 2: which one a mount takes (mmfs/mount/libfuse.py), that each
serves a golden case exactly with the other hidden from the process, and MMFS_LIBFUSE.

A library is hidden the way a node without it looks to the dynamic linker: in a
private mount namespace (`unshare -m`, as root) an empty file is bound over it, so
dlopen refuses it while the linker cache still names it. Nothing outside that
namespace sees the change."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from golden_cases import SPLITS, expected_samples
from mmfs.mount.layouts import LIBFUSE3_MAX_THREADS, fuse_options
from mmfs.mount.libfuse import SONAMES, TOOLS
from mount_fixtures import HANG_GUARD, HERE, ROOT, mmfs

CASE = "p2_blend2_u16"


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    for key in [k for k, v in env.items() if v is None]:
        full.pop(key)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full,
                          timeout=HANG_GUARD)


def _chosen(**env: str) -> dict:
    """What mmfs chooses in a fresh process with `env` (library().as_json())."""
    proc = _python("import json; from mmfs.mount.libfuse import library; print(json.dumps(library().as_json()))",
                   **env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _loads(major: int) -> bool:
    return _python(f"import ctypes; ctypes.CDLL({SONAMES[major]!r})").returncode == 0


BOTH = _loads(2) and _loads(3)
needs_both = pytest.mark.skipif(not BOTH, reason="needs libfuse 2 and 3 both (make system-deps installs them)")


@needs_both
def test_libfuse_3_is_preferred_where_both_load():
    chosen = _chosen(MMFS_LIBFUSE="")
    assert chosen["major"] == 3 and chosen["fusermount"] == "fusermount3"
    assert os.path.basename(chosen["path"]).startswith("libfuse3.so.3")


@needs_both
def test_mmfs_libfuse_forces_one_by_major_or_path():
    two = _chosen(MMFS_LIBFUSE="2")
    assert two["major"] == 2 and two["version"].startswith("2.") and two["fusermount"] == "fusermount"
    assert _chosen(MMFS_LIBFUSE="3")["major"] == 3
    by_path = _chosen(MMFS_LIBFUSE=two["path"])
    assert by_path["major"] == 2 and by_path["path"] == two["path"]


@pytest.mark.parametrize("value, says", [
    ("4", "MMFS_LIBFUSE=4: give 3, 2 or the path of a libfuse library file"),
    ("/nonexistent/libfuse.so", "MMFS_LIBFUSE=/nonexistent/libfuse.so: cannot load it"),
    ("/lib/x86_64-linux-gnu/libc.so.6", "is not a libfuse library"),
])
def test_a_bad_mmfs_libfuse_is_one_line_and_exit_2(tmp_path, value, says):
    from golden_cases import write_case_config

    config = write_case_config(CASE, tmp_path)
    (tmp_path / "mnt").mkdir()
    os.environ["MMFS_LIBFUSE"] = value
    try:
        proc = mmfs("mount", config, tmp_path / "mnt", "--log", tmp_path / "log")
    finally:
        del os.environ["MMFS_LIBFUSE"]
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in proc.stderr, proc.stderr
    assert not os.path.ismount(tmp_path / "mnt")


def test_the_mount_options_each_library_takes():
    options = {"ro": True, "nonempty": True, "allow_other": False, "max_background": 128, "subtype": "mmfs"}
    assert fuse_options(options, 2, 9) == ["ro", "nonempty", "max_background=128", "subtype=mmfs"]
    # libfuse 3: no nonempty; from 3.12 on as many workers as the kernel may keep busy
    assert fuse_options(options, 3, 10) == ["ro", "max_background=128", "subtype=mmfs"]
    assert fuse_options(options, 3, 14) == ["ro", "max_background=128", "subtype=mmfs",
                                            f"max_threads={LIBFUSE3_MAX_THREADS}"]
    assert fuse_options({**options, "max_threads": 64}, 3, 14)[-1] == "max_threads=64"


def _library_file(major: int) -> str:
    return _chosen(MMFS_LIBFUSE=str(major))["path"]


@needs_both
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="hiding a library needs root and unshare")
@pytest.mark.parametrize("hidden", [2, 3])
def test_a_mount_with_one_libfuse_hidden_serves_the_golden_samples_exactly(tmp_path, hidden):
    used = 5 - hidden
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    script = (f"mount --bind {empty} {_library_file(hidden)} && "
              "{ mount -t fusectl none /sys/fs/fuse/connections 2>/dev/null || true; } && "
              f"exec {sys.executable} {HERE / 'libfuse_hidden.py'} {CASE} {tmp_path / 'work'} "
              f"{SONAMES[hidden]} {hidden}")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("MMFS_LIBFUSE", None)
    proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                          capture_output=True, text=True, env=env, timeout=HANG_GUARD)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["hidden_loads"] is False  # the namespace hid it
    # Forcing the hidden one: one line naming it and what to install, exit 2.
    code, lines = got["forced_hidden"]
    assert code == 2 and len(lines) == 1 and f"MMFS_LIBFUSE={hidden}: libfuse {hidden} does not load" in lines[0]
    # The other one served every sample exactly, and the mount says which it was.
    want = sum(len(rows) for split in SPLITS if (rows := expected_samples(CASE, split)) is not None)
    assert got["samples"] == want > 0 and got["wrong"] == 0
    libfuse = got["counters"]["libfuse"]
    assert libfuse["major"] == used and libfuse["fusermount"] == TOOLS[used]
    line = f"libfuse {libfuse['version']} ({libfuse['path']}; unmounts with {TOOLS[used]})"
    assert got["said"] == [f"mmfs: {line}"]  # mmfs mount -v
    assert len(got["log"]) == 1 and got["log"][0].endswith(f"INFO {line}")  # the daemon's log
    assert got["unmounted"]
    if got["max_background"] is not None:  # libfuse 3 takes it in init, libfuse 2 as a mount option
        assert got["max_background"] == 128
    # Outside the namespace nothing was hidden.
    assert _loads(hidden)
