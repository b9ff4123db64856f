"""What a built config resolved to, in one record: its YAML as parsed, each
dataset's files (identity, format, header), each index's cache file names and
array headers. A re-open of the same config checks the record as a whole (the
config's bytes, one stat of each dataset file and of each cache folder) and reads
it instead of parsing the YAML, opening the datasets, describing thousands of
indices and stating every cache file: a blend of ten thousand datasets re-opens
with one read and some thirty thousand stats, not a hundred and eighty thousand.

Trusted only as far as checked: a cache file is not stated here; each array read
from the record is `known_from` it, so its file is checked (identity and its own
.npy header) before its bytes are used, and a record that disagrees with a file
is removed and the indices loaded from the files themselves (Corpus.splits). Any
change the stats see (the config, a dataset, a file added to or removed from a
cache folder, mmfs itself) makes the record stale; the full open writes it again.

Kept per user (`$XDG_CACHE_HOME/mmfs/resolved/`), named by the config's path.
Only for configs whose inputs are the config file and local IndexedDatasets
(no text, .pbin or object-storage dataset, no tokenizer files, no data_args_path
files, no phases); the others are opened the full way, as before."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import stat
from collections.abc import MutableMapping
from dataclasses import dataclass
from functools import cached_property
from importlib import metadata

import numpy as np

from mmfs.config.safe_yaml import MAX_CONFIG_BYTES
from mmfs.megatron.cache import pack as packs
from mmfs.megatron.cache.npyfile import CachedArray, FileId, file_id
from mmfs.megatron.cache.write import temp_name, unlink_quietly
from mmfs.storage import scheme_of
from mmfs.storage.settings import default_cache_dir

log = logging.getLogger(__name__)

VERSION = 1
RECORD_LIMIT = 1 << 30  # bytes: a record of a million datasets is a few hundred MB


def record_path(config_path: str) -> str:
    key = hashlib.sha256(os.path.realpath(config_path).encode("utf-8", "surrogateescape")).hexdigest()[:32]
    return os.path.join(default_cache_dir(), "resolved", f"{key}.json")


def _code() -> str:
    """mmfs's version and its source files' sizes and times: a changed mmfs (another
    derivation, other names) never reads a record an older one wrote."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parts = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith((".py", ".so")):
                st = os.stat(os.path.join(folder, name))
                parts.append(f"{os.path.relpath(os.path.join(folder, name), root)} {st.st_size} {st.st_mtime_ns}")
    try:
        version = metadata.version("mmfs")
    except metadata.PackageNotFoundError:
        version = "?"
    return hashlib.sha256("\n".join([version, *parts]).encode()).hexdigest()


@dataclass
class Resolved:
    """A record found sound: what load_config, the datasets and Builder.from_record
    take from it."""

    path: str
    yaml: object  # the config's YAML document, as parsed
    digest: str  # the sha256 of its bytes
    names: dict[str, str]  # dataset file -> its name
    datasets: dict[str, tuple]  # dataset file -> (idx stat, bin stat, header facts)
    # split -> ([[file, beg, end, num_samples, *index] per GPTDataset], [weights, size, *index] or None),
    # index: [hash, description FileId, {array: [descr, shape, offset, FileId]}]
    splits: dict[str, list]
    file: FileId  # the record's own identity, as read (cache/derived.py keys what it derived by it)
    pack_named: list | None = None  # [path, identity, table digest] of the config's pack (cache/pack.py)

    @cached_property
    def pack(self) -> packs.Pack | None:
        """The pack the record names, read when first asked for (a re-open that maps no
        array, `mmfs build`, does not); None when there is none or it is not that file."""
        if not self.pack_named:
            return None
        path, ident, digest = self.pack_named
        return packs.read(path, (tuple(ident), digest))

    @property
    def config(self) -> tuple:
        """What load_config takes as `known`."""
        return self.yaml, self.digest, self.names

    def arrays(self, cache, names, hash_: str, description: list, arrays: dict) -> dict[str, CachedArray]:
        """The arrays `names` of one index held in `cache`'s files, each known from
        this record (checked against its file before its bytes are used)."""
        if hash_ != cache.hash or sorted(arrays) != sorted(names):
            raise ValueError(f"{self.path}: not the arrays of {cache.base}")
        cache.description_file = tuple(description)
        return RecordedArrays(self, cache, arrays)


