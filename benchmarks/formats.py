"""Benchmark of the formats layer on a big synthetic IndexedDataset (a program, not a test).

    python benchmarks/formats.py [--sequences 100000000] [--reads 100000] [--dir /tmp]

Writes a dataset of short uint16 sequences (1..8 tokens) into a temporary directory
(deleted afterwards), then measures: opening (time, resident-memory increase),
random sequence reads with mmfs and, when importable, megatron-core's own
IndexedDataset, and the peak memory of `mmfs verify` and `mmfs info` run as
subprocesses. The files are freshly written, so reads hit the page cache.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from mmfs.formats.indexed import HEADER, IndexedDataset
from mmfs.formats.writer import write_index

GEN_CHUNK = 1 << 22  # sequences written per step
DTYPE = np.dtype(np.uint16)


def rss_mb() -> float:
    """Current resident set size of this process in MB (VmRSS)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def generate(prefix: str, n: int, seed: int = 0) -> int:
    """Write PREFIX.idx/.bin with n sequences of 1..8 tokens, one per document, with
    mmfs's IndexedDataset writer (byte-identical to Megatron's)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 9, size=n, dtype=np.int32)
    with open(prefix + ".bin", "wb") as bin_file:
        for start in range(0, n, GEN_CHUNK):
            count = int(lengths[start : start + GEN_CHUNK].sum(dtype=np.int64))
            bin_file.write(rng.integers(0, 50257, size=count, dtype=np.uint16).tobytes())
        # flush now, so writeback of 3 GB does not land inside the timings below
        bin_file.flush()
        os.fsync(bin_file.fileno())
    write_index(prefix + ".idx", DTYPE, lengths, np.arange(n + 1, dtype=np.int64))
    with open(prefix + ".idx", "rb") as idx:
        os.fsync(idx.fileno())
    return int(lengths.sum(dtype=np.int64))


def time_open(prefix: str, repeat: int = 5) -> tuple[float, float, float]:
    """(first open s, median of later opens s, RSS increase of the first open MB)."""
    before = rss_mb()
    t0 = time.perf_counter()
    ds = IndexedDataset(prefix)
    first = time.perf_counter() - t0
    grown = rss_mb() - before
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        IndexedDataset(prefix)
        times.append(time.perf_counter() - t0)
    del ds
    return first, float(np.median(times)), grown


def time_reads(get, ids: np.ndarray) -> float:
    """Seconds to fetch every sequence in ids and touch its first token."""
    t0 = time.perf_counter()
    touched = 0
    for i in ids.tolist():
        seq = get(i)
        touched += int(seq[0])
    return time.perf_counter() - t0


def read_rows(readers: list, ids: np.ndarray, rounds: int = 4) -> list[tuple[str, str, str]]:
    """Each reader fetches the same ids `rounds` times, the readers taking turns to go
    first (the first pass faults pages into that reader's mapping); median per reader."""
    times: dict[str, list[float]] = {name: [] for name, _ in readers}
    for r in range(rounds):
        for name, get in readers if r % 2 == 0 else readers[::-1]:
            times[name].append(time_reads(get, ids))
    rows = []
    for name, ts in times.items():
        s = float(np.median(ts))
        rows.append((f"{name} get, {len(ids):,} random sequences", f"{s:.3f} s",
                     f"{len(ids) / s:,.0f} seq/s, {s / len(ids) * 1e6:.2f} us/seq "
                     f"(median of {rounds}; first pass {ts[0]:.3f} s)"))
    return rows


def megatron_reader(prefix: str):
    """(megatron-core's IndexedDataset of prefix, seconds to open, RSS increase MB),
    or None when megatron-core is not importable."""
    try:
        from megatron.core.datasets.indexed_dataset import IndexedDataset as MegatronDataset
    except ImportError:
        return None
    before = rss_mb()
    t0 = time.perf_counter()
    ds = MegatronDataset(prefix, multimodal=False, mmap=True)
    return ds, time.perf_counter() - t0, rss_mb() - before


# The child reports its own VmHWM: ru_maxrss from wait4 would include the parent's
# memory, which the kernel carries over when the child is forked and exec'd.
_CHILD = """
import sys
from mmfs.cli import main
rc = main(sys.argv[1:])
with open("/proc/self/status") as f:
    peak = next(line.split()[1] for line in f if line.startswith("VmHWM:"))
print("VmHWM_kB", peak)
sys.exit(rc)
"""


def child_peak(args: list[str]) -> tuple[float, float, int]:
    """(seconds, peak RSS MB, exit code) of `mmfs -q ARGS` run in a fresh interpreter."""
    t0 = time.perf_counter()
    run = subprocess.run([sys.executable, "-c", _CHILD, "-q", *args], capture_output=True,
                         text=True, check=False)
    secs = time.perf_counter() - t0
    peaks = [line.split()[1] for line in run.stdout.splitlines()
             if line.startswith("VmHWM_kB ")]
    peak = int(peaks[-1]) / 1024 if peaks else float("nan")
    return secs, peak, run.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/formats.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sequences", type=int, default=100_000_000)
    parser.add_argument("--reads", type=int, default=100_000)
    parser.add_argument("--dir", default=tempfile.gettempdir(),
                        help="where to create the temporary dataset")
    args = parser.parse_args(argv)

    n = args.sequences
    need = HEADER.size + 20 * n + 8 + 5 * n * DTYPE.itemsize  # .idx + expected .bin
    free = shutil.disk_usage(args.dir).free
    if free < 1.2 * need:
        print(f"not enough space in {args.dir}: need ~{need / 1e9:.1f} GB, "
              f"{free / 1e9:.1f} GB free", file=sys.stderr)
        return 1
    rows: list[tuple[str, str, str]] = []
    with tempfile.TemporaryDirectory(prefix="mmfs-formats-bench-", dir=args.dir) as tmp:
        prefix = os.path.join(tmp, "bench")
        t0 = time.perf_counter()
        tokens = generate(prefix, n)
        gen_s = time.perf_counter() - t0
        idx_gb = os.path.getsize(prefix + ".idx") / 1e9
        bin_gb = os.path.getsize(prefix + ".bin") / 1e9
        print(f"dataset: {n:,} sequences, {tokens:,} uint16 tokens; .idx {idx_gb:.2f} GB, "
              f".bin {bin_gb:.2f} GB; written in {gen_s:.1f} s")

        first, again, grown = time_open(prefix)
        rows.append(("open (first)", f"{first * 1e3:.2f} ms", "target < 50 ms"))
        rows.append(("open (again, median of 5)", f"{again * 1e3:.2f} ms", ""))
        rows.append(("open: RSS increase", f"{grown:.1f} MB", "target < 100 MB"))

        ids = np.random.default_rng(1).integers(0, n, size=args.reads)
        ds = IndexedDataset(prefix)
        readers = [("mmfs", ds.get)]
        mega = megatron_reader(prefix)
        if mega is None:
            note = "megatron-core not installed"
        else:
            mds, open_s, open_mb = mega
            rows.append(("megatron-core open (first)", f"{open_s * 1e3:.2f} ms",
                         f"RSS +{open_mb:.1f} MB"))
            readers.append(("megatron-core", mds.get))
        rows += read_rows(readers, ids)
        if mega is None:
            rows.append(("megatron-core get", "-", note))
        del ds, mega, readers

        for command in ("verify", "info"):
            secs, peak, rc = child_peak([command, prefix])
            target = "target < 200 MB" if command == "verify" else ""
            status = "" if rc == 0 else f" (failed, exit {rc})"
            rows.append((f"mmfs {command}: time", f"{secs:.1f} s{status}", ""))
            rows.append((f"mmfs {command}: peak RSS", f"{peak:.0f} MB", target))

    width = max(len(r[0]) for r in rows)
    value_width = max(len(r[1]) for r in rows)
    for name, value, note in rows:
        print(f"{name:<{width}}  {value:>{value_width}}  {note}".rstrip())
    print("temporary dataset deleted")
    return 0


if __name__ == "__main__":
    sys.exit(main())
