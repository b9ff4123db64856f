"""How the mount's views read: long samples, documents and sequences.

    python benchmarks/mount_views.py [--dir DIR] [-n N] [-o OPTIONS] [--parts 1,2,3,4]

Writes two datasets into DIR (default: a temporary folder) with
mmfs.formats.writer, mounts each config as `mmfs mount` does, and prints:

1. Long samples (sequence_length 65535, int32: 256 KiB per sample), cold, one
   reader: MB/s through the mount (each file opened, read whole, closed: the
   kernel asks in 128 KiB READs) against an in-process pread of the same bytes
   (every piece of every sample, as its provenance names them).
2. The same with `-o map_limit_mb=0` and `dd bs=128k` on a few samples: the
   daemon's pread calls (counted with strace) per piece of those samples.
3. Documents and sequences of exactly a sample's size (4097 uint16 tokens),
   cold files/s against sample files of sequence_length 4096, random order.
4. Sample files of sequence_length 4096 (8 KiB), cold, random order, one reader:
   Python's `open(path, "rb").read()` (which asks isatty: an ioctl) and
   os.open/os.read/os.close, against the limit, an in-process pread of the same
   pieces of the token file; and the FUSE requests each file cost, by kind, from
   the daemon's own counters (`user.mmfs.counters`).

Passes take turns slice by slice (as `mmfs bench` does), so that a noisy
neighbour slows every method alike; compare the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from mmfs.formats.writer import write_index
from mmfs.megatron import open_corpus
from mmfs.mount.contract import XATTR_COUNTERS, file_name, name_width, sample_dir
from mmfs.mount.lifecycle import temporary_mount
from mmfs.tools.harness import read_files, read_through, run_parallel, single_threaded_libraries

SLICES = 5


def write_dataset(prefix: str, lengths: np.ndarray, dtype: np.dtype, seed: int) -> None:
    """Random tokens for documents of `lengths`, one sequence each."""
    rng = np.random.default_rng(seed)
    with open(prefix + ".bin", "wb") as f:
        for chunk in np.array_split(lengths, max(1, len(lengths) // 4096)):
            f.write(rng.integers(0, 50000, size=int(chunk.sum()), dtype=dtype).tobytes())
    write_index(prefix + ".idx", dtype, lengths, np.arange(len(lengths) + 1, dtype=np.int64))


def write_config(path: str, prefix: str, sequence_length: int) -> str:
    with open(path, "w") as f:
        f.write(f"datasets:\n  - path: {os.path.basename(prefix)}\nsplit: \"100,0,0\"\n"
                f"sequence_length: {sequence_length}\nseed: 1234\n"
                "tokenizer: {eod: 0, pad: null}\ncache_dir: cache\n")
    return path


def make_data(folder: str) -> tuple[str, str]:
    os.makedirs(folder, exist_ok=True)
    long_prefix = os.path.join(folder, "long_int32")
    if not os.path.exists(long_prefix + ".idx"):
        lengths = np.random.default_rng(1).integers(1, 4001, size=40_000).astype(np.int64)
        write_dataset(long_prefix, lengths, np.dtype(np.int32), 2)
    flat_prefix = os.path.join(folder, "flat_uint16")
    if not os.path.exists(flat_prefix + ".idx"):
        write_dataset(flat_prefix, np.full(40_000, 4097, dtype=np.int64), np.dtype(np.uint16), 3)
    return (write_config(os.path.join(folder, "long.yaml"), long_prefix, 65535),
            write_config(os.path.join(folder, "flat.yaml"), flat_prefix, 4096))


def timed_turns(methods: dict, ids: np.ndarray, sources: list[str]) -> dict[str, float]:
    """Seconds per method over `ids`, the methods taking turns slice by slice."""
    read_through(sources)
    seconds = dict.fromkeys(methods, 0.0)
    for part in np.array_split(ids, SLICES):
        for name, (make, fn) in methods.items():
            seconds[name] += run_parallel(fn, [make(part)])
    return seconds


def long_samples(config: str, n: int, options: str) -> None:
    corpus = open_corpus(config, progress=False)
    split = corpus.splits["train"]
    size = split.sample_bytes
    ids = np.random.default_rng(5).permutation(len(split))[: 2 * n]
    places = piece_places(split, ids)  # the bytes of each piece of each sample, for the in-process pread

    def pread_samples(part: np.ndarray) -> int:
        total, fds = 0, {}
        for i in part:
            path, pieces = places[int(i)]
            fd = fds.get(path) or fds.setdefault(path, os.open(path, os.O_RDONLY))
            total += sum(len(os.pread(fd, length, byte)) for byte, length in pieces)
        for fd in fds.values():
            os.close(fd)
        return total

    with temporary_mount(config, options) as (mount, _pid):
        width = len(os.listdir(os.path.join(mount, "train", "samples"))[0]) - 4
        paths = lambda part: [os.path.join(mount, "train", "samples", f"{int(i):0{width}d}.bin")  # noqa: E731
                              for i in part]
        seconds = timed_turns({"mount": (paths, lambda p: read_files(p, size)),
                               "in-process pread": (lambda part: part, pread_samples)},
                              ids[:n], corpus.placer.files())
    mb = n * size / 1e6
    rates = {k: mb / v for k, v in seconds.items()}
    print(f"long samples (S=65535, int32, {size} bytes), cold, 1 reader, {n} samples:")
    for k, v in rates.items():
        print(f"  {k:18s} {v:8.1f} MB/s")
    print(f"  mount / pread      {rates['mount'] / rates['in-process pread']:8.2f}x   (target >= 0.3)")


def preads_per_piece(config: str, samples: int) -> None:
    """The daemon's preads while dd reads a few long samples in 128 KiB blocks,
    by the file they read (tokens, .idx, index cache)."""
    if not shutil.which("strace"):
        print("preads per piece: strace is not installed (apt-get install strace)")
        return
    # The pieces counted in-process: asking the mount (xattrs) would warm the daemon.
    split = open_corpus(config, progress=False).splits["train"]
    ids = range(100, 100 + samples)
    pieces = sum(len(split.provenance(i)[1]) for i in ids)
    with temporary_mount(config, "map_limit_mb=0") as (mount, pid):
        base = os.path.join(mount, sample_dir("train").lstrip("/"))
        names = [file_name(i, name_width(len(split))) for i in ids]
        fds = {int(fd): os.path.basename(os.readlink(f"/proc/{pid}/fd/{fd}"))
               for fd in os.listdir(f"/proc/{pid}/fd")}
        out = tempfile.NamedTemporaryFile(suffix=".strace", delete=False).name
        tracer = subprocess.Popen(["strace", "-f", "-e", "trace=pread64", "-o", out, "-p", str(pid)],
                                  stderr=subprocess.DEVNULL)
        time.sleep(0.5)
        for x in names:
            subprocess.run(["dd", f"if={os.path.join(base, x)}", "of=/dev/null", "bs=128k"],
                           check=True, capture_output=True)
        time.sleep(0.2)
        tracer.send_signal(2)
        tracer.wait()
        with open(out) as f:
            calls = [int(m.group(1)) for m in re.finditer(r"pread64\((\d+),", f.read())]
        os.unlink(out)
    by_kind: dict[str, int] = {}
    for fd in calls:
        name = fds.get(fd, "?")
        kind = "tokens (.bin)" if name.endswith(".bin") else ".idx" if name.endswith(".idx") else "index cache"
        by_kind[kind] = by_kind.get(kind, 0) + 1
    print(f"-o map_limit_mb=0, dd bs=128k over {samples} samples ({pieces} pieces): {len(calls)} preads, "
          f"{len(calls) / max(pieces, 1):.2f} per piece (target <= 1.3)")
    for kind, count in sorted(by_kind.items()):
        print(f"  {kind:14s} {count:5d}  {count / max(pieces, 1):.2f} per piece")


def documents_and_sequences(config: str, n: int, options: str) -> None:
    corpus = open_corpus(config, progress=False)
    name = corpus.datasets[0].name
    size = corpus.splits["train"].sample_bytes
    with temporary_mount(config, options) as (mount, _pid):
        def paths_of(folder: str, width: int):
            return lambda part: [os.path.join(mount, folder, f"{int(i):0{width}d}.bin") for i in part]

        n_samples, n_docs = len(corpus.splits["train"]), corpus.datasets[0].dataset.num_documents
        methods = {
            "sample files": (paths_of("train/samples", 7), lambda p: read_files(p, size)),
            "document files": (paths_of(f"datasets/{name}/documents", 7), lambda p: read_files(p, size)),
            "sequence files": (paths_of(f"datasets/{name}/sequences", 7), lambda p: read_files(p, size)),
        }
        ids = np.random.default_rng(9).permutation(min(n_samples, n_docs))[:n]
        seconds = timed_turns(methods, ids, corpus.placer.files())
    print(f"documents and sequences of {size} bytes vs samples of {size} bytes, cold, random, 1 reader, "
          f"{n} files each:")
    for k, v in seconds.items():
        print(f"  {k:15s} {n / v:9.0f} files/s   ({seconds['sample files'] / v:.2f}x samples)")


def piece_places(split, ids) -> dict[int, tuple[str, list[tuple[int, int]]]]:
    """Each sample's token file and (byte offset, length) of its pieces."""
    places = {}
    for i in ids:
        gpt, _ = split.locate(int(i))
        ds = gpt.source.dataset
        item = ds.dtype.itemsize
        places[int(i)] = (ds.bin_path, [(int(ds.sequence_pointers[s]) + o * item, n * item)
                                        for s, o, n in split.provenance(int(i))[1]])
    return places


