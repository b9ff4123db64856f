"""A .pbin's index: the streaming reader of the pickle against pickle itself, the
fallback for pickles it does not know, and the parsed index kept in the cache."""

import os
import pickle
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmfs.formats.packed import CACHE_FROM, PackedDataset
from mmfs.megatron.arrays import file_region
from mmfs.native import ffi, lib


def parse(path, at, data_len, token_size):
    """The C reader on file bytes [at, end): (rc, offsets, byte lengths)."""
    size = os.path.getsize(path)
    cap = (size - at) // 5 + 1
    offsets, lengths = np.empty(cap, np.int64), np.empty(cap, np.int32)
    count, problem, bad = ffi.new("int64_t *"), ffi.new("int32_t *"), ffi.new("int64_t[2]")
    with open(path, "rb") as f:
        rc = lib.mmfs_parse_pickle_pairs(f.fileno(), at, size, data_len, token_size,
                                         ffi.cast("int64_t *", offsets.ctypes.data),
                                         ffi.cast("int32_t *", lengths.ctypes.data), cap, count,
                                         problem, bad)
    n = count[0] if rc == lib.MMFS_OK else 0
    return rc, offsets[:n], lengths[:n].astype(np.int64) * token_size


def write_pbin(path, pairs, data_len, protocol=4, token_size=2, raw=None):
    with open(path, "wb") as f:
        f.write(struct.pack("<QI", data_len, token_size))
        f.seek(12 + data_len)
        f.write(raw if raw is not None else pickle.dumps(pairs, protocol=protocol))


pair_lists = st.lists(st.tuples(st.integers(0, 2**40), st.integers(0, 2**20)), max_size=2600)


@settings(max_examples=40, deadline=None)
@given(pairs=pair_lists, protocol=st.integers(1, 5), as_lists=st.booleans())
def test_streaming_reader_reads_what_pickle_reads(tmp_path_factory, pairs, protocol, as_lists):
    pairs = [(o, 2 * (n // 2)) for o, n in pairs]
    data_len = max([o + n for o, n in pairs], default=0)
    obj = [list(p) for p in pairs] if as_lists else pairs
    path = tmp_path_factory.mktemp("p") / "x.pbin"
    write_pbin(path, obj, data_len, protocol)
    rc, offsets, lengths = parse(path, 12 + data_len, data_len, 2)
    if as_lists:  # lists are not tuples: refused, left to the Unpickler
        assert rc == lib.MMFS_E_UNSUPPORTED or not pairs
        return
    if protocol == 1 and any(v >= 2**31 for p in pairs for v in p):
        assert rc == lib.MMFS_E_UNSUPPORTED  # text LONG opcodes: left to the Unpickler
    else:
        assert rc == lib.MMFS_OK
        assert offsets.tolist() == [o for o, _ in pairs]
        assert lengths.tolist() == [n for _, n in pairs]
    ds = PackedDataset(path)
    assert ds.sequence_pointers.tolist() == [12 + o for o, _ in pairs]
    assert ds.sequence_lengths.tolist() == [n // 2 for _, n in pairs]


def test_a_pickle_it_does_not_know_goes_to_the_unpickler(tmp_path):
    same = (0, 4)
    path = tmp_path / "memo.pbin"
    write_pbin(path, [same, same, (4, 2)], 6)  # one tuple twice: a memo lookup (BINGET)
    assert parse(path, 18, 6, 2)[0] == lib.MMFS_E_UNSUPPORTED
    ds = PackedDataset(path)
    assert ds.sequence_pointers.tolist() == [12, 12, 16] and ds.sequence_lengths.tolist() == [2, 2, 1]


def test_the_parsed_index_is_kept_by_size_and_mtime(tmp_path):
    n = CACHE_FROM
    rng = np.random.RandomState(0)
    lengths = rng.randint(1, 50, n) * 2
    offsets = np.concatenate(([0], np.cumsum(lengths[:-1])))
    pairs = list(zip(offsets.tolist(), lengths.tolist()))
    path = tmp_path / "big.pbin"
    write_pbin(path, pairs, int(lengths.sum()))
    first = PackedDataset(path)
    folder = tmp_path / "big" / "cache" / "PackedDataset_index"
    kept = sorted(os.listdir(folder))
    assert len(kept) == 2 and all(str(os.path.getsize(path)) in k for k in kept)
    assert file_region(first.sequence_lengths) is None  # parsed, in memory
    second = PackedDataset(path)
    assert file_region(second.sequence_lengths) is not None  # mapped from the cache
    assert np.array_equal(second.sequence_lengths, first.sequence_lengths)
    assert np.array_equal(second.sequence_pointers, first.sequence_pointers)
    st_ = os.stat(path)
    os.utime(path, ns=(st_.st_atime_ns, st_.st_mtime_ns + 10**9))  # a changed file
    third = PackedDataset(path)
    assert file_region(third.sequence_lengths) is None
    assert sorted(os.listdir(folder)) != kept and len(os.listdir(folder)) == 2


@pytest.mark.parametrize("pairs,message", [
    ([(0, 4), (-2, 2)], "entry 1 (offset -2, length 2) has a negative offset"),
    ([(0, 3)], "not a multiple of 2 bytes"),
    ([(0, 2), (2, 4)], "entry 1 (offset 2, length 4) ends past the 4-byte"),
])
def test_bad_entries_found_by_the_streaming_reader_are_named(tmp_path, pairs, message):
    path = tmp_path / "bad.pbin"
    write_pbin(path, pairs, 4)
    assert parse(path, 16, 4, 2)[0] == lib.MMFS_E_INDEX_RANGE
    from mmfs.errors import FormatError

    with pytest.raises(FormatError, match=message.replace("(", r"\(").replace(")", r"\)")):
        PackedDataset(path)
