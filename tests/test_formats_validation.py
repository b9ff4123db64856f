"""Corrupt datasets: every rule fails with a FormatError that names the file and the
index or byte offset; nothing leaks a numpy traceback or returns garbage."""

import os
import pickle
import struct
import subprocess
import sys

import numpy as np
import pytest

from format_helpers import document_tokens
from mmfs.errors import FormatError
from mmfs.formats import open_dataset
from mmfs.formats.indexed import IndexedDataset
from mmfs.formats.verify import verify
from mmfs.formats.writer import IndexedDatasetWriter, write_packed

# Sequences of 3, 2, 1 and 4 uint16 tokens; documents [0, 2), [2, 3), [3, 4).
LENGTHS = [3, 2, 1, 4]
N = len(LENGTHS)
OFF_LEN, OFF_PTR, OFF_DOC = 34, 34 + 4 * N, 34 + 12 * N
OFF_MODE = OFF_DOC + 8 * 4


@pytest.fixture
def prefix(tmp_path):
    p = tmp_path / "ds"
    w = IndexedDatasetWriter(f"{p}.bin", dtype=np.uint16, multimodal=True)
    tok = 1
    for i, n in enumerate(LENGTHS):
        w.add_item(np.arange(tok, tok + n), mode=i % 2)
        tok += n
        if i != 0:
            w.end_document()
    w.finalize(f"{p}.idx")
    return str(p)


def patch(path: str, offset: int, fmt: str, value) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(struct.pack(fmt, value))


