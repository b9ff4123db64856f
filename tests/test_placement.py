"""Arrays placed as rows of facts (megatron/placement.py): the C check of a .npy
header is numpy's very header or nothing, a record's array placed without an
object is checked as one made would be, and each file region is placed once
however many structs show it."""

from __future__ import annotations

import io
import os

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mmfs.errors import FormatError
from mmfs.megatron.arrays import ArrayPlacer
from mmfs.megatron.cache.npyfile import HeaderFileLied, npy_header, read_npy_header
from mmfs.megatron.placement import HEADS
from mmfs.native import ffi, lib
from mmfs.storage import localfiles


def c_matches(heads: list[bytes], descrs: list[str], shapes: list[tuple], offsets: list[int]) -> list[int]:
    n = len(heads)
    buf = np.zeros((n, HEADS), dtype=np.uint8)
    got = np.zeros(n, dtype=np.int32)
    for i, h in enumerate(heads):
        h = h[:HEADS]
        buf[i, :len(h)] = np.frombuffer(h, dtype=np.uint8)
        got[i] = len(h)
    ndim = np.array([len(s) if 1 <= len(s) <= 2 else -1 for s in shapes], dtype=np.int32)
    dims = np.array([(tuple(s) + (0, 0))[:2] for s in shapes], dtype=np.int64).reshape(-1, 2)
    ok = np.zeros(n, dtype=np.uint8)
    lib.mmfs_npy_headers_match(ffi.from_buffer("uint8_t[]", buf), ffi.from_buffer("int32_t[]", got), HEADS, n,
                               b"".join(d.encode() + b"\0" for d in descrs), ffi.from_buffer("int32_t[]", ndim),
                               ffi.from_buffer("int64_t[]", dims),
                               ffi.from_buffer("int64_t[]", np.array(offsets, dtype=np.int64)),
                               ffi.from_buffer("uint8_t[]", ok))
    return ok.tolist()


def numpy_header(descr: str, shape: tuple) -> bytes:
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(out, {"descr": descr, "fortran_order": False, "shape": shape})
    return out.getvalue()


DESCRS = ["<i4", "<i8", "<u4", "<i2", "|u1", "|i1", ">i8", "<f8", "<u2"]


@given(descr=st.sampled_from(DESCRS), shape=st.lists(st.integers(0, 2**40), min_size=0, max_size=3).map(tuple),
       flip=st.integers(0, 200), other=st.sampled_from(DESCRS))
def test_the_c_header_check_is_numpys_header_or_nothing(descr, shape, flip, other):
    """Matched in C exactly when numpy's own header for (descr, shape) is what the
    file begins with (1-D and 2-D; any other shape is left to Python's parse)."""
    head = numpy_header(descr, shape)
    offset = len(head)
    assert head == npy_header(np.dtype(descr), shape, offset)  # Python's, the same bytes
    in_c = 1 <= len(shape) <= 2
    assert c_matches([head + b"\x07" * 9], [descr], [shape], [offset]) == [int(in_c)]
    wrong = bytearray(head)
    wrong[flip % offset] ^= 0x01
    assert c_matches([bytes(wrong)], [descr], [shape], [offset]) == [0]
    assert c_matches([head], [other], [shape], [offset]) == [int(in_c and other == descr)]
    assert c_matches([head[:offset - 1]], [descr], [shape], [offset]) == [0]  # not read whole
    if shape:
        bigger = (shape[0] + 1,) + shape[1:]
        assert c_matches([head], [descr], [bigger], [offset]) == [0]


def saved(tmp_path, name: str, array: np.ndarray):
    path = tmp_path / f"{name}.npy"
    np.save(path, array)
    return read_npy_header(str(path))


