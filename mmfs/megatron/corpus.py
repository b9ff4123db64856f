"""A config, opened: its datasets, every split's indices, and readers of samples."""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from mmfs.config.schema import Config, load_config
from mmfs.errors import ConfigError, MmfsError
from mmfs.formats import IndexedDataset, open_dataset
from mmfs.megatron.arrays import ArrayPlacer
from mmfs.megatron.build.builder import SplitIndices
from mmfs.megatron.cache import derived, resolved
from mmfs.megatron.cache.npyfile import FileId, HeaderFileLied
from mmfs.megatron.phases.build import PhasedBuilder as Builder
from mmfs.megatron.reader import SplitReader, TokenSource
from mmfs.megatron.tokenized import ensure_tokenized
from mmfs.storage import scheme_of
from mmfs.storage.localfiles import DEFAULT_OPEN_FILES, fit_open_files
from mmfs.storage.settings import configure as configure_storage

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DatasetEntry:
    name: str
    path: str  # as written in the config
    dataset: Any  # IndexedDataset or PackedDataset


class Corpus:
    """Everything a mount or a loader needs to read the samples of a config."""

    def __init__(self, config: Config, datasets: list[DatasetEntry], by_file: dict,
                 splits: dict[str, SplitIndices], map_limit_mb: int | None = None) -> None:
        self.config = config
        self.config_path = config.path
        self.config_dict = config.as_dict()
        self.datasets = datasets
        self.sequence_length = config.sequence_length
        self.sample_tokens = config.sequence_length + int(config.add_extra_token)
        self.eod = config.eod
        self.pad = config.effective_pad
        self.dtype = sample_dtype([d.dataset for d in datasets])
        self._map_limit_mb = map_limit_mb
        self._by_file = by_file
        self.indices = splits
        self.record: tuple[str, FileId] | None = None  # (path, identity) of the record it was opened from

    @property
    def remote(self) -> bool:
        """Whether some dataset is read from object storage (not a local file)."""
        return self.remote_files > 0

    @cached_property
    def remote_files(self) -> int:
        """Datasets read from object storage (a reader keeps a cache file of each open)."""
        return sum(scheme_of(file) is not None for file in self._by_file)

    @cached_property
    def placer(self) -> ArrayPlacer:
        _ = self.splits
        return self._placer

    @cached_property
    def sources(self) -> dict[str, TokenSource]:
        """The C view of each dataset file (made with the split readers)."""
        _ = self.splits
        return self._sources

    @cached_property
    def splits(self) -> dict[str, SplitReader]:
        """Readers of each non-empty split. Made on first use: they map every index
        file, which a summary of the indices (`mmfs build`) does not need.

        An index known from a header file is checked here against its files' own
        headers (their first page is read here anyway); when an entry lied, the
        indices are loaded again from the files themselves."""
        try:
            return self._readers()
        except HeaderFileLied as exc:
            log.warning("%s; loading the indices from their own files", exc.why)
            resolved.forget(self.config_path)
            self.record = None
            self._placer.close()
            self.indices = Builder(self.config, self._by_file, trust_header_files=False).build()
            return self._readers()

    def derived(self, name: str, key: str, make: Callable[[], bytes]) -> bytes:
        """Bytes derived from this corpus alone (`make`): kept beside the record it was
        opened from (cache/derived.py), taken from there while that record is the same
        file and `key` the same. Its indices are checked first (the readers: a record
        that lies is removed, then nothing derived from it is kept)."""
        _ = self.splits
        if self.record is None:
            return make()
        found = derived.read(*self.record, name, key)
        if found is None:
            found = make()
            derived.write(*self.record, name, key, found)
        return found

    @cached_property
    def phase_splits(self) -> list[dict[str, SplitReader]]:
        """Under phase_mode restart, per phase the readers of its own valid and test
        (as its relaunch builds them: megatron/phases/evals.py); else []."""
        _ = self.splits
        return self._phase_splits

    def _readers(self) -> dict[str, SplitReader]:
        limit = self._map_limit_mb
        if limit is None and self._index_files() > MAPS_AT_MOST:
            limit = 0  # every array read with pread: a map each would pass the kernel's vm.max_map_count
        self._placer = ArrayPlacer(None if limit is None else limit << 20)
        self._sources = {file: TokenSource(ds, self._placer) for file, ds in self._by_file.items()}
        made: dict[int, SplitReader] = {}  # one reader per SplitIndices (a phase may share the top level's)

        def reader(s: SplitIndices) -> SplitReader:
            if id(s) not in made:
                made[id(s)] = SplitReader(s, self._sources, self.dtype, self.sample_tokens, self.pad, self._placer)
            return made[id(s)]

        splits = {name: reader(s) for name, s in self.indices.items() if len(s) > 0}
        self._phase_splits = [{name: reader(s) for name, s in own.items() if len(s) > 0}
                              for own in phase_evals(self.indices)]
        self._placer.finish()
        return splits

    def _index_files(self) -> int:
        """Cache files of the indices (and the datasets' files): the maps it takes to map them all."""
        return 2 * len(self._by_file) + sum(3 * len(s.gpts) + 2 for s in self.indices.values())


