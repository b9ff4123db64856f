"""Scale benchmark (a program, not a test): a blend of many IndexedDatasets.

    python benchmarks/scale_blend.py --root SCRATCH [--datasets 1000] [--docs 20000]
        [--samples 4000000] [--megatron-python PYTHON] [--jobs N] [--repeat 1]
        [--pbin-docs 10000000] [--ulimit N] [--skip mount,concurrent,pbin,megatron]

The cases of docs/benchmarks.md: 1,000 datasets of 20,000 documents (the default)
and 10,000 of 5,000 (`--datasets 10000 --docs 5000`, 50 million documents); each
also under `--ulimit 1024`, the soft limit on open files of most Linux systems,
which every command of the run (mmfs's and megatron-core's) is started under.

It generates, once, in SCRATCH: N uint16 IndexedDatasets (real .idx, sparse .bin,
documents of 1..1999 tokens) and a YAML config blending them with weights
(split 99,1,0; `--samples` train samples, 1 % as many valid; sequence_length 4096),
then measures, each in a fresh process (time, peak resident memory, CPU seconds):

  cold build        `mmfs build -j` on an empty cache, side by side with megatron-core's
                    BlendedMegatronDatasetBuilder on the same blend (one run,
                    interleaved); the two caches are compared file by file
  cached re-open    `mmfs build` again
  mount             `mmfs mount` until it returns; then 2,000 samples read across the
                    blend, and the daemon's resident memory and open descriptors
  4 builders        four `mmfs build` at once on an empty cache: CPU against one build
                    (one, then four, in turn, at least three times; the median ratio)
  .pbin             opening a Modalities file of `--pbin-docs` documents (and
                    `mmfs info` of it, which also computes length statistics),
                    first and later opens

An empty cache is a new folder: old ones are set aside and removed at the end (see
set_aside). megatron-core runs under `--megatron-python` (default: this interpreter) when it can
import megatron.core; otherwise its column says so.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import pickle
import resource
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

SEQ_LEN = 4096
SEED = 1234
TOKENIZER = {"class": "benchmarks.scale_blend", "eod": 0}

# What megatron-core builds for the same config (run under --megatron-python).
MEGATRON = r"""
import json, sys, warnings
warnings.filterwarnings("ignore")
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
spec = json.load(open(sys.argv[1]))

class Tokenizer:
    eod = spec["eod"]
    vocab_size = None
    unique_identifiers = spec["tokenizer"]

config = GPTDatasetConfig(
    random_seed=spec["seed"], sequence_length=spec["sequence_length"],
    blend=(spec["paths"], spec["weights"]), split=spec["split"],
    path_to_cache=sys.argv[2], tokenizer=Tokenizer(), reset_position_ids=False,
    reset_attention_mask=False, eod_mask_loss=False, create_attention_mask=False,
    num_dataset_builder_threads=int(sys.argv[3]),
)
built = BlendedMegatronDatasetBuilder(GPTDataset, spec["sizes"], lambda: True, config).build()
print(json.dumps([None if d is None else len(d) for d in built]))
"""


def write_dataset(prefix: str, lengths: np.ndarray) -> None:
    """A uint16 MMIDIDX dataset, one sequence per document; the .bin is sparse."""
    n = len(lengths)
    pointers = np.zeros(n, dtype=np.int64)
    np.cumsum(lengths[:-1].astype(np.int64) * 2, out=pointers[1:])
    with open(prefix + ".idx", "wb") as f:
        f.write(struct.pack("<9sQBQQ", b"MMIDIDX\x00\x00", 1, 8, n, n + 1))
        f.write(lengths.astype("<i4").tobytes())
        f.write(pointers.astype("<i8").tobytes())
        f.write(np.arange(n + 1, dtype="<i8").tobytes())
    with open(prefix + ".bin", "wb") as f:
        f.truncate(int(lengths.sum(dtype=np.int64)) * 2)


def generate(root: str, datasets: int, docs: int, samples: int, cache_dir: str) -> str:
    """The datasets (once per root and shape) and the config; returns the config path."""
    tag = f"{datasets}x{docs}-{samples}"
    config = os.path.join(root, f"blend-{tag}.yaml")
    data = os.path.join(root, f"data-{datasets}x{docs}")
    os.makedirs(data, exist_ok=True)
    rng = np.random.RandomState(0)
    paths, weights = [], []
    for d in range(datasets):
        prefix = os.path.join(data, f"ds{d:05d}")
        lengths = rng.randint(1, 2000, size=docs).astype(np.int32)
        if not os.path.exists(prefix + ".bin"):
            write_dataset(prefix, lengths)
        paths.append(prefix)
        weights.append(round(float(rng.uniform(0.5, 2.0)), 4))
    spec = {
        "datasets": [{"path": p, "weight": w} for p, w in zip(paths, weights)],
        "split": "99,1,0",
        "samples": {"train": samples, "valid": samples // 100, "test": samples // 1000},
        "sequence_length": SEQ_LEN,
        "seed": SEED,
        "tokenizer": {"eod": TOKENIZER["eod"], "unique_identifiers": TOKENIZER},
        "cache_dir": cache_dir,
    }
    with open(config + ".tmp", "w") as f:
        json.dump(spec, f)  # JSON is YAML
    os.replace(config + ".tmp", config)
    return config


# Children cache their bytecode, as after any install (an environment that sets
# PYTHONDONTWRITEBYTECODE makes every process compile mmfs again).
CHILD_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


# The soft limit on open files every command runs under (--ulimit; None: as it is).
OPEN_FILES: int | None = None


def _limited() -> None:
    if OPEN_FILES is not None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (OPEN_FILES, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))


def run(cmd: list[str]) -> dict:
    """Run a command; its wall time, peak RSS (MB) and CPU seconds (os.wait4)."""
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=CHILD_ENV,
                            preexec_fn=_limited)
    out, err = proc.communicate()
    return {"seconds": time.perf_counter() - t, "out": out.decode(), "err": err.decode(),
            "rc": proc.returncode, **_usage(proc)}


def _usage(proc: subprocess.Popen) -> dict:
    ru = getattr(proc, "rusage", None)
    if ru is None:
        return {"rss_mb": float("nan"), "cpu": float("nan")}
    return {"rss_mb": ru.ru_maxrss / 1024, "cpu": ru.ru_utime + ru.ru_stime}


class _Popen(subprocess.Popen):
    """Popen that keeps the child's rusage (wait4) instead of discarding it."""

    def _try_wait(self, wait_flags):  # noqa: ANN001 - subprocess internals
        try:
            pid, sts, ru = os.wait4(self.pid, wait_flags)
        except ChildProcessError:
            return self.pid, 0
        if pid:
            self.rusage = ru
        return pid, sts