@pytest.mark.parametrize("limit", [0, 1 << 20])  # read with pread; copied
def test_an_array_placed_from_facts_is_checked_against_its_file(tmp_path, limit):
    record = tmp_path / "record.json"
    record.write_text("{}")
    a = saved(tmp_path, "a", np.arange(10, dtype=np.int64))
    placer = ArrayPlacer(limit)
    c = ffi.new("mmfs_array *")
    assert placer.place_file(c, a.path, a.offset, a.dtype, a.shape, a.file, str(record)) is None  # no object
    placer.finish()
    assert c.count == 10 and c.dtype == 5 and (c.data != ffi.NULL) == (limit > 0)
    if limit:
        assert np.frombuffer(ffi.buffer(c.data, 80), dtype=np.int64).tolist() == list(range(10))
    else:
        assert c.file > 0 and c.offset == a.offset
        with localfiles.descriptor(c.file) as fd:
            assert os.pread(fd, 8, a.offset + 8 * 3) == np.int64(3).tobytes()
    placer.close()
    lie = ArrayPlacer(limit)
    lie.place_file(ffi.new("mmfs_array *"), a.path, a.offset, np.dtype("<u8"), a.shape, a.file, str(record))
    with pytest.raises(HeaderFileLied, match="its header says <i8 \\[10\\] at byte 128, but .* says <u8"):
        lie.finish()
    assert not record.exists()  # not to be believed again
    lie.close()


@pytest.mark.parametrize("limit", [0, 1 << 20])
def test_a_region_placed_twice_is_read_once(tmp_path, limit):
    """The same bytes placed as facts, as an array and as facts again: one copy (or one
    registered file), counted once, every struct showing it."""
    a = saved(tmp_path, "a", np.arange(6, dtype=np.int32) + 40)
    known = localfiles.counts().known
    placer = ArrayPlacer(limit)
    structs = [ffi.new("mmfs_array *") for _ in range(3)]
    placer.place_file(structs[0], a.path, a.offset, a.dtype, a.shape, a.file)
    placer.place(structs[1], a)
    placer.place_file(structs[2], a.path, a.offset, a.dtype, a.shape, a.file)
    placer.finish()
    assert placer.mapped_bytes + placer.pread_bytes == 24
    assert len({(c.data, c.file, c.offset) for c in structs}) == 1 and all(c.count == 6 for c in structs)
    assert localfiles.counts().known - known == (1 if limit == 0 else 0)
    assert placer.files() == [a.path]
    placer.close()


@pytest.mark.parametrize("how", ["three dimensions", "format 2.0"])
def test_a_header_the_c_check_does_not_make_is_parsed_not_refused(tmp_path, how):
    """A header the C check does not make (three dimensions, another format version)
    is parsed in Python: the same array, not a lie."""
    path = tmp_path / "a.npy"
    array = np.arange(24, dtype=np.int16)
    if how == "three dimensions":
        array = array.reshape(2, 3, 4)
    with open(path, "wb") as f:
        np.lib.format.write_array(f, array, version=(1, 0) if how == "three dimensions" else (2, 0))
    a = read_npy_header(str(path))
    record = tmp_path / "record.json"
    record.write_text("{}")
    placer = ArrayPlacer(1 << 20)
    c = ffi.new("mmfs_array *")
    placer.place_file(c, a.path, a.offset, a.dtype, a.shape, a.file, str(record))
    placer.finish()
    assert np.frombuffer(ffi.buffer(c.data, 48), dtype=np.int16).tolist() == list(range(24))
    assert record.exists()


def test_thousands_of_files_copied_each_its_own_and_a_changed_one_named(tmp_path):
    """Enough files for the C copy to share them among threads (where there are CPUs):
    every struct gets its own file's bytes; a file changed late in the list is the
    one the error names."""
    arrays = [saved(tmp_path, f"a{k}", np.array([k, 2 * k, 3 * k], dtype=np.int64)) for k in range(4100)]
    placer = ArrayPlacer(1 << 30)
    structs = [ffi.new("mmfs_array *") for _ in arrays]
    for c, a in zip(structs, arrays):
        placer.place_file(c, a.path, a.offset, a.dtype, a.shape, a.file)
    placer.finish()
    for k, c in enumerate(structs):
        assert np.frombuffer(ffi.buffer(c.data, 24), dtype=np.int64).tolist() == [k, 2 * k, 3 * k]
    changed = arrays[4000]
    np.save(changed.path, np.array([9, 9, 9, 9], dtype=np.int64))
    again = ArrayPlacer(1 << 30)
    for a in arrays:
        again.place_file(ffi.new("mmfs_array *"), a.path, a.offset, a.dtype, a.shape, a.file)
    with pytest.raises(FormatError, match=f"{changed.path}: changed since it was read"):
        again.finish()
