"""The writer against megatron-core's own files: same input, same bytes."""

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from format_helpers import document_tokens
from mmfs.formats.dtypes import optimal_dtype
from mmfs.formats.indexed import IndexedDataset
from mmfs.formats.writer import IndexedDatasetWriter

GOLDEN = Path(__file__).parent / "golden" / "data"
DATASETS = json.loads((GOLDEN / "datasets.json").read_text())


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def rewrite(ds: IndexedDataset, writer: IndexedDatasetWriter, by_document: bool) -> None:
    """Feed every document of ds to writer, as Megatron's preprocessing would."""
    for d in range(ds.num_documents):
        seqs = ds.document_sequences(d)
        if by_document:
            writer.add_document(document_tokens(ds, d), [int(ds.sequence_lengths[s]) for s in seqs])
        else:
            for s in seqs:
                writer.add_item(ds.get(s))
            writer.end_document()


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_rewrite_is_byte_identical(name, tmp_path):
    meta = DATASETS[name]
    ds = IndexedDataset(GOLDEN / name)
    assert ds.dtype.name == meta["dtype"]
    out = tmp_path / name
    writer = IndexedDatasetWriter(f"{out}.bin", dtype=ds.dtype)
    rewrite(ds, writer, by_document=not meta["document_indices_is_arange"])
    writer.finalize(f"{out}.idx")
    assert sha256(Path(f"{out}.bin")) == meta["bin_sha256"]
    assert sha256(Path(f"{out}.idx")) == meta["idx_sha256"]


def test_multiseq_item_by_item_is_byte_identical(tmp_path):
    # add_item + end_document and add_document must give the same file.
    ds = IndexedDataset(GOLDEN / "u16_multiseq")
    writer = IndexedDatasetWriter(tmp_path / "m.bin", dtype=np.uint16)
    rewrite(ds, writer, by_document=False)
    writer.finalize(tmp_path / "m.idx")
    assert sha256(tmp_path / "m.idx") == DATASETS["u16_multiseq"]["idx_sha256"]


def test_multimodal_modes_round_trip(tmp_path):
    w = IndexedDatasetWriter(tmp_path / "mm.bin", dtype=np.uint8, multimodal=True)
    w.add_item([1, 2], mode=3)
    w.add_item([4])  # mode defaults to 0
    w.end_document()
    w.add_document([5, 6, 7], [1, 2], modes=[1, 2])
    w.add_document([8], [1])  # modes default to 0 per sequence
    w.finalize(tmp_path / "mm.idx")
    ds = IndexedDataset(tmp_path / "mm")
    assert ds.multimodal
    assert ds.sequence_modes.tolist() == [3, 0, 1, 2, 0]
    assert ds.document_indices.tolist() == [0, 2, 4, 5]
    assert document_tokens(ds, 1).tolist() == [5, 6, 7]


def test_writer_refuses_what_megatron_would_corrupt(tmp_path):
    w = IndexedDatasetWriter(tmp_path / "w.bin", dtype=np.uint16)
    with pytest.raises(ValueError, match="do not fit uint16"):
        w.add_item([70000])
    with pytest.raises(ValueError, match="fit"):
        w.add_item([1.5])
    with pytest.raises(ValueError, match="add up"):
        w.add_document([1, 2, 3], [1, 1])
    with pytest.raises(ValueError, match="lengths"):
        w.add_document([1, 2], [3, -1])
    w.add_item([1])
    with pytest.raises(ValueError, match="end_document"):
        w.finalize(tmp_path / "w.idx")
    with pytest.raises(ValueError, match="MMIDIDX code"):
        IndexedDatasetWriter(tmp_path / "u.bin", dtype=np.uint32)


def test_optimal_dtype_threshold():
    assert optimal_dtype(65499) == np.uint16
    assert optimal_dtype(65500) == np.int32
    assert optimal_dtype(None) == np.int32