def truncate(path: str, size: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(size)


def test_fixture_is_valid(prefix):
    report = verify(prefix)
    assert (report.num_sequences, report.num_documents, report.num_tokens) == (4, 3, 10)
    assert report.warnings == []
    assert IndexedDataset(prefix).sequence_modes.tolist() == [0, 1, 0, 1]


# -- caught at open (O(1) checks) -------------------------------------------

OPEN_CASES = {
    "bad magic": (lambda p: patch(p + ".idx", 0, "<9s", b"NOTMMIDX\0"), ["bad magic", "byte 0"]),
    "bad version": (lambda p: patch(p + ".idx", 9, "<Q", 2), ["version 2", "byte 9"]),
    "bad dtype code": (lambda p: patch(p + ".idx", 17, "<B", 12), ["dtype code 12", "byte 17"]),
    "zero document count": (lambda p: patch(p + ".idx", 26, "<Q", 0), ["byte 26"]),
    "truncated header": (lambda p: truncate(p + ".idx", 20), ["shorter than the 34-byte"]),
    "truncated idx": (lambda p: truncate(p + ".idx", OFF_DOC + 5),
                      ["does not match its header", "4 sequences"]),
    "idx size mismatch": (lambda p: patch(p + ".idx", 18, "<Q", 5), ["does not match its header"]),
    "huge sequence count": (lambda p: patch(p + ".idx", 18, "<Q", 2**62),
                            ["does not match its header"]),
    "truncated bin": (lambda p: truncate(p + ".bin", 15), [".bin", "sequence 3", "12..20"]),
    "first pointer negative": (lambda p: patch(p + ".idx", OFF_PTR, "<q", -2), ["sequence 0"]),
    "last length negative": (lambda p: patch(p + ".idx", OFF_LEN + 12, "<i", -1),
                             ["sequence_lengths[3]", f"byte {OFF_LEN + 12}"]),
    "document_indices[0] not 0": (lambda p: patch(p + ".idx", OFF_DOC, "<q", 1),
                                  ["document_indices[0]", f"byte {OFF_DOC}"]),
    "document_indices end not N": (lambda p: patch(p + ".idx", OFF_DOC + 24, "<q", 3),
                                   ["document_indices[3]", f"byte {OFF_DOC + 24}", "count 4"]),
}


@pytest.mark.parametrize("case", sorted(OPEN_CASES))
def test_open_rejects(prefix, case):
    corrupt, expected = OPEN_CASES[case]
    corrupt(prefix)
    with pytest.raises(FormatError) as err:
        open_dataset(prefix)
    message = str(err.value)
    assert prefix in message and "\n" not in message
    for part in expected:
        assert part in message
    with pytest.raises(FormatError):  # verify opens first, so it fails the same way
        verify(prefix)


def test_missing_bin(prefix):
    os.remove(prefix + ".bin")
    with pytest.raises(FormatError, match=r"ds\.bin: file not found"):
        open_dataset(prefix + ".idx")


# -- caught by verify (O(N) checks) ------------------------------------------

VERIFY_CASES = {
    "negative length": (lambda p: patch(p + ".idx", OFF_LEN + 4, "<i", -3),
                        f"sequence_lengths[1] (byte {OFF_LEN + 4}) is -3, negative"),
    "pointer out of range": (lambda p: patch(p + ".idx", OFF_PTR + 8, "<q", 10**9),
                             f"sequence_pointers[1] (byte {OFF_PTR + 8}) is 1000000000, outside"),
    "negative pointer": (lambda p: patch(p + ".idx", OFF_PTR + 16, "<q", -4),
                         f"sequence_pointers[2] (byte {OFF_PTR + 16}) is -4, outside"),
    "sequence past the end": (lambda p: patch(p + ".idx", OFF_LEN + 8, "<i", 9),
                              (f"sequence_pointers[2] (byte {OFF_PTR + 16}) with length 9 "
                               "ends at byte 28, past the end")),
    "pointers not back to back": (lambda p: patch(p + ".idx", OFF_PTR + 8, "<q", 4),
                                  (f"sequence_pointers[1] (byte {OFF_PTR + 8}) is 4 but the "
                                   "previous sequence ends at byte 6")),
    "lengths disagree with pointers": (lambda p: patch(p + ".idx", OFF_LEN, "<i", 2),
                                       "sequence_pointers[1]"),
    "document indices decrease": (lambda p: patch(p + ".idx", OFF_DOC + 16, "<q", 1),
                                  (f"document_indices[2] (byte {OFF_DOC + 16}) is 1, less "
                                   "than the entry before it (2)")),
    "document index past N": (lambda p: (patch(p + ".idx", OFF_DOC + 8, "<q", 7),
                                         patch(p + ".idx", OFF_DOC + 16, "<q", 9)),
                              (f"document_indices[1] (byte {OFF_DOC + 8}) is 7, past the "
                               "sequence count 4")),
}


def test_verify_accepts_negative_modes(prefix):
    """Modes are int8 and Megatron's writer and reader take any value, negative too."""
    patch(prefix + ".idx", OFF_MODE + 2, "<b", -1)
    verify(prefix)
    assert IndexedDataset(prefix).sequence_modes.tolist() == [0, 1, -1, 1]


@pytest.mark.parametrize("chunk", [1, 2, 1 << 20])
@pytest.mark.parametrize("case", sorted(VERIFY_CASES))
def test_verify_rejects(prefix, case, chunk):
    corrupt, expected = VERIFY_CASES[case]
    corrupt(prefix)
    open_dataset(prefix)  # opening's spot checks do not see it...
    with pytest.raises(FormatError) as err:  # ...verify does, whatever the chunking
        verify(prefix, chunk=chunk)
    message = str(err.value)
    assert message.startswith(prefix + ".idx: ") and "\n" not in message
    assert expected in message


def test_trailing_bytes_are_a_warning(prefix):
    with open(prefix + ".bin", "ab") as f:
        f.write(b"\0" * 6)
    report = verify(prefix, chunk=3)
    assert len(report.warnings) == 1 and "last 6 bytes (from byte 20)" in report.warnings[0]


def test_pbin_gaps_are_a_warning_not_an_error(tmp_path):
    path = tmp_path / "g.pbin"
    write_packed(path, [[1, 2], [3, 4, 5]], 2)
    raw = bytearray(path.read_bytes())
    index_at = 12 + 10
    raw[index_at:] = pickle.dumps([(0, 4), (2, 4)])  # overlapping documents
    path.write_bytes(bytes(raw))
    report = verify(str(path))
    assert report.num_tokens == 4
    assert any("1 documents do not start" in w for w in report.warnings)
    assert any("bytes 18..22 belong to no document" in w for w in report.warnings)


# -- reads of unverified corrupt files ---------------------------------------

def test_reads_never_leave_the_file(prefix):
    patch(prefix + ".idx", OFF_PTR + 8, "<q", 10**12)
    patch(prefix + ".idx", OFF_LEN + 8, "<i", -5)
    patch(prefix + ".idx", OFF_DOC + 16, "<q", 99)
    ds = open_dataset(prefix)
    with pytest.raises(FormatError, match=r"sequence 1 points to bytes 1000000000000\.\."):
        ds.get(1)
    with pytest.raises(FormatError, match="sequence 2 has negative length -5"):
        ds.get(2)
    with pytest.raises(FormatError, match="document 1 spans sequences 2..99"):
        document_tokens(ds, 1)
    with pytest.raises(IndexError):
        ds.get(0, 2, 5)
    with pytest.raises(IndexError):
        ds.get(4)
    with pytest.raises(IndexError):
        ds.document_sequences(3)


def test_verify_cli_prints_one_line_and_exits_2(prefix):
    patch(prefix + ".idx", OFF_DOC + 16, "<q", 1)
    run = subprocess.run([sys.executable, "-m", "mmfs.cli", "verify", prefix],
                         capture_output=True, text=True, check=False)
    assert run.returncode == 2
    assert run.stdout == ""
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in run.stderr
    assert lines[0].startswith("mmfs: error: ") and "document_indices[2]" in lines[0]


def test_verify_cli_ok(prefix):
    run = subprocess.run([sys.executable, "-m", "mmfs.cli", "verify", prefix + ".bin"],
                         capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("OK: ") and "4 sequences, 3 documents, 10 tokens" in run.stdout
