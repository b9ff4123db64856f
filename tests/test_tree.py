"""The mount's tree in-process (no FUSE): names, lookup, attributes, listing
with offsets, byte ranges, xattrs and mmfs.json, on the public golden cases."""

from __future__ import annotations

import json
import stat

import numpy as np
import pytest

from format_helpers import document_tokens
from golden_cases import case_names, expected_samples, write_case_config
from mmfs.megatron import open_corpus
from mmfs.mount.contract import DOCUMENTS, SEQUENCES, XATTR_DATASET, XATTR_PIECES, dataset_dir, name_width
from mmfs.mount.report_file import BEING_MADE
from mmfs.mount.tree import (
    DIR_MODE,
    FILE_MODE,
    LINK_MODE,
    Blob,
    Dir,
    Generated,
    Link,
    Tree,
)


@pytest.fixture(scope="module", params=case_names())
def tree(request, tmp_path_factory) -> Tree:
    folder = tmp_path_factory.mktemp(request.param)
    corpus = open_corpus(str(write_case_config(request.param, folder)), progress=False)
    t = Tree(corpus)
    t.case = request.param
    return t


def test_name_width():
    assert name_width(0) == 7
    assert name_width(1) == 7
    assert name_width(10_000_000) == 7  # largest id 9,999,999
    assert name_width(10_000_001) == 8
    assert name_width(123_456_789_012) == 12


def test_layout(tree: Tree):
    root = tree.lookup("/")
    assert isinstance(root, Dir)
    names = [n for n, _ in tree.entries(root)]
    assert "mmfs.json" in names and "datasets" in names
    for split in ("train", "valid", "test"):
        present = expected_samples(tree.case, split) is not None and split in tree.splits
        assert (split in names) == present
        if present:
            assert isinstance(tree.lookup(f"/{split}/samples"), Dir)
    if "train" in tree.splits:
        assert tree.readlink(tree.lookup("/samples")) == "train/samples"
    one = len(tree.corpus.datasets) == 1
    assert ("documents" in names) == one and ("sequences" in names) == one
    if one:
        name = tree.corpus.datasets[0].name
        assert tree.readlink(tree.lookup("/documents")) == f"datasets/{name}/documents"
        assert tree.readlink(tree.lookup("/sequences")) == f"datasets/{name}/sequences"


def test_attributes(tree: Tree):
    split, view = next(iter(tree.splits.items()))
    a = tree.stat(f"/{split}/samples/0000000.bin")
    assert a.mode == FILE_MODE and stat.S_IMODE(a.mode) == 0o444
    assert a.size == tree.corpus.sample_tokens * tree.corpus.dtype.itemsize
    assert tree.stat("/datasets").mode == DIR_MODE and stat.S_IMODE(DIR_MODE) == 0o555
    assert tree.stat("/mmfs.json").size == len(tree.lookup("/mmfs.json").data)
    if "train" in tree.splits:
        assert tree.stat("/samples").mode == LINK_MODE
    # mtimes are the datasets' mtimes
    ds = tree.corpus.datasets[0].dataset
    import os

    newest = max(os.stat(ds.idx_path).st_mtime_ns, os.stat(ds.bin_path).st_mtime_ns)
    assert tree.stat(f"/datasets/{tree.corpus.datasets[0].name}/sequences/0000000.bin").mtime_ns == newest



def test_dataset_mtimes_are_those_its_files_were_opened_with(tmp_path):
    """The tree takes a dataset's mtime from the identity its .idx and .bin were
    opened (and checked) with, not from a stat of its own: a file touched since the
    open changes nothing it shows (its reads fail, as for any changed file)."""
    import os

    corpus = open_corpus(str(write_case_config(case_names()[0], tmp_path)), progress=False)
    ds = corpus.datasets[0].dataset
    opened = max(os.stat(ds.idx_path).st_mtime_ns, os.stat(ds.bin_path).st_mtime_ns)
    os.utime(ds.bin_path, ns=(opened + 10**9, opened + 10**9))
    tree = Tree(corpus)
    assert tree.stat(f"/datasets/{corpus.datasets[0].name}/sequences/0000000.bin").mtime_ns == opened


