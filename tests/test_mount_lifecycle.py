"""`mmfs mount` / `mmfs umount` around the edges: user errors (exit 2, one
line, no mount left), busy and stale mount points, signals, SIGKILL, a huge
split listed without the daemon growing."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from golden_cases import GOLDEN, expected_samples, write_case_config
from mount_fixtures import (
    HANG_GUARD,
    ROOT,
    Mount,
    force_unmount,
    is_mounted,
    mmfs,
    mounted,
    start_mount,
    stat_errno,
    stop_mount,
    wait_gone,
)


@pytest.fixture
def p2_config(tmp_path) -> Path:
    return write_case_config("p2_blend2_u16", tmp_path / "case")


def _one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("mmfs: error: ")
    return lines[0]


def test_config_error_exits_2_and_leaves_no_mount(tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    bad = tmp_path / "bad.yaml"
    bad.write_text("datasets:\n  - path: nowhere\nsequence_length: 16\n")
    line = _one_error_line(mmfs("mount", bad, mnt))
    assert "bad.yaml" in line and "nowhere" in line
    assert not is_mounted(mnt) and os.listdir(mnt) == []
    line = _one_error_line(mmfs("mount", tmp_path / "missing.yaml", mnt))
    assert "missing.yaml" in line
    bad.write_text("datasets: [\n")
    assert "YAML" in _one_error_line(mmfs("mount", bad, mnt))
    assert not is_mounted(mnt)


def test_corrupt_dataset_exits_2_and_leaves_no_mount(tmp_path):
    data = tmp_path / "case" / "data"
    data.mkdir(parents=True)
    for name in ("u16_docs", "u16_small"):
        for ext in ("bin", "idx"):
            shutil.copy(GOLDEN / "data" / f"{name}.{ext}", data / f"{name}.{ext}")
    os.truncate(data / "u16_small.bin", 1000)
    config = write_case_config("p2_blend2_u16", tmp_path / "case")  # keeps our data/ folder
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    line = _one_error_line(mmfs("mount", config, mnt))
    assert "u16_small.bin" in line
    assert not is_mounted(mnt)
    # a corrupt header, too
    os.truncate(data / "u16_docs.idx", 20)
    assert "u16_docs.idx" in _one_error_line(mmfs("mount", config, mnt))
    assert not is_mounted(mnt)


def test_mount_point_must_be_an_empty_directory(tmp_path, p2_config):
    missing = tmp_path / "missing"
    assert "no such directory" in _one_error_line(mmfs("mount", p2_config, missing))
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert "not a directory" in _one_error_line(mmfs("mount", p2_config, a_file))
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("x")
    assert "not empty" in _one_error_line(mmfs("mount", p2_config, full))
    assert not is_mounted(full)


def test_already_mounted_and_umount_messages(tmp_path, p2_config):
    mnt = tmp_path / "mnt"
    with mounted(p2_config, mnt) as m:
        line = _one_error_line(mmfs("mount", p2_config, mnt))
        assert "already a mount point" in line and "mmfs umount" in line
        # busy: a process sits in the mount
        sitter = subprocess.Popen(["sleep", "600"], cwd=mnt / "train")  # there until killed, however slow the umount
        try:
            line = _one_error_line(mmfs("umount", mnt))
            assert "busy" in line and "--lazy" in line
            assert is_mounted(mnt)
        finally:
            sitter.kill()
            sitter.wait()
        proc = mmfs("umount", mnt)
        assert proc.returncode == 0, proc.stderr
        assert not is_mounted(mnt)
        assert wait_gone(m.pid), "the daemon did not exit after umount"
    assert "nothing is mounted" in _one_error_line(mmfs("umount", mnt))


def test_lazy_umount_of_a_busy_mount(tmp_path, p2_config):
    mnt = tmp_path / "mnt"
    m = start_mount(p2_config, mnt)
    try:
        fd = os.open(mnt / "mmfs.json", os.O_RDONLY)
        try:
            assert _one_error_line(mmfs("umount", mnt))
            proc = mmfs("umount", "--lazy", mnt)
            assert proc.returncode == 0, proc.stderr
            assert not is_mounted(mnt)
            assert os.read(fd, 1) == b"{"  # open files keep working
        finally:
            os.close(fd)
        assert wait_gone(m.pid)
    finally:
        stop_mount(m)


def _exact(mnt: Path) -> None:
    rows = expected_samples("p2_blend2_u16", "train")
    folder = mnt / "train" / "samples"
    assert [(folder / f"{i:07d}.bin").read_bytes() for i in range(len(rows))] == \
        [r.astype(np.uint16).tobytes() for r in rows]


def _killed(config: Path, mnt: Path, hold: bool = False) -> int | None:
    """Mount, then SIGKILL the daemon: a stale mount (ENOTCONN) is left. hold: a sample
    file kept open across it (a reader of the killed job), so only a lazy unmount clears it."""
    m = start_mount(config, mnt)
    fd = os.open(mnt / "samples" / "0000000.bin", os.O_RDONLY) if hold else None
    os.kill(m.pid, signal.SIGKILL)
    assert wait_gone(m.pid)
    with pytest.raises(OSError) as exc:
        os.listdir(mnt)
    # "Transport endpoint is not connected", or "Software caused connection
    # abort" when the kernel saw the daemon's /dev/fuse closed under it.
    assert exc.value.errno in (errno.ENOTCONN, errno.ECONNABORTED)
    return fd


@pytest.mark.parametrize("hold", [False, True], ids=["idle", "a file still open"])
def test_mount_over_a_stale_mount_clears_it_and_serves_exactly(tmp_path, p2_config, hold):
    """A requeued job on a node whose previous daemon was killed: `mmfs mount` clears the
    stale mount (lazily when a file is still open in it), says so in one line, mounts,
    and serves Megatron's samples exactly; `mmfs umount` clears one too."""
    mnt = tmp_path / "mnt"
    fd = _killed(p2_config, mnt, hold)
    try:
        proc = mmfs("mount", "-q", p2_config, mnt, "--log", tmp_path / "again.log")
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
        said = [line for line in proc.stderr.splitlines() if "stale" in line]
        assert said == [f"mmfs: cleared a stale mmfs mount on {mnt} (its daemon was gone)"], proc.stderr
        _exact(mnt)
        # A live mount there is still refused, in one line; the live one serves on.
        line = _one_error_line(mmfs("mount", p2_config, mnt))
        assert "already a mount point" in line and f"mmfs umount {mnt}" in line
        _exact(mnt)
        assert mmfs("umount", mnt).returncode == 0 and not is_mounted(mnt)
    finally:
        if fd is not None:
            with contextlib.suppress(OSError):  # its flush finds the killed daemon's connection gone
                os.close(fd)
        force_unmount(mnt)
    fd = _killed(p2_config, mnt)
    try:
        proc = mmfs("umount", mnt)
        assert proc.returncode == 0, proc.stderr
        assert not is_mounted(mnt) and os.listdir(mnt) == []
    finally:
        force_unmount(mnt)


