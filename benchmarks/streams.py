"""Stream folders (`<split>/streams/dp=D,mbs=M,from=C...`) on a 1M-sample split.

    python benchmarks/streams.py [--dir DIR] [--layouts 8] [-n 20000]

Writes a dataset of 1,000,000 samples (sequence_length 64, uint16) into DIR
(default: a temporary folder) and mounts it once per sampler (single, cyclic
sharded, cyclic unsharded; training: dp 8, mbs 4) as `mmfs mount` does. Prints:

1. Looking up a new stream folder and reading its first file: the wall time of
   open + read + close of `<layout>/000/0000000.bin` for `--layouts` layouts the
   mount has not seen (dp 3..16, mbs 1..5, consumed_samples a multiple of the
   new layout; cyclic: in epoch 0 or 1), median and worst.
2. Cold files: rank 0's first n micro-batch files of the training layout through
   `streams/dp=8,mbs=4,from=0` and through `ranks/` (the same bytes), never read
   since the mount, one reader; the two take turns slice by slice.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np

from mmfs.formats.writer import write_index
from mmfs.tools.bench import temporary_mount
from mmfs.tools.harness import read_files, read_through, run_parallel, single_threaded_libraries

SAMPLES = 1_000_000
SEQUENCE_LENGTH = 64
SLICES = 5
SAMPLERS = {"single": "dataloader_type: single",
            "cyclic sharded": "dataloader_type: cyclic, data_sharding: true",
            "cyclic unsharded": "dataloader_type: cyclic, data_sharding: false"}


def make_data(folder: str) -> str:
    """One document per sample (its tokens plus the extra one): exactly SAMPLES samples."""
    prefix = os.path.join(folder, "flat_uint16")
    if not os.path.exists(prefix + ".idx"):
        lengths = np.full(SAMPLES, SEQUENCE_LENGTH, dtype=np.int64)
        lengths[-1] += 1
        rng = np.random.default_rng(3)
        with open(prefix + ".bin", "wb") as f:
            f.write(rng.integers(1, 50000, size=int(lengths.sum()), dtype=np.uint16).tobytes())
        write_index(prefix + ".idx", np.dtype(np.uint16), lengths, np.arange(SAMPLES + 1, dtype=np.int64))
    return prefix


def write_config(folder: str, prefix: str, sampler: str) -> str:
    path = os.path.join(folder, f"{sampler.replace(' ', '_')}.yaml")
    with open(path, "w") as f:
        f.write(f"datasets:\n  - path: {os.path.basename(prefix)}\nsplit: \"100,0,0\"\n"
                f"sequence_length: {SEQUENCE_LENGTH}\nseed: 1234\ntokenizer: {{eod: 0, pad: null}}\n"
                f"cache_dir: cache\ntraining: {{data_parallel_size: 8, micro_batch_size: 4, {SAMPLERS[sampler]}}}\n")
    return path


def new_layouts(count: int, total: int, epochs: int) -> list[str]:
    rng = np.random.default_rng(7)
    out = []
    for _ in range(count):
        dp, mbs = int(rng.integers(3, 17)), int(rng.integers(1, 6))
        group = dp * mbs
        active = total - total % group
        consumed = int(rng.integers(0, epochs * active // group)) * group
        out.append(f"dp={dp},mbs={mbs},from={consumed}")
    return out


def first_file_ms(mount: str, layouts: list[str]) -> list[float]:
    times = []
    for layout in layouts:
        path = os.path.join(mount, "train", "streams", layout, "000", "0000000.bin")
        t = time.perf_counter()
        with open(path, "rb") as f:
            f.read()
        times.append((time.perf_counter() - t) * 1000)
    return times


def cold_files(mount: str, n: int, sources: list[str]) -> dict[str, float]:
    """Files/s of rank 0's first n files through streams/ and through ranks/ (the
    same samples: the dataset is read through first, and the two take turns at
    going first, so that neither pays for the other's page cache)."""
    names = [f"{j:07d}.bin" for j in range(n)]
    folders = {"streams/": os.path.join(mount, "train", "streams", "dp=8,mbs=4,from=0", "000"),
               "ranks/": os.path.join(mount, "train", "ranks", "000")}
    size = os.stat(os.path.join(folders["ranks/"], names[0])).st_size
    seconds = dict.fromkeys(folders, 0.0)
    read_through(sources)
    for k, part in enumerate(np.array_split(np.arange(n), SLICES)):
        for name, folder in sorted(folders.items(), reverse=k % 2 == 1):
            paths = [os.path.join(folder, names[j]) for j in part]
            seconds[name] += run_parallel(lambda p: read_files(p, size), [paths])
    return {name: n / s for name, s in seconds.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", help="where the dataset is written (kept for the next run)")
    ap.add_argument("--layouts", type=int, default=8, help="new stream folders looked up per sampler")
    ap.add_argument("-n", type=int, default=20000, help="files per cold pass")
    args = ap.parse_args()
    single_threaded_libraries()
    folder = args.dir or tempfile.mkdtemp(prefix="mmfs-streams-bench-")
    os.makedirs(folder, exist_ok=True)
    prefix = make_data(folder)
    print(f"split: {SAMPLES} samples of {SEQUENCE_LENGTH + 1} uint16 tokens; training layout dp 8, mbs 4")
    for sampler in SAMPLERS:
        with temporary_mount(write_config(folder, prefix, sampler)) as (mount, _pid):
            times = first_file_ms(mount, new_layouts(args.layouts, SAMPLES, 1 if sampler == "single" else 2))
            rates = cold_files(mount, args.n, [prefix + ".bin", prefix + ".idx"])
        ratio = rates["ranks/"] / rates["streams/"]
        print(f"{sampler:17s} new folder + first file: median {statistics.median(times):5.1f} ms, "
              f"worst {max(times):5.1f} ms ({len(times)} layouts) | cold files/s: streams/ {rates['streams/']:7.0f}, "
              f"ranks/ {rates['ranks/']:7.0f} (streams take {ratio:.2f}x the time)")


if __name__ == "__main__":
    main()
