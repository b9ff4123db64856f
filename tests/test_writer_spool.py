"""The writer's index arrays spill to a temporary file past SPOOL_LIMIT values: the
files it writes are the same bytes either way."""

import numpy as np
import pytest

from mmfs.formats import writer as writer_module
from mmfs.formats.indexed import IndexedDataset
from mmfs.formats.writer import IndexedDatasetWriter


def write(prefix, seed: int, multimodal: bool) -> tuple[bytes, bytes]:
    rng = np.random.default_rng(seed)
    w = IndexedDatasetWriter(f"{prefix}.bin", dtype=np.uint16, multimodal=multimodal)
    for _ in range(40):
        how = rng.integers(3)
        if how == 0:
            w.add_item(rng.integers(0, 500, rng.integers(0, 9)), mode=int(rng.integers(-3, 3)))
            w.end_document()
        elif how == 1:
            lens = rng.integers(0, 6, rng.integers(0, 4))
            w.add_document(rng.integers(0, 500, int(lens.sum())), lens.tolist())
        else:
            sizes = rng.integers(0, 3, rng.integers(0, 5))
            lens = rng.integers(0, 6, int(sizes.sum()))
            w.add_documents(rng.integers(0, 500, int(lens.sum())), lens, sizes)
    w.finalize(f"{prefix}.idx")
    return open(f"{prefix}.bin", "rb").read(), open(f"{prefix}.idx", "rb").read()


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("multimodal", [False, True])
def test_spilled_index_is_byte_identical(tmp_path, monkeypatch, seed, multimodal):
    in_memory = write(tmp_path / "mem", seed, multimodal)
    monkeypatch.setattr(writer_module, "SPOOL_LIMIT", 3)
    spilled = write(tmp_path / "spill", seed, multimodal)
    assert spilled == in_memory
    ds = IndexedDataset(tmp_path / "spill")
    assert ds.num_sequences == len(ds.sequence_lengths) and ds.document_indices[0] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mem.bin", "mem.idx", "spill.bin", "spill.idx"]