class RecordedArrays(MutableMapping):
    """One index's arrays as its record gives them: each CachedArray made when first
    asked for (a re-open of 20,000 indices asks for none; their lengths come from
    the recorded shapes), then held as the caller stores it (mapped, say)."""

    __slots__ = ("_resolved", "_record", "_cache", "_facts", "_held")

    def __init__(self, resolved: Resolved, cache, facts: dict) -> None:
        self._resolved, self._record, self._cache, self._facts, self._held = resolved, resolved.path, cache, facts, {}

    def __getitem__(self, name: str):
        found = self._held.get(name)
        if found is None:
            if name not in self._facts:
                raise KeyError(name)
            # Where a mount reads it: the config's pack where there is one (its `.npy` is not
            # opened on a node that mounts from the pack), else its own file.
            path, offset, dtype, shape, saved, record = self._fact(name)
            found = self._held[name] = CachedArray(path, dtype, shape, offset, file=saved, known_from=record)
            if len(self._held) == len(self._facts):  # all made: the record's lists need not stay (a mount's memory)
                self._facts = tuple(self._facts)
        return found

    def __setitem__(self, name: str, value) -> None:
        if name not in self._facts:
            raise KeyError(name)
        self._held[name] = value

    def __delitem__(self, name: str) -> None:
        raise TypeError("the arrays of an index are fixed")

    def __iter__(self):
        return iter(self._facts)

    def __len__(self) -> int:
        return len(self._facts)

    def facts(self, names: tuple[str, ...]) -> list[tuple] | None:
        """(path, offset, dtype, shape, file identity, this record) of each of the arrays
        `names`, without making them (the placer takes them as they are); None once one
        is made (it is held as the caller stored it). With the config's pack, each is
        where the pack holds it (checked against the pack's own table: a record that
        disagrees is removed, HeaderFileLied), with the pack's identity, and nothing
        left to check against a `.npy` header (None)."""
        if self._held or not isinstance(self._facts, dict):
            return None
        return [self._fact(name) for name in names]

    def _fact(self, name: str) -> tuple:
        """facts() of one array (its facts still held as the record gave them)."""
        prefix, record = self._cache.path(""), self._record
        descr, shape, offset, saved = self._facts[name]
        pack = self._resolved.pack
        packed = None if pack is None else pack.table.get(prefix[:-1])
        if packed is None:
            return (f"{prefix}{name}.npy", offset, _dtype(descr), tuple(shape), tuple(saved), record)
        found = packed.get(name) if isinstance(packed, dict) else packed
        if not isinstance(found, list) or len(found) != 5 or found[:2] != [descr, shape] \
                or found[3:] != [offset, saved] or type(found[2]) is not int or found[2] < 0 \
                or found[2] + math.prod(shape) * _dtype(descr).itemsize > pack.file[0]:
            raise CachedArray(f"{prefix}{name}.npy", _dtype(descr), tuple(shape), offset, file=tuple(saved),
                              known_from=record).lied(f"{pack.path}: holds {found} as {prefix}{name}.npy")
        return (pack.path, found[2], _dtype(descr), tuple(shape), pack.file, None)

    def shape_of(self, name: str) -> tuple[int, ...]:
        found = self._held.get(name)
        return tuple(found.shape) if found is not None else tuple(self._facts[name][1])

    def held(self) -> list:
        """The arrays made (or stored) so far; the others are cache files, none in memory."""
        return list(self._held.values())


_DTYPES: dict[str, np.dtype] = {}


def _dtype(descr: str) -> np.dtype:
    found = _DTYPES.get(descr)
    if found is None:
        found = _DTYPES[descr] = np.dtype(descr)
    return found


def _stat(path: str) -> os.stat_result | None:
    try:
        return os.stat(path)
    except (OSError, ValueError):
        return None


