"""Where the sample reader's arrays live: mapped, or read with pread from their
files (a long-running reader's memory must not grow with what it reads). Every
golden sample is the same either way."""

import mmap
import os

import numpy as np
import pytest

from golden_cases import expected_samples, write_case_config
from mmfs.megatron import open_corpus
from mmfs.megatron.arrays import ArrayPlacer, file_region
from mmfs.native import ffi


def test_file_region_of_memmap_views(tmp_path):
    path = tmp_path / "a.bin"
    data = np.arange(100_000, dtype=np.int64)
    data.tofile(path)
    whole = np.memmap(path, dtype=np.uint8, mode="r")
    assert file_region(whole) == (str(path), 0)
    as_ints = whole.view(np.ndarray)[800:1600].view(np.int64)
    assert file_region(as_ints) == (str(path), 800)
    # A map that starts past the allocation granularity, and a view of it.
    offset = mmap.ALLOCATIONGRANULARITY + 24
    tail = np.memmap(path, dtype=np.int64, mode="r", offset=offset)
    assert file_region(tail) == (str(path), offset)
    assert file_region(tail[10:20]) == (str(path), offset + 80)
    assert tail[10] == data[offset // 8 + 10]
    assert file_region(np.asarray(tail[5:])) == (str(path), offset + 40)
    assert file_region(tail[::2]) is None  # not contiguous: stays in memory
    assert file_region(np.arange(5)) is None


def test_npy_cache_arrays_have_regions(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, np.arange(1000, dtype=np.int32))
    loaded = np.load(path, mmap_mode="r")
    name, offset = file_region(loaded)
    assert name == str(path)
    assert np.array_equal(np.fromfile(path, dtype=np.int32, count=1000, offset=offset), np.arange(1000))


def test_placer_maps_the_smallest_files_up_to_the_limit(tmp_path):
    arrays = {}
    for name, n in (("small", 100), ("medium", 1000), ("large", 10_000)):
        np.arange(n, dtype=np.int64).tofile(tmp_path / name)
        arrays[name] = np.memmap(tmp_path / name, dtype=np.int64, mode="r")
    placer = ArrayPlacer(map_limit=8 * 1100)
    structs = {name: ffi.new("mmfs_array *") for name in arrays}
    for name, a in arrays.items():
        placer.place(structs[name], a)
    placer.place(ffi.new("mmfs_array *"), np.arange(7))  # in memory: not the placer's to move
    placer.finish()
    assert structs["small"].data != ffi.NULL and structs["medium"].data != ffi.NULL
    assert structs["large"].data == ffi.NULL and structs["large"].file > 0
    assert (placer.mapped_bytes, placer.pread_bytes, placer.memory_bytes) == (8800, 80_000, 56)
    placer.close()


@pytest.mark.parametrize("case", ["p2_blend2_u16", "p3_multi_epoch_i32"])
def test_pread_everything_gives_megatrons_samples(case, tmp_path):
    corpus = open_corpus(str(write_case_config(case, tmp_path)), progress=False, map_limit_mb=0)
    assert corpus.placer.mapped_bytes == 0 and corpus.placer.pread_bytes > 0
    for split, reader in corpus.splits.items():
        expected = expected_samples(case, split).astype(reader.dtype)
        for i in range(len(reader)):
            assert np.array_equal(reader.tokens(i), expected[i])
        mapped = open_corpus(str(tmp_path / "config.yaml"), progress=False).splits[split]
        assert [reader.provenance(i) for i in range(len(reader))] == \
               [mapped.provenance(i) for i in range(len(mapped))]


def test_pread_widening_blend(tmp_path):
    """uint16 and int32 datasets blended: tokens widened through the bounce buffer."""
    (tmp_path / "data").symlink_to(write_case_config("p1_single_u16", tmp_path / "x").parent / "data")
    config = tmp_path / "c.yaml"
    config.write_text("datasets: [{path: data/u16_docs, weight: 1}, {path: data/i32_docs, weight: 1}]\n"
                      "split: '100,0,0'\nsamples: {train: 300, valid: 0, test: 0}\nsequence_length: 5000\n"
                      "tokenizer: {eod: 0}\ncache_dir: cache\n")
    mapped = open_corpus(str(config), progress=False).splits["train"]
    pread = open_corpus(str(config), progress=False, map_limit_mb=0).splits["train"]
    assert mapped.dtype == np.int32
    for i in range(len(mapped)):
        assert mapped.read(i) == pread.read(i)


def test_mount_counts_only_index_arrays_held_in_memory(tmp_path):
    """Freshly built indices are mapped from the cache once saved, so `mmfs mount`
    need not re-open; a .pbin's sequence table (always in memory) is not an index
    and does not count."""
    from mmfs.formats.writer import write_packed
    from mmfs.megatron.corpus import index_bytes_in_memory

    docs = [np.full(50, 7, dtype=np.uint32) for _ in range(300)]
    write_packed(str(tmp_path / "web.pbin"), docs, token_size=4)
    config = tmp_path / "c.yaml"
    config.write_text("datasets: [{path: web.pbin}]\nsplit: '100,0,0'\nsamples: {train: 200}\n"
                      "sequence_length: 32\ntokenizer: {eod: 7}\ncache_dir: cache\n")
    built = open_corpus(str(config), progress=False, map_limit_mb=64)
    reopened = open_corpus(str(config), progress=False, map_limit_mb=64)
    assert built.placer.memory_bytes > 0 and reopened.placer.memory_bytes > 0  # the .pbin table
    assert not any(g.from_cache for g in built.indices["train"].gpts)
    assert index_bytes_in_memory(built) == 0
    assert index_bytes_in_memory(reopened) == 0


def test_pread_block_cache_never_serves_another_files_blocks(tmp_path):
    """Index entries read with pread go through a per-thread block cache keyed by
    the opening of the file, not the fd number: corpora opened one after another in
    one process (file descriptors reused) each read their own bytes."""
    for round_ in range(2):
        for case in ("p1_single_u16", "p3_multi_epoch_i32", "p4_single_multiseq"):
            config = write_case_config(case, tmp_path / f"{case}-{round_}")
            corpus = open_corpus(str(config), progress=False, map_limit_mb=0)
            split = corpus.splits["train"]
            expected = expected_samples(case, "train")
            for i in range(0, len(split), 7):
                assert np.array_equal(split.tokens(i).astype(np.int64), expected[i]), (case, i)
            corpus.placer.close()


def test_finish_copies_cached_arrays_and_names_a_file_that_shrank(tmp_path):
    from mmfs.errors import FormatError
    from mmfs.megatron.cache.npyfile import read_npy_header

    for name in ("kept", "shrinks"):
        np.save(tmp_path / f"{name}.npy", np.arange(3000, dtype=np.int64))
    placer = ArrayPlacer(map_limit=1 << 20)
    kept, shrinks = ffi.new("mmfs_array *"), ffi.new("mmfs_array *")
    placer.place(kept, read_npy_header(str(tmp_path / "kept.npy")))
    placer.place(shrinks, read_npy_header(str(tmp_path / "shrinks.npy")))
    assert kept.data == ffi.NULL  # until finish() copies it
    with open(tmp_path / "shrinks.npy", "r+b") as f:
        f.truncate(1000)
    with pytest.raises(FormatError, match="shrinks.npy: changed since it was read"):
        placer.finish()
    placer.close()

    placer = ArrayPlacer(map_limit=1 << 20)
    placer.place(kept, read_npy_header(str(tmp_path / "kept.npy")))
    placer.finish()
    assert kept.file == 0 and kept.data != ffi.NULL  # a copy, whatever happens to the file now
    os.unlink(tmp_path / "kept.npy")
    placer.load()
    copied = np.frombuffer(ffi.buffer(kept.data, 3000 * 8), dtype=np.int64)
    assert np.array_equal(copied, np.arange(3000))
    placer.close()
