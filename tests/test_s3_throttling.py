"""A store that throttles (503 SlowDown, as S3 answers when many nodes read at once):
fewer requests in flight and a backoff, every read served with its exact bytes while
the store answers some requests, and when it throttles every request, EIO after the
documented bound ((retries + 1) x request_timeout) with a line that says throttling,
the store never taken for down. Against the fault proxy in front of the real
S3-protocol server (tests/s3_server.py); what the code did is counted at the proxy, in
the daemon's counters and its log, never timed."""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("boto3")
pytest.importorskip("moto")

from test_s3 import proxy, server, write_configs  # noqa: E402, F401 - the fixtures, shared
from test_s3_faults import read_errno_guarded, wait_for_log  # noqa: E402

from mmfs.mount.contract import XATTR_COUNTERS  # noqa: E402
from mount_fixtures import mounted, samples  # noqa: E402

# retries: 0 -- a failed attempt is not asked again, so a read survives a throttled answer
# only because throttling is no failure; a long request_timeout: the bound on throttling
# (30 s here) is never what a read that the store answers in the end meets
PATIENT = {"prefetch": 0, "retries": 0, "request_timeout": 30}
SHORT = {"prefetch": 0, "retries": 0, "request_timeout": 1}  # throttled for 1 s at most


def gate_counters(mount) -> dict:
    [gate] = json.loads(os.getxattr(mount.path, XATTR_COUNTERS))["storage"]
    return gate


@pytest.mark.parametrize("period", [5, 2], ids=["1-in-5", "1-in-2"])
def test_a_store_throttling_some_requests_serves_every_read_exactly(tmp_path, proxy, period):  # noqa: F811
    """Every `period`-th attempt at each range answered 503 SlowDown (the first of
    each among them): every read succeeds with its exact bytes, the requests in flight
    were halved, and the store was never taken for down."""
    local, s3 = write_configs("p1_single_u16", tmp_path, proxy.url, **PATIENT)
    with mounted(local, tmp_path / "local") as a, mounted(s3, tmp_path / "s3") as b:
        names = sorted(os.listdir(samples(a)))[:60]
        proxy.inject("503", count=1 << 30, period=period)
        for name in names:
            assert (samples(b) / name).read_bytes() == (samples(a) / name).read_bytes(), name
        gate = gate_counters(b)
        assert proxy.injected >= len(names) // 2  # throttled at least once for most reads ...
        assert gate["overloads"] == proxy.injected and gate["cuts"] >= 1  # ... each counted, the limit cut
        log = b.log.read_text()
        assert "has not answered since" not in log and " ERROR " not in log, log[-2000:]


def test_a_store_throttling_every_request_fails_reads_by_the_bound_and_is_not_down(tmp_path, proxy):  # noqa: F811
    """Every attempt answered 503 SlowDown: each read is asked again with backoff until
    the bound ((0 + 1) x 1 s), then EIO with a line naming throttling; the store is not
    marked down (the next read asks it again), and once it stops throttling every read
    is served."""
    local, s3 = write_configs("p1_single_u16", tmp_path, proxy.url, **SHORT)
    with mounted(local, tmp_path / "local") as a, mounted(s3, tmp_path / "s3") as b:
        names = sorted(os.listdir(samples(a)))[:8]
        proxy.inject("503", count=1 << 30)
        for k, name in enumerate(names[:4]):
            before = proxy.injected
            assert read_errno_guarded(samples(b) / name) == 5  # EIO
            assert proxy.injected - before >= 2, k  # asked again, not failed at once: never down
        lines = [line for line in b.log.read_text().splitlines() if " ERROR " in line]
        assert lines and all("throttled: the store asked for fewer requests (SlowDown (HTTP 503)) for 1 s" in line
                             for line in lines if "folded" not in line and "more reads" not in line), lines
        assert "has not answered since" not in b.log.read_text()
        assert gate_counters(b)["limit"] == 1  # halved down to one request in flight
        proxy.inject(None)
        for name in names:
            assert (samples(b) / name).read_bytes() == (samples(a) / name).read_bytes(), name
        assert "the store answers again" not in b.log.read_text()  # it was never down


def test_a_store_that_refuses_connections_is_still_marked_down(tmp_path, proxy):  # noqa: F811
    """What marks the store down is left as it was: attempts that got no answer at all."""
    local, s3 = write_configs("p1_single_u16", tmp_path, proxy.url, **SHORT)
    with mounted(local, tmp_path / "local") as a, mounted(s3, tmp_path / "s3") as b:
        name = sorted(os.listdir(samples(a)))[30]
        proxy.down = True
        assert read_errno_guarded(samples(b) / name) == 5
        wait_for_log(b, "has not answered since")
        proxy.down = False
        wait_for_log(b, "the store answers again")
        assert (samples(b) / name).read_bytes() == (samples(a) / name).read_bytes()
