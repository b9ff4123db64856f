"""The storage seam and the format registry: every format reads the same over a local
file, over the in-memory source (mem://) and over a source the C core reaches only
through its fetcher; formats are recognised by their content, not their suffix."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from golden_cases import GOLDEN
from mmfs.errors import FormatError, MmfsError
from mmfs.formats import dataset_problem, open_dataset
from mmfs.formats.chunks import iter_array
from mmfs.formats.writer import write_packed
from mmfs.megatron.arrays import ArrayPlacer
from mmfs.megatron.reader import TokenSource
from mmfs.native import ffi, lib
from mmfs.storage import memory
from mmfs.storage.base import StorageError, register_scheme

PBIN_DOCS = [[1, 2, 3], [4], [], [5, 6, 7, 8, 9], [65535, 0]]


class FetchedSource:
    """A backend the C core can only fetch from (neither a file nor memory), as a bucket
    is; counts its reads. `fail` makes every read fail, as an unreachable endpoint."""

    def __init__(self, url: str, data: bytes) -> None:
        self.url, self._data = url, data
        self.size, self.identity = len(data), (len(data), "etag")
        self.reads, self.fail = 0, False

    def read_into(self, offset: int, buffer) -> int:
        if self.fail:
            raise StorageError(f"{self.url}: bytes {offset}..{offset + len(buffer)}: unreachable")
        self.reads += 1
        chunk = self._data[offset : offset + len(buffer)]
        memoryview(buffer).cast("B")[: len(chunk)] = chunk
        return len(chunk)

    def opened(self):
        import contextlib
        return contextlib.nullcontext()


FETCHED: dict[str, FetchedSource] = {}
register_scheme("fetched", lambda url, **_: FETCHED[url] if url in FETCHED else
                (_ for _ in ()).throw(StorageError(f"{url}: no such object")))


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    """{kind: {format: path}} of the same two datasets as files, in memory, fetched."""
    folder = tmp_path_factory.mktemp("storage")
    shutil.copy(GOLDEN / "data" / "u16_multiseq.idx", folder / "multiseq.idx")
    shutil.copy(GOLDEN / "data" / "u16_multiseq.bin", folder / "multiseq.bin")
    write_packed(str(folder / "docs.pbin"), [np.array(d, np.uint16) for d in PBIN_DOCS])
    files = {"indexed": str(folder / "multiseq"), "packed": str(folder / "docs.pbin")}
    kinds = {"file": files}
    for scheme in ("mem", "fetched"):
        paths = {}
        for fmt, path in files.items():
            names = [".idx", ".bin"] if fmt == "indexed" else [""]
            url = f"{scheme}://bucket/{path.rsplit('/', 1)[1]}"
            for suffix in names:
                data = open(path + suffix, "rb").read()
                if scheme == "mem":
                    memory.put(url + suffix, data)
                else:
                    FETCHED[url + suffix] = FetchedSource(url + suffix, data)
            paths[fmt] = url
        kinds[scheme] = paths
    return kinds


def everything(ds) -> dict:
    """What a dataset says, read every way the formats offer."""
    return {
        "counts": (ds.num_sequences, ds.num_documents, ds.dtype, ds.num_tokens),
        "sequences": [ds.get(s).tolist() for s in range(ds.num_sequences)],
        "documents": [list(ds.document_sequences(d)) for d in range(ds.num_documents)],
        "chunks": [(name, start, values.tolist()) for name in ("sequence_lengths", "document_indices")
                   for start, values in iter_array(ds, name, chunk=3)],
    }


@pytest.mark.parametrize("fmt", ["indexed", "packed"])
@pytest.mark.parametrize("kind", ["mem", "fetched"])
def test_every_format_reads_the_same_over_every_source(datasets, fmt, kind):
    assert everything(open_dataset(datasets[kind][fmt])) == everything(open_dataset(datasets["file"][fmt]))


def c_tokens(ds) -> tuple[list[list[int]], list[list[int]]]:
    """Every sequence and document as the C core's view readers read them."""
    placer = ArrayPlacer(0)  # a map limit of 0: local files are read with pread
    source = TokenSource(ds, placer)
    placer.finish()
    out = np.zeros(1 << 12, dtype=ds.dtype)
    buf = ffi.cast("uint8_t *", out.ctypes.data)

    def read(length_fn, tokens_fn, ctx, i):
        n = length_fn(ctx, i)
        assert n >= 0, n
        rc = tokens_fn(ctx, i, 0, n, buf)
        if rc < 0:
            raise OSError(rc)
        return out[:n].tolist()

    seqs = [read(lib.mmfs_sequence_length, lib.mmfs_sequence_tokens, source.c, s)
            for s in range(ds.num_sequences)]
    docs = [read(lib.mmfs_document_length, lib.mmfs_document_tokens, source.documents_c, d)
            for d in range(ds.num_documents)]
    placer.close()
    return seqs, docs


@pytest.mark.parametrize("fmt", ["indexed", "packed"])
def test_the_c_readers_fetch_what_they_pread(datasets, fmt):
    local = c_tokens(open_dataset(datasets["file"][fmt]))
    assert c_tokens(open_dataset(datasets["mem"][fmt])) == local
    fetched = FETCHED[datasets["fetched"][fmt] + (".bin" if fmt == "indexed" else "")]
    before = fetched.reads
    assert c_tokens(open_dataset(datasets["fetched"][fmt])) == local
    assert fetched.reads > before  # the tokens came through the fetcher


def test_a_failed_fetch_is_an_error_not_a_crash(datasets):
    ds = open_dataset(datasets["fetched"]["indexed"])
    placer = ArrayPlacer(0)
    source = TokenSource(ds, placer)
    placer.finish()
    bin_source = FETCHED[datasets["fetched"]["indexed"] + ".bin"]
    bin_source.fail = True
    try:
        out = np.zeros(64, dtype=np.uint16)
        rc = lib.mmfs_sequence_tokens(source.c, 0, 0, int(ds.sequence_lengths[0]),
                                      ffi.cast("uint8_t *", out.ctypes.data))
        assert rc == lib.MMFS_E_IO
    finally:
        bin_source.fail = False


def test_formats_are_recognised_by_content(datasets, tmp_path):
    renamed = tmp_path / "docs.tokens"  # a .pbin without its suffix
    shutil.copy(datasets["file"]["packed"], renamed)
    assert everything(open_dataset(renamed)) == everything(open_dataset(datasets["file"]["packed"]))
    assert dataset_problem(str(renamed)) is None
    idx = datasets["file"]["indexed"] + ".idx"
    assert open_dataset(idx).format_name == "megatron-indexed"
    neither = tmp_path / "notes.txt"
    neither.write_text("hello")
    with pytest.raises(FormatError, match="no format recognises its content"):
        open_dataset(neither)


def test_a_missing_object_is_one_line(datasets):
    with pytest.raises(MmfsError) as err:
        open_dataset("mem://bucket/nothing.pbin")
    assert "mem://bucket/nothing.pbin" in str(err.value) and "\n" not in str(err.value)