subprocess.Popen = _Popen  # type: ignore[misc] - this program only


def mmfs_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "mmfs.cli", *args]


def cache_of(config: str) -> str:
    with open(config) as f:
        return os.path.join(os.path.dirname(config), json.load(f)["cache_dir"])


def old_caches(config: str) -> str:
    return os.path.join(os.path.dirname(config), "old-caches")


def set_aside(config: str, path: str) -> None:
    """Move a cache folder aside (removed at the end of the run) rather than delete
    it: on ext4 without a journal, each file created within minutes of thousands of
    deletions scans the freed inodes (`recently_deleted`), so a build right after
    an rm -rf of a cache mostly measures that, for mmfs and Megatron alike."""
    if os.path.exists(path):
        os.makedirs(old_caches(config), exist_ok=True)
        os.rename(path, os.path.join(tempfile.mkdtemp(dir=old_caches(config)), "cache"))


def fresh_cache(config: str) -> str:
    cache = cache_of(config)
    set_aside(config, cache)
    return cache


def check(result: dict, what: str) -> dict:
    if result["rc"] != 0:
        sys.exit(f"{what} failed ({result['rc']}):\n{result['err'][-3000:]}")
    return result


def last_line(result: dict) -> str:
    """Why a command failed: its line naming the error number (Megatron's own last line
    is often a later exception in a destructor), else its last line."""
    lines = [line.strip() for line in result["err"].splitlines() if line.strip()]
    named = [line for line in lines if "[Errno" in line]
    return (named or lines or [f"exit code {result['rc']}"])[-1][:200]


def megatron_spec(config: str) -> str:
    with open(config) as f:
        cfg = json.load(f)
    spec = {
        "paths": [d["path"] for d in cfg["datasets"]],
        "weights": [d["weight"] for d in cfg["datasets"]],
        "split": cfg["split"], "seed": cfg["seed"], "sequence_length": cfg["sequence_length"],
        "sizes": [cfg["samples"]["train"], cfg["samples"]["valid"], cfg["samples"]["test"]],
        "eod": TOKENIZER["eod"], "tokenizer": TOKENIZER,
    }
    path = config + ".megatron.json"
    with open(path, "w") as f:
        json.dump(spec, f)
    return path


def has_megatron(python: str) -> bool:
    probe = subprocess.run([python, "-c", "import megatron.core.datasets.gpt_dataset"],
                           capture_output=True)
    return probe.returncode == 0