def test_a_stale_mount_of_another_file_system_is_not_cleared(tmp_path, p2_config):
    """Only a stale mmfs mount is cleared: another file system's dead mount is named."""
    from big_inode_fs import serving

    (tmp_path / "src").mkdir()
    mnt = tmp_path / "mnt"
    with serving(tmp_path / "src", mnt):
        helper = subprocess.run(["pgrep", "-f", f"big_inode_fs.py {tmp_path / 'src'}"], capture_output=True,
                                text=True).stdout.split()
        os.kill(int(helper[0]), signal.SIGKILL)
        assert wait_gone(int(helper[0]))
        line = _one_error_line(mmfs("mount", p2_config, mnt))
        assert "stale" in line and f"mmfs umount {mnt}" in line


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signals_unmount_cleanly(tmp_path, p2_config, sig):
    mnt = tmp_path / "mnt"
    m = start_mount(p2_config, mnt)
    try:
        os.kill(m.pid, sig)
        assert wait_gone(m.pid), "the daemon did not exit"
        assert not is_mounted(mnt)
        assert "unmounted" in m.log.read_text()
    finally:
        stop_mount(m)


def test_foreground_mount_and_ctrl_c(tmp_path, p2_config):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "mmfs.cli", "mount", "-f", str(p2_config), str(mnt)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + HANG_GUARD
        while not (mnt / "mmfs.json").exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, f"the mount never answered in {HANG_GUARD:.0f} s (it hangs)"
            time.sleep(0.02)
        assert (mnt / "valid" / "samples" / "0000099.bin").stat().st_size == 258
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=HANG_GUARD)
        assert proc.returncode == 0, err
        assert not is_mounted(mnt)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        force_unmount(mnt)


