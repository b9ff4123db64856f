"""What a copy's checks cost (a program, not a test): mmfs/loader/copy_check.py.

    python benchmarks/copy_check.py MOUNT FOLDER [--dp 4] [--mbs 2] [--count 2000]

Copies what `--dp` ranks read of train (`--count` micro-batches each, from 0) out of
MOUNT (a mount of a config with a training: block) into FOLDER, then measures, each
the median of three:

  copy              copy_job_files, digests and manifest included
  open              mmfs.loader.Mount(FOLDER): mmfs.json and mmfs-attributes.json hashed
  list              stream_files of every rank: names and one stat per file against the manifest
  read              every micro-batch file read whole (read_file), no digest
  read + digest     the same through the copy's check (microbatch_file's path): sha256 of each
  sha256 / blake2b  hashlib on 64 MiB in memory, MB/s
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from mmfs.adapters.megatron_copy import copy_job_files  # noqa: E402
from mmfs.loader import Mount  # noqa: E402
from mmfs.loader.files import read_file  # noqa: E402


def timed(fn, repeat: int = 3) -> tuple[float, object]:
    seconds, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        seconds.append(time.perf_counter() - t)
    return statistics.median(seconds), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mount")
    ap.add_argument("folder")
    ap.add_argument("--dp", type=int, default=4)
    ap.add_argument("--mbs", type=int, default=2)
    ap.add_argument("--count", type=int, default=2000)
    args = ap.parse_args()

    def copy():
        shutil.rmtree(args.folder, ignore_errors=True)
        return copy_job_files(args.mount, args.folder, args.dp, {"train": (args.mbs, 0, args.count)})

    t_copy, copied = timed(copy)
    print(f"copy            {t_copy:8.3f} s  {copied['files']:,} files, {copied['bytes'] / 1e6:,.1f} MB "
          f"(manifest {os.path.getsize(os.path.join(args.folder, 'mmfs-copy.json')) / 1e6:.2f} MB)")
    t_open, m = timed(lambda: Mount(args.folder))
    print(f"open            {t_open:8.3f} s")
    t_list, files = timed(lambda: [p for r in range(args.dp)
                                   for p in m.stream_files("train", r, args.dp, args.mbs, 0)])
    print(f"list            {t_list:8.3f} s  {len(files):,} files ({t_list / len(files) * 1e6:.1f} us each)")
    t_read, _ = timed(lambda: [read_file(p) for p in files])
    t_check, _ = timed(lambda: [m._rows(p, None) for p in files])
    print(f"read            {t_read:8.3f} s  ({copied['bytes'] / t_read / 1e6:,.0f} MB/s)")
    print(f"read + digest   {t_check:8.3f} s  ({copied['bytes'] / t_check / 1e6:,.0f} MB/s)")
    data = os.urandom(64 << 20)
    for name in ("sha256", "blake2b"):
        t, _ = timed(lambda name=name: hashlib.new(name, data).digest())
        print(f"{name:<15} {len(data) / t / 1e6:8,.0f} MB/s")


if __name__ == "__main__":
    main()
