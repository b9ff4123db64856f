"""A misbehaving store, through the fault proxy in front of the real S3-protocol
server (tests/s3_server.py): never a wrong byte, every read that waits on the store
ended by the bound the code applies (its log line names it: the attempts and each
one's deadline), a store known down asked nothing but its probe, attempts counted
once at the proxy, and the connection pool never discarding a connection. No
duration is checked: what the code decided is read from the log and counted at the
proxy; a deadline only ends a test whose read truly hangs (a hang guard)."""

from __future__ import annotations

import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("boto3")
pytest.importorskip("moto")

from s3_server import FaultProxy  # noqa: E402
from test_s3 import proxy, server, write_configs  # noqa: E402, F401 - the fixtures, shared

from mmfs.mount.contract import XATTR_COUNTERS  # noqa: E402
from mount_fixtures import HANG_GUARD, mmfs, mounted, read_errno, samples, wait_for  # noqa: E402

FAST = {"prefetch": 0, "retries": 1, "request_timeout": 1}  # a short bound: 2 attempts of 1 s
# how a read under FAST that the store never completes ends: each attempt's deadline (the line of the
# piece that used both attempts says "(2 attempts)", that of another piece "has not answered since")
BOUND = "no complete answer within 1 s"
PROBE = "bytes=0-0"  # the Range of the probe of a store known down (a read asks for a sample's tokens: more)


def read_errno_guarded(path: Path) -> int:
    """read_errno in a thread of its own, failing the test (not hanging it) if the read never ends."""
    done: list[int] = []
    reader = threading.Thread(target=lambda: done.append(read_errno(path)), daemon=True)
    reader.start()
    reader.join(HANG_GUARD)
    assert done, f"reading {path} hangs: no answer after {HANG_GUARD:.0f} s (the bound was not applied)"
    return done[0]


def wait_for_log(mount, text: str) -> None:
    wait_for(lambda: text in mount.log.read_text(), f"the log line {text!r}")


def log_lines(mount, text: str) -> list[str]:
    return [line for line in mount.log.read_text().splitlines() if text in line]


