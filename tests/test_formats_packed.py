"""Modalities .pbin reader: layout, the IndexedDataset interface, hostile files."""

import pickle
import struct

import numpy as np
import pytest

from format_helpers import document_tokens
from mmfs.errors import FormatError
from mmfs.formats import open_dataset
from mmfs.formats.packed import PackedDataset
from mmfs.formats.writer import write_packed

DOCS = [[5, 6, 7], [], [8], [9, 10, 11, 12]]


@pytest.mark.parametrize("token_size,dtype,code", [(1, np.uint8, 1), (2, np.uint16, 8),
                                                   (4, np.uint32, 9)])
def test_reads_documents_with_indexed_interface(tmp_path, token_size, dtype, code):
    path = tmp_path / "d.pbin"
    write_packed(path, DOCS, token_size)
    ds = open_dataset(str(path))
    assert isinstance(ds, PackedDataset)
    assert ds.format_name == "modalities-packed"
    assert ds.path_prefix == ds.idx_path == ds.bin_path == str(path)
    assert ds.dtype == dtype and ds.dtype_code == code
    assert len(ds) == ds.num_sequences == ds.num_documents == 4
    assert ds.num_tokens == 8 and not ds.multimodal and ds.sequence_modes is None
    assert ds.bin_size == path.stat().st_size
    assert ds.sequence_lengths.dtype == np.int32 and ds.sequence_lengths.tolist() == [3, 0, 1, 4]
    assert ds.sequence_pointers.dtype == np.int64
    assert ds.sequence_pointers.tolist() == [12 + token_size * p for p in (0, 3, 3, 4)]
    assert ds.document_indices.tolist() == [0, 1, 2, 3, 4]
    for i, doc in enumerate(DOCS):
        assert ds.get(i).tolist() == doc
        assert ds[i].tolist() == doc
        assert document_tokens(ds, i).tolist() == doc
        assert ds.document_sequences(i) == range(i, i + 1)
    assert ds.get(3, 1, 2).tolist() == [10, 11]
    assert ds[-1].tolist() == DOCS[-1]
    # the raw bytes: absolute pointers into the whole file
    start = int(ds.sequence_pointers[3])
    assert ds.data[start : start + 4 * token_size].view(dtype).tolist() == DOCS[3]


def test_layout_matches_modalities(tmp_path):
    path = tmp_path / "d.pbin"
    write_packed(path, [[1, 2], [3]], 2)
    raw = path.read_bytes()
    data_len, token_size = struct.unpack("<QI", raw[:12])
    assert (data_len, token_size) == (6, 2)
    assert np.frombuffer(raw[12:18], "<u2").tolist() == [1, 2, 3]
    assert pickle.loads(raw[18:]) == [(0, 4), (4, 2)]


def test_empty_file_of_no_documents(tmp_path):
    path = tmp_path / "e.pbin"
    write_packed(path, [], 2)
    ds = PackedDataset(path)
    assert len(ds) == 0 and ds.num_tokens == 0 and ds.document_indices.tolist() == [0]


def pbin(tmp_path, index_obj=None, data=b"\x01\x00\x02\x00", token_size=2, data_len=None,
         raw_index=None):
    """A hand-made .pbin; any part can be wrong."""
    path = tmp_path / "bad.pbin"
    if raw_index is None:
        raw_index = pickle.dumps([(0, len(data))] if index_obj is None else index_obj)
    header = struct.pack("<QI", len(data) if data_len is None else data_len, token_size)
    path.write_bytes(header + data + raw_index)
    return path


class Boom:
    def __reduce__(self):
        return (print, ("this must never run",))


@pytest.mark.parametrize("make,message", [
    (lambda t: t / "missing.pbin", "file not found"),
    (lambda t: (t / "short.pbin").write_bytes(b"\x00" * 5) and t / "short.pbin",
     "shorter than the 12-byte"),
    (lambda t: pbin(t, token_size=3), "token size 3 at byte 8"),
    (lambda t: pbin(t, data_len=10**6), "past the end of the"),
    (lambda t: pbin(t, raw_index=b""), "no index after the data section"),
    (lambda t: pbin(t, raw_index=b"garbage"), "cannot be read"),
    (lambda t: pbin(t, raw_index=pickle.dumps([(0, 4)])[:-3]), "cannot be read"),
    (lambda t: pbin(t, raw_index=pickle.dumps([Boom()])), "refused to load builtins.print"),
    (lambda t: pbin(t, raw_index=pickle.dumps(np.array([[0, 4]]))), "refused to load"),
    (lambda t: pbin(t, {"a": 1}), "is a dict"),
    (lambda t: pbin(t, [(0, 4), (1, 2, 3)]), "entry 1 is (1, 2, 3)"),
    (lambda t: pbin(t, [(0, 4), (0.5, 2)]), "entry 1 is (0.5, 2)"),
    (lambda t: pbin(t, [(0, 4), ("0", 2)]), "entry 1"),
    (lambda t: pbin(t, [(0, 2**70)]), "entry 0"),
    (lambda t: pbin(t, [(0, 4), (-2, 2)]), "entry 1 (offset -2, length 2) has a negative offset"),
    (lambda t: pbin(t, [(0, -2)]), "negative length"),
    (lambda t: pbin(t, [(0, 3)]), "not a multiple of 2 bytes"),
    (lambda t: pbin(t, [(0, 2), (2, 4)]), "entry 1 (offset 2, length 4) ends past the 4-byte"),
    (lambda t: pbin(t, [(2**63 - 1, 2)]), "ends past"),
])
def test_corrupt_pbin_is_a_format_error(tmp_path, capsys, make, message):
    path = make(tmp_path)
    with pytest.raises(FormatError) as err:
        PackedDataset(path)
    assert str(path) in str(err.value)
    assert message in str(err.value)
    assert "must never run" not in capsys.readouterr().out


def test_self_referencing_pickle_is_refused(tmp_path):
    loop = []
    loop.append(loop)
    loop.append(loop)
    with pytest.raises(FormatError, match="entry 0"):
        PackedDataset(pbin(tmp_path, raw_index=pickle.dumps([loop])))


def test_too_long_document_for_int32_lengths(tmp_path):
    # 2**31 one-byte tokens is too long for an int32 length (the data section is
    # declared that big but the file is sparse, so the test stays small)
    path = tmp_path / "big.pbin"
    n = 2**31
    with open(path, "wb") as f:
        f.write(struct.pack("<QI", n, 1))
        f.seek(12 + n)
        f.write(pickle.dumps([(0, n)]))
    with pytest.raises(FormatError, match="longer than 2\\*\\*31 - 1 tokens"):
        PackedDataset(path)
