"""The small index arrays a mount keeps in memory (megatron/arrays.py): copied in one
C call when placed, each file checked as it is read (the file the array was made
from; the .npy header its header file or record says), never the bytes of a file
that changed."""

from __future__ import annotations

import os

import numpy as np
import pytest

from mmfs.errors import FormatError
from mmfs.megatron.arrays import ArrayPlacer
from mmfs.megatron.cache.npyfile import CachedArray, HeaderFileLied, file_id, read_npy_header
from mmfs.native import ffi


def saved(tmp_path, name: str, array: np.ndarray, known_from: str | None = None) -> CachedArray:
    path = tmp_path / f"{name}.npy"
    np.save(path, array)
    a = read_npy_header(str(path))
    return CachedArray(a.path, a.dtype, a.shape, a.offset, file=a.file, known_from=known_from)


def placed(arrays: list[CachedArray], limit: int = 1 << 20) -> tuple[ArrayPlacer, list]:
    placer = ArrayPlacer(limit)
    structs = [ffi.new("mmfs_array *") for _ in arrays]
    for c, a in zip(structs, arrays):
        placer.place(c, a)
    placer.finish()
    return placer, structs


def values(c, dtype) -> np.ndarray:
    assert c.data != ffi.NULL and c.file == 0  # in memory, not read from the file
    return np.frombuffer(ffi.buffer(c.data, c.count * np.dtype(dtype).itemsize), dtype=dtype)


def test_arrays_within_the_limit_are_copied_with_their_own_bytes(tmp_path):
    originals = [np.arange(n, dtype=dtype) * 3 for n, dtype in
                 [(5, np.int32), (7, np.int64), (1, np.uint16), (33, np.int16), (100, np.int64)]]
    arrays = [saved(tmp_path, f"a{k}", a, known_from=str(tmp_path / "record.json") if k % 2 else None)
              for k, a in enumerate(originals)]
    placer, structs = placed(arrays)
    for c, a in zip(structs, originals):
        assert np.array_equal(values(c, a.dtype), a)
    assert placer.pread_bytes == 0 and placer.mapped_bytes == sum(a.nbytes for a in originals)
    for array in arrays:  # the copies stay whatever happens to the files now
        os.unlink(array.path)
    for c, a in zip(structs, originals):
        assert np.array_equal(values(c, a.dtype), a)


@pytest.mark.parametrize("how", ["rewritten in place", "replaced", "removed"])
@pytest.mark.parametrize("known", [False, True])
def test_a_file_changed_since_it_was_read_is_never_copied(tmp_path, how, known):
    record = tmp_path / "record.json"
    record.write_text("{}")
    array = saved(tmp_path, "a", np.arange(10, dtype=np.int64), known_from=str(record) if known else None)
    if how == "rewritten in place":
        with open(array.path, "r+b") as f:
            f.seek(array.offset)
            f.write(np.int64(99).tobytes())
        st = os.stat(array.path)
        os.utime(array.path, ns=(st.st_atime_ns, st.st_mtime_ns + 1000))
    elif how == "replaced":
        np.save(tmp_path / "b.npy", np.arange(10, dtype=np.int64) + 1)
        os.replace(tmp_path / "b.npy", array.path)
    else:
        os.unlink(array.path)
    assert os.path.exists(array.path) == (how != "removed")
    with pytest.raises(HeaderFileLied if known else FormatError,
                       match="changed since it was read" if how != "removed" else "cannot be read"):
        placed([array])
    assert record.exists() != known  # a record that vouched for it is not believed again


def test_a_header_that_is_not_what_the_record_says_is_caught(tmp_path):
    """The same file (size, mtime, inode as recorded), read as another shape: only
    its own .npy header tells, and it is checked as the file is copied."""
    record = tmp_path / "record.json"
    record.write_text("{}")
    array = saved(tmp_path, "a", np.arange(10, dtype=np.int64), known_from=str(record))
    lie = CachedArray(array.path, np.dtype("<i4"), (20,), array.offset, file=array.file,
                      known_from=str(record))
    assert file_id(os.stat(array.path)) == lie.file
    with pytest.raises(HeaderFileLied, match="its header says <i8 \\[10\\]"):
        placed([lie])
    assert not record.exists()


