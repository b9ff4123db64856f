"""The mount's directory tree and its bytes, independent of FUSE.

A `Tree` maps a path inside the mount to a node and a node to attributes,
directory entries, bytes and extended attributes. It never raises for a bad
path: `lookup` returns None (the adapter turns that into ENOENT).

Layout (a contract, see README.md):

    mmfs.json
    train/samples/0000000.bin ...          one file per sample, training order
    valid/samples/...  test/samples/...    each non-empty split
    samples -> train/samples
    datasets/<name>/documents/0000000.bin  a document's sequences concatenated
    datasets/<name>/sequences/0000000.bin  one sequence
    documents, sequences                   symlinks when there is exactly one dataset

Directories of generated files (`FileView`s) hold millions of names: names are
computed from ids on demand and never stored.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from . import __version__
from .errors import MountError

DIR_MODE = stat.S_IFDIR | 0o555
FILE_MODE = stat.S_IFREG | 0o444
LINK_MODE = stat.S_IFLNK | 0o777

MIN_NAME_WIDTH = 7
SUFFIX = ".bin"

# Extended attributes of a sample file. `user.mmfs.pieces` is text: one
# "sequence:offset:length" triple per piece, separated by single spaces, in the
# order the tokens appear in the sample (sequence ids of that dataset's .idx,
# offsets and lengths in tokens).
XATTR_DATASET = "user.mmfs.dataset"
XATTR_PIECES = "user.mmfs.pieces"


def name_width(count: int) -> int:
    """Digits in a file name: max(7, digits of the largest id)."""
    return max(MIN_NAME_WIDTH, len(str(count - 1))) if count > 0 else MIN_NAME_WIDTH


class Attr(NamedTuple):
    mode: int
    nlink: int
    size: int
    mtime_ns: int


# -- generated files ----------------------------------------------------------


class FileView:
    """A directory of `count` generated files named by zero-padded id."""

    xattr_names: tuple[str, ...] = ()

    def __init__(self, count: int, mtime_ns: int) -> None:
        self.count = count
        self.width = name_width(count)
        self.mtime_ns = mtime_ns
        # A valid name is exactly `width` digits then ".bin"; int() alone
        # would accept "+1", " 1", "1_0" and other spellings of the same id.
        self._name_re = re.compile(r"[0-9]{%d}\.bin" % self.width)
        self.name_format = f"%0{self.width}d{SUFFIX}"  # name_format % id

    def parse(self, name: str) -> int | None:
        """The id a file name stands for, or None if it is not a valid name."""
        if len(name) != self.width + 4 or not self._name_re.fullmatch(name):
            return None
        i = int(name[: self.width])
        return i if i < self.count else None

    def name(self, i: int) -> str:
        return f"{i:0{self.width}d}{SUFFIX}"

    def names(self, start: int = 0) -> Iterator[str]:
        """Names of ids start, start + 1, ..., generated one at a time."""
        fmt = self.name_format
        for i in range(max(start, 0), self.count):
            yield fmt % i

    def size(self, i: int) -> int:
        raise NotImplementedError

    def read(self, i: int, offset: int, size: int) -> bytes:
        """Bytes [offset, offset + size) of file i, shorter at the end."""
        raise NotImplementedError

    def read_into(self, i: int, buf: Any) -> int:
        """Write all of file i into the writable buffer `buf` (at least
        size(i) bytes); return the number of bytes written."""
        data = self.read(i, 0, self.size(i))
        memoryview(buf).cast("B")[: len(data)] = data
        return len(data)

    def xattr(self, i: int, name: str) -> bytes | None:
        return None

    def total_bytes(self) -> int:
        raise NotImplementedError


class SampleView(FileView):
    """The samples of one split: every file has the same size."""

    xattr_names = (XATTR_DATASET, XATTR_PIECES)

    def __init__(self, split: Any, mtime_ns: int) -> None:
        super().__init__(len(split), mtime_ns)
        self.split = split
        self.sample_bytes = int(split.sample_bytes)
        # Write a whole sample at a C address (the sampling layer's fastest entry).
        self.read_to_address = getattr(split, "read_to_address", None)

    def size(self, i: int) -> int:
        return self.sample_bytes

    def read(self, i: int, offset: int, size: int) -> bytes:
        if offset >= self.sample_bytes or size <= 0:
            return b""
        data = self.split.read(i)
        if offset == 0 and size >= self.sample_bytes:
            return data
        return data[offset : offset + size]

    def read_into(self, i: int, buf: Any) -> int:
        # The C sample reader writes straight into the caller's buffer.
        self.split.read_into(i, buf)
        return self.sample_bytes

    def xattr(self, i: int, name: str) -> bytes | None:
        if name == XATTR_DATASET:
            return self.split.provenance(i)[0].encode()
        if name == XATTR_PIECES:
            pieces = self.split.provenance(i)[1]
            return " ".join(f"{s}:{o}:{n}" for s, o, n in pieces).encode()
        return None

    def total_bytes(self) -> int:
        return self.count * self.sample_bytes


def _token_bytes(tokens: np.ndarray) -> memoryview:
    """Raw little-endian bytes of a token array, without a copy when possible."""
    if tokens.dtype.byteorder == ">" or (
        tokens.dtype.byteorder == "=" and not np.little_endian
    ):
        tokens = tokens.astype(tokens.dtype.newbyteorder("<"))
    return memoryview(np.ascontiguousarray(tokens)).cast("B")


class SequenceView(FileView):
    """A dataset's sequences, in its own dtype."""

    def __init__(self, dataset: Any, mtime_ns: int) -> None:
        super().__init__(int(dataset.num_sequences), mtime_ns)
        self.dataset = dataset
        self.itemsize = np.dtype(dataset.dtype).itemsize
        self.lengths = dataset.sequence_lengths

    def size(self, i: int) -> int:
        return int(self.lengths[i]) * self.itemsize

    def read(self, i: int, offset: int, size: int) -> bytes:
        return bytes(_token_bytes(self.dataset.get(i))[offset : offset + max(size, 0)])

    def total_bytes(self) -> int:
        return int(np.asarray(self.lengths).sum(dtype=np.int64)) * self.itemsize