def python_reads(paths: list[str]) -> int:
    total = 0
    for path in paths:
        with open(path, "rb") as f:  # buffered, as most Python code opens a file: isatty, an ioctl
            total += len(f.read())
    return total


def requests(mount: str) -> dict[str, int]:
    return json.loads(os.getxattr(mount, XATTR_COUNTERS))["requests"]


def sample_files(config: str, n: int, options: str) -> None:
    """Cold 8 KiB sample files, one reader: two ways of reading through the mount
    (different files, all cold) against an in-process pread of the first way's
    pieces; the requests per file each way cost."""
    corpus = open_corpus(config, progress=False)
    split = corpus.splits["train"]
    size = split.sample_bytes
    ids = np.random.default_rng(11).permutation(len(split))[: 2 * n]
    by_python, by_os = ids[:n], ids[n:]
    places = piece_places(split, by_python)

    def pread_samples(part: np.ndarray) -> int:
        total, fds = 0, {}
        for i in part:
            path, pieces = places[int(i)]
            fd = fds.get(path) or fds.setdefault(path, os.open(path, os.O_RDONLY))
            total += sum(len(os.pread(fd, length, byte)) for byte, length in pieces)
        for fd in fds.values():
            os.close(fd)
        return total

    with temporary_mount(config, options) as (mount, _pid):
        folder = os.path.join(mount, "train", "samples")
        width = len(os.listdir(folder)[0]) - 4
        paths = lambda part: [os.path.join(folder, f"{int(i):0{width}d}.bin") for i in part]  # noqa: E731
        spent: dict[str, dict[str, int]] = {}

        def counted(name: str, fn, chunk) -> float:
            """run_parallel(fn, [chunk]), and the requests it cost added to spent[name]."""
            before = requests(mount)
            took = run_parallel(fn, [chunk])
            total = spent.setdefault(name, {})
            for k, v in requests(mount).items():
                total[k] = total.get(k, 0) + v - before.get(k, 0)
            return took

        read_through(corpus.placer.files())
        seconds = dict.fromkeys(("open().read()", "os.open/os.read", "in-process pread"), 0.0)
        for a, b in zip(np.array_split(by_python, SLICES), np.array_split(by_os, SLICES)):
            seconds["open().read()"] += counted("open().read()", python_reads, paths(a))
            seconds["os.open/os.read"] += counted("os.open/os.read", lambda p: read_files(p, size), paths(b))
            seconds["in-process pread"] += run_parallel(pread_samples, [a])
    limit = n / seconds["in-process pread"]
    print(f"sample files of {size} bytes, cold, random, 1 reader, {n} files each (-o {options or 'defaults'}):")
    for name, took in seconds.items():
        rate = n / took
        line = f"  {name:17s} {rate:9.0f} files/s  {rate / limit:5.2f}x the pread limit"
        if name in spent:  # (less the counters' own GETXATTRs)
            per = {k: v / n for k, v in spent[name].items() if v and k not in ("getxattr", "open")}
            line += "; requests per file: " + ", ".join(f"{k} {v:.2f}" for k, v in sorted(per.items()))
        print(line + ("   (target >= 0.5)" if name == "open().read()" else ""))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", help="data folder (default: a temporary one, removed afterwards)")
    ap.add_argument("-n", type=int, default=300, help="long samples per pass (x10 for documents)")
    ap.add_argument("-o", dest="options", default="", help="mount options (as for mmfs mount)")
    ap.add_argument("--parts", default="1,2,3,4", help="which of the four parts to run (comma-separated)")
    args = ap.parse_args(argv)
    parts = {int(p) for p in args.parts.split(",")}
    single_threaded_libraries()
    folder = args.dir or tempfile.mkdtemp(prefix="mmfs-views-")
    try:
        long_config, flat_config = make_data(folder)
        if 1 in parts:
            long_samples(long_config, args.n, args.options)
        if 2 in parts:
            preads_per_piece(long_config, 6)
        if 3 in parts:
            documents_and_sequences(flat_config, 10 * args.n, args.options)
        if 4 in parts:
            sample_files(flat_config, 10 * args.n, args.options)
    finally:
        if not args.dir:
            shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