# Files a process maps at most to read samples; beyond, it reads them with pread
# (each map is an area of the process; Linux allows 65,530 by default).
MAPS_AT_MOST = 16384


def phase_evals(indices: dict[str, SplitIndices]) -> list[dict[str, SplitIndices]]:
    """Per phase of a restart run, its own valid and test indices; else []."""
    return getattr(indices.get("train"), "evals", None) or []


def sample_dtype(datasets: list) -> np.dtype:
    """One dtype for every sample file: the widest of the datasets'."""
    return np.dtype(np.result_type(*[d.dtype for d in datasets])).newbyteorder("<")


def check_token_ids(config: Config, dtype: np.dtype) -> None:
    """An eod or pad id the datasets' tokens cannot hold: the tokenizer is not the
    one that wrote them. No eod would ever be found (Megatron runs on, masking no
    document end), and a padded sample's file could not hold the pad (Megatron's
    -1, no pad, is kept: it is the dtype's top value, which its preprocessing never
    gives a token)."""
    if dtype.kind not in "iu":
        return
    top = int(np.iinfo(dtype).max)
    if config.eod > top:
        raise ConfigError(f"{config.path}: tokenizer.eod: {config.eod} cannot occur in the datasets' {dtype.name} "
                          f"tokens (at most {top}): they were not written with this tokenizer; give the "
                          "end-of-document id of the tokenizer that wrote them")
    if config.pad is not None and config.pad > top:
        raise ConfigError(f"{config.path}: tokenizer.pad: {config.pad} does not fit the datasets' {dtype.name} "
                          f"tokens (at most {top}), so a padded sample's file cannot hold it; give the pad id of "
                          "the tokenizer that wrote them, or -1 (none)")


