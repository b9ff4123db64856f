"""Cold-node mount benchmark (a program, not a test): what `mmfs mount` opens and
reads of the shared index cache, and how long it takes with the page cache dropped.

    python benchmarks/cold_mount.py --root SCRATCH [--datasets 1000 --docs 20000]
        [--rounds 3] [--other CHECKOUT] [--nodes 64]

The blend is scale_blend.py's (generated and built once in SCRATCH). Each round
mounts it twice, cold (as root: `sync; echo 3 > /proc/sys/vm/drop_caches` first,
as a node whose page cache does not hold the cache, or one that reads it from a
shared file system) and warm (right after), each time a fresh `mmfs -q mount` until it
returns, then unmounts. Beside the times, for one cold and one warm mount:

  cache files opened   open(2) of files in the cache folder by every process of the
                       mount (inotify's open events on the folder)
  bytes read           read/pread/preadv of those files, summed (`strace -f -y`, in
                       a run of its own: strace slows what it traces)

and, for `--nodes N` nodes starting at once on one shared cache, the opens the
cache's metadata server sees per job start (N x the cache files opened; each open
is also a lookup of its name and a close).

`--other CHECKOUT` runs the same rounds with another checkout of mmfs (its own
`XDG_CACHE_HOME`, so each keeps its record), interleaved, for a before/after.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import re
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scale_blend  # noqa: E402  (the blend generator, beside this file)

IN_OPEN = 0x20
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Side:
    """A checkout of mmfs, run with its own record folder."""

    def __init__(self, name: str, checkout: str, scratch: str) -> None:
        self.name, self.checkout = name, checkout
        self.env = {**scale_blend.CHILD_ENV, "PYTHONPATH": checkout,
                    "XDG_CACHE_HOME": os.path.join(scratch, f"user-cache-{name}")}

    def cmd(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "mmfs.cli", *args]


def drop_caches() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


class Opens:
    """open(2) of files in a folder by any process (inotify)."""

    def __init__(self, folder: str) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self.fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        libc.inotify_add_watch(self.fd, os.fsencode(folder), IN_OPEN)

    def count(self) -> tuple[int, int]:
        """(opens, distinct files) since the last count; -1 when the queue overflowed."""
        names, overflow = [], False
        while True:
            try:
                raw = os.read(self.fd, 1 << 20)
            except BlockingIOError:
                break
            at = 0
            while at < len(raw):
                _, mask, _, length = struct.unpack_from("iIII", raw, at)
                overflow |= bool(mask & 0x4000)
                names.append(raw[at + 16 : at + 16 + length].rstrip(b"\0"))
                at += 16 + length
        return (-1, -1) if overflow else (len(names), len(set(names)))


def mount(side: Side, config: str, mountpoint: str, strace: str | None = None) -> float:
    cmd = side.cmd("-q", "mount", config, mountpoint)
    if strace:
        cmd = ["strace", "-ff", "-y", "-qq", "-o", strace, "-e", "trace=openat,read,pread64,preadv,preadv2", *cmd]
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, env=side.env, cwd=side.checkout, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if strace:  # strace waits for the daemon: the mount is up when the mount point is
        while not os.path.ismount(mountpoint):
            if proc.poll() is not None:
                sys.exit(f"{side.name}: mount failed: {proc.stderr.read().decode()[-2000:]}")
            time.sleep(0.05)
    else:
        out, err = proc.communicate()
        if proc.returncode != 0:
            sys.exit(f"{side.name}: mount failed ({proc.returncode}): {err.decode()[-2000:]}")
    seconds = time.perf_counter() - t
    subprocess.run(side.cmd("umount", mountpoint), env=side.env, cwd=side.checkout, capture_output=True)
    if strace:
        proc.wait()
    return seconds


_READ = re.compile(r"^(?:read|pread64|preadv2?)\((\d+)<([^>]*)>.*\)\s+=\s+(\d+)", re.M)
_OPEN = re.compile(r"^openat\(.*\)\s+=\s+\d+<([^>]*)>", re.M)


def traced(trace: str, folder: str) -> tuple[int, int, int]:
    """(opens, distinct files opened, bytes read) of files in `folder`, from strace -ff -y's
    files (one per thread: no call split across lines), which are removed."""
    text = ""
    for name in os.listdir(os.path.dirname(trace)):
        path = os.path.join(os.path.dirname(trace), name)
        if name.startswith(os.path.basename(trace) + "."):
            with open(path) as f:
                text += f.read()
            os.unlink(path)
    inside = folder + os.sep
    opened = [m.group(1) for m in _OPEN.finditer(text) if m.group(1).startswith(inside)]
    return (len(opened), len(set(opened)),
            sum(int(m.group(3)) for m in _READ.finditer(text) if m.group(2).startswith(inside)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", required=True, help="scratch folder (scale_blend.py's)")
    ap.add_argument("--datasets", type=int, default=1000)
    ap.add_argument("--docs", type=int, default=20000)
    ap.add_argument("--samples", type=int, default=4_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--other", default=None, help="another checkout of mmfs, for a before/after")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        sys.exit("run as root: the cold mounts drop the page cache")
    os.makedirs(args.root, exist_ok=True)
    config = scale_blend.generate(args.root, args.datasets, args.docs, args.samples, "cache")
    cache = os.path.realpath(scale_blend.cache_of(config))
    sides = [Side("this", HERE, args.root)]
    if args.other:
        sides.insert(0, Side("other", os.path.realpath(args.other), args.root))
    for side in sides:  # built, and each side's record written (a first mount of each, not measured)
        built = subprocess.run(side.cmd("-q", "build", config), env=side.env, cwd=side.checkout,
                               capture_output=True, text=True)
        if built.returncode != 0:
            sys.exit(f"{side.name}: build failed: {built.stderr[-2000:]}")
    mountpoint = tempfile.mkdtemp(prefix="mmfs-cold-mnt-", dir=args.root)
    print(f"blend: {args.datasets} datasets x {args.docs} documents; cache {cache}: "
          f"{len(os.listdir(cache))} files")
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at the start")
    opens = Opens(cache)
    try:
        for side in sides:
            mount(side, config, mountpoint)  # a warm-up: its record and derived files as a mount leaves them
        for side in sides:
            drop_caches()
            opens.count()
            mount(side, config, mountpoint)
            files = opens.count()[1]
            trace = os.path.join(args.root, f"strace-{side.name}.txt")
            counted = []
            for cold in (True, False):
                if cold:
                    drop_caches()
                mount(side, config, mountpoint, strace=trace)
                counted.append(traced(trace, cache))
            (n_cold, _, b_cold), (n_warm, _, b_warm) = counted
            print(f"{side.name}: cache files opened {files} (inotify), opens {n_cold} cold / {n_warm} warm (strace); "
                  f"bytes read {b_cold / 1e6:.1f} MB cold / {b_warm / 1e6:.1f} MB warm; {args.nodes} nodes starting "
                  f"at once: {args.nodes * n_cold:,} opens of cache files per job start", flush=True)
        for r in range(args.rounds):
            for side in sides:
                drop_caches()
                load = os.getloadavg()[0]
                cold = mount(side, config, mountpoint)
                warm = mount(side, config, mountpoint)
                print(f"round {r + 1} {side.name}: cold {cold:.2f} s, warm {warm:.2f} s, cold/warm "
                      f"{cold / warm:.2f} (load {load:.1f})", flush=True)
    finally:
        subprocess.run(sides[0].cmd("umount", mountpoint), capture_output=True)
        os.rmdir(mountpoint)
    return 0


if __name__ == "__main__":
    sys.exit(main())
