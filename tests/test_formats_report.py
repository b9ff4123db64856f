"""`mmfs info`: figures against numpy on the golden data, CLI text/JSON and errors."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from format_helpers import document_tokens
from mmfs.formats.chunks import iter_document_lengths
from mmfs.formats.indexed import IndexedDataset
from mmfs.formats.report import ValueCounts, describe
from mmfs.formats.writer import IndexedDatasetWriter, write_packed

GOLDEN = Path(__file__).parent / "golden" / "data"
DATASETS = json.loads((GOLDEN / "datasets.json").read_text())


def numpy_stats(values: np.ndarray) -> dict:
    return {"count": values.size, "min": int(values.min()), "median": float(np.median(values)),
            "mean": float(values.mean()), "p99": float(np.percentile(values, 99)),
            "max": int(values.max())}


def assert_stats(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for k, value in want.items():
        assert got[k] == pytest.approx(value, rel=1e-12), k


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_describe_matches_numpy_and_datasets_json(name):
    meta = DATASETS[name]
    info = describe(str(GOLDEN / name))
    ds = IndexedDataset(GOLDEN / name)
    assert info["format"] == "megatron-indexed" and info["dtype"] == meta["dtype"]
    assert info["num_sequences"] == meta["num_sequences"]
    assert info["num_documents"] == meta["num_documents"]
    assert info["num_tokens"] == meta["num_tokens"]
    assert info["multimodal"] is False
    assert [f["bytes"] for f in info["files"]] == [ds.idx_size, ds.bin_size]
    lengths = np.asarray(ds.sequence_lengths)
    assert_stats(info["sequence_lengths"], numpy_stats(lengths))
    assert info["sequence_lengths"]["median"] == meta["median_len"]
    docs = np.array([document_tokens(ds, d).size for d in range(ds.num_documents)])
    assert_stats(info["document_lengths"], numpy_stats(docs))


@pytest.mark.parametrize("chunk_values", [
    [np.array([5, 1, 1, 9])],
    [np.array([0]), np.array([], dtype=np.int64), np.array([2**40, 3, 2**40 + 1, 7])],
    [np.arange(1000) % 17, np.full(3, 2**33), np.arange(5) * 2**21],
])
def test_value_counts_is_exact(chunk_values):
    vc = ValueCounts()
    for c in chunk_values:
        vc.add(c)
    assert_stats(vc.stats(), numpy_stats(np.concatenate(chunk_values)))


def test_value_counts_empty():
    assert ValueCounts().stats()["median"] is None


@pytest.mark.parametrize("chunk", [1, 2, 7, 1 << 20])
def test_document_lengths_streamed_across_chunks(chunk):
    # small chunks force the side-by-side walk over many chunk edges
    ds = IndexedDataset(GOLDEN / "u16_multiseq")
    got = np.concatenate(list(iter_document_lengths(ds, chunk=chunk)))
    want = [document_tokens(ds, d).size for d in range(ds.num_documents)]
    assert got.tolist() == want


@pytest.mark.parametrize("chunk", [1, 2, 3, 1 << 20])
def test_document_lengths_with_empty_documents(tmp_path, chunk):
    w = IndexedDatasetWriter(tmp_path / "e.bin", dtype=np.uint8)
    w.end_document()  # empty documents first, in the middle and last
    w.add_document([1, 2, 3], [2, 1])
    w.end_document()
    w.end_document()
    w.add_item([4])
    w.add_item([])
    w.end_document()
    w.end_document()
    w.finalize(tmp_path / "e.idx")
    ds = IndexedDataset(tmp_path / "e")
    got = np.concatenate(list(iter_document_lengths(ds, chunk=chunk)))
    assert got.tolist() == [0, 3, 0, 0, 1, 0]
    assert describe(str(tmp_path / "e"))["document_lengths"]["max"] == 3


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mmfs.cli", *args], capture_output=True,
                          text=True, check=False)


def test_info_cli_text():
    run = run_cli("info", str(GOLDEN / "u16_multiseq"))
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert "megatron-indexed" in out and "uint16 (code 8)" in out
    assert "1,833" in out and "450" in out and "112,627" in out and "multimodal  no" in out
    assert "lengths (tokens)" in out and "median" in out and "p99" in out


def test_info_cli_json_pbin(tmp_path):
    path = tmp_path / "d.pbin"
    write_packed(path, [[1, 2, 3], [4], []], 4)
    run = run_cli("info", "--json", str(path))
    assert run.returncode == 0, run.stderr
    info = json.loads(run.stdout)
    assert info["format"] == "modalities-packed" and info["dtype"] == "uint32"
    assert info["dtype_code"] == 9
    assert (info["num_sequences"], info["num_documents"], info["num_tokens"]) == (3, 3, 4)
    assert info["files"] == [{"path": str(path), "bytes": path.stat().st_size}]
    assert info["document_lengths"]["max"] == 3 and info["document_lengths"]["min"] == 0


@pytest.mark.parametrize("target", ["does/not/exist", "corrupt"])
def test_info_cli_error_is_one_line_exit_2(tmp_path, target):
    if target == "corrupt":
        (tmp_path / "c.idx").write_bytes(b"MMIDIDX\x00\x00" + b"\x01" + b"\x00" * 30)
        (tmp_path / "c.bin").write_bytes(b"")
        target = str(tmp_path / "c")
    run = run_cli("info", target)
    assert run.returncode == 2
    assert run.stdout == "" and "Traceback" not in run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mmfs: error: ") and target in lines[0]
