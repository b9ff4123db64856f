"""The headers of many indices of one config in one file, `<md5>-mmfs-headers.json`:
the next open stats the cache files instead of reading them."""

from __future__ import annotations

import json
import logging
import math
import os

import numpy as np

from mmfs.megatron.cache.index_cache import IndexCache, description_hash
from mmfs.megatron.cache.npyfile import NPY_MIN_HEADER, CachedArray, FileId, arrays_fit_specs, file_id
from mmfs.megatron.cache.write import temp_name, unlink_quietly

log = logging.getLogger(__name__)

HEADERS_FROM = 16  # indices of a config in one folder; with fewer, their own files do


class HeaderFile:
    """The headers of a config's indices in one folder, in `<md5>-mmfs-headers.json`
    (the md5 of their file names), with each file's FileId as it was loaded or
    written. An index whose files all still have those ids is known without reading
    them; one whose files changed is loaded the usual way (and the header file
    written again). Losing this file costs only time, so it is not synced."""

    VERSION = 1

    def __init__(self, folder: str, caches: list[IndexCache]) -> None:
        self.folder = folder
        key = description_hash("\n".join(sorted({c.base for c in caches})))
        self.path = os.path.join(folder, f"{key}-mmfs-headers.json")

    def read(self, specs: dict[str, dict]) -> dict[str, tuple[FileId, dict[str, CachedArray]]]:
        """base -> (its description's FileId, its arrays), for each index of `specs`
        (base -> its arrays' specs) whose files are unchanged; nothing when the
        header file is missing or unreadable."""
        try:
            with open(self.path, "rb") as f:
                saved = json.loads(f.read())
            entries = saved["indices"] if saved["version"] == self.VERSION else {}
        except (OSError, ValueError, LookupError, TypeError):
            return {}
        if not isinstance(entries, dict):
            return {}
        dtypes: dict[str, np.dtype] = {}
        known = {}
        for base, array_specs in specs.items():
            try:
                arrays = self._unchanged(base, entries.get(base), array_specs, dtypes)
            except (OSError, ValueError, LookupError, TypeError, AttributeError):
                arrays = None  # gone, changed or malformed: load it the usual way
            if arrays is not None:
                known[base] = arrays
        return known

    def _unchanged(self, base: str, entry: dict, specs: dict,
                   dtypes: dict) -> tuple[FileId, dict[str, CachedArray]] | None:
        description = file_id(os.stat(os.path.join(self.folder, f"{base}-description.txt")))
        if description != tuple(entry["description.txt"]):
            return None
        arrays = {}
        for name in specs:
            descr, shape, offset, saved_id = entry[name]
            path = os.path.join(self.folder, f"{base}-{name}.npy")
            now = file_id(os.stat(path))
            dtype = dtypes.get(descr) or dtypes.setdefault(descr, np.dtype(descr))
            shape, offset = tuple(int(n) for n in shape), int(offset)
            if now != tuple(saved_id) or min(shape, default=0) < 0 or offset < NPY_MIN_HEADER \
                    or now[0] != offset + math.prod(shape) * dtype.itemsize:
                return None
            arrays[name] = CachedArray(path, dtype, shape, offset, file=now,
                                       known_from=self.path)
        return (description, arrays) if arrays_fit_specs(arrays, specs) else None

    def write(self, indices: list[tuple[IndexCache, dict]]) -> None:
        """Record every index (cache, arrays) held in its cache files."""
        entries = {}
        for cache, arrays in indices:
            if cache.description_file is None or not all(
                    isinstance(a, CachedArray) and a.file for a in arrays.values()):
                continue  # held in memory: not in the cache
            entries[cache.base] = {"description.txt": cache.description_file, **{
                name: [a.dtype.str, a.shape, a.offset, a.file] for name, a in arrays.items()}}
        text = json.dumps({"version": self.VERSION, "indices": entries}, separators=(",", ":"))
        tmp = temp_name(self.folder, self.path)
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(text)  # dumps, not dump: dump encodes in pure Python
            os.replace(tmp, self.path)
        except OSError as exc:
            unlink_quietly(tmp)
            log.debug("%s: not written (%s)", self.path, exc)