def _read_regular(path: str, limit: int) -> tuple[bytes, FileId] | None:
    """At most `limit` bytes of a regular file, and its identity; None for anything
    else (a FIFO put in its place must not block the open) or when it cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except (OSError, ValueError):
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(limit), file_id(st)
    except OSError:
        return None
    finally:
        os.close(fd)


def read(config_path: str) -> Resolved | None:
    """The record of this config if everything it depends on is unchanged, else None."""
    path = record_path(config_path)
    found, config_found = _read_regular(path, RECORD_LIMIT), _read_regular(config_path, MAX_CONFIG_BYTES + 1)
    if found is None or config_found is None:
        return None
    (text, record_file), (config_bytes, _) = found, config_found
    try:
        record = json.loads(text)
    except (ValueError, RecursionError):
        return None
    digest = hashlib.sha256(config_bytes).hexdigest()
    try:
        if record.get("version") != VERSION or record["config"]["sha256"] != digest or record["code"] != _code():
            return None
        for folder, saved in record["folders"].items():
            st = _stat(folder)
            if st is None or [st.st_mtime_ns, st.st_ino] != saved:
                return None
        datasets = {}
        for file, (idx, bin_, header) in record["datasets"].items():
            stats = _stat(file + ".idx"), _stat(file + ".bin")
            if None in stats or [list(file_id(st)) for st in stats] != [idx, bin_]:
                return None
            datasets[file] = (*stats, tuple(header))
        return Resolved(path, record["config"]["yaml"], digest, record["names"], datasets, record["splits"],
                        record_file, record.get("pack"))
    except (LookupError, TypeError, ValueError, AttributeError):
        return None


def forget(config_path: str) -> None:
    unlink_quietly(record_path(config_path))


def _eligible(config, by_file: dict) -> bool:
    raw = config.raw
    return (config.source is not None and config.phases is None and config.tokenizer is None
            and raw.get("data_args_path") is None and raw.get("per_split_data_args_path") is None
            and all(scheme_of(file) is None and getattr(ds, "format_name", None) == "megatron-indexed"
                    and hasattr(ds, "facts") for file, ds in by_file.items())
            and all(spec.json_key is None for spec in config.all_datasets))


def write(config, by_file: dict, splits: dict) -> None:
    """Record what the config resolved to (when its inputs allow a record and every
    index is in the cache); a folder that cannot take it only costs the next
    re-open its time."""
    if not _eligible(config, by_file):
        return
    splits_out: dict[str, list] = {}
    folders: set[str] = set()
    packed: dict[str, dict[str, CachedArray]] = {}  # cache path prefix -> its arrays

    def index(part) -> list | None:
        cache = part.cache
        arrays = {n: part.raw(n) for n in part.names()}
        if cache.folder is None or cache.description_file is None or not all(
                isinstance(a, CachedArray) and a.file for a in arrays.values()):
            return None  # held in memory: not in the cache
        folders.add(cache.folder)
        packed[os.path.join(cache.folder, cache.base)] = arrays
        return [cache.hash, cache.description_file,
                {n: [a.dtype.str, a.shape, a.offset, a.file] for n, a in arrays.items()}]

    for name, split in splits.items():
        gpts = []
        for g in split.gpts:
            entry = index(g)
            if entry is None:
                return
            gpts.append([g.spec.file, g.params.beg, g.params.end, g.params.num_samples, *entry])
        blend = None
        if split.blend is not None:
            entry = index(split.blend)
            if entry is None:
                return
            blend = [split.blend.weights, split.blend.size, *entry]
        splits_out[name] = [gpts, blend]
    yaml, digest = config.source
    # The pack first: written into a cache folder, it changes the folder the record stats.
    pack = packs.ensure(os.path.dirname(next(iter(packed))), packed) if len(packed) >= packs.PACK_FROM else None
    try:
        stats = {folder: os.stat(folder) for folder in sorted(folders)}
        datasets = {file: [list(ds.idx.file_identity), list(ds.bin.file_identity), list(ds.facts())]
                    for file, ds in by_file.items()}
        record = {
            "version": VERSION, "code": _code(),
            "config": {"path": os.path.realpath(config.path), "sha256": digest, "yaml": yaml},
            "folders": {folder: [st.st_mtime_ns, st.st_ino] for folder, st in stats.items()},
            "names": {spec.file: spec.name for spec in config.all_datasets},
            "datasets": datasets, "splits": splits_out, "pack": None if pack is None else pack.named(),
        }
        text = json.dumps(record, separators=(",", ":"))
        again = json.loads(text)
        if again["config"]["yaml"] != yaml or again["splits"] != json.loads(json.dumps(splits_out)) \
                or any(g[1] is not None and g[1][0] != s.blend.weights
                       for g, s in zip(again["splits"].values(), splits.values())):
            return  # what JSON does not hold as it is
    except (OSError, TypeError, ValueError) as exc:
        log.debug("no record of %s: %s", config.path, exc)
        return
    path = record_path(config.path)
    tmp = None
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = temp_name(os.path.dirname(path), path)
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as exc:
        if tmp is not None:
            unlink_quietly(tmp)
        log.debug("%s: not written (%s)", path, exc)
