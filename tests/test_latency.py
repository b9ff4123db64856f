"""The daemon's PM QoS request: taken on a request, written as 0, dropped when idle."""

import os

from mmfs.mount.latency import LatencyGuard
from mount_fixtures import wait_for


def _open_fds_to(path) -> int:
    target = os.path.realpath(path)
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}") == target
        except OSError:
            pass
    return count


def _at(guard: LatencyGuard, seconds: float) -> None:
    """Set the guard's clock to `seconds` and wait until its releaser has looked at that time."""
    before = guard.set_clock(seconds)
    wait_for(lambda: guard.checks > before, "the releaser looking at the time")


def test_guard_holds_while_touched_and_releases_when_idle(tmp_path):
    device = tmp_path / "qos"
    device.write_bytes(b"")
    guard = LatencyGuard(enabled=True, device=str(device), idle=1.0)
    try:
        assert guard.enabled and not guard.held
        guard.set_clock(100.0)  # the guard's time is what the test sets: no pause of a busy machine counts
        guard.touch()
        assert guard.held and _open_fds_to(device) == 1
        assert device.read_bytes() == b"\0\0\0\0"
        for now in (100.999, 101.998, 102.997):  # touches keep it: each just under a second after the last
            _at(guard, now)
            assert guard.held and _open_fds_to(device) == 1
            guard.touch()
        _at(guard, 103.996)  # 0.999 s idle: held
        assert guard.held and _open_fds_to(device) == 1
        _at(guard, 103.997)  # 1 s idle: dropped
        assert not guard.held and _open_fds_to(device) == 0
        guard.touch()  # taken again on the next request
        assert guard.held and _open_fds_to(device) == 1
    finally:
        guard.close()
    assert not guard.held and _open_fds_to(device) == 0


def test_guard_is_off_without_access(tmp_path):
    guard = LatencyGuard(enabled=True, device=str(tmp_path / "missing"))
    assert not guard.enabled
    guard.touch()
    assert not guard.held
    guard.close()
