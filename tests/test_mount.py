"""The file system for real: `mmfs mount` of every public golden case in a
temporary directory, read with the usual tools, written to (refused),
hammered by threads and processes, and killed."""

from __future__ import annotations

import ctypes
import errno
import hashlib
import json
import multiprocessing as mp
import os
import random
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest

from format_helpers import document_tokens
from golden_cases import GOLDEN, case_names, expected_samples, write_case_config
from mmfs.formats import open_dataset
from mount_fixtures import (
    HANG_GUARD,
    mounted,
    pid_alive,
    stat_errno,
)

SPLITS = ("train", "valid", "test")


@pytest.fixture(scope="module", params=case_names())
def golden(request, tmp_path_factory):
    """(case name, Mount) for each public golden case, mounted once per module."""
    folder = tmp_path_factory.mktemp(request.param)
    config = write_case_config(request.param, folder)
    with mounted(config, folder / "mnt") as m:
        yield request.param, m


@pytest.fixture(scope="module")
def p2(tmp_path_factory):
    """The blend case, for tests that need just one mount."""
    folder = tmp_path_factory.mktemp("p2")
    config = write_case_config("p2_blend2_u16", folder)
    with mounted(config, folder / "mnt") as m:
        yield m


def _info(mount) -> dict:
    return json.loads((mount.path / "mmfs.json").read_text())


def _expected_bytes(case: str, split: str, dtype: str) -> list[bytes]:
    rows = expected_samples(case, split)
    return [] if rows is None else [r.tobytes() for r in rows.astype(np.dtype(dtype).newbyteorder("<"))]


# -- contents -------------------------------------------------------------------


def test_every_sample_is_megatrons(golden):
    case, m = golden
    info = _info(m)
    for split in SPLITS:
        want = _expected_bytes(case, split, info["dtype"])
        folder = m.path / split / "samples"
        if not want:
            assert not folder.exists()
            continue
        names = sorted(os.listdir(folder))
        assert names == [f"{i:07d}.bin" for i in range(len(want))]
        for i, data in enumerate(want):
            path = folder / names[i]
            assert path.stat().st_size == len(data)
            assert path.read_bytes() == data, f"{case} {split} sample {i}"
    assert os.readlink(m.path / "samples") == "train/samples"
    assert (m.path / "samples" / "0000000.bin").read_bytes() == _expected_bytes(case, "train", info["dtype"])[0]


def test_documents_and_sequences_are_the_datasets(golden):
    case, m = golden
    info = _info(m)
    for d in info["datasets"]:
        ds = open_dataset(GOLDEN / "data" / Path(d["path"]).name)
        base = m.path / "datasets" / d["name"]
        assert len(os.listdir(base / "sequences")) == ds.num_sequences
        assert len(os.listdir(base / "documents")) == ds.num_documents
        for i in range(ds.num_sequences):
            assert (base / "sequences" / f"{i:07d}.bin").read_bytes() == ds.get(i).tobytes()
        for i in range(ds.num_documents):
            assert (base / "documents" / f"{i:07d}.bin").read_bytes() == document_tokens(ds, i).tobytes()
    if len(info["datasets"]) == 1:
        name = info["datasets"][0]["name"]
        assert os.readlink(m.path / "documents") == f"datasets/{name}/documents"
        assert (m.path / "sequences" / "0000001.bin").read_bytes() == (
            m.path / "datasets" / name / "sequences" / "0000001.bin").read_bytes()
    else:
        assert not (m.path / "documents").exists()


def test_metadata(p2):
    info = _info(p2)
    assert info["dtype"] == "uint16" and info["byte_order"] == "little"
    assert info["tokens_per_sample"] == 129 and info["sequence_length"] == 128
    assert info["samples"] == {"train": 1200, "valid": 100, "test": 20}
    assert info["eod_id"] == 50256 and info["pad_id"] == -1
    assert [d["name"] for d in info["datasets"]] == ["u16_docs", "u16_small"]
    assert info["config"]["sequence_length"] == 128
    st = os.stat(p2.path / "train" / "samples" / "0000000.bin")
    assert st.st_mode & 0o7777 == 0o444 and st.st_size == 258
    assert os.stat(p2.path / "train").st_mode & 0o7777 == 0o555
    src = max(os.stat(GOLDEN / "data" / f"u16_docs.{e}").st_mtime for e in ("bin", "idx"))
    src = max([src] + [os.stat(GOLDEN / "data" / f"u16_small.{e}").st_mtime for e in ("bin", "idx")])
    assert abs(st.st_mtime - src) < 1e-3


