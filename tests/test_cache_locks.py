"""Many builders, one cache: build locks, killed builders, temporary files, the
re-open path's reads, and what the cache says when it cannot be written."""

import errno
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from tiny_blends import write_tiny_blend

from golden_cases import BLEND_CONFIG, GOLDEN
from mmfs.errors import CacheError
from mmfs.megatron import open_corpus
from mmfs.megatron.cache import locks as cachelock
from mmfs.megatron.cache.write import TEMP_PREFIX, clean_stale_temporaries, write_problem
from mmfs.megatron.indices.blend import build_blending_indices
from mount_fixtures import HANG_GUARD

CONFIG = BLEND_CONFIG


def write_config(tmp_path, **changes):
    link = tmp_path / "data"
    if not link.exists():
        link.symlink_to(GOLDEN / "data", target_is_directory=True)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({**CONFIG, **changes}))
    return path


def mmfs(*args, **kw):
    return subprocess.Popen([sys.executable, "-m", "mmfs.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def built_labels(stderr: str) -> list[str]:
    """What one `mmfs build` says it built (GPTDatasets and blends)."""
    out = []
    for line in stderr.splitlines():
        if "] building " in line:
            out.append(line.split("] building ")[1].split()[0])
        elif "/blend: blending index" in line:
            out.append(line.split("mmfs: ")[1].split(":")[0])
    return out


def test_concurrent_builders_build_each_index_exactly_once(tmp_path):
    config = write_config(tmp_path)
    procs = [mmfs("build", str(config), "-j", "2") for _ in range(4)]
    results = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [r[1] for r in results]
    assert len({r[0] for r in results}) == 1  # the same summary everywhere
    labels = [label for _, err in results for label in built_labels(err)]
    # 2 datasets x 3 splits + 3 blends, each built by exactly one process
    assert sorted(labels) == sorted(set(labels)) and len(labels) == 9, labels
    names = os.listdir(tmp_path / "cache")
    assert not [n for n in names if n.endswith(".lock") or n.startswith(TEMP_PREFIX)]
    assert len(names) == 6 * 4 + 3 * 3


HOLD = """
import sys, time
from mmfs.megatron.cache.locks import try_lock
assert try_lock(sys.argv[1]) is not None
print("held", flush=True)
time.sleep(600)
"""


def lock_of_first_index(tmp_path, config) -> str:
    """The lock path of one GPTDataset of the config (learnt from a build's names)."""
    open_corpus(str(config), progress=False)
    desc = sorted(n for n in os.listdir(tmp_path / "cache") if n.endswith("-train-description.txt")
                  and "GPTDataset" in n)[0]
    for name in os.listdir(tmp_path / "cache"):
        os.unlink(tmp_path / "cache" / name)
    return str(tmp_path / "cache" / desc.replace("-description.txt", ".lock"))


def test_a_killed_builders_lock_is_taken_over(tmp_path):
    config = write_config(tmp_path)
    lock = lock_of_first_index(tmp_path, config)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, lock], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    assert json.loads(open(lock).read())["pid"] == holder.pid
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    build = mmfs("-v", "build", str(config))
    out, err = build.communicate(timeout=HANG_GUARD)
    assert build.returncode == 0, err
    assert "taking the lock over" in err
    assert not os.path.exists(lock)
    assert len(os.listdir(tmp_path / "cache")) == 6 * 4 + 3 * 3


def test_a_waiting_builder_times_out_naming_the_lock(tmp_path):
    lock = str(tmp_path / "x-GPTDataset-train.lock")
    holder = subprocess.Popen([sys.executable, "-c", HOLD, lock], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(CacheError, match="x-GPTDataset-train.lock.*delete the lock file"):
            cachelock.wait_unlocked(lock, timeout=0.3)
        assert os.path.exists(lock)  # a live holder keeps its lock
    finally:
        holder.kill()
        holder.wait()


def test_a_lock_of_another_host_without_heartbeat_goes_stale(tmp_path, monkeypatch, caplog):
    lock = tmp_path / "y.lock"
    lock.write_text(json.dumps({"host": "elsewhere-" + socket.gethostname(), "pid": 1, "start": 0}))
    clock = [0.0]

    class Waits:  # the waiter's clock moves only by the pauses it takes: no machine's speed counts
        time = staticmethod(time.time)
        monotonic = staticmethod(lambda: clock[0])

        @staticmethod
        def sleep(seconds: float) -> None:
            clock[0] += seconds

    monkeypatch.setattr(cachelock, "time", Waits)
    with caplog.at_level(logging.WARNING):
        cachelock.wait_unlocked(str(lock), stale_after=0.3, timeout=30)
    assert not lock.exists() and clock[0] > 0.3  # taken over once unchanged for longer than stale_after
    assert "stale lock" in caplog.text and "not refreshed for 0 s" in caplog.text, caplog.text


def test_stale_temporary_files_are_removed(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = socket.gethostname()
    folder = tmp_path / "cache"
    folder.mkdir()
    gone = folder / f"{TEMP_PREFIX}{dead.pid}@{host}@0000-a-sample_index.npy"
    live = folder / f"{TEMP_PREFIX}{os.getpid()}@{host}@0000-b-sample_index.npy"
    old_style = folder / f"{TEMP_PREFIX}abc123"  # an unnamed writer's, recent: kept
    for f in (gone, live, old_style):
        f.write_bytes(b"x")
    config = write_config(tmp_path)
    open_corpus(str(config), progress=False)  # writes into the folder: cleans first
    assert not gone.exists() and live.exists() and old_style.exists()
    os.utime(old_style, (0, 0))
    assert clean_stale_temporaries(str(folder)) == 1 and not old_style.exists()


def test_an_unwritable_cache_builds_once_per_process_and_says_what_to_do(tmp_path, caplog):
    (tmp_path / "afile").write_text("not a folder")
    config = write_config(tmp_path, cache_dir="afile")
    with caplog.at_level(logging.INFO, logger="mmfs"):
        first = open_corpus(str(config), progress=True)
        built_first = [r for r in caplog.records if "] building " in r.getMessage()]
        caplog.clear()
        second = open_corpus(str(config), progress=True)
        built_again = [r for r in caplog.records if "building" in r.getMessage()
                       or "blending index" in r.getMessage()]
    assert len(built_first) == 6 and built_again == []
    assert all(g.bytes_in_memory() > 0 for g in second.indices["train"].gpts)
    saved = open_corpus(str(write_config(tmp_path)), progress=False)  # a writable cache
    assert [g.bytes_in_memory() for g in saved.indices["train"].gpts] == [0, 0]
    assert saved.indices["train"].blend.bytes_in_memory() == 0
    assert second.splits["train"].read(7) == first.splits["train"].read(7)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert not warnings  # said once, by the first open
    assert os.path.isfile(tmp_path / "afile")


def test_cache_write_problems_say_what_to_do(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    exc = OSError(17, "File exists")
    assert write_problem(str(afile), exc).startswith(f"{afile} is a file, not a folder; set cache_dir")
    # a folder under the file: the file is named, and what to do
    for under in (afile / "cache", afile / "cache" / "deeper"):
        said = write_problem(str(under), OSError(errno.ENOTDIR, "Not a directory"))
        assert said.startswith(f"{afile} (in {under}'s path) is a file, not a folder; set cache_dir"), said
        assert "not under it, or move it away" in said and f"{afile}/cache is a file" not in said
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    said = write_problem(str(tmp_path / "gone" / "cache"), OSError(errno.EEXIST, "File exists"))
    assert said.startswith(f"{tmp_path / 'gone'} (in {tmp_path / 'gone' / 'cache'}'s path) is a broken symbolic "
                           "link, not a folder"), said
    full = OSError("5860 requested and 4064 written")
    assert "no space left" in write_problem(str(tmp_path), full)
    assert "cache_dir" in write_problem(str(tmp_path), full)


def test_a_full_disk_is_named(tmp_path, caplog):
    small = tmp_path / "small"
    small.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8k", "tmpfs", str(small)],
                             capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr!r}")
    try:
        config = write_config(tmp_path, cache_dir="small", samples={"train": 3000, "valid": 10,
                                                                     "test": 5})
        with caplog.at_level(logging.WARNING, logger="mmfs"):
            corpus = open_corpus(str(config), progress=False)
        assert len(corpus.splits["train"]) == 3000
        messages = " ".join(r.getMessage() for r in caplog.records)
        assert "no space left in" in messages and "set cache_dir" in messages
        assert not [n for n in os.listdir(small) if n.startswith(TEMP_PREFIX)]
    finally:
        subprocess.run(["umount", str(small)], check=True)


REOPEN = """
import json, os, sys
from mmfs.config.schema import load_config
from mmfs.formats import open_dataset
from mmfs.megatron.build.builder import Builder

def rchar():
    for line in open("/proc/self/io"):
        if line.startswith("rchar"):
            return int(line.split()[1])

config = load_config(sys.argv[1])
before = rchar()
by_file = {s.file: open_dataset(s.file) for s in config.all_datasets}
splits = Builder(config, by_file, jobs=1).build()
read = rchar() - before
maps = open("/proc/self/maps").read()
print(json.dumps({"read": read, "from_cache": all(g.from_cache for s in splits.values()
                                                  for g in s.gpts),
                  "mapped": [p for p in maps.split() if p.endswith((".idx", ".npy", ".bin"))]}))
"""


def test_reopen_reads_headers_and_spot_values_only(tmp_path):
    # Datasets large enough that reading their indices would show.
    from mmfs.formats.writer import IndexedDatasetWriter

    rng = np.random.RandomState(0)
    paths = []
    for d in range(3):
        prefix = tmp_path / f"big{d}"
        with IndexedDatasetWriter(str(prefix) + ".bin", dtype=np.uint16) as w:
            for _ in range(20000):
                w.add_item(rng.randint(0, 100, size=rng.randint(1, 20)))
                w.end_document()
            w.finalize(str(prefix) + ".idx")
        paths.append(str(prefix))
    config = tmp_path / "big.yaml"
    config.write_text(yaml.safe_dump({
        "datasets": [{"path": p, "weight": 1.0} for p in paths], "split": "90,10,0",
        "samples": {"train": 5000, "valid": 100, "test": 0}, "sequence_length": 16,
        "tokenizer": {"eod": 0}, "cache_dir": "cache"}))
    open_corpus(str(config), progress=False)
    out = subprocess.run([sys.executable, "-c", REOPEN, str(config)], capture_output=True,
                         text=True, check=True)
    result = json.loads(out.stdout)
    assert result["from_cache"] and result["mapped"] == []
    idx_bytes = sum(os.path.getsize(p + ".idx") for p in paths)
    cache_files = os.listdir(tmp_path / "cache")
    descriptions = sum(os.path.getsize(tmp_path / "cache" / n) for n in cache_files
                       if n.endswith(".txt"))
    npy_headers = 4096 * sum(n.endswith(".npy") for n in cache_files)
    # headers and six spot values per dataset, the descriptions, .npy headers and three
    # values per GPTDataset: far below the indices themselves
    assert result["read"] <= 3 * (34 + 6 * 8) + descriptions + npy_headers + 6 * 8 * 3
    assert result["read"] < idx_bytes / 10


@pytest.mark.parametrize("kind", ["uniform", "equal", "skewed", "near-equal"])
def test_blocked_blending_index_picks_what_the_full_scan_picks(kind):
    rng = np.random.RandomState(len(kind))
    for datasets in (1, 3, 40, 300):
        w = {"uniform": rng.uniform(0.5, 2, datasets), "equal": np.ones(datasets),
             "skewed": rng.pareto(1.0, datasets) + 1e-3,
             "near-equal": np.full(datasets, 0.1) + rng.randint(0, 2, datasets) * 1e-17}[kind]
        weights = list(w / w.sum())
        size = 3000
        got = build_blending_indices(weights, size)
        wv, counts = np.asarray(weights), np.zeros(datasets, np.int64)
        for i in range(size):  # megatron-core's loop, in the same double arithmetic
            best = int(np.argmax(wv * (float(i) if i > 1 else 1.0) - counts.astype(np.float64)))
            assert got["dataset_index"][i] == best and got["dataset_sample_index"][i] == counts[best]
            counts[best] += 1


def test_a_large_blend_is_built_under_claims_of_several_indices(tmp_path, monkeypatch):
    from mmfs.megatron.cache import write

    config = write_tiny_blend(tmp_path, 70)  # 140 GPTDatasets and 2 blends: claims of 2
    taken = []
    real = write.try_lock  # the builder takes its locks through its batch (cache/write.py)

    def recording(path):
        taken.append(os.path.basename(path))
        return real(path)

    monkeypatch.setattr(write, "try_lock", recording)
    open_corpus(config, progress=False)
    claims = [n for n in taken if n.endswith("-indices.lock")]
    singles = [n for n in taken if not n.endswith("-indices.lock")]
    assert len(claims) == len(set(claims)) == 70
    assert len(singles) == 2 and all("-BlendedDataset-" in n for n in singles)
    assert not [n for n in os.listdir(tmp_path / "cache") if n.endswith(".lock")]


def test_concurrent_builders_of_a_large_blend_build_each_index_once(tmp_path):
    config = write_tiny_blend(tmp_path, 70)
    procs = [mmfs("-v", "build", config, "-j", "2") for _ in range(4)]
    results = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [r[1][-2000:] for r in results]
    assert len({r[0] for r in results}) == 1
    labels = [label for _, err in results for label in built_labels(err)]
    assert sorted(labels) == sorted(set(labels)) and len(labels) == 142, len(labels)
    names = os.listdir(tmp_path / "cache")
    assert not [n for n in names if n.endswith(".lock") or n.startswith(TEMP_PREFIX)]
    assert len(names) == 140 * 4 + 2 * 3 + 2  # and the header file and the pack (cache/pack.py)


DIE_AFTER_ONE_INDEX = """
import os, signal, sys
from mmfs.megatron import open_corpus
from mmfs.megatron.cache import index_cache as cache
real = cache.IndexCache.stage
def stage(self, arrays, batch):
    out = real(self, arrays, batch)
    if "GPTDataset" in self.base:
        os.kill(os.getpid(), signal.SIGKILL)  # holding a claim, one index staged
    return out
cache.IndexCache.stage = stage
open_corpus(sys.argv[1], progress=False, jobs=1)
"""


def test_a_killed_builders_claim_is_taken_over(tmp_path):
    config = write_tiny_blend(tmp_path, 70)
    dead = subprocess.run([sys.executable, "-c", DIE_AFTER_ONE_INDEX, config])
    assert dead.returncode == -signal.SIGKILL
    left = os.listdir(tmp_path / "cache")
    assert [n for n in left if n.endswith("-indices.lock")]  # its claim, held
    build = mmfs("-v", "build", config)
    out, err = build.communicate(timeout=120)
    assert build.returncode == 0, err
    assert "taking the lock over" in err
    names = os.listdir(tmp_path / "cache")
    assert not [n for n in names if n.endswith(".lock") or n.startswith(TEMP_PREFIX)]
    assert len(names) == 140 * 4 + 2 * 3 + 2  # and the header file and the pack
    again = mmfs("-v", "build", config)
    out_again, err_again = again.communicate(timeout=120)
    assert out_again == out and not built_labels(err_again)


def _first_build(tmp_path) -> tuple[Path, Path]:
    config = write_config(tmp_path, cache_dir="cache")
    build = mmfs("-q", "build", str(config))
    assert build.wait(timeout=120) == 0, build.stderr.read()
    return config, tmp_path / "cache"


def test_an_empty_lock_file_is_not_a_builders(tmp_path):
    """What a builder on a full disk used to leave: the next build takes it over at once."""
    config, cache = _first_build(tmp_path)
    index = sorted(cache.glob("*-GPTDataset-train-shuffle_index.npy"))[0]
    index.unlink()  # a miss: the next build must take this index's lock
    lock = cache / index.name.replace("-shuffle_index.npy", ".lock")
    lock.write_bytes(b"")
    old = time.time() - 60
    os.utime(lock, (old, old))
    build = mmfs("-v", "build", str(config))
    out, err = build.communicate(timeout=HANG_GUARD)  # (the line below says it did not wait for the lock)
    assert build.returncode == 0, err
    assert "names no builder" in err and not lock.exists()


def test_a_lock_path_that_is_a_directory_is_one_line(tmp_path):
    config, cache = _first_build(tmp_path)
    index = sorted(cache.glob("*-GPTDataset-train-shuffle_index.npy"))[0]
    index.unlink()
    lock = cache / index.name.replace("-shuffle_index.npy", ".lock")
    lock.mkdir()
    build = mmfs("-q", "build", str(config))
    out, err = build.communicate(timeout=HANG_GUARD)
    assert build.returncode == 2 and err.count("\n") == 1 and str(lock) in err, err


def test_a_fifo_in_the_cache_is_rebuilt_not_waited_on(tmp_path):
    config, cache = _first_build(tmp_path)
    index = sorted(cache.glob("*-GPTDataset-train-shuffle_index.npy"))[0]
    index.unlink()
    os.mkfifo(tmp_path / "fifo")
    index.symlink_to(tmp_path / "fifo")
    build = mmfs("-q", "build", str(config))
    out, err = build.communicate(timeout=HANG_GUARD)
    assert build.returncode == 0, err
    assert index.is_file() and not index.is_symlink()  # rebuilt in its place


def test_a_lock_whose_write_fails_is_not_left_behind(tmp_path):
    """A real full file system (a tiny tmpfs, tests run as root): the lock file is
    created, its owner cannot be written, and nothing stays for others to wait on."""
    folder = tmp_path / "full"
    folder.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(folder)]).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        fd = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT)
        with pytest.raises(OSError):
            while True:
                os.write(fd, b"\0" * 4096)
        os.close(fd)
        with pytest.raises(OSError):
            cachelock.try_lock(str(folder / "x.lock"))
        assert not (folder / "x.lock").exists()
    finally:
        subprocess.run(["umount", "-l", str(folder)])