def test_ten_million_samples_list_lazily(tmp_path):
    """A split of >10 million samples: names stream (the first arrive at once)
    and the daemon's memory does not grow with the listing."""
    (tmp_path / "data").symlink_to(GOLDEN / "data", target_is_directory=True)
    config = tmp_path / "big.yaml"
    config.write_text(
        "datasets:\n  - path: data/u16_docs\nsplit: '100,0,0'\nsamples: {train: 10000000}\n"
        "sequence_length: 8\nseed: 1\ntokenizer: {eod: 50256}\ncache_dir: cache\n"
    )
    with mounted(config, tmp_path / "mnt") as m:
        samples = m.path / "samples"
        count = int(json.loads((m.path / "mmfs.json").read_text())["samples"]["train"])
        assert count >= 10_000_000
        width = len(str(count - 1))
        def rss() -> int:
            with open(f"/proc/{m.pid}/status") as f:
                return int(next(line for line in f if line.startswith("RssAnon")).split()[1])

        before = rss()
        head = subprocess.run(f"ls -U {samples} | head -3", shell=True, capture_output=True,
                              text=True, check=True)
        assert head.stdout.split() == [f"{i:0{width}d}.bin" for i in range(3)]
        # Stream a good part of the directory through os.scandir.
        seen, last_name = 0, ""
        with os.scandir(samples) as it:
            for entry in it:
                seen, last_name = seen + 1, entry.name
                if seen == 1_000_000:
                    break
        assert last_name == f"{999_999:0{width}d}.bin"
        assert rss() - before < 8 * 1024, "the daemon's memory grew with the listing"
        last = samples / f"{count - 1:0{width}d}.bin"
        assert last.stat().st_size == 9 * 2
        assert stat_errno(samples / f"{count:0{width}d}.bin") == errno.ENOENT


def test_an_option_libfuse_refuses_is_named_on_the_command_line(tmp_path, p2_config):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    proc = mmfs("mount", p2_config, mnt, "--log", tmp_path / "log", "-o", "bogusopt")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    # libfuse 2: "unknown option `bogusopt'"; libfuse 3: "unknown option(s): `-o bogusopt'"
    assert lines[-1].startswith("mmfs: error:") and re.search(r"unknown option(\(s\): )? ?`(-o )?bogusopt'", lines[-1])
    assert "Traceback" not in proc.stderr and not is_mounted(mnt)


def test_mount_run_as_the_program_ends_once_mounted_with_its_output_flushed(tmp_path, p2_config):
    """The command's process ends with os._exit once the daemon answers (it does not
    free its copy of the corpus object by object): its line and its log still arrive."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    proc = mmfs("mount", p2_config, mnt, "--log", tmp_path / "mnt.log")
    pid = re.search(r"daemon pid (\d+)", proc.stdout)
    try:
        assert proc.returncode == 0 and pid, (proc.stdout, proc.stderr)
        assert proc.stdout.startswith(f"mmfs: mounted {p2_config} on {mnt}")
        assert "indices ready" in proc.stderr  # logged, flushed before the end
        assert json.loads((mnt / "mmfs.json").read_text())["samples"]["train"] > 0
    finally:
        if pid:
            stop_mount(Mount(mnt, int(pid.group(1)), tmp_path / "mnt.log", p2_config))
        force_unmount(mnt)
