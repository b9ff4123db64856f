"""Token files: Megatron's IndexedDataset (.bin/.idx) and Modalities' .pbin, in a
registry. Each format is declared once (`FORMATS`) and recognised by its content
(the suffix is only a hint for the error message of a file that is neither)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from mmfs.errors import FormatError, out_of_descriptors
from mmfs.formats import indexed, packed
from mmfs.formats.base import SequenceDataset
from mmfs.formats.indexed import IndexedDataset
from mmfs.formats.packed import PackedDataset
from mmfs.storage import NotThere, StorageError, StorageUnavailable, open_source, source_failure

__all__ = ["FORMATS", "IndexedDataset", "PackedDataset", "dataset_problem", "dataset_stem",
           "open_dataset"]


@dataclass(frozen=True)
class Format:
    name: str
    suffix: str  # the usual suffix: a hint only
    head_file: Callable[[str], str]  # a dataset path -> the file whose first bytes tell
    recognise: Callable[[bytes, int], bool]  # (first bytes, file size) -> this format?
    stem: Callable[[str], str]  # a dataset path -> the path Megatron names it by
    open: Callable[[str], SequenceDataset]


FORMATS = (
    Format("megatron-indexed", ".idx", lambda p: indexed.prefix_of(p) + ".idx",
           indexed.recognise, lambda p: p, IndexedDataset),
    Format("modalities-packed", ".pbin", lambda p: p, packed.recognise,
           lambda p: p[: -len(".pbin")] if p.endswith(".pbin") else p, PackedDataset),
)
HEAD_BYTES = 16  # enough for every format's signature


def _head(path: str) -> tuple[bytes, int] | None:
    """The first bytes and size of the file at `path`, or None when there is none."""
    try:
        source = open_source(path)
    except StorageUnavailable:
        raise
    except StorageError:
        return None
    head = bytearray(min(HEAD_BYTES, source.size))
    try:
        source.read_into(0, head)
    except StorageUnavailable:
        raise
    except (OSError, StorageError) as exc:
        if out_of_descriptors(exc):  # not "no dataset here": no file could be opened
            raise
        return None
    return bytes(head), source.size


def find_format(path: str) -> Format | None:
    """The format whose content is at `path` (None: no format recognises it)."""
    for fmt in FORMATS:
        found = _head(fmt.head_file(path))
        if found is not None and fmt.recognise(*found):
            return fmt
    return None


def _hinted(path: str) -> Format:
    """For a path no format recognises: the format its suffix names (a .pbin), else
    Megatron's prefix convention; its reader then says what is wrong."""
    return next((f for f in FORMATS if f.suffix != ".idx" and path.endswith(f.suffix)), FORMATS[0])


def dataset_stem(path: str) -> str:
    """The path a dataset is named by (a .pbin without its suffix, a prefix as given)."""
    return (find_format(path) or _hinted(path)).stem(path)


def dataset_problem(path: str) -> str | None:
    """Why there is no dataset at `path`, or None when a format recognises one there
    (reads a few bytes; the reader checks the rest when it opens)."""
    if find_format(path) is not None:
        return None
    fmt = _hinted(path)
    if fmt.name == "modalities-packed":
        failure = source_failure(path)
        return None if failure is None else f"{path} {str(failure).removeprefix(f'{path}: ')}"
    prefix = indexed.prefix_of(path)
    problems = {p: source_failure(p) for p in (prefix + ".bin", prefix + ".idx")}
    if all(isinstance(v, NotThere) for v in problems.values()):
        return f"no dataset at {path} (expected {path}.bin and {path}.idx, or a .pbin file)"
    return next((str(v) for v in problems.values() if v is not None), None)


def open_dataset(path: str | os.PathLike) -> SequenceDataset:
    """Open a dataset by path: a Megatron prefix / `.idx` / `.bin`, or a `.pbin` file,
    whichever format its content is."""
    path = os.fspath(path)
    fmt = find_format(path)
    if fmt is not None:
        return fmt.open(path)
    if _hinted(path).name == "modalities-packed":
        return PackedDataset(path)
    prefix = indexed.prefix_of(path)
    if not any(_head(prefix + s) is not None for s in (".idx", ".bin")):
        if os.path.isdir(path):
            what = "is a directory, not a dataset"
        elif _head(path) is not None:
            what = "not a dataset: no format recognises its content"
        else:
            what = f"no dataset found (no {os.path.basename(prefix)}.idx or .bin)"
        raise FormatError(
            f"{path}: {what}; give a Megatron prefix (PREFIX for PREFIX.idx + PREFIX.bin), "
            "its .idx or .bin, or a Modalities .pbin file"
        )
    return IndexedDataset(prefix)
