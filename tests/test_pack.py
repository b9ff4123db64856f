"""A config's pack (megatron/cache/pack.py): a mount reads its indices from a
constant number of cache files whatever the number of datasets (counted by the
kernel: inotify's open events on the cache folder, from every process of the
mount), serves the same samples as the `.npy` files, and a pack changed under a
live mount is EIO and a log line, never its new bytes."""

from __future__ import annotations

import ctypes
import errno
import json
import os
import struct

import numpy as np
import pytest
from tiny_blends import write_tiny_blend

from mmfs.megatron import open_corpus
from mmfs.megatron.cache import pack, resolved
from mount_fixtures import mmfs, mounted, samples, start_mount, stop_mount

IN_OPEN, IN_Q_OVERFLOW = 0x20, 0x4000
CACHE_FILES_AT_MOST = 16


class OpenEvents:
    """Every open(2) of a file in a folder, by any process, as the kernel reports it."""

    def __init__(self, folder) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        assert self.fd >= 0, os.strerror(ctypes.get_errno())
        assert self._libc.inotify_add_watch(self.fd, os.fsencode(folder), IN_OPEN) >= 0
        self.names: list[str] = []

    def take(self) -> list[str]:
        """The names opened since the last take (an overflowed queue: a failure)."""
        while True:
            try:
                raw = os.read(self.fd, 1 << 20)
            except BlockingIOError:
                break
            at = 0
            while at < len(raw):
                _, mask, _, length = struct.unpack_from("iIII", raw, at)
                assert not mask & IN_Q_OVERFLOW, "more opens than the kernel's queue holds"
                self.names.append(raw[at + 16 : at + 16 + length].rstrip(b"\0").decode())
                at += 16 + length
        names, self.names = self.names, []
        return names

    def close(self) -> None:
        os.close(self.fd)


@pytest.fixture
def user_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user-cache"))  # the record's folder, this test's


def _opened_by_a_mount(tmp_path, datasets: int, documents: int, options: tuple[str, ...],
                       record: bool = True) -> tuple[list, list]:
    """The cache files a mount opened (as it starts, then serving samples across the
    blend) and the samples it served, against those read from the .npy files."""
    folder = tmp_path / f"n{datasets}"
    folder.mkdir()
    config = write_tiny_blend(folder, datasets, documents=documents)
    built = mmfs("-q", "build", config)
    assert built.returncode == 0, built.stderr
    saved = json.loads(open(resolved.record_path(config), "rb").read())
    assert saved["pack"] is not None and os.path.exists(saved["pack"][0])
    if not record:
        resolved.forget(config)  # a node without the record: the full open, then the record it writes
    events = OpenEvents(folder / "cache")
    try:
        with mounted(config, folder / "mnt", *options) as m:
            started = events.take()
            files = sorted(os.listdir(samples(m)))
            picked = [files[i] for i in np.random.RandomState(0).choice(len(files), 200, replace=False)]
            served = {name: (samples(m) / name).read_bytes() for name in picked}
            serving = events.take()
    finally:
        events.close()
    resolved.forget(config)  # the .npy files, the full way, for the expected bytes
    corpus = open_corpus(config, progress=False)
    split = corpus.splits["train"]
    for name, data in served.items():
        assert data == split.read(int(name.split(".")[0])), name
    return started + serving, started


@pytest.mark.parametrize("options", [(), ("-o", "map_limit_mb=0")])  # copied as the default; read with pread
def test_a_mount_opens_the_same_few_cache_files_whatever_the_blend(tmp_path, user_cache, options):
    """Files opened, counted by name: inotify folds an open event into the one before
    it when they are the same (a file opened twice in a row is one event), so the
    events bound the opens from below, and the names opened are exact."""
    small, small_start = _opened_by_a_mount(tmp_path, 24, 40, options)
    large, large_start = _opened_by_a_mount(tmp_path, 1000, 8, options)
    assert len(set(large)) <= CACHE_FILES_AT_MOST and len(large) <= CACHE_FILES_AT_MOST, large
    assert len(set(small)) == len(set(large)) and len(set(small_start)) == len(set(large_start))
    assert all(name.endswith("-mmfs-pack") for name in large), large


