"""What a read of a file costs in FUSE requests, counted by the daemon itself
(`user.mmfs.counters` on the mount's root), and how many READs the kernel sends it
at once (the connection's max_background). Counts, never durations."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from golden_cases import write_case_config
from mmfs.mount.contract import XATTR_COUNTERS
from mmfs.mount.fuse import CONGESTION_THRESHOLD, MAX_BACKGROUND
from mount_fixtures import HANG_GUARD, mounted

FILES = 20


def counters(mount) -> dict:
    return json.loads(os.getxattr(mount.path, XATTR_COUNTERS))


def requests_for(mount, read) -> dict[str, int]:
    """The requests the daemon was sent while `read()` ran, by kind, less the
    counters' own (one or two GETXATTRs of the root)."""
    before = counters(mount)["requests"]
    read()
    after = counters(mount)["requests"]
    spent = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
    spent.pop("getxattr", None)
    return spent


def python_open(paths: list[Path]) -> None:
    for path in paths:
        with open(path, "rb") as f:  # buffered: Python asks isatty, an ioctl
            f.read()


def os_read(paths: list[Path]) -> None:
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.read(fd, 1 << 20)
        finally:
            os.close(fd)


def test_a_cold_file_costs_a_lookup_and_a_read_and_python_adds_an_ioctl_per_open(tmp_path):
    config = write_case_config("p2_blend2_u16", tmp_path)
    with mounted(config, tmp_path / "mnt") as m:
        folder = m.path / "train" / "samples"
        names = sorted(os.listdir(folder))
        assert len(names) >= 3 * FILES
        first = [folder / n for n in names[:FILES]]
        second = [folder / n for n in names[FILES:2 * FILES]]
        cold = requests_for(m, lambda: python_open(first))
        assert cold.pop("open", 0) <= 1  # answered ENOSYS once: the kernel sends no OPEN after it
        assert cold == {"getattr": FILES, "read": FILES, "ioctl": FILES}
        # again: names, attributes and bytes are the kernel's now; only the ioctl still asks
        assert requests_for(m, lambda: python_open(first)) == {"ioctl": FILES}
        assert requests_for(m, lambda: os_read(second)) == {"getattr": FILES, "read": FILES}
        assert requests_for(m, lambda: os_read(second)) == {}
        assert os.listxattr(m.path) == [XATTR_COUNTERS]


pytest.importorskip("boto3")
pytest.importorskip("moto")

from test_s3 import proxy, recording, server, wait_for, write_configs  # noqa: E402, F401 - the fixtures, shared

READERS = 24  # more than the kernel's default max_background (12)


def test_the_daemon_takes_more_reads_at_once_than_the_kernels_default_background_cap(tmp_path, recording):  # noqa: F811
    """24 readers of cold files of a bucket mount, every fetch held at the proxy until
    the daemon has more than 12 READs (the kernel's default max_background) in it
    together: the event waited for, whatever the machine's speed (a kernel that sends
    no more than 12 never gets there: the hang guard fails the test); where fusectl is
    mounted, the connection shows mmfs's max_background."""
    _, s3 = write_configs("p1_single_u16", tmp_path, recording.url, prefetch=0)
    with mounted(s3, tmp_path / "s3") as m:
        folder = m.path / "train" / "samples"
        paths = [folder / n for n in sorted(os.listdir(folder))[:READERS]]
        recording.hold = lambda path, rng: True  # every fetch waits: the READs pile up in the daemon
        readers = [threading.Thread(target=python_open, args=([p],)) for p in paths]
        for t in readers:
            t.start()
        try:
            wait_for(lambda: counters(m)["reads_at_once"] > 12, "more than 12 READs in the daemon at once")
        finally:
            recording.let_go()
            for t in readers:
                t.join(HANG_GUARD)
        assert not any(t.is_alive() for t in readers), f"a read hangs past {HANG_GUARD:.0f} s"
        connection = Path(f"/sys/fs/fuse/connections/{os.stat(m.path).st_dev}")
        if connection.exists():  # (only where fusectl is mounted)
            assert int((connection / "max_background").read_text()) == MAX_BACKGROUND
            assert int((connection / "congestion_threshold").read_text()) == CONGESTION_THRESHOLD
