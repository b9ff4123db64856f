"""A misbehaving store, through the fault proxy in front of the real S3-protocol
server (tests/s3_server.py): never a wrong byte, every wait bounded as documented
(mmfs.storage.remote.longest_wait), attempts counted once at the proxy, and the
connection pool never discarding a connection. Counts requests at the proxy;
times are only checked against the documented bound (and as hang guards)."""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("boto3")
pytest.importorskip("moto")

from test_s3 import proxy, server, write_configs  # noqa: E402, F401 - the fixtures, shared

from mmfs.storage.remote import longest_wait  # noqa: E402
from mmfs.storage.settings import StorageSettings  # noqa: E402
from mount_fixtures import mmfs, mounted  # noqa: E402

FAST = {"prefetch": 0, "retries": 1, "request_timeout": 1}  # a short bound: 2 attempts of 1 s
SLACK = 10.0  # seconds past the documented bound for a loaded machine (FUSE, the kernel's retry)


def bound(**storage) -> float:
    return longest_wait(StorageSettings(**{k: v for k, v in storage.items() if k in ("retries", "request_timeout")}))


def samples(mount) -> Path:
    return mount.path / "train" / "samples"


def read_errno(path: Path) -> tuple[int, float]:
    """(errno of reading the file, 0 if it read; seconds it took)."""
    t0 = time.monotonic()
    try:
        path.read_bytes()
        return 0, time.monotonic() - t0
    except OSError as exc:
        return exc.errno or -1, time.monotonic() - t0


def wait_for_log(mount, text: str, guard: float = 60.0) -> None:
    deadline = time.monotonic() + guard  # a hang guard, not a speed check
    while text not in mount.log.read_text():
        assert time.monotonic() < deadline, f"no {text!r} in the log"
        time.sleep(0.05)


def test_a_range_answered_with_other_bytes_of_its_length_is_eio_and_not_cached(tmp_path, proxy):  # noqa: F811 - the fixture
    local, s3 = write_configs("p1_single_u16", tmp_path, proxy.url, **FAST)
    with mounted(local, tmp_path / "local") as a, mounted(s3, tmp_path / "s3") as b:
        names = sorted(os.listdir(samples(a)))[10:16]
        proxy.inject("shift", count=10_000)  # 206, honest Content-Range, right length, wrong range
        for name in names:
            assert read_errno(samples(b) / name)[0] == 5  # EIO
        assert proxy.injected >= 2
        assert "not bytes" in b.log.read_text()
        proxy.inject(None)
        wait_for_log(b, "the store answers again")
        for name in names:  # fetched again: nothing of the wrong answers was kept
            assert (samples(b) / name).read_bytes() == (samples(a) / name).read_bytes()


def test_a_store_that_never_answers_fails_each_read_within_the_bound_and_comes_back(tmp_path, proxy):  # noqa: F811 - the fixture
    local, s3 = write_configs("p1_single_u16", tmp_path, proxy.url, **FAST)
    limit = bound(**FAST) + SLACK
    with mounted(local, tmp_path / "local") as a, mounted(s3, tmp_path / "s3") as b:
        names = sorted(os.listdir(samples(a)))
        cached = names[:3]
        for name in cached:
            assert (samples(b) / name).read_bytes() == (samples(a) / name).read_bytes()
        proxy.inject("hang", count=10_000)
        before = proxy.ranged_gets
        done = []
        hung = threading.Thread(target=lambda: done.append(read_errno(samples(b) / names[40])))
        hung.start()
        deadline = time.monotonic() + 60  # a hang guard: the hung read's request reaches the proxy
        while not proxy.injected:
            assert time.monotonic() < deadline, "the read's request never reached the store"
            time.sleep(0.02)
        for name in cached:  # the daemon answers other reads while one waits for the store
            assert (samples(b) / name).read_bytes() == (samples(a) / name).read_bytes()
        hung.join(limit + 30)
        assert done and done[0][0] == 5 and done[0][1] <= limit, done
        for name in names[41:61]:  # the store is known down: each read fails at once, asking nothing
            err, took = read_errno(samples(b) / name)
            assert err == 5 and took <= limit
        # the first read's attempts and a probe now and then: fewer than the 20 reads would ask
        assert proxy.ranged_gets - before < 20
        assert "has not answered since" in b.log.read_text()
        proxy.release()
        wait_for_log(b, "the store answers again")
        for name in names[40:61]:
            assert (samples(b) / name).read_bytes() == (samples(a) / name).read_bytes()


def test_a_body_trickled_a_byte_a_second_fails_within_the_bound_in_one_line(tmp_path, proxy):  # noqa: F811 - the fixture
    local, s3 = write_configs("p1_single_u16", tmp_path, proxy.url, **FAST)
    with mounted(local, tmp_path / "local") as a, mounted(s3, tmp_path / "s3") as b:
        name = sorted(os.listdir(samples(a)))[20]
        proxy.inject("trickle", count=10_000)
        err, took = read_errno(samples(b) / name)
        assert err == 5 and took <= bound(**FAST) + SLACK, (err, took)
        errors = [line for line in b.log.read_text().splitlines() if " ERROR " in line or " WARNING " in line]
        assert len(errors) == 1 and "no complete answer within 1 s" in errors[0], errors  # one line, no library's
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
        proxy.inject(fault, count=10_000, period=2)  # every other attempt fails: never 4 in a row
        for name in names:
            assert (samples(b) / name).read_bytes() == (samples(a) / name).read_bytes()
        answered = proxy.ranges  # the ranges the store answered (an injected failure is not listed)
        proxy.ranges = None
        assert len(answered) == len(set(answered))  # each range fetched once
        assert proxy.ranged_gets - before == len(answered) + proxy.injected  # one more attempt a failure
        assert proxy.injected > 10

        proxy.ranges = []
        before = proxy.ranged_gets
        proxy.inject(fault, count=10_000)  # every attempt fails: a read gives up after retries + 1
        documents = b.path / "datasets" / "u16_docs" / "documents"  # a document: one piece, one request
        assert read_errno(documents / sorted(os.listdir(documents))[-3])[0] == 5
        assert proxy.ranged_gets - before == 3 + 1  # botocore's retries inside ours no more
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
                assert read_errno(folder / mine[k])[0] == 5
        proxy.inject(None)
    errors = [line for line in b.log.read_text().splitlines() if " ERROR " in line]
    for name in ("u16_docs", "u16_small"):
        mine = [line for line in errors if f"s3://golden/data/{name}.bin" in line]
        assert len(mine) == 2, errors  # the first, and the count
        assert "AccessDenied (HTTP 403)" in mine[0] and "more reads failed the same way" not in mine[0]
        count = int(mine[1].split(" ERROR ", 1)[1].split(" more reads failed the same way in the last ")[0])
        assert count >= 19, mine[1]  # (a kernel's retry later than a second after its read counts too)
    assert len(errors) == 4, errors
