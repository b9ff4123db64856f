"""The mount's directory tree, independent of FUSE.

A `Tree` maps a path inside the mount to a node and a node to attributes,
directory entries, bytes and extended attributes. It never raises for a bad
path: `lookup` returns None (the adapter turns that into ENOENT).

The layout is the mount contract: docs/mount.md describes it (the one copy),
mmfs/mount/contract.py holds its names and paths.

The directories of generated files are the registered views (declared in
mmfs/mount/declarations.py, served through mmfs/mount/views.py):
their files are found, sized and read through the registry, by the same C
code that serves them under FUSE. The tree adds the directories above them,
mmfs.json, report.html (made in the background: mmfs/mount/report_file.py) and the symlinks.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from mmfs.mount.contract import (
    DOCUMENTS,
    MANIFEST,
    REPORT,
    SAMPLES,
    SEQUENCES,
    STREAMS,
    dataset_dir,
    sample_dir,
    streams_dir,
)
from mmfs.mount.declarations import declare_views
from mmfs.mount.manifest import manifest
from mmfs.mount.report_file import ReportFile
from mmfs.mount.streams import Streams
from mmfs.mount.views import Registry, View
from mmfs.native import lib

__all__ = ["DIR_MODE", "FILE_MODE", "LINK_MODE", "Attr", "Blob", "Dir", "Generated", "Link", "Tree"]

DIR_MODE = stat.S_IFDIR | 0o555
FILE_MODE = stat.S_IFREG | 0o444
LINK_MODE = stat.S_IFLNK | 0o777


class Attr(NamedTuple):
    mode: int
    nlink: int
    size: int
    mtime_ns: int


@dataclass(frozen=True)
class Dir:
    """A directory: fixed entries, or the generated files of a view."""

    mtime_ns: int
    entries: dict[str, Node] = field(default_factory=dict)
    view: View | None = None

    def __len__(self) -> int:
        return self.view.count if self.view is not None else len(self.entries)


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
    """File `index` of a view (of `registry`, when not the tree's own: a stream)."""

    view: View
    index: int
    registry: Registry | None = None


Node = Dir | Blob | ReportFile | Link | Generated


def mode_of(node: Node) -> int:
    """A node's file type, known without its size (asking report.html's starts making it)."""
    return DIR_MODE if isinstance(node, Dir) else LINK_MODE if isinstance(node, Link) else FILE_MODE


def _mtime_ns(entry: Any) -> int:
    """The newest modification time of a dataset's files: as its local sources were
    opened (a cached re-open took them from its record, checked), a stat only for a
    file no source knows."""
    ds = entry.dataset
    known = {}
    for spec in getattr(ds, "arrays", {}).values():
        identity = getattr(spec.source, "file_identity", None)
        if identity is not None:
            known[spec.source.path] = identity[1]
    times = []
    for p in _dataset_files(entry):
        if p in known:
            times.append(known[p])
            continue
        if p == getattr(ds, "path_prefix", None) and ds.idx_path in known and ds.bin_path in known:
            continue  # a Megatron prefix: the name of its .idx and .bin, no file of its own
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


# mmfs.json of a blend of more datasets than this keeps one line per top-level key: json's
# indented output is pure Python, seconds for the megabytes of ten thousand datasets.
INDENTED_UP_TO = 256


def manifest_text(info: dict) -> str:
    """mmfs.json's text: indented, or for a large blend each top-level key on a line."""
    if len(info.get("datasets", ())) <= INDENTED_UP_TO:
        return json.dumps(info, indent=2, default=_json_default) + "\n"
    lines = (f"  {json.dumps(key)}: {json.dumps(value, default=_json_default)}" for key, value in info.items())
    return "{\n" + ",\n".join(lines) + "\n}\n"


class Tree:
    """The mount's tree over an opened corpus (see mmfs.megatron.open_corpus)."""

    def __init__(self, corpus: Any) -> None:
        self.corpus = corpus
        ds_mtimes = {e.name: _mtime_ns(e) for e in corpus.datasets}
        self.mtime_ns = t = max(ds_mtimes.values(), default=0)
        self.registry = Registry(declare_views(corpus, ds_mtimes, t))

        # The directories above the views, made from the views' paths.
        self.root = Dir(t)
        self._dirs: dict[str, Dir] = {"": self.root}  # "" for the root, then "/train", ...
        for view in self.registry.views:
            parent = self.root
            parts = view.path.strip("/").split("/")
            path = ""
            for depth, part in enumerate(parts):
                path = f"{path}/{part}"
                node = self._dirs.get(path)
                if node is None:
                    last = depth == len(parts) - 1
                    node = Dir(view.mtime_ns if last or path.startswith("/datasets/") else t,
                               view=view if last else None)
                    self._dirs[path] = parent.entries[part] = node
                parent = node
        if "train" in corpus.splits:
            self.root.entries[SAMPLES] = Link(sample_dir("train").lstrip("/"), t)
        if len(corpus.datasets) == 1:
            only = corpus.datasets[0].name
            for kind in (DOCUMENTS, SEQUENCES):
                self.root.entries[kind] = Link(dataset_dir(only, kind).lstrip("/"), t)
        # mmfs.json: megabytes of JSON at 10,000 datasets, derived from the corpus alone (and
        # the config's path): kept beside the record a re-open reads, not made again.
        self.root.entries[MANIFEST] = Blob(corpus.derived(
            MANIFEST, f"{os.path.abspath(str(corpus.config_path))}",
            lambda: manifest_text(manifest(corpus)).encode()), t)
        self.report = self.root.entries[REPORT] = ReportFile(corpus.config, t)
        self.streams = Streams(corpus, t)
        for folder in self.streams.folders:  # each split's, each restart phase's own valid and test
            self._dirs[f"/{folder}"].entries[STREAMS] = self._dirs[streams_dir(folder)] = Dir(t)
        self._statfs = self._compute_statfs()  # now: nothing later may touch the files

    # -- the views, by kind ----------------------------------------------------

    @property
    def splits(self) -> dict[str, View]:
        """Split name -> its samples view (not a restart phase's own: /valid/phases/...)."""
        return {v.path.split("/")[1]: v for v in self.registry.views
                if v.reader == "split" and v.path == sample_dir(v.path.split("/")[1])}

    # -- resolution -----------------------------------------------------------

    def lookup(self, path: str) -> Node | None:
        """The node at `path` ("/", "/train/samples/0000000.bin", ...), or None."""
        if path == "/":
            return self.root
        d = self._dirs.get(path) if path else None
        if d is not None:
            return d
        kind, view, i = self.registry.find(path)
        if kind == lib.MMFS_PATH_FILE:
            return Generated(view, i)
        if kind != lib.MMFS_PATH_OTHER:
            return None
        parent, _, name = path.rpartition("/")
        d = self._dirs.get(parent)
        node = d.entries.get(name) if d is not None and name else None
        return node if node is not None else self._lookup_stream(path)

    def _lookup_stream(self, path: str) -> Node | None:
        """A path below /<split>/streams/ (or /<split>/phases/<PPP>/streams/): a layout
        folder, a rank folder, a file."""
        folder, found, below = path.partition(f"/{STREAMS}/")
        parts = below.split("/")  # layout[, rank[, file]]
        if not found or not 1 <= len(parts) <= 3 or folder[1:] not in self.streams.folders:
            return None
        layout = self.streams.layout(folder[1:], parts[0])
        if layout is None:
            return None
        if len(parts) == 1:
            return Dir(self.mtime_ns, {r: Dir(self.mtime_ns, view=v)
                                       for r, v in zip(layout.rank_names, layout.registry.views)})
        kind, view, i = layout.registry.find(path)
        if kind == lib.MMFS_PATH_DIR:
            return Dir(view.mtime_ns, view=view)
        return Generated(view, i, layout.registry) if kind == lib.MMFS_PATH_FILE else None

    def attr(self, node: Node) -> Attr:
        if isinstance(node, Generated):
            registry = node.registry or self.registry
            return Attr(FILE_MODE, 1, registry.size(node.view, node.index), node.view.mtime_ns)
        if isinstance(node, Dir):
            subdirs = sum(isinstance(c, Dir) for c in node.entries.values())
            return Attr(DIR_MODE, 2 + subdirs, 0, node.mtime_ns)
        if isinstance(node, Blob):
            return Attr(FILE_MODE, 1, len(node.data), node.mtime_ns)
        if isinstance(node, ReportFile):
            return Attr(FILE_MODE, 1, node.size(), node.mtime_ns)
        return Attr(LINK_MODE, 1, len(node.target), node.mtime_ns)

    def stat(self, path: str) -> Attr | None:
        node = self.lookup(path)
        return None if node is None else self.attr(node)

    # -- contents -------------------------------------------------------------

    def entries(self, d: Dir, start: int = 0) -> Iterator[tuple[str, int]]:
        """(name, mode) of the entries of `d` from position `start` on
        (without "." and ".."), generated lazily."""
        if d.view is not None:
            for name in d.view.names(start):
                yield name, FILE_MODE
            return
        for name, child in list(d.entries.items())[max(start, 0):]:
            yield name, mode_of(child)  # not attr(): a listing must not make report.html to size it

    def read(self, node: Node, offset: int, size: int) -> bytes:
        """Bytes [offset, offset + size) of a file node (short at the end)."""
        if offset < 0 or size <= 0:
            return b""
        if isinstance(node, Generated):
            return (node.registry or self.registry).read(node.view, node.index, offset, size)
        if isinstance(node, Blob):
            return node.data[offset : offset + size]
        if isinstance(node, ReportFile):
            return node.read(offset, size)
        raise IsADirectoryError(str(node))

    def readlink(self, node: Node) -> str | None:
        return node.target if isinstance(node, Link) else None

    def xattr_names(self, node: Node) -> tuple[str, ...]:
        return node.view.xattr_names if isinstance(node, Generated) else ()

    def xattr(self, node: Node, name: str) -> bytes | None:
        if isinstance(node, Generated) and name in node.view.xattr_names and node.view.xattrs:
            return node.view.xattrs(node.index).get(name)
        return None

    def close(self) -> None:
        """The mount is going away: stop what works in the background."""
        self.report.close()

    def statfs(self) -> dict[str, int]:
        """Totals for `df`: every byte and file the mount presents."""
        return self._statfs

    def _compute_statfs(self) -> dict[str, int]:
        views = self.registry.views
        total = sum(v.total_bytes for v in views)
        block = 4096
        return {
            "f_bsize": block,
            "f_frsize": block,
            "f_blocks": -(-total // block),
            "f_bfree": 0,
            "f_bavail": 0,
            "f_files": sum(v.count for v in views),
            "f_ffree": 0,
            "f_favail": 0,
            "f_namemax": 255,
        }