class DocumentView(FileView):
    """A dataset's documents (their sequences concatenated), in its own dtype."""

    def __init__(self, dataset: Any, mtime_ns: int) -> None:
        super().__init__(int(dataset.num_documents), mtime_ns)
        self.dataset = dataset
        self.itemsize = np.dtype(dataset.dtype).itemsize
        self.lengths = dataset.sequence_lengths

    def _sequences(self, i: int) -> range:
        return self.dataset.document_sequences(i)

    def size(self, i: int) -> int:
        seqs = self._sequences(i)
        tokens = int(np.asarray(self.lengths[seqs.start : seqs.stop]).sum(dtype=np.int64))
        return tokens * self.itemsize

    def read(self, i: int, offset: int, size: int) -> bytes:
        # Copy only the sequences that overlap the requested range, so that
        # small reads of a long document stay cheap.
        out = bytearray()
        end = offset + max(size, 0)
        pos = 0
        for seq in self._sequences(i):
            seq_bytes = int(self.lengths[seq]) * self.itemsize
            if pos + seq_bytes > offset and pos < end:
                data = _token_bytes(self.dataset.get(seq))
                out += data[max(offset - pos, 0) : min(end - pos, seq_bytes)]
            pos += seq_bytes
            if pos >= end:
                break
        return bytes(out)

    def total_bytes(self) -> int:
        return int(np.asarray(self.lengths).sum(dtype=np.int64)) * self.itemsize


# -- static nodes -------------------------------------------------------------


@dataclass(frozen=True)
class Dir:
    """A directory: fixed entries, or the generated files of a view."""

    mtime_ns: int
    entries: dict[str, Node] | None = None
    view: FileView | None = None

    def __len__(self) -> int:
        return self.view.count if self.view is not None else len(self.entries or ())


@dataclass(frozen=True)
class Blob:
    """A small file whose bytes are known at mount time (mmfs.json)."""

    data: bytes
    mtime_ns: int


@dataclass(frozen=True)
class Link:
    target: str
    mtime_ns: int


class Generated(NamedTuple):
    """File `index` of a view."""

    view: FileView
    index: int


Node = Dir | Blob | Link | Generated


# -- the tree -----------------------------------------------------------------


def _mtime_ns(paths: list[str]) -> int:
    times = []
    for p in paths:
        try:
            times.append(os.stat(p).st_mtime_ns)
        except (OSError, TypeError):
            continue
    return max(times, default=0)


