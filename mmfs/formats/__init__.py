"""Token files on disk: Megatron's IndexedDataset (.bin/.idx) and Modalities' .pbin."""

from __future__ import annotations

import os

from mmfs.errors import FormatError
from mmfs.formats.base import file_problem
from mmfs.formats.indexed import IndexedDataset, prefix_of
from mmfs.formats.packed import PackedDataset

__all__ = ["IndexedDataset", "PackedDataset", "open_dataset"]


def open_dataset(path: str | os.PathLike) -> IndexedDataset | PackedDataset:
    """Open a dataset by path: a `.pbin` file, or a Megatron prefix / `.idx` / `.bin`."""
    path = os.fspath(path)
    if path.endswith(".pbin"):
        problem = file_problem(path)
        if problem is not None:
            raise FormatError(f"{path}: {problem} (expected a Modalities .pbin file)")
        return PackedDataset(path)
    prefix = prefix_of(path)
    if not any(os.path.exists(prefix + s) for s in (".idx", ".bin")):
        what = "is a directory, not a dataset" if os.path.isdir(path) else (
            f"no dataset found (no {os.path.basename(prefix)}.idx or .bin)")
        raise FormatError(
            f"{path}: {what}; give a Megatron prefix (PREFIX for PREFIX.idx + PREFIX.bin), "
            "its .idx or .bin, or a Modalities .pbin file"
        )
    for p in (prefix + ".idx", prefix + ".bin"):
        problem = file_problem(p)
        if problem is not None:
            raise FormatError(f"{p}: {problem} (an IndexedDataset needs both "
                              f"{os.path.basename(prefix)}.idx and .bin as regular files)")
    return IndexedDataset(prefix)
