"""Facts the Python side and the C core both rely on agree: file names, dtype
codes, .pbin problem codes and the header generated from the mount contract."""

from __future__ import annotations

import pickle
import runpy
from pathlib import Path

import numpy as np
import pytest

from mmfs.formats import packed
from mmfs.formats.dtypes import CODE_TO_DTYPE, UINT32_CODE, native_code
from mmfs.mount import contract
from mmfs.native import ffi, lib

NATIVE = Path(__file__).resolve().parent.parent / "native"


def test_the_built_header_is_the_contracts():
    assert (NATIVE / "mmfs_contract.h").read_text() == contract.c_header()


def test_a_build_leaves_an_unchanged_header_alone():
    """`pip install -e .` runs build_native.py; a header it rewrote with the same text would
    be newer than the venv's stamp, and the next `make` would reinstall the venv."""
    header = NATIVE / "mmfs_contract.h"
    before = header.stat().st_mtime_ns
    runpy.run_path(str(NATIVE / "build_native.py"))  # what setuptools runs (not its compile step)
    assert header.stat().st_mtime_ns == before
    assert header.read_text() == contract.c_header()


def _view(path: bytes, count: int, width: int):
    v = ffi.new("mmfs_view *")
    v.path, v.count, v.name_width, v.item, v.file_tokens = path, count, width, 2, 1
    return v


@pytest.mark.parametrize("count", [1, 10_000_000, 10_000_001, 123_456_789_012])
def test_c_names_and_parses_files_as_the_contract_does(count):
    path = ffi.new("char[]", b"/train/samples")
    width = contract.name_width(count)
    v = _view(path, count, width)
    out = ffi.new("char[64]")
    d, i = ffi.new("int32_t *"), ffi.new("int64_t *")
    for file in {0, count // 3, count - 1}:
        name = contract.file_name(file, width)
        assert lib.mmfs_view_name(v, file, out, 64) == len(name)
        assert ffi.string(out).decode() == name
        assert lib.mmfs_view_find(v, 1, f"/train/samples/{name}".encode(), d, i) == lib.MMFS_PATH_FILE
        assert i[0] == file
        other = name[: -len(contract.FILE_SUFFIX)] + ".dat"
        assert lib.mmfs_view_find(v, 1, f"/train/samples/{other}".encode(), d, i) == lib.MMFS_PATH_MISSING


def _source(tokens: np.ndarray, lengths: np.ndarray):
    """An mmfs_source of one sequence over numpy arrays (kept alive by the caller)."""
    raw = tokens.view(np.uint8)
    pointers = np.zeros(1, np.int64)
    src = ffi.new("mmfs_source *")
    for c, arr, code in ((src.bytes, raw, 1), (src.lengths, lengths, native_code(lengths.dtype)),
                         (src.pointers, pointers, native_code(pointers.dtype))):
        c.data, c.count, c.dtype = ffi.cast("const uint8_t *", arr.ctypes.data), arr.size, code
    src.dtype = native_code(tokens.dtype)
    return src, (raw, pointers, lengths)


@pytest.mark.parametrize("code", [*CODE_TO_DTYPE, UINT32_CODE])
def test_c_reads_each_dtype_code_as_python_names_it(code):
    dtype = CODE_TO_DTYPE.get(code, np.dtype(np.uint32))
    tokens = np.arange(5).astype(dtype)
    # Token bytes check the code's size; lengths (integer codes only) its sign.
    src, keep = _source(tokens, np.array([5], dtype if dtype.kind in "iu" else np.int32))
    assert lib.mmfs_sequence_length(src, 0) == 5
    out = ffi.new("uint8_t[]", tokens.nbytes)
    assert lib.mmfs_sequence_tokens(src, 0, 0, 5, out) == 0
    assert ffi.buffer(out)[:] == tokens.tobytes()
    if dtype.kind in "iu":  # all bits set: -1 if signed (refused), the largest value if not
        src, keep = _source(tokens, np.array([-1]).astype(dtype))
        length = lib.mmfs_sequence_length(src, 0)
        assert (length < 0) if dtype.kind == "i" else length == np.iinfo(dtype).max


@pytest.mark.parametrize("pair,token_size,data_len,words", [
    ((-2, 4), 2, 100, "negative offset"),
    ((0, -4), 2, 100, "negative length"),
    ((0, 3), 2, 100, "not a multiple"),
    ((0, 2 * 2**31), 2, 2**40, "longer than"),
    ((0, 8), 2, 4, "past the"),
])
def test_c_pickle_problem_codes_mean_what_the_python_messages_say(tmp_path, pair, token_size, data_len, words):
    path = tmp_path / "index.pickle"
    path.write_bytes(pickle.dumps([pair], protocol=4))
    count, problem, bad = ffi.new("int64_t *"), ffi.new("int32_t *"), ffi.new("int64_t[2]")
    offsets, lengths = ffi.new("int64_t[4]"), ffi.new("int32_t[4]")
    with open(path, "rb") as f:
        rc = lib.mmfs_parse_pickle_pairs(f.fileno(), 0, path.stat().st_size, data_len, token_size,
                                         offsets, lengths, 4, count, problem, bad)
    assert rc == lib.MMFS_E_INDEX_RANGE
    assert words in packed._PROBLEMS[problem[0]]


def test_the_randperm_switch_is_torchs():
    assert lib.MMFS_RANDPERM_SMALL_LIMIT == (2**32 - 1) // 20