@contextmanager
def _collector_paused(freeze: bool):
    """Opening a blend of thousands of datasets makes hundreds of thousands of small
    objects and no garbage cycles to speak of; the cyclic collector's passes over
    them cost a tenth of a cached re-open. freeze: the caller keeps the corpus to
    its end (a command, a mount), so what was made is moved out of the collector's
    reach (gc.freeze) before it runs again: else its first pass walks it all."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if freeze:
            gc.freeze()
        if enabled:
            gc.enable()


def open_corpus(config_path: str | Config, progress: bool = True, map_limit_mb: int | None = None,
                jobs: int | None = None, freeze: bool = False) -> Corpus:
    """Load a config (or take one loaded before: a mount's, as it was when mounted), open
    its datasets and build (or load) every index.

    progress: log what is being built, with timings (logging level INFO).
    map_limit_mb: keep at most this many MB of index and token files mapped and
    read the rest with pread (for long-running readers, whose resident memory
    must not grow with what they read; see arrays.py). None: map everything.
    jobs: indices built at once (default: one per CPU).
    freeze: the corpus is kept to the process's end: the objects made are frozen
    (gc.freeze), never walked by the collector again."""
    with _collector_paused(freeze):
        return _open_corpus(config_path, progress, map_limit_mb, jobs)


def _open_corpus(config_path: str | Config, progress: bool, map_limit_mb: int | None,
                 jobs: int | None) -> Corpus:
    t0 = time.perf_counter()
    sampling_log = logging.getLogger("mmfs.megatron")
    saved_level = sampling_log.level
    if not progress:
        sampling_log.setLevel(logging.WARNING)
    try:
        # A Config given loaded (a mount's snapshot) may differ from its file on disk,
        # which is what the record is checked against: it is resolved the full way.
        record = None if isinstance(config_path, Config) else resolved.read(config_path)
        opened = None if record is None else _from_record(config_path, record, jobs)
        if opened is None:
            record = None
            opened = _resolve(config_path, jobs)
            if not isinstance(config_path, Config):
                resolved.write(*opened)
    finally:
        sampling_log.setLevel(saved_level)
    config, by_file, splits = opened
    entries = [DatasetEntry(spec.name, spec.path, by_file[spec.file]) for spec in config.all_datasets]
    corpus = Corpus(config, entries, by_file, splits, map_limit_mb)
    if record is not None:
        corpus.record = record.path, record.file
    if progress:
        log.info("indices ready in %.2f s: %s", time.perf_counter() - t0,
                 ", ".join(f"{n} {len(s)} samples" for n, s in corpus.indices.items() if len(s))
                 or "no samples")
    return corpus


def _resolve(config_path: str | Config, jobs: int | None) -> tuple[Config, dict, dict[str, SplitIndices]]:
    """The config, its datasets opened and every split's indices built or loaded."""
    if isinstance(config_path, Config):
        config = config_path
        configure_storage(config.storage)  # as load_config does, before any dataset is looked at
    else:
        config = load_config(config_path)
    specs = config.all_datasets
    for spec in specs:
        if spec.text is not None:
            ensure_tokenized(spec.text)
    by_file = {spec.file: open_dataset(spec.file) for spec in specs}
    check_token_ids(config, sample_dtype(list(by_file.values())))
    return config, by_file, Builder(config, by_file, jobs).build()


def _from_record(config_path: str, record: resolved.Resolved,
                 jobs: int | None) -> tuple[Config, dict, dict[str, SplitIndices]] | None:
    """What _resolve gives, read from the record of this config (found unchanged,
    with everything it depends on: cache/resolved.py); None when it fails."""
    try:
        config = load_config(config_path, known=record.config)
        by_file = {spec.file: IndexedDataset(spec.file, known=record.datasets[spec.file])
                   for spec in config.all_datasets}
        check_token_ids(config, sample_dtype(list(by_file.values())))
        return config, by_file, Builder(config, by_file, jobs).from_record(record)
    except (MmfsError, LookupError, TypeError, ValueError) as exc:  # not what was recorded: the full way
        log.debug("%s: the record %s is not used (%s)", config_path, record.path, exc)
        resolved.forget(config_path)
        return None


# Index arrays held in memory (not mapped from the cache) above this size are
# re-opened from the cache by open_corpus_for_serving.
REOPEN_ABOVE = 32 << 20


def index_bytes_in_memory(corpus: Corpus) -> int:
    """Bytes of the corpus's index arrays held in memory rather than mapped from
    their cache files (a .pbin's sequence table is always in memory: not counted)."""
    total = 0
    splits = {id(s): s for s in corpus.indices.values()}
    splits.update((id(s), s) for own in phase_evals(corpus.indices) for s in own.values())
    for s in splits.values():
        total += sum(g.bytes_in_memory() for g in s.gpts)
        if s.blend is not None:
            total += s.blend.bytes_in_memory()
    return total


def _packed_since(corpus: Corpus) -> bool:
    """Whether the corpus was opened the full way and its open wrote a record naming
    the config's pack (cache/pack.py): opened again from that record, its readers
    read the pack, one file, not each index's .npy files (a node without the record)."""
    if corpus.record is not None or not isinstance(corpus.config_path, str):
        return False
    record = resolved.read(corpus.config_path)
    return record is not None and bool(record.pack_named)


def open_corpus_for_serving(config_path: str, progress: bool = True, map_limit_mb: int = 64,
                            open_files: int = DEFAULT_OPEN_FILES, freeze: bool = False) -> Corpus:
    """open_corpus for a long-running reader (the mount daemon): indices just
    built, and so held in memory, are re-opened from the cache, so that the
    reader's resident memory does not hold them. At most `open_files` dataset and
    index files are kept open (localfiles.py); the open-file limit is raised for
    them, and for the cache file of each dataset in object storage, where needed."""
    corpus = open_corpus(config_path, progress=progress, map_limit_mb=map_limit_mb, freeze=freeze)
    fit_open_files(corpus.remote_files, open_files, f"the mount of {config_path}")
    if index_bytes_in_memory(corpus) <= REOPEN_ABOVE and not _packed_since(corpus):
        return corpus
    log.info("re-opening the indices from the cache")
    corpus = open_corpus(config_path, progress=False, map_limit_mb=map_limit_mb, freeze=freeze)
    held = index_bytes_in_memory(corpus)
    if held > REOPEN_ABOVE:
        log.warning("the index cache could not be used: %.0f MB of indices stay in memory "
                    "(is cache_dir writable?)", held / 1e6)
    return corpus


__all__ = ["Corpus", "DatasetEntry", "open_corpus", "open_corpus_for_serving", "MmfsError"]
