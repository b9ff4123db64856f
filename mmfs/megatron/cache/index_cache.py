"""Megatron's index cache: `<md5>-<Class>-<split>-<suffix>` files in a folder.

Loading reads each file's .npy header (and the description) with pread and maps
nothing: an array is mapped when first used, so re-opening a blend of thousands
of datasets costs a few small reads per index. A file that does not load, has
the wrong dtype or shape, or whose description differs, is a miss and is
rebuilt, never trusted.

Saving is in two steps so that thousands of files cost one sync, not one fsync
each: `IndexCache.stage` writes an index's files under temporary names, and
`Batch.commit` syncs the file system once, renames every staged file into place
(the description last: a hit needs all files) and syncs the folder. Builders on
many hosts sharing a folder so never see half a file. Temporary files left by a
killed builder are removed by the next one (see `clean_stale_temporaries`).

A folder holding many indices of one config also gets a header file
(`HeaderFile`): every array's header and every file's size, mtime and inode, as
loaded or saved. The next open of the same indices stats their files instead of
reading them, so a blend of a thousand datasets re-opens with one read.

The pieces live beside this module: `npyfile` (reading), `write` (saving),
`headerfile` (the header file)."""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable

import numpy as np

from mmfs.config.schema import Config, DatasetSpec
from mmfs.errors import CacheError
from mmfs.formats import dataset_stem
from mmfs.megatron.cache.npyfile import CachedArray, FileId, arrays_fit_specs, file_id, read_npy_header, read_text
from mmfs.megatron.cache.write import Batch, clean_stale_temporaries, temp_name, unlink_quietly, write_problem
from mmfs.storage import scheme_of

log = logging.getLogger(__name__)


def description_hash(description: str) -> str:
    return hashlib.md5(description.encode("utf-8")).hexdigest()



# Indices this process built but could not save, by cache file base: a second open
# of the same config in this process (the mount re-opens) does not build them again.
_UNSAVED: dict[str, dict[str, np.ndarray]] = {}


class IndexCache:
    """The cache files of one dataset object (a GPTDataset or a BlendedDataset split)."""

    def __init__(self, folder: str | None, description: str | Callable[[], str], class_name: str, split: str,
                 known_hash: str | None = None) -> None:
        """description: the text, or a function that makes it when it is first needed
        (a re-open from the resolved record knows the hash, `known_hash`, and names the
        files without making thousands of descriptions)."""
        self.folder = folder
        self._description = description
        self.hash = known_hash or description_hash(self.description)
        self.base = f"{self.hash}-{class_name}-{split}"
        self._prefix = None if folder is None else os.path.join(folder, self.base)
        self.description_file: FileId | None = None  # as last loaded or staged

    @property
    def description(self) -> str:
        if callable(self._description):
            self._description = self._description()
        return self._description

    def path(self, suffix: str) -> str:
        if self._prefix is None:
            raise CacheError("no cache folder")
        return f"{self._prefix}-{suffix}"

    @property
    def lock_path(self) -> str:
        return os.path.join(self.folder or "", f"{self.base}.lock")

    def _key(self) -> str:
        return os.path.join(self.folder or "", self.base)

    def unsaved(self) -> dict[str, np.ndarray] | None:
        """Arrays built earlier in this process that the cache could not keep."""
        return _UNSAVED.get(self._key())

    def load(self, specs: dict[str, tuple[tuple[str, ...], int]]) -> dict[str, CachedArray] | None:
        """Every array's header if all files are present and sound, else None.

        specs: name -> (allowed dtypes, ndim). Nothing is mapped."""
        if self.folder is None:
            return None
        description_path = self.path("description.txt")
        try:
            # one byte more than ours: a longer file differs, however long it is
            text, self.description_file = read_text(description_path,
                                                     len(self.description.encode("utf-8")) + 1)
        except (FileNotFoundError, NotADirectoryError):  # not built, or a cache_dir that cannot be (said once)
            return None
        except (OSError, UnicodeDecodeError) as exc:
            log.warning("%s: unreadable (%s); rebuilding", description_path, exc)
            return None
        if text != self.description:
            log.warning("%s: description differs from this config; rebuilding", description_path)
            return None
        arrays = {}
        for name in specs:
            p = self.path(f"{name}.npy")
            try:
                arrays[name] = read_npy_header(p)
            except FileNotFoundError:
                return None
            except (OSError, ValueError, SyntaxError, KeyError, TypeError) as exc:
                log.warning("%s: corrupt or truncated (%s); rebuilding", p, exc)
                return None
        return arrays if arrays_fit_specs(arrays, specs) else None

    def stage(self, arrays: dict[str, np.ndarray], batch: Batch) -> dict[str, CachedArray | np.ndarray]:
        """Write the arrays and the description under temporary names, to be renamed
        by batch.commit(). Returns where each array will be (mapped after the
        commit), or the arrays themselves when the folder cannot take them."""
        if self.folder is None:
            return arrays
        moves: list[tuple[str, str]] = []
        out: dict[str, CachedArray | np.ndarray] = {}
        try:
            if batch.first_write_in(self.folder):
                os.makedirs(self.folder, exist_ok=True)
                clean_stale_temporaries(self.folder)
            for name, array in arrays.items():
                final = self.path(f"{name}.npy")
                written = self._write(final, lambda f, a=array: np.save(f, a), moves, batch)
                out[name] = CachedArray(final, array.dtype, array.shape,
                                        written[0] - array.nbytes, file=written)
            self.description_file = self._write(
                self.path("description.txt"), lambda f: f.write(self.description.encode("utf-8")),
                moves, batch)
        except OSError as exc:
            for tmp, _ in moves:
                unlink_quietly(tmp)
            batch.warn_once(self.folder, write_problem(self.folder, exc))
            _UNSAVED[self._key()] = arrays
            return arrays
        batch.add(moves)
        return out

    @staticmethod
    def _write(final: str, write, moves: list, batch: Batch) -> FileId:
        """Write a temporary file to be renamed to `final`; the FileId it will have."""
        tmp = temp_name(os.path.dirname(final), final)
        fd = batch.create(tmp)
        moves.append((tmp, final))
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            return file_id(os.fstat(fd))


def default_cache_dir(spec: DatasetSpec, config: Config, class_name: str = "GPTDataset") -> str:
    """Megatron's default: <dataset prefix>/cache/<Class>_indices. (Megatron does not
    cache blends without a cache path; mmfs keeps them beside the first dataset's.)
    A dataset in object storage has no folder to write beside: its indices go in the
    per-user cache folder (storage.cache_dir), which is said once."""
    if scheme_of(spec.file) is None:
        return os.path.join(dataset_stem(spec.file), "cache", f"{class_name}_indices")
    folder = os.path.join(config.storage.cache_folder, "indices")
    if folder not in _said:
        _said.add(folder)
        log.info("the index cache of the datasets in object storage is in %s (set cache_dir to "
                 "choose another folder)", folder)
    return folder


_said: set[str] = set()
