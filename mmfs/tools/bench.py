"""`mmfs bench`: how fast samples come out of a mount, beside the alternatives.

    mmfs bench MOUNTPOINT_OR_CONFIG [-n N] [--readers 1,2,4] [--json]
    python -m mmfs.tools.bench --make-data DIR       # ~500 MB of uint16 tokens + configs

Reads N sample files in sequential and in random order with 1, 2 and 4 reader
processes, a cold pass (files never read since the mount) then a warm pass
(the same files again), and in the same run the same reads from:
megatron-core's in-process GPTDataset.__getitem__ (when it is installed), the
same bytes as real files on tmpfs (/dev/shm), an in-process numpy memmap slice
of the token file, and mmfs's own in-process reader. Given a config, it mounts
it in a temporary directory and unmounts afterwards, and reports the daemon's
memory.

A reader opens, reads and closes each file (os.open, one os.read of the file
size, os.close), as a data loader does.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import asdict
from typing import Any

import numpy as np

from mmfs.errors import MmfsError
from mmfs.mount.contract import (
    KEY_BYTES_PER_MICROBATCH,
    KEY_BYTES_PER_SAMPLE,
    KEY_DATA_PARALLEL_SIZE,
    KEY_MICRO_BATCH_SIZE,
    KEY_MICROBATCH_NAME_WIDTH,
    KEY_MICROBATCHES,
    KEY_NAME_WIDTH,
    KEY_RANK_NAME_WIDTH,
    KEY_SAMPLES,
    KEY_SPLITS,
    KEY_TOKENS_PER_SAMPLE,
    KEY_TRAINING,
    MANIFEST,
    file_name,
    rank_dir,
    sample_dir,
)
from mmfs.mount.lifecycle import temporary_mount
from mmfs.tools import harness
from mmfs.tools.bench_data import make_data
from mmfs.tools.harness import (
    MB,
    SLICES,
    Method,
    Plan,
    Row,
    daemon_memory,
    interleaved,
    read_files,
    read_one,
    read_through,
    run_parallel,
    single_threaded_libraries,
)
from mmfs.tools.megatron.baseline import megatron_reader

log = logging.getLogger(__name__)


# -- readers -----------------------------------------------------------------


# -- the benchmark -------------------------------------------------------------


def _copy_to_tmpfs(ids: np.ndarray, width: int, read: Callable[[int], bytes], root: str | None) -> str:
    """The bytes of samples `ids` as real files in a new folder on tmpfs."""
    folder = tempfile.mkdtemp(prefix="mmfs-bench-", dir=root)
    try:
        for i in ids:
            with open(os.path.join(folder, file_name(int(i), width)), "wb") as f:
                f.write(read(int(i)))
    except BaseException:  # a signal (bench_command) or an error: no half-copied folder left
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return folder


def sample_paths(mount: str, split: str, width: int, ids: np.ndarray) -> list[str]:
    base = os.path.join(mount, sample_dir(split).lstrip("/"))
    return [os.path.join(base, file_name(int(i), width)) for i in ids]


def bench_mount(mount: str, n: int, readers: list[int], corpus: Any = None,
                daemon_pid: int | None = None) -> dict[str, Any]:
    """Every measurement on a mounted mmfs directory (and its corpus, if open).

    The methods take turns slice by slice (see interleaved), so that a noisy
    neighbour slows all of them alike."""
    with open(os.path.join(mount, MANIFEST)) as f:
        info = json.load(f)
    split = "train" if "train" in info[KEY_SAMPLES] else next(iter(info[KEY_SAMPLES]))
    total = int(info[KEY_SAMPLES][split])
    size = int(info[KEY_BYTES_PER_SAMPLE])
    width = int(info[KEY_SPLITS][split][KEY_NAME_WIDTH])
    tokens = int(info[KEY_TOKENS_PER_SAMPLE])
    plan = Plan(total, n, readers).ids()
    rows: list[Row] = []
    notes: list[str] = []
    rss_before = daemon_memory(daemon_pid)
    read_sized = lambda paths: read_files(paths, size)  # noqa: E731
    memmap_read = _memmap_reader(corpus, tokens) if corpus is not None else None
    if corpus is not None:
        reader = corpus.splits[split]

        def inprocess_read(part: np.ndarray) -> int:
            return sum(len(reader.read(int(i))) for i in part)
    megatron_read = None
    megatron_cache = tempfile.mkdtemp(prefix="mmfs-bench-megatron-")
    try:  # (also when a signal ends the bench: bench_command)
        if corpus is None:
            notes.append("in-process baselines need a config (bench a CONFIG.yaml, not a mount)")
        else:
            megatron_read = megatron_reader(corpus, split, megatron_cache, notes)
        shm_root = "/dev/shm" if os.path.isdir("/dev/shm") else None
        sources = corpus.placer.files() if corpus is not None else []
        sources += sorted(os.path.join(d, f) for d, _, files in os.walk(megatron_cache) for f in files)
        if corpus is None:
            notes.append("the source files are not read through before cold passes (bench a config for that)")
        for (order, r), ids in plan.items():
            def tmpfs_method(folder: str) -> Method:
                return Method("tmpfs files", lambda part: [os.path.join(folder, file_name(int(i), width))
                                                           for i in part], read_sized)

            methods = [Method("mmfs mount", lambda part: sample_paths(mount, split, width, part), read_sized)]
            shm = None
            try:
                if corpus is not None:
                    # The same bytes as real files on tmpfs, written by the in-process
                    # reader (reading them from the mount would warm it).
                    shm = _copy_to_tmpfs(ids, width, reader.read, shm_root)
                    methods += [tmpfs_method(shm),
                                Method("mmfs in-process", lambda part: part, inprocess_read),
                                Method("numpy memmap slice", lambda part: part, memmap_read)]
                    if megatron_read is not None:
                        methods.append(Method("megatron __getitem__", lambda part: part, megatron_read))
                rows += interleaved(methods, order, r, ids, sources)
                if corpus is None:  # copied from the mount, after its passes
                    shm = _copy_to_tmpfs(ids, width, lambda i: read_one(sample_paths(mount, split, width, [i])[0]),
                                         shm_root)
                    rows += interleaved([tmpfs_method(shm)], order, r, ids)
            finally:
                if shm is not None:
                    shutil.rmtree(shm, ignore_errors=True)
    finally:
        shutil.rmtree(megatron_cache, ignore_errors=True)
    rss_after = daemon_memory(daemon_pid)
    return {
        "mount": mount,
        "split": split,
        "samples_in_split": total,
        "bytes_per_sample": size,
        "dtype": info["dtype"],
        "sequence_length": info["sequence_length"],
        "rows": [dict(asdict(r), samples_per_s=r.rate, mb_per_s=r.rate * size / MB) for r in rows],
        "daemon_memory_before": rss_before,
        "daemon_memory_after": rss_after,
        "notes": notes,
    }


def _memmap_reader(corpus: Any, tokens: int) -> Callable[[np.ndarray], int]:
    """An in-process numpy memmap slice of the first dataset's token file, one
    sample's worth of tokens at a position derived from the id (no shuffling
    or blending: the floor any reader of the raw file pays)."""
    ds = corpus.datasets[0].dataset
    data = np.memmap(ds.bin_path, dtype=ds.dtype, mode="r")
    span = max(len(data) - tokens, 1)

    def read(part: np.ndarray) -> int:
        total = 0
        for i in part:
            off = (int(i) * tokens) % span
            total += len(data[off : off + tokens].tobytes())
        return total

    return read


# -- output --------------------------------------------------------------------


def format_table(result: dict[str, Any]) -> str:
    lines = [
        f"mmfs bench: {result['mount']}  split {result['split']} "
        f"({result['samples_in_split']} samples of {result['bytes_per_sample']} bytes, "
        f"{result['dtype']}, sequence_length {result['sequence_length']})",
        "",
        f"| {'method':<20} | {'order':<10} | readers | pass | {'samples/s':>9} | {'MB/s':>7} |",
        f"|{'-' * 22}|{'-' * 12}|---------|------|{'-' * 11}|{'-' * 9}|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['method']:<20} | {r['order']:<10} | {r['readers']:>7} | {r['phase']:<4} "
            f"| {r['samples_per_s']:>9.0f} | {r['mb_per_s']:>7.1f} |"
        )
    for key in ("daemon_memory_before", "daemon_memory_after"):
        if result.get(key):
            m = result[key]
            lines.append(
                f"daemon memory {key.split('_')[-1]} reading: RSS {m.get('VmRSS', 0) / 1024:.1f} MB "
                f"(anonymous {m.get('RssAnon', 0) / 1024:.1f} MB, file-backed "
                f"{m.get('RssFile', 0) / 1024:.1f} MB)"
            )
    for note in result["notes"]:
        lines.append(f"note: {note}")
    return "\n".join(lines)


# -- micro-batch files -------------------------------------------------------------


def bench_microbatches(config: str, sizes: list[int], n: int, options: str = "",
                       data_parallel_size: int = 8) -> list[str]:
    """Rank 0's micro-batch files (`<split>/ranks/000/`, Megatron's default
    sampler) against the same samples read as single sample files, both cold,
    one reader, taking turns slice by slice; one mount per micro-batch size, of
    the config with a `training:` block added. Returns the lines to print."""
    import yaml

    with open(config) as f:
        raw = yaml.safe_load(f)
    lines = [f"micro-batch files of rank 0 (data_parallel_size {data_parallel_size}, dataloader "
             "single) vs single sample files, the same samples, cold, 1 reader:"]
    for mbs in sizes:
        raw["training"] = {"data_parallel_size": data_parallel_size, "micro_batch_size": mbs}
        variant = os.path.join(os.path.dirname(os.path.abspath(config)), f".mmfs-bench-mbs{mbs}.yaml")
        with open(variant, "w") as f:
            yaml.safe_dump(raw, f, sort_keys=False)
        try:
            files, rates = _microbatch_rates(variant, n, options)
        finally:
            os.unlink(variant)
        lines.append(f"  micro_batch_size {mbs}: {rates['micro-batch files']:,.0f} samples/s in micro-batch "
                     f"files, {rates['sample files']:,.0f} in sample files: "
                     f"{rates['micro-batch files'] / rates['sample files']:.2f}x ({files} files)")
    return lines


def _microbatch_rates(config: str, n: int, options: str) -> tuple[int, dict[str, float]]:
    """(files read, samples/s by method) for bench_microbatches."""
    from mmfs.megatron import open_corpus

    sources = open_corpus(config, progress=False).placer.files()
    with temporary_mount(config, options) as (mount, _pid):
        with open(os.path.join(mount, MANIFEST)) as f:
            info = json.load(f)
        t = info[KEY_TRAINING]
        mbs, step = t[KEY_MICRO_BATCH_SIZE], t[KEY_MICRO_BATCH_SIZE] * t[KEY_DATA_PARALLEL_SIZE]
        files = min(n // mbs, t[KEY_MICROBATCHES]["train"])
        width, fwidth = info[KEY_SPLITS]["train"][KEY_NAME_WIDTH], t[KEY_MICROBATCH_NAME_WIDTH]["train"]
        rank0 = os.path.join(mount, rank_dir("train", 0, t[KEY_RANK_NAME_WIDTH]).lstrip("/"))
        size, batch = info[KEY_BYTES_PER_SAMPLE], t[KEY_BYTES_PER_MICROBATCH]
        methods = {
            "micro-batch files": (lambda part: [os.path.join(rank0, file_name(int(j), fwidth)) for j in part],
                                  lambda paths: read_files(paths, batch)),
            "sample files": (lambda part: sample_paths(mount, "train", width, np.concatenate(
                [np.arange(j * step, j * step + mbs) for j in part])), lambda paths: read_files(paths, size)),
        }
        read_through(sources)
        seconds = dict.fromkeys(methods, 0.0)
        for part in np.array_split(np.arange(files), SLICES):
            for name, (make, fn) in methods.items():
                seconds[name] += run_parallel(fn, [make(part)])
    return files, {name: files * mbs / sec for name, sec in seconds.items()}


# -- entry points ----------------------------------------------------------------


MAX_READERS = 256  # reader processes at most


def _parse_readers(text: str) -> list[int]:
    try:
        readers = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise MmfsError(f"--readers {text!r}: give a comma-separated list of counts, e.g. 1,2,4") from None
    if not readers or min(readers) < 1:
        raise MmfsError(f"--readers {text!r}: counts must be >= 1")
    if max(readers) > MAX_READERS:
        raise MmfsError(f"--readers {text!r}: at most {MAX_READERS} reader processes (more measure the "
                        "machine's process table, not the mount)")
    return readers


def run(target: str, n: int, readers: list[int], options: str = "") -> dict[str, Any]:
    """Bench a mount point, or mount a config in a temporary directory and bench that."""
    from mmfs.mount.mountpoint import mount_point_state

    if os.path.isdir(target):
        if mount_point_state(os.path.abspath(target)).state != "mounted":
            raise MmfsError(f"{target}: not a mounted mmfs directory (give a mount point or a config)")
        return bench_mount(target, n, readers)

    from mmfs.megatron import open_corpus

    with temporary_mount(target, options) as (mount, pid):
        corpus = open_corpus(target, progress=False)  # the in-process baselines' own copy, mapped
        return bench_mount(mount, n, readers, corpus=corpus, daemon_pid=pid)


@contextlib.contextmanager
def _stopped_by_signals() -> Iterator[list[int]]:
    """While the block runs, the first SIGINT or SIGTERM raises KeyboardInterrupt (the
    bench unwinds: its readers are ended, its mount unmounted, its daemon waited for)
    and is noted in the list yielded; a second is ignored, so that it cannot cut that
    short. Where this is not the main thread, nothing changes."""
    seen: list[int] = []

    def first(signum, frame) -> None:
        if not seen:
            seen.append(signum)
            harness.stopping.set()
            if not harness.starting:  # (while readers are started, their runner raises it)
                raise KeyboardInterrupt

    try:
        previous = {s: signal.signal(s, first) for s in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:  # not the main thread
        yield seen
        return
    try:
        yield seen
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def bench_command(args: argparse.Namespace) -> int:
    """`mmfs bench TARGET [-n N] [--readers 1,2,4] [--json]`; SIGINT or SIGTERM ends its
    readers, its mount and its daemon, says so in one line, exit 130 or 143."""
    single_threaded_libraries()
    harness.stopping.clear()
    with _stopped_by_signals() as seen:
        try:
            return _bench(args)
        except KeyboardInterrupt:
            signum = seen[0] if seen else signal.SIGINT
            print(f"mmfs: bench stopped ({signal.Signals(signum).name}); its readers, its mount and its "
                  "daemon ended", file=sys.stderr)
            return 128 + signum


def _bench(args: argparse.Namespace) -> int:
    options = getattr(args, "options", "") or ""
    sizes = _parse_readers(args.microbatches) if getattr(args, "microbatches", None) else []
    if sizes:
        if os.path.isdir(args.target):
            raise MmfsError("--microbatches needs a config (it mounts it with a training: block)")
        print("\n".join(bench_microbatches(args.target, sizes, args.samples, options)))
        return 0
    result = run(args.target, args.samples, _parse_readers(args.readers), options)
    print(json.dumps(result, indent=2) if args.json else format_table(result))
    return 0


# -- benchmark data ----------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mmfs.tools.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("target", nargs="?", help="a mounted mmfs directory or a YAML config")
    parser.add_argument("-n", "--samples", type=int, default=20000, help="samples per pass")
    parser.add_argument("--readers", default="1,2,4", help="reader process counts")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("-o", dest="options", default="", help="FUSE options when mounting a config")
    parser.add_argument("--make-data", metavar="DIR", help="write the benchmark dataset and configs")
    parser.add_argument("--tokens", type=int, default=250_000_000, help="tokens for --make-data")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="mmfs: %(message)s", stream=sys.stderr)
    try:
        if args.make_data:
            for path in make_data(args.make_data, args.tokens):
                print(path)
            return 0
        if not args.target:
            parser.error("give a target (mount point or config) or --make-data DIR")
        return bench_command(args)
    except MmfsError as exc:
        print(f"mmfs: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