def long_headed(tmp_path, name: str, array: np.ndarray, header: int) -> CachedArray:
    """A .npy file whose header is padded to `header` bytes (numpy reads it as any other)."""
    text = f"{{'descr': {array.dtype.str!r}, 'fortran_order': False, 'shape': {array.shape!r}, }}"
    text += " " * (header - 10 - len(text) - 1) + "\n"
    path = tmp_path / f"{name}.npy"
    path.write_bytes(b"\x93NUMPY\x01\x00" + (header - 10).to_bytes(2, "little") + text.encode() + array.tobytes())
    assert np.array_equal(np.load(path), array)
    a = read_npy_header(str(path))
    assert a.offset == header
    return a


@pytest.mark.parametrize("header", [128, 512, 1024, 2048])
def test_headers_of_any_length_are_checked_and_their_data_copied(tmp_path, header):
    """A header that ends within the first bytes read (header and data in one read),
    at their end, or beyond (the header read on its own)."""
    record = tmp_path / "record.json"
    record.write_text("{}")
    original = np.arange(300, dtype=np.int64) * 7
    a = long_headed(tmp_path, "a", original, header)
    known = CachedArray(a.path, a.dtype, a.shape, a.offset, file=a.file, known_from=str(record))
    _, (c,) = placed([known])
    assert np.array_equal(values(c, np.int64), original)
    lie = CachedArray(a.path, np.dtype("<i4"), (600,), a.offset, file=a.file, known_from=str(record))
    with pytest.raises(HeaderFileLied, match="<i8 \\[300\\]|header"):
        placed([lie])
    assert not record.exists()


def test_a_tiny_array_is_copied_and_checked_in_one_read(tmp_path):
    """Data shorter than the bytes read first for the header: the head is the
    whole file."""
    record = tmp_path / "record.json"
    record.write_text("{}")
    a = saved(tmp_path, "a", np.array([5], dtype=np.int16), known_from=str(record))
    _, (c,) = placed([a])
    assert values(c, np.int16).tolist() == [5]
    lie = CachedArray(a.path, np.dtype("<u2"), (1,), a.offset, file=a.file, known_from=str(record))
    with pytest.raises(HeaderFileLied, match="its header says <i2 \\[1\\]"):
        placed([lie])


def test_arrays_in_memory_placed_among_file_arrays(tmp_path):
    """Arrays with no file (in memory) placed before and between file-backed ones: each
    struct points at its own bytes, copied, or read with pread from its own file."""
    originals = [np.arange(n, dtype=np.int64) + n for n in (3, 50, 7, 400)]
    files = [saved(tmp_path, f"a{k}", a) for k, a in enumerate(originals)]
    memory = [np.arange(5, dtype=np.int32) * 2, np.arange(9, dtype=np.int16)]
    placer = ArrayPlacer(8 * 40)  # the two smallest files copied, the others read with pread
    order = [memory[0], files[0], memory[1], files[1], files[2], files[3]]
    expected = [memory[0], originals[0], memory[1], originals[1], originals[2], originals[3]]
    structs = [ffi.new("mmfs_array *") for _ in order]
    for c, a in zip(structs, order):
        placer.place(c, a)
    placer.finish()
    placer.load()
    assert [c.data == ffi.NULL for c in structs] == [False, False, False, True, False, True]
    for c, a, e in zip(structs, order, expected):
        if c.data == ffi.NULL:
            assert c.file > 0 and c.offset == a.offset and c.count == e.size
        else:
            assert np.array_equal(np.frombuffer(ffi.buffer(c.data, c.count * e.dtype.itemsize), dtype=e.dtype), e)
    assert placer.pread_bytes == originals[1].nbytes + originals[3].nbytes
    placer.close()
