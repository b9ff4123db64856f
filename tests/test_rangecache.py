"""The range cache under the S3 reader: exact bytes, only the missing ranges
fetched, one fetch for concurrent readers of a range, and the disk under the limit
counted in the pages the file system really holds."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from mmfs.storage.rangecache import PAGE, RangeCache

DATA = np.random.default_rng(5).integers(0, 256, 1 << 20, dtype=np.uint8).tobytes()


class Origin:
    """The object's bytes and a record of the ranges asked for."""

    def __init__(self, delay: float = 0.0, fail: int = 0) -> None:
        self.asked: list[tuple[int, int]] = []
        self.delay = delay
        self.fail = fail
        self.lock = threading.Lock()

    def fetch(self, offset: int, buffer: memoryview) -> None:
        with self.lock:
            self.asked.append((offset, offset + len(buffer)))
            failing = self.fail > 0
            self.fail -= failing
        time.sleep(self.delay)
        if failing:
            raise OSError(5, "injected")
        buffer[:] = DATA[offset : offset + len(buffer)]


def read(cache: RangeCache, origin: Origin, offset: int, n: int) -> bytes:
    buf = bytearray(n)
    got = cache.read("obj", len(DATA), offset, memoryview(buf), origin.fetch)
    return bytes(buf[:got])


def disk(folder) -> int:
    return sum(os.stat(os.path.join(d, f)).st_blocks * 512 for d, _, fs in os.walk(folder) for f in fs)


def test_only_the_gaps_are_fetched(tmp_path):
    cache, origin = RangeCache(str(tmp_path / "c"), 1 << 30), Origin()
    assert read(cache, origin, 100, 50) == DATA[100:150]
    assert read(cache, origin, 120, 100) == DATA[120:220]
    assert read(cache, origin, 90, 200) == DATA[90:290]
    assert origin.asked == [(100, 150), (150, 220), (90, 100), (220, 290)]
    assert read(cache, origin, len(DATA) - 10, 100) == DATA[-10:]  # the end of the object
    assert read(cache, origin, len(DATA), 10) == b""
    cache.close()
    assert not (tmp_path / "c").exists()


def test_readers_of_one_range_share_its_fetch(tmp_path):
    cache, origin = RangeCache(str(tmp_path / "c"), 1 << 30), Origin(delay=0.2)
    out = []
    threads = [threading.Thread(target=lambda: out.append(read(cache, origin, 4000, 3000)))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out == [DATA[4000:7000]] * 4
    assert origin.asked == [(4000, 7000)]


def test_a_failed_fetch_raises_and_the_next_read_fetches_again(tmp_path):
    cache, origin = RangeCache(str(tmp_path / "c"), 1 << 30), Origin(fail=1)
    with pytest.raises(OSError):
        read(cache, origin, 0, 100)
    assert read(cache, origin, 0, 100) == DATA[:100]


@pytest.mark.parametrize("size", [100, 3000, 9000])
def test_the_disk_stays_under_the_limit_in_pages(tmp_path, size):
    limit = 64 * PAGE
    cache, origin = RangeCache(str(tmp_path / "c"), limit), Origin()
    rng = np.random.default_rng(size)
    peak = 0
    for offset in rng.integers(0, len(DATA) - size, 2000):
        assert read(cache, origin, int(offset), size) == DATA[offset : offset + size]
        peak = max(peak, disk(tmp_path / "c"))
    assert limit // 2 < peak <= limit
    assert cache.cached_bytes <= limit
    counted = cache.counters()  # as the mount's user.mmfs.counters gives them
    assert counted["dropped"] > 0 and counted["cached"] <= counted["peak"] <= limit, counted
    assert counted["requests"] == len(origin.asked) and counted["fetched"] == sum(b - a for a, b in origin.asked)


def test_concurrent_reads_under_a_tiny_limit_are_exact(tmp_path):
    """Ranges sharing pages are fetched, kept and dropped by many threads at once:
    dropping one never punches out the page of a neighbour whose bytes are written
    but not yet recorded as cached (that read back as zeros)."""
    cache, origin = RangeCache(str(tmp_path / "c"), 3 * PAGE), Origin()
    wrong = []

    def reader(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(1500):
            lo = int(rng.integers(0, 16 * PAGE))
            n = int(rng.integers(1, 400))
            if read(cache, origin, lo, n) != DATA[lo : lo + n]:
                wrong.append((lo, n))

    threads = [threading.Thread(target=reader, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []
