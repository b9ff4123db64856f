"""mmfs's read path against the fastest FUSE daemon possible serving the same files.

    python benchmarks/fuse_floor.py [--dir DIR] [-n N] [-o OPTIONS] [--readers 1,8]

The floor (benchmarks/fuse_floor/floor.c, compiled here with libfuse 3's headers:
`apt-get install libfuse3-dev`) is a libfuse 3 low-level daemon with no open
handler, whose every answer was computed before it mounted: the names, sizes and
bytes of a mount's `train/samples/` and `train/ranks/` files, read once through a
mount of the same config and packed into one file it holds in memory. It caches
names and attributes for a day and has the same max_background as a mount, so a
cold file costs it what it costs mmfs in requests (a LOOKUP and a READ) and
nothing more in work.

Both are read cold (every file read once, the configurations on disjoint files),
by 1 and 8 reader processes that os.open/os.read/os.close each file (two FUSE
requests: no isatty ioctl), the two taking turns slice by slice so that a noisy
neighbour slows both alike. The floor runs its loop as the mount does: single-
threaded unless the mount has `-o threads` (a multi-threaded floor is printed too).
Prints files/s each and mmfs ÷ floor, and the load average.

FUSE over io_uring needs libfuse 3.18 or newer; the floor says whether the libfuse
it was built with has it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager

import numpy as np

from mmfs.mount.lifecycle import temporary_mount
from mmfs.mount.options import parse_mount_options
from mmfs.tools.harness import Method, interleaved, read_files, single_threaded_libraries

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "fuse_floor", "floor.c")
VIEWS = ("train/samples", "train/ranks")


def write_data(folder: str, samples: int) -> str:
    """A dataset of 4,097-token documents (one 8 KiB sample each) and a config with
    8 data-parallel ranks of micro-batch 1, so that ranks/ holds 8 KiB files too."""
    from mount_views import write_dataset  # a sibling benchmark's writer

    os.makedirs(folder, exist_ok=True)
    prefix = os.path.join(folder, "flat_uint16")
    if not os.path.exists(prefix + ".idx"):
        write_dataset(prefix, np.full(samples + 1, 4097, dtype=np.int64), np.dtype(np.uint16), 3)
    config = os.path.join(folder, "floor.yaml")
    with open(config, "w") as f:
        f.write(f"datasets:\n  - path: {os.path.basename(prefix)}\nsplit: \"100,0,0\"\nsequence_length: 4096\n"
                "seed: 1234\ntokenizer: {eod: 0, pad: null}\ncache_dir: cache\n"
                "training:\n  data_parallel_size: 8\n  micro_batch_size: 1\n")
    return config


def build_floor(folder: str) -> str:
    """Compile the floor daemon; say what is missing when it cannot be."""
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "fuse3"], capture_output=True, text=True)
    if flags.returncode != 0:
        sys.exit("fuse_floor: libfuse 3's headers are missing (apt-get install libfuse3-dev pkg-config)")
    binary = os.path.join(folder, "floor")
    subprocess.run(["cc", "-O2", SOURCE, *flags.stdout.split(), "-o", binary], check=True)
    return binary


def libfuse_version() -> tuple[int, ...]:
    out = subprocess.run(["pkg-config", "--modversion", "fuse3"], capture_output=True, text=True)
    return tuple(int(p) for p in out.stdout.strip().split(".") if p.isdigit())


def pack(mount: str, path: str) -> dict[str, list[str]]:
    """Write the floor's pack of VIEWS under `mount`; return each view's file paths
    (relative to the mount), in the order the benchmark reads them."""
    entries: list[tuple[int, int, int, int, bytes]] = []  # parent, mode, size, data offset, name
    data = bytearray()
    files: dict[str, list[str]] = {}
    inodes = {"": 1}

    def add_dir(rel: str) -> None:
        parent, _, name = rel.rpartition("/")
        if parent not in inodes:
            add_dir(parent)
        entries.append((inodes[parent], 0o040000, 0, 0, name.encode()))
        inodes[rel] = len(entries) + 1

    # Breadth first, so that the entries of each directory are contiguous.
    queue = [view for view in VIEWS if os.path.isdir(os.path.join(mount, view))]
    for view in queue:
        add_dir(view)
    while queue:
        rel = queue.pop(0)
        names = sorted(os.listdir(os.path.join(mount, rel)))
        subdirs = []
        for name in names:
            full = os.path.join(mount, rel, name)
            child = f"{rel}/{name}"
            if os.path.isdir(full):
                subdirs.append(child)
                continue
            with open(full, "rb", buffering=0) as f:
                body = f.read()
            entries.append((inodes[rel], 0o100000, len(body), len(data), name.encode()))
            data += body
            files.setdefault(rel.split("/")[0] + "/" + rel.split("/")[1], []).append(child)
        for sub in subdirs:
            add_dir(sub)
        queue.extend(subdirs)
    with open(path, "wb") as f:
        f.write(b"MMFSFLR1" + struct.pack("<Q", len(entries)))
        for parent, mode, size, offset, name in entries:
            f.write(struct.pack("<QIQQH", parent, mode, size, offset, len(name)) + name)
        f.write(data)
    return files


def cpu_seconds(pid: int) -> float:
    """User and system CPU a process (all its threads) has used."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def floor_mount(binary: str, pack_path: str, folder: str, threads: bool):
    mount = tempfile.mkdtemp(prefix="floor-", dir=folder)
    proc = subprocess.Popen([binary, pack_path, mount, "-f", *([] if threads else ["-s"])])
    try:
        while not os.path.ismount(mount):
            if proc.poll() is not None:
                sys.exit(f"fuse_floor: the floor daemon ended with {proc.returncode}")
            time.sleep(0.05)
        yield mount, proc.pid
    finally:
        unmount = ["fusermount3", "-u"] if shutil.which("fusermount3") else ["umount"]  # umount: as root
        subprocess.run([*unmount, mount], check=False)
        proc.wait()
        os.rmdir(mount)


def paths_under(root: str, names: list[str]):
    """ids -> the paths of those files under root."""
    return lambda part: [os.path.join(root, names[i]) for i in part]


def measure(config: str, options: str, binary: str, folder: str, n: int, readers: list[int]) -> None:
    threads = bool(parse_mount_options(options).threads)
    pack_path = os.path.join(folder, "floor.pack")
    with temporary_mount(config, options) as (mount, _pid):  # read once, for the pack only
        files = pack(mount, pack_path)
    size = os.path.getsize(os.path.join(folder, "flat_uint16.bin"))
    version = libfuse_version()
    print(f"libfuse {'.'.join(map(str, version))} for the floor; FUSE over io_uring: "
          f"{'possible (not measured here)' if version >= (3, 18) else 'not in this libfuse (needs 3.18)'}")
    print(f"load average before: {os.getloadavg()[0]:.1f}; mmfs -o {options or 'defaults'}")
    rng = np.random.default_rng(7)
    with temporary_mount(config, options) as (mount, pid), \
            floor_mount(binary, pack_path, folder, threads) as (floor, floor_pid), \
            floor_mount(binary, pack_path, folder, not threads) as (other, _):
        for view, names in files.items():
            order = rng.permutation(len(names))
            per = len(order) // len(readers)
            for k, r in enumerate(readers):
                ids = order[k * per:(k + 1) * per][:n]
                methods = [Method(name, paths_under(root, names), lambda paths: read_files(paths, 1 << 20))
                           for name, root in (("mmfs", mount), ("floor", floor), ("floor, other loop", other))]
                before = cpu_seconds(pid), cpu_seconds(floor_pid)
                rows = {row.method: row for row in interleaved(methods, "random", r, ids,
                                                               [os.path.join(folder, "flat_uint16.bin")])
                        if row.phase == "cold"}
                # Warm passes cost neither daemon a request: their CPU is the cold files'.
                cpu = [(cpu_seconds(p) - b) * 1e6 / len(ids) for p, b in zip((pid, floor_pid), before)]
                m, f, o = rows["mmfs"].rate, rows["floor"].rate, rows["floor, other loop"].rate
                print(f"{view:14s} cold, {r} reader(s), {len(ids)} files: mmfs {m:7.0f} files/s, floor {f:7.0f} "
                      f"({'threads' if threads else 'one thread'}), {o:7.0f} (the other loop); "
                      f"mmfs / floor {m / f:5.2f} (target >= 0.8); daemon CPU per file: mmfs {cpu[0]:5.1f} us, "
                      f"floor {cpu[1]:5.1f} us")
    print(f"load average after: {os.getloadavg()[0]:.1f}; data {size / 1e6:.0f} MB")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", help="data folder (default: a temporary one, removed afterwards)")
    ap.add_argument("-n", type=int, default=4000, help="files per configuration (cold, each read once)")
    ap.add_argument("--samples", type=int, default=20000, help="samples in the dataset")
    ap.add_argument("-o", dest="options", default="", help="mount options for mmfs (as for mmfs mount)")
    ap.add_argument("--readers", default="1,8", help="reader processes per configuration (comma-separated)")
    args = ap.parse_args(argv)
    single_threaded_libraries()
    folder = args.dir or tempfile.mkdtemp(prefix="mmfs-floor-")
    try:
        config = write_data(folder, args.samples)
        binary = build_floor(folder)
        measure(config, args.options, binary, folder, args.n, [int(r) for r in args.readers.split(",")])
    finally:
        if not args.dir:
            shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