def same_tree(a: str, b: str) -> str:
    """Whether two caches hold the same files (mmfs's header files and packs aside:
    Megatron writes none)."""
    names_a, names_b = (sorted(n for n in os.listdir(d) if not n.endswith(("-mmfs-headers.json", "-mmfs-pack")))
                        for d in (a, b))
    if names_a != names_b:
        return f"DIFFERENT names ({len(names_a)} vs {len(names_b)} files)"
    _, mismatch, errors = filecmp.cmpfiles(a, b, names_a, shallow=False)
    if mismatch or errors:
        return f"DIFFERENT bytes in {len(mismatch) + len(errors)} files, e.g. {(mismatch + errors)[0]}"
    return f"identical ({len(names_a)} files)"


def row(what: str, r: dict, extra: str = "") -> None:
    print(f"  {what:34} {r['seconds']:7.2f} s  {r['rss_mb']:7.0f} MB peak  "
          f"{r['cpu']:7.1f} CPU-s  {extra}", flush=True)


def bench_cold(config: str, args: argparse.Namespace, megatron: bool) -> None:
    print("cold build (empty cache), side by side:")
    spec = megatron_spec(config) if megatron else None
    for _ in range(args.repeat):
        cache = fresh_cache(config)
        mm = check(run(mmfs_cmd("-q", "build", config, "-j", str(args.jobs))), "mmfs build")
        row(f"mmfs build -j {args.jobs}", mm)
        if not megatron:
            print("  megatron-core: not importable here (--megatron-python)")
            continue
        ours = cache + ".mmfs"
        set_aside(config, ours)
        os.rename(cache, ours)
        finished = False
        for threads in sorted({1, args.jobs}):
            set_aside(config, cache)
            mg = run([args.megatron_python, "-c", MEGATRON, spec, cache, str(threads)])
            if mg["rc"] != 0:  # e.g. out of descriptors under --ulimit
                row(f"megatron-core threads={threads}", mg, f"FAILS: {last_line(mg)}")
                continue
            finished = True
            row(f"megatron-core threads={threads}", mg,
                f"mmfs/megatron time {mm['seconds'] / mg['seconds']:.2f}, "
                f"memory {mm['rss_mb'] / mg['rss_mb']:.2f}")
        if finished:
            print(f"  caches: {same_tree(ours, cache)}")
        set_aside(config, cache)
        os.rename(ours, cache)


def bench_reopen(config: str, args: argparse.Namespace) -> None:
    print("cached re-open:")
    for _ in range(max(args.repeat, 3)):
        row("mmfs build (cached)", check(run(mmfs_cmd("-q", "build", config)), "mmfs build"))


