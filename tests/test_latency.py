"""The daemon's PM QoS request: taken on a request, written as 0, dropped when idle."""

import os
import time

from mmfs.mount.latency import LatencyGuard


def _open_fds_to(path) -> int:
    target = os.path.realpath(path)
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}") == target
        except OSError:
            pass
    return count


def test_guard_holds_while_touched_and_releases_when_idle(tmp_path):
    device = tmp_path / "qos"
    device.write_bytes(b"")
    # idle: far longer than a busy machine takes between a touch and the next line
    guard = LatencyGuard(enabled=True, device=str(device), idle=1.0)
    try:
        assert guard.enabled and not guard.held
        guard.touch()
        assert guard.held and _open_fds_to(device) == 1
        assert device.read_bytes() == b"\0\0\0\0"
        for _ in range(5):  # touches keep it
            time.sleep(0.06)
            guard.touch()
            assert guard.held
        deadline = time.monotonic() + 30
        while guard.held and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not guard.held and _open_fds_to(device) == 0
        guard.touch()  # taken again on the next request
        assert guard.held
    finally:
        guard.close()
    assert not guard.held and _open_fds_to(device) == 0


def test_guard_is_off_without_access(tmp_path):
    guard = LatencyGuard(enabled=True, device=str(tmp_path / "missing"))
    assert not guard.enabled
    guard.touch()
    assert not guard.held
    guard.close()