BAD = [
    "/train/samples/12.bin",
    "/train/samples/99999999999.bin",
    "/train/samples/-1.bin",
    "/train/samples/-000001.bin",
    "/train/samples/+000001.bin",
    "/train/samples/ 000001.bin",
    "/train/samples/0000000.txt",
    "/train/samples/0000000.bin/x",
    "/train/samples/00000000.bin",
    "/train/samples/9999999.bin",
    "/train/samples/",
    "/train/nope",
    "/../",
    "/..",
    "/train/..",
    "/train/samples/..",
    "/train/samples/../0000000.bin",
    "/datasets/nope/documents/0000000.bin",
    "//train",
    "",
    "/mmfs.json/x",
    "/\udcff",
]


@pytest.mark.parametrize("path", BAD)
def test_bad_names_are_none(tree: Tree, path: str):
    assert tree.lookup(path) is None
    assert tree.stat(path) is None


def test_every_name_resolves(tree: Tree):
    for split, view in tree.splits.items():
        d = tree.lookup(f"/{split}/samples")
        names = [n for n, _ in tree.entries(d)]
        assert len(names) == view.count
        assert names[0] == "0" * view.width + ".bin"
        assert names == sorted(names)
        for i in (0, view.count // 2, view.count - 1):
            node = tree.lookup(f"/{split}/samples/{names[i]}")
            assert isinstance(node, Generated) and node.index == i


def test_listing_resumes_at_any_offset(tree: Tree):
    d = tree.lookup("/" + next(iter(tree.splits)) + "/samples")
    full = list(tree.entries(d))
    for start in (0, 1, 7, len(full) - 1, len(full), len(full) + 5):
        assert list(tree.entries(d, start)) == full[start:]
    root = tree.lookup("/")
    full_root = list(tree.entries(root))
    assert list(tree.entries(root, 2)) == full_root[2:]


def test_report_html_is_made_in_the_background_on_first_stat(tmp_path):
    """A listing gives each entry's type without making report.html; its first size starts
    a child that makes it and is the note's; a read gets the note until the size is asked
    again once the page is made (the kernel reads no further than the size it was given)."""
    tree = Tree(open_corpus(str(write_case_config("p2_blend2_u16", tmp_path)), progress=False))
    report = tree.lookup("/report.html")
    assert ("report.html", FILE_MODE) in list(tree.entries(tree.root))
    assert not report.started
    assert tree.attr(report).size == len(BEING_MADE) and report.started
    assert tree.read(report, 0, 1 << 20) == BEING_MADE
    assert report.made.wait(300)
    assert tree.read(report, 0, 1 << 20) == BEING_MADE  # its size was not asked since
    page = tree.read(report, 0, tree.attr(report).size)
    assert len(page) == tree.attr(report).size and b"id='mmfs-data'" in page
    assert tree.read(report, 0, 1 << 30) == page
    tree.close()


def test_samples_bytes_and_ranges(tree: Tree):
    dtype = tree.corpus.dtype
    for split, view in tree.splits.items():
        expected = expected_samples(tree.case, split).astype(dtype)
        assert view.count == len(expected)
        for i in range(view.count):
            node = tree.lookup(f"/{split}/samples/{view.name(i)}")
            data = expected[i].tobytes()
            assert tree.read(node, 0, 1 << 20) == data
        data = expected[-1].tobytes()
        node = tree.lookup(f"/{split}/samples/{view.name(view.count - 1)}")
        for off, size in [(0, 1), (1, 3), (3, 1000), (len(data) - 1, 10), (len(data), 5), (len(data) + 7, 5)]:
            assert tree.read(node, off, size) == data[off : off + size]
        # Every sample read in odd-sized blocks (cutting tokens) assembles the same bytes.
        for i in range(0, view.count, 11):
            node = tree.lookup(f"/{split}/samples/{view.name(i)}")
            for block in (3, 97, 1000):
                parts = [tree.read(node, off, block) for off in range(0, len(data), block)]
                assert b"".join(parts) == expected[i].tobytes()


def test_documents_and_sequences(tree: Tree):
    for entry in tree.corpus.datasets:
        ds = entry.dataset
        docs = tree.registry.by_path[dataset_dir(entry.name, DOCUMENTS)]
        seqs = tree.registry.by_path[dataset_dir(entry.name, SEQUENCES)]
        assert seqs.count == ds.num_sequences and docs.count == ds.num_documents
        for i in range(0, ds.num_sequences, 7):
            node = tree.lookup(f"/datasets/{entry.name}/sequences/{seqs.name(i)}")
            want = np.asarray(ds.get(i)).astype(ds.dtype.newbyteorder("<")).tobytes()
            assert tree.attr(node).size == len(want)
            assert tree.read(node, 0, 1 << 24) == want
        for i in range(0, ds.num_documents, 5):
            node = tree.lookup(f"/datasets/{entry.name}/documents/{docs.name(i)}")
            want = np.asarray(document_tokens(ds, i)).astype(ds.dtype.newbyteorder("<")).tobytes()
            assert tree.attr(node).size == len(want)
            assert tree.read(node, 0, 1 << 24) == want
            if len(want) > 6:
                assert tree.read(node, 3, len(want) - 5) == want[3:-2]
            for off in {1, 5, len(want) // 3, max(len(want) - 3, 0)}:  # odd offsets and sizes
                for size in (1, 7, 4099):
                    assert tree.read(node, off, size) == want[off : off + size]


def test_xattrs(tree: Tree):
    split, view = next(iter(tree.splits.items()))
    reader = tree.corpus.splits[split]
    node = tree.lookup(f"/{split}/samples/{view.name(3)}")
    assert set(tree.xattr_names(node)) == {XATTR_DATASET, XATTR_PIECES}
    name, pieces = reader.provenance(3)
    assert tree.xattr(node, XATTR_DATASET) == name.encode()
    text = tree.xattr(node, XATTR_PIECES).decode()
    assert [tuple(map(int, p.split(":"))) for p in text.split(" ")] == [tuple(p) for p in pieces]
    assert sum(n for _, _, n in pieces) <= tree.corpus.sample_tokens
    assert tree.xattr(node, "user.other") is None
    assert tree.xattr_names(tree.lookup("/mmfs.json")) == ()


def test_mmfs_json(tree: Tree):
    blob = tree.lookup("/mmfs.json")
    assert isinstance(blob, Blob)
    info = json.loads(blob.data)
    c = tree.corpus
    assert info["dtype"] == c.dtype.name and info["byte_order"] == "little"
    assert info["tokens_per_sample"] == c.sample_tokens
    assert info["sequence_length"] == c.sequence_length
    assert info["eod_id"] == c.eod and info["pad_id"] == c.pad
    assert info["samples"] == {k: len(v) for k, v in c.splits.items()}
    assert info["mmfs_version"]
    assert info["config"] == json.loads(json.dumps(c.config_dict))
    for split in c.splits:
        assert info["splits"][split]["path"] == f"{split}/samples"
        assert info["splits"][split]["name_width"] == 7
    for d, entry in zip(info["datasets"], c.datasets):
        assert d["name"] == entry.name
        assert d["sequences"] == entry.dataset.num_sequences
        assert d["documents"] == entry.dataset.num_documents
        assert d["tokens"] == entry.dataset.num_tokens
        assert d["documents_path"] == f"datasets/{entry.name}/documents"


def test_node_kinds(tree: Tree):
    assert isinstance(tree.lookup("/datasets"), Dir)
    if "train" in tree.splits:
        assert isinstance(tree.lookup("/samples"), Link)
    assert tree.statfs()["f_files"] > 0
