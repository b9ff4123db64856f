"""Every registered view through a real mount, served in C: documents and
sequences at odd offsets and sizes, samples larger than a FUSE READ read in
pieces, the start-up check of the operations table, and no machine-wide PM QoS
request unless asked for."""

from __future__ import annotations

import ctypes
import errno
import json
import logging
import os
import shutil
import subprocess
import time

import numpy as np
import pytest
import yaml

from format_helpers import document_tokens
from golden_cases import GOLDEN, write_case_config
from mmfs.errors import MountError
from mmfs.formats.writer import write_index
from mmfs.megatron import open_corpus
from mmfs.mount.fuse import mfusepy
from mmfs.mount.layouts import MFUSEPY_VERSION, NATIVE_HANDLERS, check_table, native_address
from mount_fixtures import mounted


def _want(ds, tokens: np.ndarray) -> bytes:
    return np.asarray(tokens).astype(ds.dtype.newbyteorder("<")).tobytes()


@pytest.mark.parametrize("case", ["p2_blend2_u16", "p4_single_multiseq"])
def test_documents_and_sequences_through_the_mount(case, tmp_path):
    config = write_case_config(case, tmp_path)
    corpus = open_corpus(str(config), progress=False)
    with mounted(config, tmp_path / "mnt", "-o", "map_limit_mb=0") as m:
        for entry in corpus.datasets:
            ds = entry.dataset
            for kind, count, get in (("sequences", ds.num_sequences, ds.get),
                                     ("documents", ds.num_documents, lambda d, ds=ds: document_tokens(ds, d))):
                folder = m.file(f"datasets/{entry.name}/{kind}")
                assert len(os.listdir(folder)) == count
                for i in range(0, count, 13):
                    want = _want(ds, get(i))
                    path = folder / f"{i:07d}.bin"
                    assert path.stat().st_size == len(want)
                    with open(path, "rb", buffering=0) as f:
                        assert f.read() == want
                        for off in {1, 3, len(want) // 2, max(len(want) - 3, 0)}:
                            for size in (1, 5, 4097):
                                f.seek(off)
                                assert f.read(size) == want[off : off + size], (path, off, size)
        assert "served in C: " in m.log.read_text()
        assert f"/datasets/{corpus.datasets[0].name}/documents" in m.log.read_text()


@pytest.fixture(scope="module")
def long_config(tmp_path_factory):
    """int32 tokens, documents of 1..3000 tokens, sequence_length 40000:
    160 KiB samples, more than one 128 KiB FUSE READ."""
    folder = tmp_path_factory.mktemp("long")
    rng = np.random.default_rng(7)
    lengths = rng.integers(1, 3001, size=600).astype(np.int64)
    rng.integers(0, 2**31 - 1, size=int(lengths.sum()), dtype=np.int32).tofile(folder / "long.bin")
    write_index(str(folder / "long.idx"), np.int32, lengths, np.arange(len(lengths) + 1))
    config = folder / "long.yaml"
    config.write_text('datasets: [{path: long}]\nsplit: "100,0,0"\nsequence_length: 40000\n'
                      "seed: 3\ntokenizer: {eod: 0, pad: null}\n")
    return config


@pytest.mark.parametrize("options", [(), ("-o", "map_limit_mb=0")])
def test_samples_larger_than_a_read_come_in_pieces(long_config, tmp_path, options):
    split = open_corpus(str(long_config), progress=False).splits["train"]
    assert split.sample_bytes > 128 * 1024 and len(split) >= 4
    with mounted(long_config, tmp_path / "mnt", *options) as m:
        for i in range(len(split)):
            want = split.read(i)
            path = m.file(f"train/samples/{i:07d}.bin")
            for bs in ("128k", "100000", "4093"):
                got = subprocess.run(["dd", f"if={path}", f"bs={bs}", "status=none"],
                                     capture_output=True, check=True).stdout
                assert got == want, (i, bs)
            with open(path, "rb", buffering=0) as f:  # blocks that cut tokens, backwards
                for off in range(len(want) - 70001, -1, -70001):
                    f.seek(off)
                    assert f.read(70001) == want[off : off + 70001]


def _table_with_c_handlers():
    table = mfusepy.fuse_operations()
    prototypes = dict(f[:2] for f in mfusepy.fuse_operations._fields_)
    for name in NATIVE_HANDLERS:
        setattr(table, name, prototypes[name](native_address(name)))
    return table


def test_the_operations_table_check_passes_on_the_real_table():
    check_table(_table_with_c_handlers())


def test_the_operations_table_check_fires():
    table = _table_with_c_handlers()
    python_read = dict(f[:2] for f in mfusepy.fuse_operations._fields_)["read"](lambda *args: 0)
    table.read = python_read  # a Python handler where the C one belongs
    with pytest.raises(MountError, match="does not hold mmfs's C handler for read"):
        check_table(table)
    with pytest.raises(MountError, match=f"mfusepy 9.9.9 is installed.*mfusepy {MFUSEPY_VERSION}"):
        check_table(_table_with_c_handlers(), mfusepy_version="9.9.9")
    empty = mfusepy.fuse_operations()
    with pytest.raises(MountError, match="C handler for getattr"):
        check_table(empty)
    assert ctypes.cast(empty.getattr, ctypes.c_void_p).value is None


def _open_files(pid: int) -> set[str]:
    out = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            out.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            pass
    return out


def _read_some(m, count: int = 200) -> None:
    for i in range(count):
        (m.path / "train" / "samples" / f"{i:07d}.bin").read_bytes()


def test_a_default_mount_takes_no_pm_qos_request(tmp_path):
    config = write_case_config("p1_single_u16", tmp_path)
    with mounted(config, tmp_path / "mnt") as m:
        _read_some(m)
        assert "/dev/cpu_dma_latency" not in _open_files(m.pid)
        assert "low_latency" not in m.log.read_text()


@pytest.mark.skipif(not os.access("/dev/cpu_dma_latency", os.W_OK), reason="needs root and the device")
def test_low_latency_takes_it_when_asked(tmp_path):
    config = write_case_config("p1_single_u16", tmp_path)
    with mounted(config, tmp_path / "mnt", "-o", "low_latency") as m:
        _read_some(m)
        assert "/dev/cpu_dma_latency" in _open_files(m.pid)
        assert "-o low_latency: holding a PM QoS request" in m.log.read_text()


@pytest.mark.parametrize("options", [("-o", "map_limit_mb=0"), ()])
def test_a_dataset_rewritten_under_the_mount_gives_eio_not_a_dead_daemon(tmp_path, options):
    """Truncating the token file, the .idx and a cache file under a live mount.
    Read with pread (map_limit_mb=0): every read of the changed file gets EIO with
    a log line naming the file, even of bytes it still holds.
    Within the map limit the daemon serves its own copies, unchanged. Either
    way the daemon keeps answering."""
    shutil.copytree(GOLDEN / "data", tmp_path / "data")  # never truncate the golden files
    config = write_case_config("p1_single_u16", tmp_path)
    pread = bool(options)
    open_corpus(str(config), progress=False)  # builds the index cache
    corpus = open_corpus(str(config), progress=False)  # maps it
    split = corpus.splits["train"]
    ds = corpus.datasets[0].dataset
    want = {i: split.read(i) for i in range(len(split))}
    cache = sorted(p for p in corpus.placer.files() if p.endswith("shuffle_index.npy"))[0]
    with mounted(config, tmp_path / "mnt", *options) as m:
        samples = m.path / "train" / "samples"
        first = (samples / "0000000.bin").read_bytes()
        assert first == want[0]
        os.truncate(ds.bin_path, os.path.getsize(ds.bin_path) // 2)
        failed, exact = 0, 0
        for i in range(1, 400):
            try:
                data = (samples / f"{i:07d}.bin").read_bytes()
            except OSError as exc:
                assert exc.errno == errno.EIO
                failed += 1
                continue
            assert data == want[i]
            exact += 1
        # pread: the file is checked after every read, and a changed file is never served,
        # not even the bytes it still holds; within the map limit, the daemon's own copy.
        assert (failed, exact) == ((399, 0) if pread else (0, 399))
        if pread:
            log = m.log.read_text()
            assert os.path.realpath(ds.bin_path) in log and "changed since the mount" in log
            # one line per failed read, from the C handler's one hand-over: the file,
            # which sample of which dataset, the request
            line = next(x for x in log.splitlines() if "changed since the mount" in x)
            assert "/train/samples/" in line and "its sample" in line and "(a read of" in line
        os.truncate(ds.idx_path, 100)
        os.truncate(cache, 10)
        for path in (samples / "0000500.bin", samples / "0000600.bin",
                     m.path / "datasets" / corpus.datasets[0].name / "sequences" / "0001000.bin"):
            try:
                path.read_bytes()
            except OSError as exc:
                assert pread and exc.errno == errno.EIO
        try:
            os.getxattr(samples / "0000700.bin", "user.mmfs.pieces")
        except OSError as exc:
            assert pread and exc.errno == errno.EIO  # not EINVAL
        assert (samples / "0000000.bin").read_bytes() == first  # in the page cache: still served
        assert json.loads((m.path / "mmfs.json").read_bytes())  # the daemon still answers
        assert os.path.exists(f"/proc/{m.pid}")


@pytest.mark.parametrize("sampler", [{"dataloader_type": "single"},
                                     {"dataloader_type": "cyclic", "data_sharding": True},
                                     {"dataloader_type": "cyclic", "data_sharding": False}])
def test_rank_files_are_their_samples_back_to_back(tmp_path, sampler):
    """Every micro-batch file of every rank, read whole and in blocks that cut
    tokens, is its samples' files concatenated; its xattr lists them."""
    config = write_case_config("p2_blend2_u16", tmp_path)
    raw = yaml.safe_load(config.read_text())
    raw["training"] = {"data_parallel_size": 3, "micro_batch_size": 2, **sampler}
    config.write_text(yaml.safe_dump(raw))
    with mounted(config, tmp_path / "mnt", "-o", "map_limit_mb=0") as m:
        info = json.loads((m.path / "mmfs.json").read_text())["training"]
        for split, files in info["microbatches"].items():
            ranks = m.path / split / "ranks"
            assert ranks.is_dir() == (files > 0)
            if not files:
                continue
            assert sorted(os.listdir(ranks)) == ["000", "001", "002"]
            for rank in ranks.iterdir():
                names = sorted(os.listdir(rank))
                assert len(names) == files
                for name in names[::3]:
                    ids = [int(i) for i in os.getxattr(rank / name, "user.mmfs.samples").split()]
                    want = b"".join((m.path / split / "samples" / f"{i:07d}.bin").read_bytes() for i in ids)
                    assert (rank / name).stat().st_size == len(want) == info["bytes_per_microbatch"]
                    with open(rank / name, "rb", buffering=0) as f:
                        assert f.read() == want
                        for off in (1, 3, len(want) // 2 + 1):
                            f.seek(off)
                            assert f.read(333) == want[off : off + 333]


def test_a_read_failing_again_and_again_is_logged_a_few_times(tmp_path):
    """Readers retrying a failed read: the first line (a retry within a second of it
    adds none), then at most one a second."""
    shutil.copytree(GOLDEN / "data", tmp_path / "data")
    config = write_case_config("p1_single_u16", tmp_path)
    corpus = open_corpus(str(config), progress=False)
    ds = corpus.datasets[0].dataset
    with mounted(config, tmp_path / "mnt", "-o", "map_limit_mb=0") as m:
        samples = m.path / "train" / "samples"
        os.truncate(ds.bin_path, os.path.getsize(ds.bin_path) // 2)
        failing = None
        for i in range(1, 400):
            try:
                (samples / f"{i:07d}.bin").read_bytes()
            except OSError:
                failing = samples / f"{i:07d}.bin"
                break
        assert failing is not None
        start = time.monotonic()
        for _ in range(300):
            with pytest.raises(OSError):
                failing.read_bytes()
        seconds = time.monotonic() - start
        lines = [x for x in m.log.read_text().splitlines() if f"/train/samples/{failing.name}" in x]
        assert 1 <= len(lines) <= 1 + seconds + 2, len(lines)


def test_repeat_filter_summarises_copies(monkeypatch):
    from mmfs.mount import repeats

    clock = [100.0]
    monkeypatch.setattr(repeats.time, "monotonic", lambda: clock[0])
    f = repeats.RepeatFilter()

    def record(msg):
        return logging.LogRecord("mmfs", logging.ERROR, __file__, 1, msg, None, None)

    passed = [f.filter(record("boom")) for _ in range(10)]
    assert passed == [True] * 3 + [False] * 7
    assert f.filter(record("other"))  # another line is not held back
    clock[0] += 1.5
    summary = record("boom")
    assert f.filter(summary) and summary.getMessage() == "boom (8 times since the last such line)"
