"""The registry of the mount's views: directories of generated files.

A view is declared once, here: its directory, its file count (and so its name
width), the C reader of its files' tokens, their dtype, their extended
attributes. Everything else follows from the declaration: the tree lists,
looks up and stats the view's files from it, and the C FUSE handlers
(native/mmfs_fuse.c) serve getattr, read and readdir of every registered view
without entering Python. Adding a view is one declaration below, plus one C
reader (`mmfs_<reader>_length`/`mmfs_<reader>_tokens` in native/) if its bytes
are new.

File names: zero-padded decimal ids, `max(7, digits of the largest id)` wide,
then ".bin" (a contract; the C side parses and formats them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mmfs.errors import NativeError
from mmfs.native import error_detail, ffi, lib

MIN_NAME_WIDTH = 7

# Extended attributes of a sample file. `user.mmfs.pieces` is text: one
# "sequence:offset:length" triple per piece, separated by single spaces, in the
# order the tokens appear in the sample (sequence ids of that dataset's .idx,
# offsets and lengths in tokens).
XATTR_DATASET = "user.mmfs.dataset"
XATTR_PIECES = "user.mmfs.pieces"
XATTR_SAMPLES = "user.mmfs.samples"
XATTR_DOCS = {
    XATTR_DATASET: "name of the dataset a sample was cut from",
    XATTR_PIECES: "space-separated sequence:offset:length triples, in sample order "
    "(sequence ids of that dataset; offsets and lengths in tokens)",
    XATTR_SAMPLES: "on a micro-batch file: its sample ids in the split, space-separated, in batch order",
}


def sample_dir(split: str) -> str:
    return f"/{split}/samples"


def ranks_dir(split: str) -> str:
    return f"/{split}/ranks"


def dataset_dir(name: str, kind: str) -> str:
    """`kind`: "documents" or "sequences"."""
    return f"/datasets/{name}/{kind}"


def name_width(count: int) -> int:
    """Digits in a file name: max(7, digits of the largest id)."""
    return max(MIN_NAME_WIDTH, len(str(count - 1))) if count > 0 else MIN_NAME_WIDTH


@dataclass
class View:
    """A directory of `count` generated files.

    reader: the C reader family; file i holds `mmfs_<reader>_length(ctx, i)`
    tokens (or `file_tokens` for every file) of dtype `dtype`, written by
    `mmfs_<reader>_tokens`. ctx: the C struct that reader reads (kept alive
    by `keep`). xattrs: file id -> {name: value}, computed on request."""

    path: str
    count: int
    dtype: np.dtype
    reader: str
    ctx: Any
    mtime_ns: int
    file_tokens: int | None = None
    xattr_names: tuple[str, ...] = ()
    xattrs: Callable[[int], dict[str, bytes]] | None = None
    total_tokens: Callable[[], int] | None = None  # all files' tokens, for statfs (None: count * file_tokens)
    describe_file: Callable[[int], str] | None = None  # " (dataset x, ...)" for messages
    keep: Any = None
    width: int = field(init=False)

    def __post_init__(self) -> None:
        self.dtype = np.dtype(self.dtype)
        self.width = name_width(self.count)

    def name(self, i: int) -> str:
        """The name of file i (the C side parses and formats the same)."""
        return f"{i:0{self.width}d}.bin"

    def names(self, start: int = 0) -> Iterator[str]:
        fmt = f"%0{self.width}d.bin"
        for i in range(max(start, 0), self.count):
            yield fmt % i

    @property
    def file_bytes(self) -> int | None:
        """The size of every file, when they all have one."""
        return None if self.file_tokens is None else self.file_tokens * self.dtype.itemsize

    @property
    def total_bytes(self) -> int:
        tokens = self.total_tokens() if self.total_tokens is not None else self.count * (self.file_tokens or 0)
        return tokens * self.dtype.itemsize

    def fill(self, c: Any, path: Any) -> None:
        """Describe the view in the C struct c (an mmfs_view)."""
        c.path = path
        c.count = self.count
        c.name_width = self.width
        c.item = self.dtype.itemsize
        c.file_tokens = -1 if self.file_tokens is None else self.file_tokens
        c.length = ffi.addressof(lib, f"mmfs_{self.reader}_length")
        c.tokens = ffi.addressof(lib, f"mmfs_{self.reader}_tokens")
        c.ctx = self.ctx
        c.mtime_ns = self.mtime_ns


class Registry:
    """The views of a mount, as the C handlers and the tree see them."""

    def __init__(self, views: list[View]) -> None:
        paths = [v.path for v in views]
        if len(set(paths)) != len(paths):
            raise ValueError(f"a view is declared twice: {paths}")
        # Sorted by path: the C side finds a path by binary search.
        self.views = views = sorted(views, key=lambda v: v.path.encode("utf-8", "surrogateescape"))
        self.index = {id(v): d for d, v in enumerate(views)}
        self.by_path = {v.path: v for v in views}
        self._paths = [ffi.new("char[]", v.path.encode()) for v in views]
        self.c = ffi.new("mmfs_view[]", max(len(views), 1))
        for c, view, path in zip(self.c, views, self._paths):
            view.fill(c, path)

    def __len__(self) -> int:
        return len(self.views)

    def find(self, path: str) -> tuple[int, View | None, int]:
        """(lib.MMFS_PATH_*, view, file id) of a path in the mount."""
        d, i = ffi.new("int32_t *"), ffi.new("int64_t *")
        kind = lib.mmfs_view_find(self.c, len(self.views), path.encode("utf-8", "surrogateescape"), d, i)
        view = self.views[d[0]] if kind != lib.MMFS_PATH_OTHER else None
        return kind, view, i[0]

    def _c(self, view: View) -> Any:
        return self.c + self.index[id(view)]

    def size(self, view: View, i: int) -> int:
        """Bytes in file i of view."""
        if view.file_bytes is not None:
            return view.file_bytes
        n = lib.mmfs_view_size(self._c(view), i)
        if n < 0:
            raise NativeError(read_failure(view, i, n))
        return n

    def read(self, view: View, i: int, offset: int, size: int) -> bytes:
        """Bytes [offset, offset + size) of file i of view (fewer at its end)."""
        if offset < 0 or size <= 0:
            return b""
        size = min(size, max(self.size(view, i) - offset, 0))
        buf = ffi.new("uint8_t[]", max(size, 1))
        n = lib.mmfs_view_read(self._c(view), i, offset, size, buf)
        if n < 0:
            raise NativeError(read_failure(view, i, n))
        return ffi.buffer(buf, n)[:]


def read_failure(view: View, i: int, rc: int) -> str:
    """One line on why file i of view could not be read: the C core's code and
    what it was doing (the file, the sequence, the byte offset)."""
    where = view.describe_file(i) if view.describe_file is not None else ""
    return f"{view.path}/{view.name(i)}{where}: {error_detail(rc)}"


# -- the declarations -----------------------------------------------------------


def sample_view(split_name: str, split: Any, mtime_ns: int) -> View:
    """A split's samples in training order: `/<split>/samples`."""

    def xattrs(i: int) -> dict[str, bytes]:
        dataset, pieces = split.provenance(i)
        return {
            XATTR_DATASET: dataset.encode(),
            XATTR_PIECES: " ".join(f"{s}:{o}:{n}" for s, o, n in pieces).encode(),
        }

    def describe_file(i: int) -> str:
        try:
            gpt, k = split.locate(i)
        except Exception as exc:  # the blend or shuffle index itself is bad: say that
            return f" ({exc})"
        return f" (dataset {gpt.name}, its sample {k})"

    return View(sample_dir(split_name), len(split), split.dtype, "split", split.c, mtime_ns,
                file_tokens=split.sample_tokens, xattr_names=(XATTR_DATASET, XATTR_PIECES),
                xattrs=xattrs, keep=split, describe_file=describe_file)


def sequence_view(name: str, source: Any, mtime_ns: int) -> View:
    """A dataset's sequences, in its own dtype: `/datasets/<name>/sequences`."""
    ds = source.dataset
    return View(dataset_dir(name, "sequences"), int(ds.num_sequences), ds.dtype, "sequence",
                source.c, mtime_ns, total_tokens=lambda: ds.num_tokens, keep=source,
                describe_file=lambda i: f" (sequence {i} of {ds.path_prefix})")


def document_view(name: str, source: Any, mtime_ns: int) -> View:
    """A dataset's documents (their sequences concatenated): `/datasets/<name>/documents`."""
    ds = source.dataset
    return View(dataset_dir(name, "documents"), int(ds.num_documents), ds.dtype, "document",
                source.documents_c, mtime_ns, total_tokens=lambda: ds.num_tokens, keep=source,
                describe_file=lambda i: f" (document {i} of {ds.path_prefix})")


def microbatch_view(split_name: str, split: Any, plan: Any, plan_c: Any, rank: int, rank_width: int,
                    mtime_ns: int) -> View:
    """Data-parallel rank `rank`'s micro-batches of a split, in the order
    Megatron's sampler hands them to it: `/<split>/ranks/<rank>`."""
    from mmfs.megatron.samplers import microbatch_ids

    c = ffi.new("mmfs_microbatches *")
    c.plan = plan_c
    c.split = split.c
    c.rank = rank

    def xattrs(j: int) -> dict[str, bytes]:
        return {XATTR_SAMPLES: " ".join(map(str, microbatch_ids(plan, rank, j).tolist())).encode()}

    return View(f"{ranks_dir(split_name)}/{rank:0{rank_width}d}", plan.files_per_rank, split.dtype,
                "microbatch", c, mtime_ns, file_tokens=plan.micro_batch_size * split.sample_tokens,
                xattr_names=(XATTR_SAMPLES,), xattrs=xattrs, keep=(split, plan, plan_c),
                describe_file=lambda j: f" (rank {rank}, samples {microbatch_ids(plan, rank, j).tolist()})")