def _rss_of(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _daemon_pid(mountpoint: str) -> int | None:
    mp = os.path.realpath(mountpoint)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"mount" in argv and any(os.path.realpath(a.decode(errors="replace")) == mp
                                    for a in argv if a):
            return int(entry)
    return None


def _descriptors(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


def bench_mount(config: str, args: argparse.Namespace) -> None:
    print("mount of the cached config:")
    mountpoint = tempfile.mkdtemp(prefix="mmfs-scale-mnt-", dir=args.root)
    try:
        for _ in range(max(args.repeat, 1)):
            r = check(run(mmfs_cmd("-q", "mount", config, mountpoint)), "mmfs mount")
            pid = _daemon_pid(mountpoint)
            samples = os.path.join(mountpoint, "train", "samples")
            count = len(os.listdir(samples))
            t = time.perf_counter()
            for i in np.random.RandomState(0).randint(0, count, size=2000):  # across the whole blend
                with open(os.path.join(samples, f"{i:07d}.bin"), "rb") as f:
                    f.read()
            read = time.perf_counter() - t
            rss = _rss_of(pid) if pid else float("nan")
            row("mmfs mount (returns)", r, f"daemon {rss:.0f} MB, {_descriptors(pid) if pid else -1} open "
                f"descriptors after 2,000 random samples ({read:.2f} s)")
            subprocess.run(mmfs_cmd("umount", mountpoint), capture_output=True)
    finally:
        subprocess.run(mmfs_cmd("umount", mountpoint), capture_output=True)
        os.rmdir(mountpoint)


def bench_concurrent(config: str, args: argparse.Namespace, n: int = 4) -> None:
    print(f"{n} builders at once on an empty cache (-j 1 each), against one build, "
          "in turn:")
    ratios = []
    for _ in range(max(args.repeat, 3)):
        fresh_cache(config)
        one = check(run(mmfs_cmd("-q", "build", config, "-j", "1")), "mmfs build")
        fresh_cache(config)
        t = time.perf_counter()
        procs = [subprocess.Popen(mmfs_cmd("-q", "build", config, "-j", "1"), env=CHILD_ENV,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                 for _ in range(n)]
        errs = [p.communicate()[1] for p in procs]
        wall = time.perf_counter() - t
        if any(p.returncode for p in procs):
            sys.exit(f"a concurrent build failed: {errs}")
        cpu = sum(_usage(p)["cpu"] for p in procs)
        peak = max(_usage(p)["rss_mb"] for p in procs)
        ratios.append(cpu / one["cpu"])
        print(f"  one: {one['seconds']:.2f} s, {one['cpu']:.1f} CPU-s; {n} at once: {wall:.2f} s "
              f"wall, {cpu:.1f} CPU-s in all ({ratios[-1]:.2f}x), {peak:.0f} MB peak each",
              flush=True)
    print(f"  median: {statistics.median(ratios):.2f}x the CPU of one build")


OPEN_PBIN = r"""
import sys, time
from mmfs.formats.packed import PackedDataset
t = time.perf_counter()
PackedDataset(sys.argv[1])
print(time.perf_counter() - t)
"""


def write_pbin(path: str, docs: int) -> None:
    """A Modalities .pbin of `docs` documents (uint16, 1..1999 tokens; sparse data),
    its index pickled as Modalities does: a list of (offset, length) tuples."""
    rng = np.random.RandomState(1)
    lengths = rng.randint(1, 2000, size=docs).astype(np.int64) * 2
    offsets = np.zeros(docs, dtype=np.int64)
    np.cumsum(lengths[:-1], out=offsets[1:])
    data_len = int(lengths.sum())
    index = list(zip(offsets.tolist(), lengths.tolist()))
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<QI", data_len, 2))
        f.seek(12 + data_len)
        pickle.dump(index, f, protocol=4)
    os.replace(path + ".tmp", path)


def bench_pbin(args: argparse.Namespace) -> None:
    path = os.path.join(args.root, f"big-{args.pbin_docs}.pbin")
    if not os.path.exists(path):
        write_pbin(path, args.pbin_docs)
    print(f".pbin of {args.pbin_docs:,} documents (`mmfs info`):")
    opener = [sys.executable, "-c", OPEN_PBIN, path]
    for what, cmd in (("open", opener), ("mmfs info", mmfs_cmd("info", path))):
        shutil.rmtree(path[: -len(".pbin")], ignore_errors=True)  # its index cache
        for k in range(1 + max(args.repeat, 2)):
            r = check(run(cmd), what)
            extra = f"open itself {float(r['out']):.3f} s" if what == "open" else ""
            row(f"{what}, {'first' if k == 0 else 'later'}", r, extra)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", required=True, help="scratch folder for data and caches")
    ap.add_argument("--datasets", type=int, default=1000)
    ap.add_argument("--docs", type=int, default=20000, help="documents per dataset")
    ap.add_argument("--samples", type=int, default=4_000_000, help="train samples")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                    help="mmfs build -j and megatron-core's num_dataset_builder_threads")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--pbin-docs", type=int, default=10_000_000)
    ap.add_argument("--megatron-python", default=sys.executable)
    ap.add_argument("--cache-dir", default="cache",
                    help="index cache folder, relative to --root (e.g. one on tmpfs)")
    ap.add_argument("--ulimit", type=int, default=None, metavar="N",
                    help="run every command under a soft limit of N open files (e.g. 1024)")
    ap.add_argument("--skip", default="", help="comma list: cold,reopen,mount,concurrent,pbin,megatron")
    args = ap.parse_args(argv)
    global OPEN_FILES
    OPEN_FILES = args.ulimit
    skip = set(filter(None, args.skip.split(",")))
    os.makedirs(args.root, exist_ok=True)
    t = time.perf_counter()
    config = generate(args.root, args.datasets, args.docs, args.samples, args.cache_dir)
    print(f"blend: {args.datasets} datasets x {args.docs} documents, {args.samples:,} train "
          f"samples, sequence_length {SEQ_LEN} ({config}; ready in {time.perf_counter() - t:.1f} s)")
    limit = f"; every command under ulimit -n {args.ulimit}" if args.ulimit else ""
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; each figure from one "
          f"fresh process{limit}\n", flush=True)
    megatron = "megatron" not in skip and has_megatron(args.megatron_python)
    if "cold" not in skip:
        bench_cold(config, args, megatron)
    if "reopen" not in skip:
        if not os.path.isdir(cache_of(config)):
            check(run(mmfs_cmd("-q", "build", config)), "mmfs build")
        bench_reopen(config, args)
    if "mount" not in skip:
        bench_mount(config, args)
    if "concurrent" not in skip:
        bench_concurrent(config, args)
    if "pbin" not in skip:
        bench_pbin(args)
    shutil.rmtree(old_caches(config), ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
