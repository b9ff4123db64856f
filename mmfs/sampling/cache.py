"""Megatron's index cache: `<md5>-<Class>-<split>-<suffix>` files in a folder.

Files are written atomically (temporary name + rename) so builders on many hosts
sharing a cache folder never read half a file. A file that does not load, has
the wrong dtype or shape, or whose description differs, is treated as a miss and
rebuilt, never trusted.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile

import numpy as np

log = logging.getLogger(__name__)


def description_hash(description: str) -> str:
    return hashlib.md5(description.encode("utf-8")).hexdigest()


def _load(path: str) -> np.ndarray:
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError:
        # An empty array cannot be memory-mapped; a small file is read instead
        # (a truncated one raises again).
        if os.path.getsize(path) > 4096:
            raise
        return np.load(path, allow_pickle=False)


class IndexCache:
    """The cache files of one dataset object (a GPTDataset or a BlendedDataset split)."""

    def __init__(self, folder: str | None, description: str, class_name: str, split: str) -> None:
        self.folder = folder
        self.description = description
        self.hash = description_hash(description)
        self.base = f"{self.hash}-{class_name}-{split}"

    def path(self, suffix: str) -> str:
        assert self.folder is not None
        return os.path.join(self.folder, f"{self.base}-{suffix}")

    def load(self, specs: dict[str, tuple[tuple[str, ...], int]]) -> dict[str, np.ndarray] | None:
        """Memory-map every array if all files are present and sound, else None.

        specs: name -> (allowed dtypes, ndim).
        """
        if self.folder is None:
            return None
        paths = [self.path("description.txt")] + [self.path(f"{n}.npy") for n in specs]
        if not all(os.path.isfile(p) for p in paths):
            return None
        try:
            with open(paths[0], encoding="utf-8") as f:
                if f.read() != self.description:
                    log.warning("%s: description differs from this config; rebuilding", paths[0])
                    return None
        except (OSError, UnicodeDecodeError) as exc:
            log.warning("%s: unreadable (%s); rebuilding", paths[0], exc)
            return None
        arrays = {}
        for name, (dtypes, ndim) in specs.items():
            p = self.path(f"{name}.npy")
            try:
                a = _load(p)
            except (OSError, ValueError, EOFError) as exc:
                log.warning("%s: corrupt or truncated (%s); rebuilding", p, exc)
                return None
            if a.dtype.name not in dtypes or a.ndim != ndim or not a.dtype.isnative:
                log.warning("%s: unexpected dtype %s / shape %s; rebuilding", p, a.dtype, a.shape)
                return None
            arrays[name] = a
        return arrays

    def save(self, arrays: dict[str, np.ndarray]) -> None:
        """Write the arrays, then the description (a hit needs all files)."""
        if self.folder is None:
            return
        try:
            os.makedirs(self.folder, exist_ok=True)
            for name, array in arrays.items():
                self._atomic_write(self.path(f"{name}.npy"), lambda f, a=array: np.save(f, a))
            self._atomic_write(
                self.path("description.txt"), lambda f: f.write(self.description.encode("utf-8"))
            )
        except OSError as exc:
            log.warning(
                "cannot write the index cache in %s (%s); indices stay in memory. "
                "Set cache_dir in the config to a writable folder to keep them.",
                self.folder,
                exc.strerror or exc,
            )

    @staticmethod
    def _atomic_write(path: str, write) -> None:
        folder = os.path.dirname(path)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=folder)
        try:
            with os.fdopen(fd, "wb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
