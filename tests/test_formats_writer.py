"""The writer against megatron-core's own files: same input, same bytes."""

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from mmfs.errors import FormatError
from mmfs.formats.dtypes import optimal_dtype
from mmfs.formats.indexed import IndexedDataset
from mmfs.formats.writer import IndexedDatasetBuilder, IndexedDatasetWriter

GOLDEN = Path(__file__).parent / "golden" / "data"
DATASETS = json.loads((GOLDEN / "datasets.json").read_text())


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def rewrite(ds: IndexedDataset, writer: IndexedDatasetWriter, by_document: bool) -> None:
    """Feed every document of ds to writer, as Megatron's preprocessing would."""
    for d in range(ds.num_documents):
        seqs = ds.document_sequences(d)
        if by_document:
            writer.add_document(ds.get_document(d), [int(ds.sequence_lengths[s]) for s in seqs])
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


def test_add_index_merges_like_writing_both(tmp_path):
    parts = [IndexedDataset(GOLDEN / n) for n in ("u16_multiseq", "u16_small")]
    with IndexedDatasetBuilder(tmp_path / "merged.bin", dtype=np.uint16) as merged:
        merged.add_item([1, 2, 3])
        merged.end_document()
        for p in parts:
            merged.add_index(p.path_prefix)
        merged.finalize(tmp_path / "merged.idx")
    direct = IndexedDatasetWriter(tmp_path / "direct.bin", dtype=np.uint16)
    direct.add_item([1, 2, 3])
    direct.end_document()
    for p in parts:
        rewrite(p, direct, by_document=True)
    direct.finalize(tmp_path / "direct.idx")
    for ext in ("bin", "idx"):
        assert sha256(tmp_path / f"merged.{ext}") == sha256(tmp_path / f"direct.{ext}")
    m = IndexedDataset(tmp_path / "merged")
    assert m.num_documents == 1 + sum(p.num_documents for p in parts)
    np.testing.assert_array_equal(m.get_document(1 + 450), parts[1].get_document(0))


def test_add_index_rejects_other_dtype(tmp_path):
    with (IndexedDatasetWriter(tmp_path / "x.bin", dtype=np.int32) as w,
          pytest.raises(FormatError, match="dtype")):
        w.add_index(str(GOLDEN / "u16_small"))


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
    assert ds.get_document(1).tolist() == [5, 6, 7]


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
