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
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from mmfs.config.schema import SPLITS
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

log = logging.getLogger(__name__)

MB = 1e6


@dataclass
class Row:
    method: str
    order: str
    readers: int
    phase: str  # "cold" | "warm"
    samples: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else float("inf")


# -- readers -----------------------------------------------------------------


def single_threaded_libraries() -> None:
    """Math libraries' worker threads spin after each call; on a small machine
    they would take the CPU the daemon needs. Every reader here is
    single-threaded: set before torch (megatron-core) is imported, and
    inherited by the reader processes."""
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")


def read_files(paths: Sequence[str], size: int) -> int:
    """Open, read `size` bytes of and close each file, as a data loader does."""
    total = 0
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            total += len(os.read(fd, size))
        finally:
            os.close(fd)
    return total


def _read_one(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _worker(fn: Callable[[Any], int], chunk: Any, start: Any, conn: Any) -> None:
    start.wait()
    t0 = time.perf_counter()
    n = fn(chunk)
    conn.send((n, time.perf_counter() - t0))
    conn.close()


def run_parallel(fn: Callable[[Any], int], chunks: list[Any]) -> float:
    """Run fn(chunk) in one forked process per chunk (one reader too: a fresh
    process, like every other reader), all started together; return the wall
    time from the start signal until the last one finished."""
    ctx = mp.get_context("fork")
    start = ctx.Event()
    pipes, procs = [], []
    for chunk in chunks:
        recv, send = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_worker, args=(fn, chunk, start, send))
        p.start()
        pipes.append(recv)
        procs.append(p)
    time.sleep(0.05)  # let every worker reach the start line
    t0 = time.perf_counter()
    start.set()
    for r in pipes:
        r.recv()
    elapsed = time.perf_counter() - t0
    for p in procs:
        p.join()
    return elapsed


def _split(items: Sequence[Any], parts: int) -> list[Any]:
    return [items[i::parts] for i in range(parts)]


# -- the benchmark -------------------------------------------------------------


