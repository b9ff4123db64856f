"""The range cache and the prefetcher under a whole node's load, against the real
S3-protocol server (moto on 127.0.0.1, through the counting proxy): the cache
folder on a small tmpfs that fills (not one wrong byte, the reads go on, one log
line), never above cache_limit while ranges are in flight, `streams/` prefetched
like the declared views, and one log line per failed read."""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import yaml

from mmfs.mount.fairshare import FairQueue
from mmfs.storage.rangecache import PAGE, RangeCache

DATA = np.random.default_rng(11).integers(0, 256, 4 << 20, dtype=np.uint8).tobytes()


@contextlib.contextmanager
def tmpfs(path: Path, size: int):
    """A tmpfs of `size` bytes at `path` (root only), unmounted on the way out."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def allocated(folder: Path) -> int:
    """Bytes the file system holds for the files under `folder` (du's count)."""
    total = 0
    for d, _, names in os.walk(folder):
        for n in names:
            with contextlib.suppress(FileNotFoundError):
                total += os.stat(os.path.join(d, n)).st_blocks * 512
    return total


def exact(offset: int, buffer: memoryview) -> None:
    buffer[:] = DATA[offset : offset + len(buffer)]


def hammer(cache: RangeCache, threads: int, reads: int, fetch=exact, span: int = 20000) -> int:
    """`threads` readers reading random ranges at once; the count of wrong bytes."""
    wrong = [0] * threads

    def reader(k: int) -> None:
        rng = np.random.default_rng(k)
        for _ in range(reads):
            lo, n = int(rng.integers(0, len(DATA) - span)), int(rng.integers(1, span))
            buf = bytearray(n)
            assert cache.read("obj", len(DATA), lo, memoryview(buf), fetch) == n
            want = np.frombuffer(DATA[lo : lo + n], np.uint8)
            wrong[k] += int(np.count_nonzero(np.frombuffer(buf, np.uint8) != want))

    pool = [threading.Thread(target=reader, args=(k,)) for k in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return sum(wrong)


# -- the range cache on its own ------------------------------------------------------


def test_a_full_disk_never_caches_bytes_it_did_not_store(tmp_path, caplog):
    """A 1 MiB tmpfs under a 64 MiB limit: writes fail short or with ENOSPC; those
    ranges stay uncached, every read is served from the fetched bytes, the cache
    shrinks below what fits, and says so once."""
    with tmpfs(tmp_path / "disk", 1 << 20) as disk, caplog.at_level(logging.WARNING):
        cache = RangeCache(str(disk / "ranges"), 64 << 20)
        assert hammer(cache, 8, 400) == 0
        assert cache.limit < 1 << 20  # shrunk to what the disk holds
        assert hammer(cache, 8, 200) == 0  # and reads go on, from the cache too
        assert cache.on_disk and cache.cached_bytes > 0
        assert allocated(disk) <= cache.limit
        lines = [r.getMessage() for r in caplog.records if "ranges" in r.getMessage()]
        assert len(lines) == 1 and "the disk is full" in lines[0], lines
        cache.close()


def test_a_disk_with_no_room_at_all_turns_the_cache_off(tmp_path, caplog):
    with tmpfs(tmp_path / "disk", 64 << 10) as disk, caplog.at_level(logging.WARNING):
        cache = RangeCache(str(disk / "ranges"), 64 << 20)
        assert hammer(cache, 4, 200) == 0
        assert not cache.on_disk and cache.cached_bytes == 0
        assert allocated(disk) == 0
        assert hammer(cache, 4, 50) == 0  # every read fetched for itself
        assert len([r for r in caplog.records if "without a disk cache" in r.getMessage()]) == 1


def test_a_write_error_leaves_the_range_uncached_and_the_cache_off(tmp_path, caplog):
    """Any error but a full disk (here EBADF: the data file is open read-only) turns
    the disk cache off; the read that hit it is served from its fetched bytes."""
    cache = RangeCache(str(tmp_path / "ranges"), 1 << 20)
    buf = bytearray(100)
    cache.read("obj", len(DATA), 0, memoryview(buf), exact)  # makes the object's file
    obj = cache._objects["obj"]
    writable, obj.fd = obj.fd, os.open(os.path.join(cache.folder, "0.data"), os.O_RDONLY)
    os.close(writable)
    with caplog.at_level(logging.WARNING):
        got = bytearray(5000)
        cache.read("obj", len(DATA), 10000, memoryview(got), exact)
        assert got == DATA[10000:15000]
        assert not cache.on_disk and cache.cached_bytes == 0
        assert hammer(cache, 2, 50) == 0
    [line] = [r.getMessage() for r in caplog.records]
    assert "cannot write the cache folder" in line and os.strerror(errno.EBADF) in line


def test_ranges_in_flight_are_counted_in_the_limit(tmp_path):
    """Every range is reserved before it is written: sampled while 8 readers read,
    neither the cache's own count nor the disk is ever above the limit."""
    limit = 24 * PAGE
    gate = threading.Event()
    samples: list[tuple[int, int]] = []

    def slow(offset: int, buffer: memoryview) -> None:
        samples.append((cache.cached_bytes + cache.reserved_bytes, allocated(tmp_path / "disk")))
        gate.wait(0.001)
        exact(offset, buffer)

    with tmpfs(tmp_path / "disk", 16 << 20) as disk:
        cache = RangeCache(str(disk / "ranges"), limit)
        assert hammer(cache, 8, 300, fetch=slow, span=9000) == 0
        assert cache.peak_bytes <= limit
        assert max(s for s, _ in samples) <= limit
        assert max(d for _, d in samples) <= limit
        assert allocated(disk) <= limit



# -- the prefetcher's fair queue -------------------------------------------------------


def handed_out(q: FairQueue, n: int) -> list[tuple[str, int]]:
    return [q.get() for _ in range(n)]


def test_ranks_waiting_together_are_served_in_turn():
    """Rank 0 queued its whole window before rank 1 asked: they still take turns
    (a FIFO would serve rank 0's ten first)."""
    q = FairQueue()
    for j in range(10):
        q.put("rank0", 100, j)
    for j in range(10):
        q.put("rank1", 100, j)
    assert handed_out(q, 6) == [("rank0", 0), ("rank1", 0), ("rank0", 1), ("rank1", 1), ("rank0", 2), ("rank1", 2)]


def test_a_rank_that_fell_behind_is_served_first():
    """Rank 1's reader has read 300 bytes, rank 0's 1,000: rank 1's files go first
    until it has caught up, then they alternate."""
    q = FairQueue()
    for j in range(10):
        q.put("rank0", 100, j)
    for j in range(3):
        q.put("rank1", 100, j)
    handed_out(q, 13)
    for j in range(10, 16):
        q.put("rank0", 100, j)
    for j in range(3, 13):
        q.put("rank1", 100, j)
    order = [view for view, _ in handed_out(q, 16)]
    assert order[:7] == ["rank1"] * 7
    assert order[7:13] == ["rank0", "rank1"] * 3


def test_fetches_go_in_proportion_to_what_each_reads():
    """While both wait, each view is given the same bytes: a view of 2 KB files gets
    one file for every two of a view of 1 KB files."""
    q = FairQueue()
    for j in range(20):
        q.put("big", 2000, j)
        q.put("small", 1000, j)
    given = {"big": 0, "small": 0}
    for view, _ in handed_out(q, 30):
        given[view] += 2000 if view == "big" else 1000
        assert abs(given["big"] - given["small"]) <= 2000
    assert q.given == given


def test_a_reader_that_starts_late_gets_no_credit_for_its_idle_time():
    q = FairQueue()
    for j in range(20):
        q.put("early", 100, j)
    handed_out(q, 10)
    for j in range(5):
        q.put("late", 100, j)
    order = [view for view, _ in handed_out(q, 6)]
    assert order.count("late") == 3, order  # in turn with the early one, not all five first


def test_a_jump_takes_the_view_s_waiting_files_out():
    q = FairQueue()
    for j in range(5):
        q.put("a", 100, j)
        q.put("b", 100, j)
    handed_out(q, 4)
    assert q.drop("a") == [2, 3, 4]
    q.put("a", 100, 40)
    assert q.waiting()[0] == ("a", 40)  # from the tag last handed out: before b's waiting three
    assert q.given == {"a": 200, "b": 200}



def test_the_prefetcher_queues_a_rank_that_fell_behind_first(tmp_path):
    """The planner's own decisions, for the 8 ranks of a mount (nothing fetched: no
    worker runs): rank 0's reader is at file 9, rank 1's at file 3; rank 1's next
    files wait before any of rank 0's, although rank 0 asked first."""
    from golden_cases import write_case_config
    from mmfs.megatron import open_corpus
    from mmfs.mount.fuse import view_finder
    from mmfs.mount.prefetch import Prefetcher
    from mmfs.mount.tree import Tree

    config = write_case_config("p1_single_u16", tmp_path)
    cfg = yaml.safe_load(config.read_text())
    cfg["training"] = {"data_parallel_size": 8, "micro_batch_size": 1}
    config.write_text(yaml.safe_dump(cfg))
    find = view_finder(Tree(open_corpus(str(config), progress=False)))
    ahead, behind = "/train/ranks/000", "/train/ranks/001"
    prefetcher = Prefetcher(find, prefetch=1 << 20, max_requests=4)
    for j in range(10):
        prefetcher._advance(ahead, find(ahead), j)
    for j in range(4):
        prefetcher._advance(behind, find(behind), j)
    reading = {ahead: 9, behind: 3}
    order = [(view, j) for view, (_, j, *_) in prefetcher.queue.waiting() if j > reading[view]]  # (passed: skipped)
    views = [view for view, _ in order]
    assert behind in views and ahead in views
    assert views == sorted(views, key=lambda v: v != behind), order  # every file of rank 1 first
    assert [j for view, j in order if view == behind] == sorted(j for view, j in order if view == behind)


# -- through a mount, from the real S3-protocol server -------------------------------

pytest.importorskip("boto3")
pytest.importorskip("moto")

from s3_server import FaultProxy, MotoServer, use_test_credentials  # noqa: E402
from test_s3 import covered, span, wait_for  # noqa: E402

from mount_fixtures import mounted  # noqa: E402

BUCKET = "node"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """A 1.5 MB uint16 dataset on local disk and in the bucket."""
    from mmfs.formats.writer import IndexedDatasetWriter

    folder = tmp_path_factory.mktemp("node") / "data"
    folder.mkdir()
    rng = np.random.default_rng(23)
    with IndexedDatasetWriter(str(folder / "toks.bin"), dtype=np.uint16) as w:
        for n in rng.integers(100, 1400, 1000):
            w.add_item(rng.integers(0, 50000, int(n), dtype=np.uint16))
            w.end_document()
        w.finalize(str(folder / "toks.idx"))
    server = MotoServer()
    for name in ("toks.bin", "toks.idx"):
        server.put(BUCKET, f"data/{name}", (folder / name).read_bytes())
    yield server, folder
    server.stop()


@pytest.fixture
def proxy(dataset, monkeypatch):
    use_test_credentials(monkeypatch)
    p = FaultProxy(dataset[0].port)
    yield p
    p.close()


def configs(tmp_path: Path, folder: Path, endpoint: str, cache: Path, **storage) -> tuple[Path, Path]:
    """(local config, the same dataset from the bucket), 8 ranks of micro-batches of 2."""
    (tmp_path / "data").symlink_to(folder, target_is_directory=True)
    base = {"split": "100,0,0", "sequence_length": 128, "tokenizer": {"eod": 0, "pad": None},
            "training": {"data_parallel_size": 8, "micro_batch_size": 2, "global_batch_size": 16}}
    local = tmp_path / "local.yaml"
    local.write_text(yaml.safe_dump({**base, "datasets": [{"path": "data/toks"}], "cache_dir": "c1"}))
    remote = tmp_path / "s3.yaml"
    remote.write_text(yaml.safe_dump({**base, "datasets": [{"path": f"s3://{BUCKET}/data/toks"}],
                                      "cache_dir": "c2", "storage": {"endpoint_url": endpoint,
                                                                     "cache_dir": str(cache), **storage}}))
    return local, remote


STREAM = "train/streams/dp=4,mbs=2,from=8/001"


def pieces_of(config: Path, folder: str, count: int) -> list[list[tuple[str, int, int]]]:
    """(object path, first byte, end) of what reading each of the first `count` files of
    `folder` (a stream layout's too) in a mount of `config` needs, as the C core notes
    it (in this process, fetching nothing)."""
    from mmfs.megatron import open_corpus
    from mmfs.megatron.arrays import noted_fetches
    from mmfs.mount.fuse import view_finder
    from mmfs.mount.tree import Tree

    tree = Tree(open_corpus(str(config), progress=False))
    tree.lookup("/" + folder)  # (a stream layout is made when first looked up)
    registry, view = view_finder(tree)("/" + folder)
    out = []
    for j in range(count):
        with noted_fetches() as wanted:
            registry.read(view, j, 0, registry.size(view, j))
        out.append([("/" + s.url.split("://", 1)[1], o, o + n) for s, o, n in wanted])
    return out


def answered(proxy: FaultProxy) -> dict[str, list[tuple[int, int]]]:
    """The byte ranges [lo, hi) of every ranged GET the store has answered (not one
    the proxy refused), by object path."""
    out: dict[str, list[tuple[int, int]]] = {}
    for path, rng in list(proxy.ranges or ()):
        out.setdefault(path, []).append(span(rng))
    return out


@pytest.mark.parametrize("folder", ["train/ranks/003", STREAM])
def test_every_view_is_prefetched_streams_too(tmp_path, proxy, dataset, folder):
    """After a file of a view is read, the next one is fetched ahead: once the store
    has answered the window's requests for its bytes (counted at the proxy: what the
    test waits for, whatever the machine's speed), it reads while the store refuses
    every ranged GET."""
    local, s3 = configs(tmp_path, dataset[1], proxy.url, tmp_path / "storage", prefetch=64 << 10, retries=0)
    proxy.ranges = []
    with mounted(local, tmp_path / "local") as a, mounted(s3, tmp_path / "s3") as b:
        names = sorted(os.listdir(a.path / folder))[:24]
        assert len(names) == 24
        pieces = pieces_of(s3, folder, len(names))
        # each pair after a jump back, so the window starts again at file k whatever it grew
        # to before: a reader that catches up with a fetch in flight doubles it, and the files
        # it then asks for while the store refuses fail and are not asked again by the window
        # (their reader fetches them itself), so going on forwards could meet such a file
        for k in reversed(range(0, len(names), 6)):
            assert (b.path / folder / names[k]).read_bytes() == (a.path / folder / names[k]).read_bytes()
            wait_for(lambda k=k: covered(pieces[k + 1], answered(proxy)), f"the window fetches file {k + 1}")
            proxy.inject("deny", count=1 << 30)  # every ranged GET refused (403): EIO unless fetched
            try:
                assert (b.path / folder / names[k + 1]).read_bytes() == (a.path / folder / names[k + 1]).read_bytes()
            finally:
                proxy.inject(None)


def test_a_failed_read_is_one_log_line(tmp_path, proxy, dataset):
    """Each failed read of a file is one line (the object, the bytes, why, and the
    file and sample it was), not one from the fetch and one from the read, and the
    kernel's retry of the same read adds none (folding of reads that fail the same
    way off: tests/test_log_fold.py)."""
    local, s3 = configs(tmp_path, dataset[1], proxy.url, tmp_path / "storage", prefetch=64 << 10,
                        retries=0, request_timeout=2)
    files = [f"train/ranks/002/{k:07d}.bin" for k in (0, 1, 5)] + [f"{STREAM}/{k:07d}.bin" for k in (0, 3)]
    with mounted(s3, tmp_path / "s3", "-o", "log_fold=0") as b:
        assert (b.path / "train/samples/0000000.bin").read_bytes()
        start = len(b.log.read_text().splitlines())
        proxy.inject("deny", count=1 << 30)  # every ranged GET refused (403)
        for name in files:
            with pytest.raises(OSError) as failed:
                (b.path / name).read_bytes()
            assert failed.value.errno == errno.EIO
        proxy.inject(None)
    lines = b.log.read_text().splitlines()[start:]  # all of them: the daemon has ended
    errors = [line for line in lines if "ERROR" in line]
    assert len(errors) == len(files), "\n".join(lines)
    for name, line in zip(files, errors):
        assert name in line and f"s3://{BUCKET}/data/toks.bin" in line, line


def read_ranks(local: Path, remote: Path, ranks: int = 8, files: int = 80,
               after_each: Callable[[], None] | None = None) -> tuple[int, list[str]]:
    """The first `files` files of ranks/000..: one reader thread per rank at once;
    (wrong files, errors). `after_each()` runs in a reader after each file it read."""
    wrong, errors = [0] * ranks, []

    def reader(rank: int) -> None:
        folder = f"train/ranks/{rank:03d}"
        for name in sorted(os.listdir(local / folder))[:files]:
            try:
                wrong[rank] += (remote / folder / name).read_bytes() != (local / folder / name).read_bytes()
            except OSError as exc:
                errors.append(f"{folder}/{name}: {exc}")
            if after_each is not None:
                after_each()

    pool = [threading.Thread(target=reader, args=(r,)) for r in range(ranks)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return sum(wrong), errors


def test_a_cache_disk_that_fills_serves_every_byte_right(tmp_path, proxy, dataset):
    """The cache folder on a 1 MiB tmpfs, cache_limit 64 MiB, 8 readers: not one
    wrong byte, no failed read, and one line in the log."""
    with tmpfs(tmp_path / "disk", 1 << 20) as disk:
        local, s3 = configs(tmp_path, dataset[1], proxy.url, disk, cache_limit="64MiB", prefetch=256 << 10)
        with mounted(local, tmp_path / "local") as a, mounted(s3, tmp_path / "s3") as b:
            for _ in range(2):  # filling, then full
                assert read_ranks(a.path, b.path) == (0, [])
            assert allocated(disk) <= 1 << 20
        log = b.log.read_text()
    assert len([line for line in log.splitlines() if "ranges" in line and "WARNING" in line]) == 1, log
    assert "the disk is full" in log or "without a disk cache" in log
    assert "ERROR" not in log


def test_the_cache_folder_stays_under_its_limit_while_8_ranks_read(tmp_path, proxy, dataset):
    """While 8 readers read (and the prefetcher fetches ahead of each), the allocated
    blocks of the range folder, measured after every file a reader reads (640 times,
    whatever the machine's speed), never pass cache_limit; the cache's own counters
    (`user.mmfs.counters`) say the limit was reached: ranges were dropped to make room,
    and never more than the limit was cached and reserved at once. Each rank's window
    was served from the fair queue."""
    limit = 1 << 20
    with tmpfs(tmp_path / "disk", 16 << 20) as disk:
        local, s3 = configs(tmp_path, dataset[1], proxy.url, disk, cache_limit=limit, prefetch=256 << 10)
        proxy.delay = 0.005  # a store that takes its time: ranges stay reserved while in flight
        with mounted(local, tmp_path / "local") as a, mounted(s3, tmp_path / "s3") as b:
            samples: list[int] = []
            assert read_ranks(a.path, b.path, after_each=lambda: samples.append(allocated(disk / "ranges"))) == (0, [])
            [ranges] = json.loads(os.getxattr(b.path, "user.mmfs.counters"))["ranges"]
        log = b.log.read_text()
    assert len(samples) == 8 * 80 and max(samples) <= limit, max(samples)
    assert ranges["limit"] == limit and ranges["on_disk"], ranges
    assert ranges["dropped"] > 0 and ranges["peak"] <= limit, ranges  # the limit was reached, and held
    given = json.loads(log.split("bytes per view: ", 1)[1].splitlines()[0])
    assert sorted(given) == [f"/train/ranks/{r:03d}" for r in range(8)], given