def test_a_mount_without_the_record_opens_the_pack_and_the_header_file(tmp_path, user_cache):
    """A node whose record folder does not hold the record (its own home): the full
    open stats the cache files (the header file) and writes the record; the mount
    then reads the indices from the pack all the same."""
    small, _ = _opened_by_a_mount(tmp_path, 24, 40, (), record=False)
    large, _ = _opened_by_a_mount(tmp_path, 1000, 8, (), record=False)
    assert set(n.split("-", 1)[1] for n in large) == {"mmfs-pack", "mmfs-headers.json"}, large
    assert len(set(small)) == len(set(large)) and len(large) <= CACHE_FILES_AT_MOST


def test_a_pack_replaced_under_a_live_mount_is_never_served(tmp_path, user_cache):
    """The pack read with pread (map_limit_mb=0) and another file renamed over it while
    the mount serves: every read is the bytes it served before or EIO (with a log
    line naming the pack), never the new file's bytes."""
    config = write_tiny_blend(tmp_path, 20, documents=40)
    assert mmfs("-q", "build", config).returncode == 0
    packed = json.loads(open(resolved.record_path(config), "rb").read())["pack"][0]
    corpus = open_corpus(config, progress=False)
    split = corpus.splits["train"]
    m = start_mount(config, tmp_path / "mnt", "-o", "map_limit_mb=0,open_files=8")
    try:
        names = sorted(os.listdir(samples(m)))
        for name in names[:40]:
            assert (samples(m) / name).read_bytes() == split.read(int(name[:7]))
        with open(packed, "rb") as f:
            raw = bytearray(f.read())
        raw[pack.DATA_FROM : -4096] = b"\xff" * (len(raw) - pack.DATA_FROM - 4096)
        (tmp_path / "new").write_bytes(raw)
        os.replace(tmp_path / "new", packed)
        failed = 0
        for name in names[40:]:
            try:
                data = (samples(m) / name).read_bytes()
            except OSError as exc:
                assert exc.errno == errno.EIO
                failed += 1
                continue
            assert data == split.read(int(name[:7]))  # never the new bytes
        assert not failed or f"{os.path.realpath(packed)} changed since the mount" in m.log.read_text()
    finally:
        stop_mount(m)


def test_a_record_that_disagrees_with_its_pack_is_removed(tmp_path, user_cache):
    """A record whose facts about an array differ from the pack's table (sizes kept
    consistent): the pack is not read as the record says; the record is removed,
    the indices loaded from their own files, the same samples served."""
    config = write_tiny_blend(tmp_path, 20)
    expected = {n: [s.read(i) for i in range(len(s))] for n, s in open_corpus(config, progress=False).splits.items()}
    record = resolved.record_path(config)
    for limit in (None, 0, 64):
        saved = json.loads(open(record, "rb").read())
        assert saved["pack"] is not None
        gpts, _ = saved["splits"]["train"]
        descr, shape, offset, file = gpts[0][-1]["document_index"]
        gpts[0][-1]["document_index"] = [descr, [shape[0] - 1], offset + np.dtype(descr).itemsize, file]
        with open(record, "w") as f:
            f.write(json.dumps(saved))
        corpus = open_corpus(config, progress=False, map_limit_mb=limit)
        assert {n: [s.read(i) for i in range(len(s))] for n, s in corpus.splits.items()} == expected
        assert corpus.record is None
        open_corpus(config, progress=False)  # the full way: the record written again, whole
        assert json.loads(open(record, "rb").read())["splits"]["train"][0][0][-1]["document_index"][1] == shape


def test_a_pack_is_kept_while_its_sources_are_and_written_again_when_one_changes(tmp_path, user_cache):
    config = write_tiny_blend(tmp_path, 20)
    open_corpus(config, progress=False)
    path, ident, _ = json.loads(open(resolved.record_path(config), "rb").read())["pack"]
    resolved.forget(config)
    open_corpus(config, progress=False)  # the full way again: the pack holds what it would write
    assert json.loads(open(resolved.record_path(config), "rb").read())["pack"][1] == ident
    cache = tmp_path / "cache"
    victim = sorted(n for n in os.listdir(cache) if n.endswith("-train-shuffle_index.npy"))[0]
    os.replace(cache / victim, cache / "aside")
    os.replace(cache / "aside", cache / victim)  # the same bytes, another identity for a moment
    os.utime(cache / victim, ns=(0, 1))
    open_corpus(config, progress=False)
    again = json.loads(open(resolved.record_path(config), "rb").read())["pack"]
    assert again[0] == path and again[1] != ident
