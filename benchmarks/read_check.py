"""What checking an open file after every read costs (issue 41): the C readers fstat a
file read with pread after each read, so that a file rewritten in place while open is
refused (EIO), never served. This measures the readers with the check against a
checkout without it, in one run.

    python benchmarks/read_check.py --before DIR [--dir DIR] [-n N] [--rounds R]

--before: a checkout of mmfs (its C core built) from before the check. Writes one
dataset (sample files of sequence_length 4096, uint16: 8 KiB each) and reads N samples
in random order through the pread path (map_limit_mb=0: every index entry and token
read with pread, the most system calls per sample, so the check's largest share),
warm (the page cache holds the files), in process and then N/4 through a mount of
each checkout: samples/s of each, the two taking turns for R rounds in fresh
interpreters, and the ratio of the medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from mmfs.formats.writer import write_index

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

READ = """
import os, sys, time
import numpy as np
from mmfs.megatron import open_corpus
from mmfs.mount.lifecycle import temporary_mount
config, n, where = sys.argv[1], int(sys.argv[2]), sys.argv[3]
split = open_corpus(config, progress=False, map_limit_mb=0).splits["train"]
ids = np.random.default_rng(7).permutation(len(split))[:n].tolist()
if where == "process":
    read = split.read
    for i in ids[:200]:
        read(i)
    t0 = time.perf_counter()
    for i in ids:
        read(i)
    print(n / (time.perf_counter() - t0))
else:
    with temporary_mount(config, "map_limit_mb=0") as (mount, _):
        names = sorted(os.listdir(os.path.join(mount, "train", "samples")))
        paths = [os.path.join(mount, "train", "samples", names[i]) for i in ids]
        def read(path):
            fd = os.open(path, os.O_RDONLY)
            os.read(fd, 1 << 20)
            os.close(fd)
        for p in paths[:200]:
            read(p)
        t0 = time.perf_counter()
        for p in paths:
            read(p)
        print(n / (time.perf_counter() - t0))
"""


def write_data(folder: Path) -> str:
    prefix = str(folder / "flat_uint16")
    if not os.path.exists(prefix + ".idx"):
        lengths = np.random.default_rng(3).integers(1, 8000, size=40_000).astype(np.int64)
        rng = np.random.default_rng(4)
        with open(prefix + ".bin", "wb") as f:
            f.write(rng.integers(0, 50000, size=int(lengths.sum()), dtype=np.uint16).tobytes())
        write_index(prefix + ".idx", np.dtype(np.uint16), lengths, np.arange(len(lengths) + 1, dtype=np.int64))
    config = folder / "flat.yaml"
    config.write_text("datasets:\n  - path: flat_uint16\nsplit: \"100,0,0\"\nsequence_length: 4096\n"
                      "seed: 1234\ntokenizer: {eod: 0, pad: null}\ncache_dir: cache\n")
    return str(config)


def rate(checkout: Path, config: str, n: int, where: str) -> float:
    env = dict(os.environ, PYTHONPATH=str(checkout))
    out = subprocess.run([sys.executable, "-c", READ, config, str(n), where], env=env, capture_output=True,
                         text=True, check=True, cwd=checkout)
    return float(out.stdout.split()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, type=Path, help="a checkout without the check (built)")
    ap.add_argument("--dir", type=Path, help="where the data goes (default: a temporary folder)")
    ap.add_argument("-n", type=int, default=20_000, help="samples read per pass")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    folder = args.dir or Path(tempfile.mkdtemp(prefix="mmfs-read-check-"))
    folder.mkdir(parents=True, exist_ok=True)
    config = write_data(folder)
    rate(ROOT, config, 10, "process")  # builds the index cache once
    turns = [("before (no check)", args.before.resolve()), ("after (fstat after each pread)", ROOT)]
    for where, n in (("process", args.n), ("mount", args.n // 4)):
        rates: dict[str, list[float]] = {name: [] for name, _ in turns}
        for k in range(args.rounds):
            for name, checkout in turns[:: 1 if k % 2 == 0 else -1]:  # each first in every other round
                rates[name].append(rate(checkout, config, n, where))
        how = ("in process" if where == "process" else
               "through a mount (os.open/os.read/os.close per file, one reader)")
        print(f"{n} samples of 4096 uint16 tokens, {how}, map_limit_mb=0, warm; median of {args.rounds}:")
        medians = {k: statistics.median(v) for k, v in rates.items()}
        for k, v in medians.items():
            print(f"  {k:32s} {v:9.0f} samples/s   ({', '.join(f'{x:.0f}' for x in rates[k])})")
        before, after = medians.values()
        print(f"  after / before                   {after / before:9.3f}")


if __name__ == "__main__":
    main()