def _dataset_files(entry: Any) -> list[str]:
    ds = entry.dataset
    return [p for p in (getattr(ds, "idx_path", None), getattr(ds, "bin_path", None), entry.path) if p]


def _json_default(value: Any) -> Any:
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.dtype):
        return value.name
    return str(value)


def _check_name(name: str, what: str) -> None:
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise MountError(
            f"{what} {name!r} cannot be a directory name in the mount; give the dataset a "
            "`name:` without '/' in the config"
        )


class Tree:
    """The mount's tree over an opened corpus (see mmfs.sampling.open_corpus)."""

    def __init__(self, corpus: Any) -> None:
        self.corpus = corpus
        self._statfs: dict[str, int] | None = None
        ds_mtimes = {e.name: _mtime_ns(_dataset_files(e)) for e in corpus.datasets}
        self.mtime_ns = max(ds_mtimes.values(), default=0)
        t = self.mtime_ns

        self.splits: dict[str, SampleView] = {
            name: SampleView(split, t) for name, split in corpus.splits.items() if len(split) > 0
        }
        root: dict[str, Node] = {}
        self._dirs: dict[str, Dir] = {}  # path -> directory, for one-lookup resolution

        for name, view in self.splits.items():
            samples = Dir(t, view=view)
            root[name] = Dir(t, entries={"samples": samples})
        if "train" in self.splits:
            root["samples"] = Link("train/samples", t)

        datasets: dict[str, Node] = {}
        self.dataset_views: dict[str, tuple[DocumentView, SequenceView]] = {}
        for entry in corpus.datasets:
            _check_name(entry.name, "dataset name")
            m = ds_mtimes[entry.name]
            docs = DocumentView(entry.dataset, m)
            seqs = SequenceView(entry.dataset, m)
            self.dataset_views[entry.name] = (docs, seqs)
            datasets[entry.name] = Dir(
                m, entries={"documents": Dir(m, view=docs), "sequences": Dir(m, view=seqs)}
            )
        root["datasets"] = Dir(t, entries=datasets)
        if len(corpus.datasets) == 1:
            only = corpus.datasets[0].name
            root["documents"] = Link(f"datasets/{only}/documents", t)
            root["sequences"] = Link(f"datasets/{only}/sequences", t)

        self.info = self._describe()
        root["mmfs.json"] = Blob(
            (json.dumps(self.info, indent=2, default=_json_default) + "\n").encode(), t
        )
        self.root = Dir(t, entries=root)
        self._index("", self.root)

    def _index(self, path: str, d: Dir) -> None:
        # Keys: "" for the root, then "/train", "/train/samples", ...
        self._dirs[path] = d
        for name, child in (d.entries or {}).items():
            if isinstance(child, Dir):
                self._index(f"{path}/{name}", child)

    def _describe(self) -> dict[str, Any]:
        """What mmfs.json holds: everything a loader needs to read the files.

        The sampling layer's own description (Corpus.describe) is the base;
        the tree adds where each split's and dataset's files are."""
        c = self.corpus
        dtype = np.dtype(c.dtype)
        info: dict[str, Any] = {
            "mmfs_version": __version__,
            "dtype": dtype.name,
            "byte_order": "little",
            "sequence_length": int(c.sequence_length),
            "tokens_per_sample": int(c.sample_tokens),
            "bytes_per_sample": int(c.sample_tokens) * dtype.itemsize,
            "eod_id": int(c.eod),
            "pad_id": int(c.pad),
            "samples": {name: view.count for name, view in self.splits.items()},
        }
        described = c.describe() if hasattr(c, "describe") else {}
        for key, value in described.items():
            if key not in ("splits", "datasets"):
                info[key] = value
        info["byte_order"] = "little"  # whatever the source, the files are little-endian

        splits = {k: dict(v) for k, v in (described.get("splits") or {}).items()}
        for name, view in self.splits.items():
            splits.setdefault(name, {"samples": view.count})
            splits[name].update(path=f"{name}/samples", name_width=view.width)
        info["splits"] = splits

        given = {d.get("name"): d for d in described.get("datasets") or []}
        datasets = []
        for e in c.datasets:
            docs, seqs = self.dataset_views[e.name]
            d = dict(given.get(e.name) or {})
            d.setdefault("name", e.name)
            d.setdefault("path", e.path)
            d.setdefault("format", getattr(e.dataset, "format_name", None))
            d.setdefault("dtype", np.dtype(e.dataset.dtype).name)
            d.setdefault("sequences", seqs.count)
            d.setdefault("documents", docs.count)
            d["tokens"] = int(np.asarray(e.dataset.sequence_lengths).sum(dtype=np.int64))
            d["documents_path"] = f"datasets/{e.name}/documents"
            d["documents_name_width"] = docs.width
            d["sequences_path"] = f"datasets/{e.name}/sequences"
            d["sequences_name_width"] = seqs.width
            datasets.append(d)
        info["datasets"] = datasets

        info["file_names"] = (
            "zero-padded decimal id, width max(7, digits of the largest id), then .bin"
        )
        info["xattrs"] = {
            XATTR_DATASET: "name of the dataset a sample was cut from",
            XATTR_PIECES: "space-separated sequence:offset:length triples, in sample order "
            "(sequence ids of that dataset; offsets and lengths in tokens)",
        }
        info["config_path"] = str(c.config_path)
        info.setdefault("config", c.config_dict)
        return info

    # -- resolution -------------------------------------------------------

    def lookup(self, path: str) -> Node | None:
        """The node at `path` ("/", "/train/samples/0000000.bin", ...), or None."""
        if path == "/":
            return self.root
        d = self._dirs.get(path) if path else None
        if d is not None:
            return d
        parent, _, name = path.rpartition("/")
        d = self._dirs.get(parent)
        if d is None or not name:
            return None
        if d.view is not None:
            i = d.view.parse(name)
            return None if i is None else Generated(d.view, i)
        return d.entries.get(name) if d.entries else None

    def attr(self, node: Node) -> Attr:
        if isinstance(node, Generated):
            v = node.view
            return Attr(FILE_MODE, 1, v.size(node.index), v.mtime_ns)
        if isinstance(node, Dir):
            subdirs = sum(isinstance(c, Dir) for c in (node.entries or {}).values())
            return Attr(DIR_MODE, 2 + subdirs, 0, node.mtime_ns)
        if isinstance(node, Blob):
            return Attr(FILE_MODE, 1, len(node.data), node.mtime_ns)
        return Attr(LINK_MODE, 1, len(node.target), node.mtime_ns)

    def stat(self, path: str) -> Attr | None:
        node = self.lookup(path)
        return None if node is None else self.attr(node)

    # -- contents ---------------------------------------------------------

    def entries(self, d: Dir, start: int = 0) -> Iterator[tuple[str, int]]:
        """(name, mode) of the entries of `d` from position `start` on
        (without "." and ".."), generated lazily."""
        if d.view is not None:
            for name in d.view.names(start):
                yield name, FILE_MODE
            return
        items = list((d.entries or {}).items())
        for name, child in items[max(start, 0) :]:
            yield name, self.attr(child).mode

    def read(self, node: Node, offset: int, size: int) -> bytes:
        """Bytes [offset, offset + size) of a file node (short at the end)."""
        if offset < 0 or size <= 0:
            return b""
        if isinstance(node, Generated):
            return node.view.read(node.index, offset, size)
        if isinstance(node, Blob):
            return node.data[offset : offset + size]
        raise IsADirectoryError(str(node))

    def readlink(self, node: Node) -> str | None:
        return node.target if isinstance(node, Link) else None

    def xattr_names(self, node: Node) -> tuple[str, ...]:
        return node.view.xattr_names if isinstance(node, Generated) else ()

    def xattr(self, node: Node, name: str) -> bytes | None:
        if isinstance(node, Generated) and name in node.view.xattr_names:
            return node.view.xattr(node.index, name)
        return None

    def statfs(self) -> dict[str, int]:
        """Totals for `df`: every byte and file the mount presents."""
        if self._statfs is not None:
            return self._statfs
        views: list[FileView] = list(self.splits.values())
        for docs, seqs in self.dataset_views.values():
            views += [docs, seqs]
        total = sum(v.total_bytes() for v in views)
        files = sum(v.count for v in views)
        block = 4096
        self._statfs = {
            "f_bsize": block,
            "f_frsize": block,
            "f_blocks": -(-total // block),
            "f_bfree": 0,
            "f_bavail": 0,
            "f_files": files,
            "f_ffree": 0,
            "f_favail": 0,
            "f_namemax": 255,
        }
        return self._statfs
