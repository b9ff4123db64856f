"""Write -> read round trips over random datasets, every MMIDIDX dtype and .pbin."""

import tempfile
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from format_helpers import document_tokens
from mmfs.formats import open_dataset
from mmfs.formats.dtypes import CODE_TO_DTYPE
from mmfs.formats.report import describe
from mmfs.formats.verify import verify
from mmfs.formats.writer import IndexedDatasetWriter, write_packed

SETTINGS = settings(max_examples=30, deadline=None)


def tokens_of(dtype: np.dtype) -> st.SearchStrategy:
    if dtype.kind == "f":
        return st.floats(width=dtype.itemsize * 8, allow_nan=True)
    info = np.iinfo(dtype)
    return st.integers(int(info.min), int(info.max))


@st.composite
def datasets(draw):
    code = draw(st.integers(1, 8))
    dtype = CODE_TO_DTYPE[code]
    sequence = st.lists(tokens_of(dtype), max_size=6)
    # documents of 0..5 sequences, sequences of 0..6 tokens
    docs = draw(st.lists(st.lists(sequence, max_size=5), max_size=8))
    multimodal = draw(st.booleans())
    modes = [[draw(st.integers(0, 127)) for _ in doc] for doc in docs]
    by_document = draw(st.lists(st.booleans(), min_size=len(docs), max_size=len(docs)))
    return dtype, docs, multimodal, modes, by_document


def write(prefix: Path, dtype, docs, multimodal, modes, by_document) -> None:
    w = IndexedDatasetWriter(f"{prefix}.bin", dtype=dtype, multimodal=multimodal)
    for doc, doc_modes, whole in zip(docs, modes, by_document, strict=True):
        if whole:
            flat = [t for seq in doc for t in seq]
            w.add_document(np.array(flat, dtype=dtype), [len(s) for s in doc],
                           modes=doc_modes if multimodal else None)
        else:
            for seq, mode in zip(doc, doc_modes, strict=True):
                w.add_item(np.array(seq, dtype=dtype), mode=mode)
            w.end_document()
    w.finalize(f"{prefix}.idx")


@SETTINGS
@given(datasets())
def test_indexed_round_trip(case):
    dtype, docs, multimodal, modes, by_document = case
    with tempfile.TemporaryDirectory() as tmp:
        prefix = Path(tmp) / "d"
        write(prefix, dtype, docs, multimodal, modes, by_document)
        ds = open_dataset(str(prefix))
        seqs = [np.array(s, dtype=dtype) for doc in docs for s in doc]
        # an index of no sequences cannot tell whether it is multimodal
        assert ds.dtype == dtype and ds.multimodal == (multimodal and bool(seqs))
        assert ds.num_sequences == len(seqs) and ds.num_documents == len(docs)
        assert ds.num_tokens == sum(s.size for s in seqs)
        assert ds.sequence_lengths.tolist() == [s.size for s in seqs]
        expected_docs = np.cumsum([0] + [len(d) for d in docs]).tolist()
        assert ds.document_indices.tolist() == expected_docs
        for i, s in enumerate(seqs):
            np.testing.assert_array_equal(ds.get(i), s)
        for d, doc in enumerate(docs):
            want = np.concatenate([np.array(s, dtype=dtype) for s in doc] or
                                  [np.zeros(0, dtype)])
            np.testing.assert_array_equal(document_tokens(ds, d), want)
        if ds.multimodal:
            assert ds.sequence_modes.tolist() == [m for dm in modes for m in dm]
        else:
            assert ds.sequence_modes is None
        report = verify(str(prefix), chunk=3)
        assert report.warnings == [] and report.num_tokens == ds.num_tokens
        info = describe(str(prefix))
        assert info["num_tokens"] == ds.num_tokens
        if docs:
            sizes = [sum(len(s) for s in doc) for doc in docs]
            assert info["document_lengths"]["max"] == max(sizes)
            assert info["document_lengths"]["min"] == min(sizes)


@SETTINGS
@given(st.sampled_from([1, 2, 4]), st.data())
def test_packed_round_trip(token_size, data):
    dtype = np.dtype({1: np.uint8, 2: np.uint16, 4: np.uint32}[token_size])
    docs = data.draw(st.lists(st.lists(tokens_of(dtype), max_size=8), max_size=10))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "p.pbin"
        write_packed(path, docs, token_size)
        ds = open_dataset(str(path))
        assert ds.dtype == dtype and ds.num_documents == ds.num_sequences == len(docs)
        assert ds.sequence_lengths.tolist() == [len(d) for d in docs]
        for i, doc in enumerate(docs):
            assert document_tokens(ds, i).tolist() == doc
            assert ds.document_sequences(i) == range(i, i + 1)
        assert verify(str(path), chunk=2).warnings == []