@dataclass
class Plan:
    """Which sample ids each (order, readers) configuration reads: disjoint
    ranges, so that every cold pass reads files nobody has read yet."""

    total: int
    n: int
    readers: list[int]
    seed: int = 1234

    def ids(self) -> dict[tuple[str, int], np.ndarray]:
        rng = np.random.default_rng(self.seed)
        configs = [(order, r) for order in ("sequential", "random") for r in self.readers]
        per = min(self.n, self.total // len(configs))
        if per < 1:
            raise MmfsError(f"the split has {self.total} samples; too few to benchmark")
        sequential = [c for c in configs if c[0] == "sequential"]
        out = {c: np.arange(k * per, (k + 1) * per, dtype=np.int64) for k, c in enumerate(sequential)}
        # Random ids come from what the sequential ranges leave, drawn without
        # replacement, so that no two configurations share a file.
        pool = rng.permutation(np.arange(len(sequential) * per, self.total, dtype=np.int64))
        for k, c in enumerate(c for c in configs if c[0] == "random"):
            out[c] = pool[k * per : (k + 1) * per]
        return out


def read_through(paths: Sequence[str]) -> None:
    """Read files end to end, so that their pages are in memory. On a VM, data
    that sat in the page cache untouched for a few seconds reads much slower
    the first time again (the host reclaims the guest's idle memory), so every
    cold pass starts from freshly read source files."""
    buf = bytearray(4 << 20)
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass


@dataclass
class Method:
    """One way of reading samples: make_chunk(ids) -> what fn reads."""

    name: str
    make_chunk: Callable[[np.ndarray], Any]
    fn: Callable[[Any], int]


SLICES = 5  # methods take turns slice by slice, so that noise hits them alike


def _interleaved(methods: list[Method], order: str, readers: int, ids: np.ndarray,
                 sources: Sequence[str] = ()) -> list[Row]:
    """A cold (first) and a warm (second) pass of every method over `ids`. The
    ids are cut into SLICES slices and the methods take turns on each slice, so
    that a noisy neighbour slows all of them alike; a method's time is the sum
    of its slices."""
    rows = []
    for phase in ("cold", "warm"):
        if phase == "cold":
            read_through(sources)
        seconds = dict.fromkeys((m.name for m in methods), 0.0)
        for part in np.array_split(ids, min(SLICES, len(ids))):
            for m in methods:
                seconds[m.name] += run_parallel(m.fn, [m.make_chunk(p) for p in _split(part, readers)])
        for m in methods:
            rows.append(Row(m.name, order, readers, phase, len(ids), seconds[m.name]))
            log.info("%-20s %-10s %d reader(s) %-4s %9.0f samples/s", m.name, order, readers,
                     phase, rows[-1].rate)
    return rows


def _copy_to_tmpfs(ids: np.ndarray, width: int, read: Callable[[int], bytes], root: str | None) -> str:
    """The bytes of samples `ids` as real files in a new folder on tmpfs."""
    folder = tempfile.mkdtemp(prefix="mmfs-bench-", dir=root)
    for i in ids:
        with open(os.path.join(folder, file_name(int(i), width)), "wb") as f:
            f.write(read(int(i)))
    return folder


def sample_paths(mount: str, split: str, width: int, ids: np.ndarray) -> list[str]:
    base = os.path.join(mount, sample_dir(split).lstrip("/"))
    return [os.path.join(base, file_name(int(i), width)) for i in ids]


def bench_mount(mount: str, n: int, readers: list[int], corpus: Any = None,
                daemon_pid: int | None = None) -> dict[str, Any]:
    """Every measurement on a mounted mmfs directory (and its corpus, if open).

    The methods take turns slice by slice (see _interleaved), so that a noisy
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
    if corpus is None:
        notes.append("in-process baselines need a config (bench a CONFIG.yaml, not a mount)")
    else:
        megatron_read = _megatron_reader(corpus, split, megatron_cache, notes)
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
            rows += _interleaved(methods, order, r, ids, sources)
            if corpus is None:  # copied from the mount, after its passes
                shm = _copy_to_tmpfs(ids, width, lambda i: _read_one(sample_paths(mount, split, width, [i])[0]),
                                     shm_root)
                rows += _interleaved([tmpfs_method(shm)], order, r, ids)
        finally:
            if shm is not None:
                shutil.rmtree(shm, ignore_errors=True)
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


class _Tokenizer:
    """The little of a tokenizer GPTDataset reads: eod, pad, identifiers."""

    def __init__(self, eod: int, pad: int | None) -> None:
        self.eod = eod
        if pad is not None and pad >= 0:
            self.pad = pad
        self.vocab_size = None
        self.unique_identifiers = {"class": "mmfs.bench", "eod": eod, "pad": pad}


def megatron_dataset(corpus: Any, split: str, cache_dir: str) -> Any:
    """megatron-core's own top-level dataset of `split` for the corpus's config,
    built by BlendedMegatronDatasetBuilder (indices cached in `cache_dir`).
    ImportError when megatron-core is not installed."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.blended_megatron_dataset_builder import (
            BlendedMegatronDatasetBuilder,
        )
        from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    import torch

    # One thread: idle OpenMP workers spinning after each tensor op would steal
    # the CPU from the other methods measured in the same process.
    torch.set_num_threads(1)
    cfg = corpus.config
    names = SPLITS

    def blend(b: Any) -> Any:
        return None if b is None else ([d.file for d in b.datasets], b.weights)

    kwargs: dict[str, Any] = {}
    if cfg.blend_per_split is not None:
        kwargs["blend_per_split"] = [blend(cfg.blend_per_split.get(n)) for n in names]
    else:
        kwargs["blend"] = blend(cfg.blend)
        kwargs["split"] = cfg.split
    config = GPTDatasetConfig(
        random_seed=cfg.seed,
        sequence_length=cfg.sequence_length,
        path_to_cache=cache_dir,
        tokenizer=_Tokenizer(cfg.eod, cfg.pad),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        create_attention_mask=False,
        add_extra_token_to_sequence=cfg.add_extra_token,
        drop_last_partial_validation_sequence=cfg.drop_last_partial_validation_sequence,
        mid_level_dataset_surplus=cfg.mid_level_dataset_surplus,
        **kwargs,
    )
    sizes = [cfg.samples.get(n) for n in names]
    built = BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, config).build()
    return built[names.index(split)]


def _megatron_reader(corpus: Any, split: str, cache_dir: str,
                     notes: list[str]) -> Callable[[np.ndarray], int] | None:
    try:
        ds = megatron_dataset(corpus, split, cache_dir)
    except ImportError as exc:
        notes.append(
            f"megatron-core is not installed here ({exc.name or exc}), so its "
            "GPTDataset.__getitem__ was not run; on this machine it read 12,000-17,000 "
            "samples/s (sequence_length 4096, uint16, 500 MB; tests/golden/README.md)"
        )
        return None
    except Exception as exc:  # its asserts on configs it does not support
        notes.append(f"megatron-core could not build this config: {type(exc).__name__}: {exc}")
        return None
    import megatron.core

    notes.append(f"megatron-core {getattr(megatron.core, '__version__', '?')}: "
                 "GPTDataset.__getitem__ (tokens, labels, masks as torch tensors), in-process")

    def read(part: np.ndarray) -> int:
        total = 0
        for i in part:
            total += int(ds[int(i)]["tokens"].numel())
        return total

    return read