def test_xattrs(p2):
    path = p2.path / "samples" / "0000042.bin"
    names = os.listxattr(path)
    assert set(names) == {"user.mmfs.dataset", "user.mmfs.pieces"}
    dataset = os.getxattr(path, "user.mmfs.dataset").decode()
    pieces = [tuple(map(int, p.split(":"))) for p in os.getxattr(path, "user.mmfs.pieces").decode().split()]
    assert dataset in ("u16_docs", "u16_small")
    # The pieces rebuild the sample from the dataset's own sequences.
    ds = open_dataset(GOLDEN / "data" / dataset)
    tokens = np.concatenate([ds.get(s, o, n) for s, o, n in pieces])
    assert tokens.astype(np.uint16).tobytes() == path.read_bytes()
    with pytest.raises(OSError) as exc:
        os.getxattr(path, "user.nope")
    assert exc.value.errno == errno.ENODATA
    # A size query (size 0) returns the length without the value.
    libc = ctypes.CDLL(None, use_errno=True)
    n = libc.getxattr(str(path).encode(), b"user.mmfs.pieces", None, ctypes.c_size_t(0))
    assert n == len(os.getxattr(path, "user.mmfs.pieces"))
    small = ctypes.create_string_buffer(1)
    assert libc.getxattr(str(path).encode(), b"user.mmfs.pieces", small, ctypes.c_size_t(1)) == -1
    assert ctypes.get_errno() == errno.ERANGE
    assert os.listxattr(p2.path / "mmfs.json") == []


# -- tools ---------------------------------------------------------------------------


def test_read_with_tools(p2):
    path = p2.path / "train" / "samples" / "0000007.bin"
    data = _expected_bytes("p2_blend2_u16", "train", "uint16")[7]
    assert subprocess.run(["cat", path], capture_output=True, check=True).stdout == data
    for skip, count in [(0, 1), (1, 3), (7, 13), (255, 5), (257, 1), (258, 4), (1000, 3)]:
        out = subprocess.run(["dd", f"if={path}", "bs=1", f"skip={skip}", f"count={count}"],
                             capture_output=True, check=True).stdout
        assert out == data[skip : skip + count], (skip, count)
    out = subprocess.run(["dd", f"if={path}", "bs=7", "skip=3"], capture_output=True, check=True).stdout
    assert out == data[21:]
    hexdump = subprocess.run(["hexdump", "-C", path], capture_output=True, text=True, check=True).stdout
    first = " ".join(f"{b:02x}" for b in data[:8])
    assert hexdump.splitlines()[0].startswith("00000000  " + first)
    assert hexdump.splitlines()[-1] == f"{len(data):08x}"
    od = subprocess.run(["od", "-An", "-tu2", "-v", "-w258", path], capture_output=True, text=True,
                        check=True).stdout.split()
    assert [int(x) for x in od] == np.frombuffer(data, "<u2").tolist()
    assert np.array_equal(np.fromfile(path, dtype=np.uint16), np.frombuffer(data, "<u2"))
    # Reads at odd offsets and past the end, straight through the syscalls.
    fd = os.open(path, os.O_RDONLY)
    try:
        assert os.pread(fd, 5, 3) == data[3:8]
        assert os.pread(fd, 100, 250) == data[250:]
        assert os.pread(fd, 10, 258) == b""
        assert os.pread(fd, 10, 10**9) == b""
    finally:
        os.close(fd)


def test_listing_kinds(p2):
    kinds = {e.name: (e.is_symlink(), e.is_dir(follow_symlinks=False), e.is_file(follow_symlinks=False))
             for e in os.scandir(p2.path)}
    assert kinds["samples"] == (True, False, False)
    assert kinds["train"] == (False, True, False)
    assert kinds["mmfs.json"] == (False, False, True)


