"""A config, opened: its datasets, every split's indices, and readers of samples."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from .. import __version__
from ..config import SPLITS, Config, load_config
from ..errors import MmfsError
from ..formats import open_dataset
from .arrays import ArrayPlacer
from .builder import Builder, SplitIndices
from .reader import SplitReader, TokenSource

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
        # One dtype for every sample file: the widest of the datasets'.
        self.dtype = np.dtype(np.result_type(*[d.dataset.dtype for d in datasets])).newbyteorder("<")
        self._map_limit_mb = map_limit_mb
        self._by_file = by_file
        self.indices = splits

    @cached_property
    def placer(self) -> ArrayPlacer:
        _ = self.splits
        return self._placer

    @cached_property
    def splits(self) -> dict[str, SplitReader]:
        """Readers of each non-empty split. Made on first use: they map every index
        file, which a summary of the indices (`mmfs build`) does not need."""
        limit = self._map_limit_mb
        self._placer = ArrayPlacer(None if limit is None else limit << 20)
        sources = {file: TokenSource(ds, self._placer) for file, ds in self._by_file.items()}
        splits = {
            name: SplitReader(s, sources, self.dtype, self.sample_tokens, self.pad, self._placer)
            for name, s in self.indices.items()
            if len(s) > 0
        }
        self._placer.finish()
        return splits

    def describe(self) -> dict[str, Any]:
        """What a loader needs to read the sample files (the core of mmfs.json)."""
        return {
            "mmfs_version": __version__,
            "dtype": self.dtype.name,
            "byte_order": "little",
            "sequence_length": self.sequence_length,
            "add_extra_token_to_sequence": self.config.add_extra_token,
            "tokens_per_sample": self.sample_tokens,
            "bytes_per_sample": self.sample_tokens * self.dtype.itemsize,
            "eod_id": self.eod,
            "pad_id": self.pad,
            "pad_value_in_dtype": int(np.array(self.pad).astype(self.dtype)),
            "samples": {name: len(self.indices[name]) for name in SPLITS
                        if name in self.indices and len(self.indices[name]) > 0},
            "splits": {name: self._describe_split(s) for name, s in self.indices.items()},
            "datasets": [
                {
                    "name": d.name,
                    "path": d.path,
                    "format": d.dataset.format_name,
                    "dtype": d.dataset.dtype.name,
                    "sequences": int(d.dataset.num_sequences),
                    "documents": int(d.dataset.num_documents),
                }
                for d in self.datasets
            ],
            "config": self.config_dict,
        }

    @staticmethod
    def _describe_split(s: SplitIndices) -> dict[str, Any]:
        out: dict[str, Any] = {
            "top_level": "BlendedDataset" if s.blend else "GPTDataset",
            "samples": len(s),
            "gpt_datasets": [
                {
                    "dataset": g.spec.name,
                    "sequences": [g.params.beg, g.params.end],
                    "num_samples_requested": g.params.num_samples,
                    "samples": len(g),
                    "epochs": g.shape("document_index")[0] // (g.params.end - g.params.beg),
                    "cache": g.cache.path("*"),
                }
                for g in s.gpts
            ],
        }
        if s.blend:
            out["blend"] = {"weights": s.blend.weights, "size": s.blend.size,
                            "cache": s.blend.cache.path("*")}
        return out


def open_corpus(config_path: str, progress: bool = True, map_limit_mb: int | None = None,
                jobs: int | None = None) -> Corpus:
    """Load a config, open its datasets and build (or load) every index.

    progress: log what is being built, with timings (logging level INFO).
    map_limit_mb: keep at most this many MB of index and token files mapped and
    read the rest with pread (for long-running readers, whose resident memory
    must not grow with what they read; see arrays.py). None: map everything.
    jobs: indices built at once (default: one per CPU)."""
    t0 = time.perf_counter()
    config = load_config(config_path)
    specs = config.all_datasets
    by_file = {spec.file: open_dataset(spec.file) for spec in specs}
    entries = [DatasetEntry(spec.name, spec.path, by_file[spec.file]) for spec in specs]
    sampling_log = logging.getLogger("mmfs.sampling")
    saved_level = sampling_log.level
    if not progress:
        sampling_log.setLevel(logging.WARNING)
    try:
        splits = Builder(config, by_file, jobs).build()
    finally:
        sampling_log.setLevel(saved_level)
    corpus = Corpus(config, entries, by_file, splits, map_limit_mb)
    if progress:
        log.info("indices ready in %.2f s: %s", time.perf_counter() - t0,
                 ", ".join(f"{n} {len(s)} samples" for n, s in corpus.indices.items() if len(s))
                 or "no samples")
    return corpus


__all__ = ["Corpus", "DatasetEntry", "open_corpus", "MmfsError"]