def daemon_memory(pid: int | None) -> dict[str, int] | None:
    """VmRSS, RssAnon and RssFile of a process, in kB."""
    if not pid:
        return None
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
                    out[key] = int(value.split()[0])
    except OSError:
        return None
    return out


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


def _parse_readers(text: str) -> list[int]:
    try:
        readers = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise MmfsError(f"--readers {text!r}: give a comma-separated list of counts, e.g. 1,2,4") from None
    if not readers or min(readers) < 1:
        raise MmfsError(f"--readers {text!r}: counts must be >= 1")
    return readers


def run(target: str, n: int, readers: list[int], options: str = "") -> dict[str, Any]:
    """Bench a mount point, or mount a config in a temporary directory and bench that."""
    from mmfs.mount.lifecycle import mount_point_state

    if os.path.isdir(target):
        if mount_point_state(os.path.abspath(target)).state != "mounted":
            raise MmfsError(f"{target}: not a mounted mmfs directory (give a mount point or a config)")
        return bench_mount(target, n, readers)

    from mmfs.megatron import open_corpus

    with temporary_mount(target, options) as (mount, pid):
        corpus = open_corpus(target, progress=False)  # the in-process baselines' own copy, mapped
        return bench_mount(mount, n, readers, corpus=corpus, daemon_pid=pid)


@contextlib.contextmanager
def temporary_mount(config: str, options: str = "") -> Iterator[tuple[str, int]]:
    """Mount `config` (as `mmfs mount` does, with `-o options`) in a temporary
    directory; yields (mount point, daemon pid) and unmounts afterwards."""
    from mmfs.megatron import open_corpus_for_serving
    from mmfs.mount.lifecycle import spawn_daemon, unmount, wait_until_mounted
    from mmfs.mount.options import parse_mount_options
    from mmfs.mount.tree import Tree

    mount_options = parse_mount_options(options)
    tree = Tree(open_corpus_for_serving(config, map_limit_mb=mount_options.map_limit_mb))
    tmp = tempfile.mkdtemp(prefix="mmfs-bench-")
    mount = os.path.join(tmp, "mnt")
    os.mkdir(mount)
    log_path = os.path.join(tmp, "daemon.log")
    pid = spawn_daemon(tree, mount, mount_options, log_path)
    try:
        wait_until_mounted(mount, pid, log_path)
        yield mount, pid
    finally:
        try:
            unmount(mount)
        except MmfsError as exc:
            log.warning("%s", exc)
        os.waitpid(pid, 0)
        shutil.rmtree(tmp, ignore_errors=True)


def bench_command(args: argparse.Namespace) -> int:
    """`mmfs bench TARGET [-n N] [--readers 1,2,4] [--json]`."""
    single_threaded_libraries()
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


def make_data(folder: str, tokens: int = 250_000_000, seed: int = 0) -> list[str]:
    """Write a uint16 IndexedDataset of about `tokens` random tokens (documents
    of 1..2000 tokens, eod 65535 last) and two configs beside it:
    bench.yaml (sequence_length 4096, 1,000,000 train samples) and
    bench-100m.yaml (100,000,000 train samples, for the daemon's memory)."""
    from mmfs.formats.writer import write_index

    os.makedirs(folder, exist_ok=True)
    prefix = os.path.join(folder, "bench_text_document")
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 2001, size=tokens // 1000 + 1, dtype=np.int64)
    lengths = lengths[: int(np.searchsorted(np.cumsum(lengths), tokens)) + 1]
    eod = 65535
    with open(prefix + ".bin", "wb") as f:
        chunk = 1 << 22
        written = 0
        total = int(lengths.sum())
        ends = np.cumsum(lengths) - 1
        while written < total:
            n = min(chunk, total - written)
            block = rng.integers(0, 50000, size=n, dtype=np.uint16)
            lo, hi = np.searchsorted(ends, [written, written + n])
            block[ends[lo:hi] - written] = eod
            f.write(block.tobytes())
            written += n
    write_index(prefix + ".idx", np.uint16, lengths, np.arange(len(lengths) + 1, dtype=np.int64))
    configs = []
    for name, seq, train in (("bench.yaml", 4096, 1_000_000), ("bench-100m.yaml", 256, 100_000_000)):
        path = os.path.join(folder, name)
        with open(path, "w") as f:
            f.write(
                f"# mmfs benchmark data ({int(lengths.sum())} uint16 tokens)\n"
                "datasets:\n  - path: bench_text_document\n"
                'split: "100,0,0"\n'
                f"samples:\n  train: {train}\n"
                f"sequence_length: {seq}\nseed: 1234\n"
                f"tokenizer: {{eod: {eod}, pad: null}}\n"
                "cache_dir: cache\n"
            )
        configs.append(path)
    return configs


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