def test_listing_and_stat_tools(p2):
    # -I: not report.html, whose size is its page made by an `mmfs report` child (test_report_mount.py)
    out = subprocess.run(["ls", "-l", "-I", "report.html", p2.path], capture_output=True, text=True,
                         check=True).stdout
    assert "samples -> train/samples" in out and "mmfs.json" in out and "report.html" not in out
    head = subprocess.run(f"ls {p2.path}/samples/ | head -3", shell=True, capture_output=True,
                          text=True, check=True).stdout.split()
    assert head == ["0000000.bin", "0000001.bin", "0000002.bin"]
    find = subprocess.run(["find", p2.path / "valid", "-type", "f"], capture_output=True, text=True,
                          check=True).stdout.split()
    assert len(find) == 100
    df = subprocess.run(["df", p2.path], capture_output=True, text=True, check=True).stdout
    assert "mmfs" in df


# -- concurrency -----------------------------------------------------------------


READS = 40  # by each reader: a count, not a time (a busy machine reads as much, later)


def _reader_process(paths_and_digests, out):
    rng = random.Random(os.getpid())
    n = bad = 0
    for _ in range(READS):
        path, digest = rng.choice(paths_and_digests)
        with open(path, "rb") as f:
            if hashlib.sha1(f.read()).hexdigest() != digest:
                bad += 1
        n += 1
    out.put((n, bad))


def test_threads_and_processes_read_right_bytes(golden):
    case, m = golden
    info = _info(m)
    items = []
    for split in SPLITS:
        for i, data in enumerate(_expected_bytes(case, split, info["dtype"])):
            items.append((str(m.path / split / "samples" / f"{i:07d}.bin"), hashlib.sha1(data).hexdigest()))
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_reader_process, args=(items, queue)) for _ in range(4)]
    results: list[tuple[int, int]] = []
    lock = threading.Lock()

    def thread_reader():
        rng = random.Random(threading.get_ident())
        n = bad = 0
        for _ in range(READS):
            path, digest = rng.choice(items)
            fd = os.open(path, os.O_RDONLY)
            try:
                # Mix whole reads and odd partial reads.
                if rng.random() < 0.5:
                    data = os.read(fd, 1 << 16)
                    ok = hashlib.sha1(data).hexdigest() == digest
                else:
                    off = rng.randrange(0, 50)
                    part = os.pread(fd, 17, off)
                    whole = os.pread(fd, 1 << 16, 0)
                    ok = part == whole[off : off + 17] and hashlib.sha1(whole).hexdigest() == digest
            finally:
                os.close(fd)
            bad += not ok
            n += 1
        with lock:
            results.append((n, bad))

    for p in procs:
        p.start()
    threads = [threading.Thread(target=thread_reader) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for _ in procs:
        results.append(queue.get(timeout=HANG_GUARD))  # a hang guard: a reader process that never reports
    for p in procs:
        p.join(timeout=30)
    total = sum(n for n, _ in results)
    assert sum(b for _, b in results) == 0
    assert total == 12 * READS


# -- read-only ---------------------------------------------------------------------


def _checksums(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.iterdir()) if p.suffix in (".bin", ".idx")}


def test_every_write_is_erofs(p2):
    before = _checksums(GOLDEN / "data")
    root = p2.path
    f = root / "train" / "samples" / "0000000.bin"
    data = f.read_bytes()
    attempts = {
        "open for write": lambda: os.open(f, os.O_WRONLY),
        "open read-write": lambda: os.open(f, os.O_RDWR),
        "append": lambda: os.open(f, os.O_WRONLY | os.O_APPEND),
        "truncate via open": lambda: os.open(f, os.O_WRONLY | os.O_TRUNC),
        "create": lambda: os.open(root / "new.bin", os.O_WRONLY | os.O_CREAT, 0o644),
        "create in samples": lambda: os.open(root / "train" / "samples" / "9.bin", os.O_CREAT | os.O_WRONLY),
        "mkdir": lambda: os.mkdir(root / "d"),
        "unlink": lambda: os.unlink(f),
        "rmdir": lambda: os.rmdir(root / "test" / "samples"),
        "rename": lambda: os.rename(f, root / "train" / "samples" / "x.bin"),
        "link": lambda: os.link(f, root / "hard"),
        "symlink": lambda: os.symlink("mmfs.json", root / "soft"),
        "chmod": lambda: os.chmod(f, 0o644),
        "chown": lambda: os.chown(f, 1, 1),
        "truncate": lambda: os.truncate(f, 0),
        "setxattr": lambda: os.setxattr(f, "user.mmfs.dataset", b"x"),
        "removexattr": lambda: os.removexattr(f, "user.mmfs.pieces"),
        "utime": lambda: os.utime(f, (0, 0)),
        "mknod": lambda: os.mknod(root / "fifo", 0o600 | 0o010000),
    }
    for what, attempt in attempts.items():
        with pytest.raises(OSError) as exc:
            attempt()
        assert exc.value.errno == errno.EROFS, f"{what}: {exc.value}"
    shell = subprocess.run(f"echo x > {f}", shell=True, capture_output=True, text=True)
    assert shell.returncode != 0 and "Read-only file system" in shell.stderr
    assert f.read_bytes() == data
    assert _checksums(GOLDEN / "data") == before