def ranged_reads(seen: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """The ranged GETs among the requests the proxy saw, less the probes."""
    return [r for r in seen if r[0] == "GET" and r[2] and r[2] != PROBE]


def attempts(mount) -> int:
    """The attempts at ranges the daemon has made so far (its own count, user.mmfs.counters;
    a probe is not one)."""
    return sum(gate["attempts"] for gate in json.loads(os.getxattr(mount.path, XATTR_COUNTERS))["storage"])


def arrived(mount, at: FaultProxy, since: int) -> list[tuple[str, str, str]]:
    """The ranged GETs (less probes) proxy `at` saw since its `seen` was emptied, once it
    has seen every attempt the daemon made since its count was `since` (an attempt a
    deadline or an error answer ended may reach a busy proxy's thread after the read's EIO)."""
    made = attempts(mount) - since
    wait_for(lambda: len(ranged_reads(at.seen)) >= made, f"the daemon's {made} attempts reaching the proxy")
    return ranged_reads(at.seen)


def test_a_range_answered_with_other_bytes_of_its_length_is_eio_and_not_cached(tmp_path, proxy):  # noqa: F811 - the fixture
    local, s3 = write_configs("p1_single_u16", tmp_path, proxy.url, **FAST)
    with mounted(local, tmp_path / "local") as a, mounted(s3, tmp_path / "s3") as b:
        names = sorted(os.listdir(samples(a)))[10:16]
        proxy.inject("shift", count=10_000)  # 206, honest Content-Range, right length, wrong range
        for name in names:
            assert read_errno(samples(b) / name) == 5  # EIO
        assert proxy.injected >= 2
        assert "not bytes" in b.log.read_text()
        proxy.inject(None)
        wait_for_log(b, "the store answers again")
        for name in names:  # fetched again: nothing of the wrong answers was kept
            assert (samples(b) / name).read_bytes() == (samples(a) / name).read_bytes()


def test_a_store_that_never_answers_fails_each_read_by_the_bound_and_comes_back(tmp_path, proxy):  # noqa: F811 - the fixture
    local, s3 = write_configs("p1_single_u16", tmp_path, proxy.url, **FAST)
    with mounted(local, tmp_path / "local") as a, mounted(s3, tmp_path / "s3") as b:
        names = sorted(os.listdir(samples(a)))
        cached = names[:3]
        for name in cached:
            assert (samples(b) / name).read_bytes() == (samples(a) / name).read_bytes()
        since, proxy.seen = attempts(b), []
        proxy.inject("hang", count=10_000)
        done = []
        hung = threading.Thread(target=lambda: done.append(read_errno(samples(b) / names[40])), daemon=True)
        hung.start()
        wait_for(lambda: proxy.injected, "the hung read's request reaching the store")
        for name in cached:  # the daemon answers other reads while one waits for the store
            assert (samples(b) / name).read_bytes() == (samples(a) / name).read_bytes()
        hung.join(HANG_GUARD)
        assert done, f"the read of a store that never answers hangs past {HANG_GUARD:.0f} s: the bound was not applied"
        assert done[0] == 5, done  # EIO
        [ended] = log_lines(b, BOUND)  # what ended it: the attempts' deadline (and their count: below)
        assert f"/train/samples/{names[40]}" in ended, ended
        pieces = [r[2] for r in arrived(b, proxy, since)]  # each piece of it asked twice at most
        assert pieces and all(pieces.count(r) <= 2 for r in pieces), proxy.seen
        since, proxy.seen = attempts(b), []
        for name in names[41:61]:  # the store is known down: each read fails at once, asking nothing
            assert read_errno_guarded(samples(b) / name) == 5
        assert attempts(b) == since  # not one attempt (however long the reads took) ...
        asked, proxy.seen = list(proxy.seen), None
        assert ranged_reads(asked) == [], asked  # ... so the proxy saw only the probe's
        assert "has not answered since" in b.log.read_text()
        proxy.release()
        wait_for_log(b, "the store answers again")
        for name in names[40:61]:
            assert (samples(b) / name).read_bytes() == (samples(a) / name).read_bytes()


def test_a_body_trickled_a_byte_a_second_fails_by_the_bound_in_one_line(tmp_path, proxy):  # noqa: F811 - the fixture
    local, s3 = write_configs("p1_single_u16", tmp_path, proxy.url, **FAST)
    with mounted(local, tmp_path / "local") as a, mounted(s3, tmp_path / "s3") as b:
        name = sorted(os.listdir(samples(a)))[20]
        since, proxy.seen = attempts(b), []
        proxy.inject("trickle", count=10_000)
        assert read_errno_guarded(samples(b) / name) == 5  # EIO, not the whole body a byte a second
        asked, proxy.seen = arrived(b, proxy, since), None
        errors = [line for line in b.log.read_text().splitlines() if " ERROR " in line or " WARNING " in line]
        assert len(errors) == 1 and BOUND in errors[0], errors  # one line, no library's: the bound it applied
        # each piece of the read asked at most twice (an attempt and one retry), however slow the machine
        pieces = [r[2] for r in asked]
        assert pieces and all(pieces.count(r) <= 2 for r in pieces), asked
        proxy.release()
        wait_for_log(b, "the store answers again")
        assert (samples(b) / name).read_bytes() == (samples(a) / name).read_bytes()


@pytest.mark.parametrize("fault", ["503", "500"])
def test_storms_cost_one_attempt_per_failure_and_no_wrong_byte(tmp_path, proxy, fault):  # noqa: F811 - the fixture
    local, s3 = write_configs("p1_single_u16", tmp_path, proxy.url, prefetch=0, retries=3)
    with mounted(local, tmp_path / "local") as a, mounted(s3, tmp_path / "s3") as b:
        names = sorted(os.listdir(samples(a)))[::5][:20]
        proxy.ranges = []
        before = proxy.ranged_gets
        proxy.inject(fault, count=10_000, period=2)  # every other attempt at a range fails: never 4 in a row
        for name in names:
            assert (samples(b) / name).read_bytes() == (samples(a) / name).read_bytes()
        answered = proxy.ranges  # the ranges the store answered (an injected failure is not listed)
        proxy.ranges = None
        assert len(answered) == len(set(answered))  # each range fetched once
        assert proxy.ranged_gets - before == len(answered) + proxy.injected  # one more attempt a failure
        assert proxy.injected > 10
        if fault == "503":  # throttling on every attempt is no failure: test_s3_throttling.py
            return

        since, proxy.seen = attempts(b), []
        proxy.inject(fault, count=10_000)  # every attempt fails: a read gives up after retries + 1
        documents = b.path / "datasets" / "u16_docs" / "documents"  # a document: one piece, one request
        assert read_errno(documents / sorted(os.listdir(documents))[-3]) == 5
        assert attempts(b) - since == 3 + 1
        asked, proxy.seen = arrived(b, proxy, since), None  # (the probe of the store now down: not counted)
        assert len(asked) == 3 + 1 and len(set(asked)) == 1, asked  # botocore's retries inside ours no more
        proxy.inject(None)


def test_eight_readers_never_make_the_pool_discard_a_connection(tmp_path, proxy):  # noqa: F811 - the fixture
    max_requests = 4
    local, s3 = write_configs("p2_blend2_u16", tmp_path, proxy.url, prefetch=64 << 10, max_requests=max_requests)
    with mounted(local, tmp_path / "local") as a, mounted(s3, tmp_path / "s3") as b:
        ranks = sorted(os.listdir(a.path / "train" / "ranks"))

        def read_rank(rank: str) -> int:
            folder = Path("train") / "ranks" / rank
            wrong = 0
            for name in sorted(os.listdir(a.path / folder)):
                wrong += (b.path / folder / name).read_bytes() != (a.path / folder / name).read_bytes()
            return wrong

        with ThreadPoolExecutor(8) as pool:
            assert sum(pool.map(read_rank, ranks * 3)) == 0  # every byte the local mount's
        assert proxy.ranged_gets > 20
        # every connection the daemon opened stayed in its pool: never more than the
        # requests that can be in flight (a pool that discards opens one per request)
        assert proxy.connections <= 2 * max_requests + 16 + 4  # (+ the lookups' own, by boto3)


def test_a_remount_asks_one_head_per_object(tmp_path, proxy):  # noqa: F811 - the fixture
    """With the index copies current, a mount looks each object up once (a HEAD:
    its ETag says the copy is current) and fetches nothing else before a read."""
    local, s3 = write_configs("p2_blend2_u16", tmp_path, proxy.url)
    with mounted(s3, tmp_path / "first"):
        pass
    proxy.seen = []
    with mounted(s3, tmp_path / "again") as b:
        seen = list(proxy.seen)
        assert sorted(os.listdir(samples(b)))
    proxy.seen = None
    objects = [f"/golden/data/{name}{ext}" for name in ("u16_docs", "u16_small") for ext in (".idx", ".bin")]
    assert sorted(seen) == sorted(("HEAD", path, "") for path in objects)


def test_an_index_copy_is_checked_against_the_stores_checksum(tmp_path, proxy):  # noqa: F811 - the fixture
    """moto keeps the CRC32 boto3 sends with every upload: a copy of an .idx whose
    bytes changed on the way (right length) is fetched again, and refused if it
    changes again, in one line."""
    local, s3 = write_configs("p1_single_u16", tmp_path, proxy.url)
    proxy.match = ".idx"
    proxy.inject("flip", count=1)
    assert mmfs("build", s3, timeout=120).returncode == 0
    assert proxy.injected == 1
    [copy] = (tmp_path / "storage" / "objects").glob("*-u16_docs.idx")
    assert copy.read_bytes() == (tmp_path / "data" / "u16_docs.idx").read_bytes()
    copy.unlink()
    proxy.inject("flip", count=10_000)
    failed = mmfs("build", s3, timeout=120)
    assert failed.returncode == 2 and len(failed.stderr.strip().splitlines()) == 1, failed.stderr
    assert "CRC32 checksum" in failed.stderr
    assert not list((tmp_path / "storage" / "objects").glob("*-u16_docs.idx*"))


def test_reads_failing_one_way_are_folded_and_distinct_causes_each_logged(tmp_path, proxy):  # noqa: F811 - the fixture
    """Every ranged GET refused (403) while documents of two datasets are read: per
    object (a cause each) the first failed read in full, and one line with the count
    of the others (the interval made an hour: the count comes when the mount ends)."""
    local, s3 = write_configs("p2_blend2_u16", tmp_path, proxy.url, prefetch=0)
    with mounted(s3, tmp_path / "s3", "-o", "log_fold=3600") as b:
        folders = [b.path / "datasets" / name / "documents" for name in ("u16_docs", "u16_small")]
        names = [sorted(os.listdir(folder))[:20] for folder in folders]
        proxy.inject("deny", count=1 << 30)
        for k in range(20):
            for folder, mine in zip(folders, names):
                assert read_errno(folder / mine[k]) == 5
        proxy.inject(None)
    errors = [line for line in b.log.read_text().splitlines() if " ERROR " in line]
    for name in ("u16_docs", "u16_small"):
        mine = [line for line in errors if f"s3://golden/data/{name}.bin" in line]
        assert len(mine) == 2, errors  # the first, and the count
        assert "AccessDenied (HTTP 403)" in mine[0] and "more reads failed the same way" not in mine[0]
        count = int(mine[1].split(" ERROR ", 1)[1].split(" more reads failed the same way in the last ")[0])
        assert count >= 19, mine[1]  # (a kernel's retry later than a second after its read counts too)
    assert len(errors) == 4, errors
