"""What every benchmark of mmfs shares: reader processes that open, read and
close files as a data loader does, passes that take turns slice by slice (so
that a noisy neighbour slows every method alike), dropping files from the page
cache, and a process's memory."""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mmfs.errors import MmfsError

log = logging.getLogger(__name__)

MB = 1e6


@dataclass
class Row:
    method: str
    order: str
    readers: int
    phase: str  # "cold" | "warm"
    samples: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else float("inf")


def single_threaded_libraries() -> None:
    """Math libraries' worker threads spin after each call; on a small machine
    they would take the CPU the daemon needs. Every reader here is
    single-threaded: set before torch (megatron-core) is imported, and
    inherited by the reader processes."""
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")


def read_files(paths: Sequence[str], size: int) -> int:
    """Open, read `size` bytes of and close each file, as a data loader does."""
    total = 0
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            total += len(os.read(fd, size))
        finally:
            os.close(fd)
    return total


def read_one(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


# Set when the benchmark was told to stop (a signal: mmfs/tools/bench.py). Its handler
# raises KeyboardInterrupt too, except while run_parallel starts its readers (`starting`:
# raised there, in a fork's handlers or between a fork and the note of its child, it
# would be lost or leave a reader behind): run_parallel looks here once they are started,
# and after they ran.
stopping = threading.Event()
starting = False


def check_stop() -> None:
    if stopping.is_set():
        raise KeyboardInterrupt


def _worker(fn: Callable[[Any], int], chunk: Any, start: Any, conn: Any) -> None:
    # Ctrl-C at a terminal reaches the whole group: the parent ends its readers (no
    # traceback of each); SIGTERM, as the parent sends it, ends one at once.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    start.wait()
    t0 = time.perf_counter()
    n = fn(chunk)
    conn.send((n, time.perf_counter() - t0))
    conn.close()


def run_parallel(fn: Callable[[Any], int], chunks: list[Any]) -> float:
    """Run fn(chunk) in one forked process per chunk (one reader too: a fresh
    process, like every other reader), all started together; return the wall
    time from the start signal until the last one finished."""
    global starting
    check_stop()
    ctx = mp.get_context("fork")
    start = ctx.Event()
    pipes, procs = [], []
    try:
        starting = True  # (a signal now is raised by check_stop below, every reader noted)
        try:
            for chunk in chunks:
                recv, send = ctx.Pipe(duplex=False)
                # daemonic: should one be left, the process's exit ends it instead of waiting for it
                p = ctx.Process(target=_worker, args=(fn, chunk, start, send), daemon=True)
                p.start()
                procs.append(p)
                pipes.append(recv)
        finally:
            starting = False
        check_stop()
        time.sleep(0.05)  # let every worker reach the start line
        t0 = time.perf_counter()
        start.set()
        for r in pipes:
            r.recv()
        elapsed = time.perf_counter() - t0
        check_stop()
    except BaseException:  # Ctrl-C, SIGTERM: the readers end here, before their mount is unmounted
        for p in procs:
            p.terminate()
        raise
    finally:
        for p in procs:
            p.join()
    return elapsed


def _split(items: Sequence[Any], parts: int) -> list[Any]:
    return [items[i::parts] for i in range(parts)]


@dataclass
class Plan:
    """Which sample ids each (order, readers) configuration reads: disjoint
    ranges, so that every cold pass reads files nobody has read yet."""

    total: int
    n: int
    readers: list[int]
    seed: int = 1234

    def ids(self) -> dict[tuple[str, int], np.ndarray]:
        rng = np.random.default_rng(self.seed)
        configs = [(order, r) for order in ("sequential", "random") for r in self.readers]
        per = min(self.n, self.total // len(configs))
        if per < 1:
            raise MmfsError(f"the split has {self.total} samples; too few to benchmark")
        sequential = [c for c in configs if c[0] == "sequential"]
        out = {c: np.arange(k * per, (k + 1) * per, dtype=np.int64) for k, c in enumerate(sequential)}
        # Random ids come from what the sequential ranges leave, drawn without
        # replacement, so that no two configurations share a file.
        pool = rng.permutation(np.arange(len(sequential) * per, self.total, dtype=np.int64))
        for k, c in enumerate(c for c in configs if c[0] == "random"):
            out[c] = pool[k * per : (k + 1) * per]
        return out


def read_through(paths: Sequence[str]) -> None:
    """Read files end to end, so that their pages are in memory. On a VM, data
    that sat in the page cache untouched for a few seconds reads much slower
    the first time again (the host reclaims the guest's idle memory), so every
    cold pass starts from freshly read source files."""
    buf = bytearray(4 << 20)
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass


@dataclass
class Method:
    """One way of reading samples: make_chunk(ids) -> what fn reads."""

    name: str
    make_chunk: Callable[[np.ndarray], Any]
    fn: Callable[[Any], int]

SLICES = 5  # methods take turns slice by slice, so that noise hits them alike


def interleaved(methods: list[Method], order: str, readers: int, ids: np.ndarray,
                 sources: Sequence[str] = ()) -> list[Row]:
    """A cold (first) and a warm (second) pass of every method over `ids`. The
    ids are cut into SLICES slices and the methods take turns on each slice, so
    that a noisy neighbour slows all of them alike; a method's time is the sum
    of its slices."""
    rows = []
    for phase in ("cold", "warm"):
        if phase == "cold":
            read_through(sources)
        seconds = dict.fromkeys((m.name for m in methods), 0.0)
        for part in np.array_split(ids, min(SLICES, len(ids))):
            for m in methods:
                seconds[m.name] += run_parallel(m.fn, [m.make_chunk(p) for p in _split(part, readers)])
        for m in methods:
            rows.append(Row(m.name, order, readers, phase, len(ids), seconds[m.name]))
            log.info("%-20s %-10s %d reader(s) %-4s %9.0f samples/s", m.name, order, readers,
                     phase, rows[-1].rate)
    return rows


def daemon_memory(pid: int | None) -> dict[str, int] | None:
    """VmRSS, RssAnon and RssFile of a process, in kB."""
    if not pid:
        return None
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
                    out[key] = int(value.split()[0])
    except OSError:
        return None
    return out