# -- bad names ------------------------------------------------------------------------


@pytest.mark.parametrize("name", [
    "samples/12.bin", "samples/99999999999.bin", "samples/-1.bin", "samples/0000000.txt",
    "samples/00000000.bin", "samples/0001200.bin", "nope",
    "datasets/nope", "train/samples/+000001.bin", "samples/../../nope",
])
def test_bad_names_are_enoent(p2, name):
    assert stat_errno(p2.path / name) == errno.ENOENT
    with pytest.raises(FileNotFoundError):
        open(p2.path / name, "rb")
    # ... and the daemon goes on serving.
    assert (p2.path / "samples" / "0000001.bin").stat().st_size == 258
    assert pid_alive(p2.pid)


def test_file_as_directory_is_enotdir(p2):
    assert stat_errno(p2.path / "samples" / "0000000.bin" / "x") == errno.ENOTDIR


def test_dotdot_stays_in_the_mount(p2):
    assert (p2.path / "samples" / ".." / "samples" / "0000000.bin").read_bytes() == (
        p2.path / "train" / "samples" / "0000000.bin").read_bytes()
    assert os.path.samefile(p2.path / "train" / "samples" / ".." / "..", p2.path)
    log = p2.log.read_text()
    assert " ERROR " not in log and "Traceback" not in log, log


def test_packed_and_indexed_blend(tmp_path):
    """A Modalities .pbin (uint32 tokens) blended with an IndexedDataset (uint16):
    samples are uint32, each dataset's own files keep its own dtype."""
    from mmfs.formats.writer import write_packed
    from mmfs.megatron import open_corpus

    rng = np.random.default_rng(3)
    docs = [rng.integers(0, 100_000, size=int(n), dtype=np.uint32) for n in rng.integers(1, 300, 400)]
    for d in docs:
        d[-1] = 99_999
    write_packed(str(tmp_path / "web.pbin"), docs, token_size=4)
    (tmp_path / "data").symlink_to(GOLDEN / "data", target_is_directory=True)
    config = tmp_path / "mix.yaml"
    config.write_text(
        "datasets:\n  - {path: web.pbin, weight: 0.6}\n  - {path: data/u16_small, weight: 0.4}\n"
        "split: '90,10,0'\nsamples: {train: 300, valid: 20, test: 0}\nsequence_length: 64\nseed: 9\n"
        "tokenizer: {eod: 99999}\ncache_dir: cache\n"
    )
    corpus = open_corpus(str(config), progress=False)
    with mounted(config, tmp_path / "mnt") as m:
        info = _info(m)
        assert info["dtype"] == "uint32" and info["bytes_per_sample"] == 65 * 4
        for split, reader in corpus.splits.items():
            for i in range(len(reader)):
                assert (m.path / split / "samples" / f"{i:07d}.bin").read_bytes() == reader.read(i)
        web = m.path / "datasets" / "web"
        for i, d in enumerate(docs):
            assert (web / "documents" / f"{i:07d}.bin").read_bytes() == d.astype("<u4").tobytes()
            assert (web / "sequences" / f"{i:07d}.bin").read_bytes() == d.astype("<u4").tobytes()
        assert os.stat(m.path / "datasets" / "u16_small" / "sequences" / "0000000.bin").st_size == (
            open_dataset(GOLDEN / "data" / "u16_small").get(0).nbytes)
        assert not (m.path / "documents").exists()
