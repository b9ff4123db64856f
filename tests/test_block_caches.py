"""The C readers' block caches (native/mmfs_readers.c) follow the threads alive, never
every thread that ever read: libfuse's multithreaded loop starts and ends worker threads
as load comes and goes, and a cache per thread kept after its thread ended grew a
daemon from 45 to 292 MB in two minutes. Counted (the daemon's counters, the C core's),
never timed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest
from tiny_blends import write_tiny_blend

from mmfs.megatron import open_corpus
from mmfs.mount.contract import XATTR_COUNTERS
from mmfs.mount.counters import block_caches
from mount_fixtures import mounted, samples, wait_for

pytest.importorskip("boto3")
pytest.importorskip("moto")

from test_s3 import proxy, server, write_configs  # noqa: E402, F401 - the fixtures, shared

WAVES, AT_ONCE = 40, 8


def test_caches_of_ended_threads_are_reused_not_made_again(tmp_path):
    """320 threads, 8 at a time, each reading samples through the pread path (every
    index entry through its thread's cache): when they have ended none holds a cache,
    and no more caches were made than threads ran at once."""
    config = write_tiny_blend(tmp_path, 6, documents=60)
    want = open_corpus(config, progress=False).splits["train"]
    want = [want.read(i) for i in range(len(want))]
    split = open_corpus(config, progress=False, map_limit_mb=0).splits["train"]
    before = block_caches()
    wrong = []

    def reader(k: int) -> None:
        for i in range(k % 7, len(want), 37):
            if split.read(i) != want[i]:
                wrong.append(i)

    for wave in range(WAVES):
        threads = [threading.Thread(target=reader, args=(wave * AT_ONCE + t,)) for t in range(AT_ONCE)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # A thread's cache is given back as its OS thread ends, just after join() returns.
        wait_for(lambda: block_caches()["held"] == before["held"], "the ended threads' caches given back")
    after = block_caches()
    assert not wrong
    assert after["made"] - before["made"] <= AT_ONCE  # 320 threads read; the first wave's caches served all
    assert after["pooled"] + after["held"] == after["made"] - after["freed"]


READERS = """
import sys, threading
def read(p):
    with open(p, "rb", buffering=0) as f:
        f.read()
threads = [threading.Thread(target=read, args=(p,)) for p in sys.argv[1:]]
[t.start() for t in threads]
[t.join() for t in threads]
"""


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def test_a_threaded_mount_holds_no_more_caches_than_it_has_threads(tmp_path, proxy):  # noqa: F811 - the fixture
    """The probe's case: a bucket mount (the threaded loop, its default) whose READs wait
    on a slow store (the proxy delays each request), waves of 24 readers at once: libfuse
    starts a thread for each READ waiting and ends all but 10 idle ones after each wave.
    After each wave the caches held are no more than the daemon's threads alive (counted
    in that order; a cache is taken only by a READ), and every cache made is held or
    pooled for the next thread, never lost: the count plateaus while threads come and go."""
    local, s3 = write_configs("p1_single_u16", tmp_path, proxy.url, prefetch=0)
    with mounted(local, tmp_path / "local") as a, mounted(s3, tmp_path / "s3", "-o", "map_limit_mb=0") as b:
        names = sorted(os.listdir(samples(a)))
        proxy.delay = 0.2  # READs pile up in the daemon, each on a thread of its own
        threads_seen = set()
        made = []
        waves = min(12, len(names) // 24)
        for wave in range(waves):
            paths = [str(samples(b) / name) for name in names[wave * 24:(wave + 1) * 24]]
            proc = subprocess.run([sys.executable, "-c", READERS, *paths], capture_output=True, text=True)
            assert proc.returncode == 0, proc.stderr
            threads_seen.update(os.listdir(f"/proc/{b.pid}/task"))
            alive = _threads(b.pid)
            caches = json.loads(os.getxattr(b.path, XATTR_COUNTERS))["block_caches"]
            assert caches["held"] <= alive, (wave, caches, alive)
            assert caches["held"] + caches["pooled"] + caches["freed"] == caches["made"]
            made.append(caches["made"])
        proxy.delay = 0
        # threads came and went (more were seen, at the ends of waves only, than caches made) ...
        assert len(threads_seen) > made[-1], (len(threads_seen), made)
        # ... and the caches did not follow them: at most a wave's readers, libfuse's 10 idle
        # threads and the last wave's threads still ending held one at once
        assert made[-1] <= 24 + 10 + 24, made
        for name in names[: waves * 24]:
            assert (samples(b) / name).read_bytes() == (samples(a) / name).read_bytes()
