"""mmfs.loader.Mount(MOUNTPOINT) against Mount(CONFIG) (served in the process, no FUSE)
on a 1M-sample split.

    python benchmarks/in_process.py [--dir DIR] [-n 20000]

Writes the dataset of benchmarks/streams.py into DIR (default: a temporary folder),
mounts it as `mmfs mount` does (training: dp 8, mbs 4, single sampler) and prints:

1. Opening: Mount(MOUNTPOINT) (reads mmfs.json) and Mount(CONFIG) (opens the config as
   the mount did: indices from the cache the mount built), the median of 5 (a new
   config file each time, so nothing opened is shared), and the resident memory the
   first Mount(CONFIG) added to this process.
2. Reading, one reader: rank 0's first n micro-batch files (Mount.microbatches, ranks/)
   and n sample files at random ids (Mount.sample), each never read before through the
   mount; the two take turns slice by slice, the dataset read through first.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

import numpy as np
from streams import SAMPLES, SEQUENCE_LENGTH, make_data, write_config

from mmfs.loader import Mount
from mmfs.tools.bench import temporary_mount
from mmfs.tools.harness import read_through, single_threaded_libraries

SLICES = 5


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def opening(mount: str, config: str) -> dict[str, float]:
    """Median seconds to open each (a copy of the config each time: a Tree per file)."""
    times: dict[str, list[float]] = {"mount point": [], "config": []}
    for k in range(5):
        t = time.perf_counter()
        Mount(mount)
        times["mount point"].append(time.perf_counter() - t)
        copy = f"{config}.{k}.yaml"
        shutil.copyfile(config, copy)
        t = time.perf_counter()
        Mount(copy)
        times["config"].append(time.perf_counter() - t)
        os.unlink(copy)
    return {name: statistics.median(v) for name, v in times.items()}


def reading(mounts: dict[str, Mount], n: int, sources: list[str]) -> dict[str, dict[str, float]]:
    """Files/s of each way, micro-batch files and samples at random ids."""
    ids = np.random.default_rng(5).choice(SAMPLES, size=n, replace=False)
    ways = {"micro-batch files": lambda m, part: [m.files.read(m.microbatch_path("train", 0, int(j))) for j in part],
            "sample files": lambda m, part: [m.sample("train", int(ids[j])) for j in part]}
    out: dict[str, dict[str, float]] = {}
    for what, read in ways.items():
        seconds = dict.fromkeys(mounts, 0.0)
        read_through(sources)
        for k, part in enumerate(np.array_split(np.arange(n), SLICES)):
            for name, m in sorted(mounts.items(), reverse=k % 2 == 1):
                t = time.perf_counter()
                read(m, part)
                seconds[name] += time.perf_counter() - t
        out[what] = {name: n / s for name, s in seconds.items()}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", help="where the dataset is written (kept for the next run)")
    ap.add_argument("-n", type=int, default=20000, help="files read per kind")
    args = ap.parse_args()
    single_threaded_libraries()
    folder = args.dir or tempfile.mkdtemp(prefix="mmfs-in-process-bench-")
    os.makedirs(folder, exist_ok=True)
    prefix = make_data(folder)
    config = write_config(folder, prefix, "single")
    print(f"split: {SAMPLES} samples of {SEQUENCE_LENGTH + 1} uint16 tokens; training layout dp 8, mbs 4")
    with temporary_mount(config) as (mount, _pid):
        before = rss_mb()
        mounts = {"mount": Mount(mount), "in-process": Mount(config)}
        added = rss_mb() - before
        opened = opening(mount, config)
        rates = reading(mounts, args.n, [prefix + ".bin", prefix + ".idx"])
    print(f"open: Mount(MOUNTPOINT) {opened['mount point'] * 1000:.1f} ms, Mount(CONFIG) "
          f"{opened['config'] * 1000:.1f} ms (median of 5); the first Mount(CONFIG) added {added:.0f} MB resident")
    for what, r in rates.items():
        print(f"{what}, files/s: mount {r['mount']:7.0f}, in-process {r['in-process']:7.0f} "
              f"({r['in-process'] / r['mount']:.2f}x)")


if __name__ == "__main__":
    main()
