"""megatron-core's BlendedMegatronDatasetBuilder, for GPT: from a Config and the
opened datasets to each split's GPTDataset indices and, where Megatron blends,
the BlendedDataset indices. Indices come from the cache when it has them.

Where megatron-core hangs or asserts (a split with no sequences, weights without
a size, a blend that draws more samples than a dataset has), this raises a
ConfigError naming the YAML file and the key instead.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field

import numpy as np

from ..config import SPLITS, Config, DatasetSpec
from ..errors import ConfigError
from .blend import (
    MAX_DATASETS,
    blend_description,
    build_blending_indices,
    build_exhaustive_blending_indices,
    sizes_per_dataset,
)
from .cache import IndexCache
from .gpt import GptParams, build_gpt_indices, check_gpt_build
from .splits import normalize, split_matrix, split_range

log = logging.getLogger(__name__)

GPT_ARRAYS = {
    "document_index": (("int32",), 1),
    "sample_index": (("int32", "int64"), 2),
    "shuffle_index": (("uint32", "int64"), 1),
}
BLEND_ARRAYS = {
    "dataset_index": (("int16",), 1),
    "dataset_sample_index": (("int64",), 1),
}


@dataclass
class GptIndices:
    """One GPTDataset: a dataset, a split of its sequences, and its three indices."""

    spec: DatasetSpec
    params: GptParams
    cache: IndexCache
    document_index: np.ndarray
    sample_index: np.ndarray
    shuffle_index: np.ndarray
    from_cache: bool

    def __len__(self) -> int:
        return self.sample_index.shape[0] - 1


@dataclass
class BlendIndices:
    weights: list
    size: int | None
    cache: IndexCache
    dataset_index: np.ndarray
    dataset_sample_index: np.ndarray
    from_cache: bool


@dataclass
class SplitIndices:
    """What a split's top-level dataset is: one GPTDataset, or a blend of several."""

    name: str
    gpts: list[GptIndices]
    blend: BlendIndices | None = None
    notes: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        if self.blend is None:
            return len(self.gpts[0])
        return self.blend.dataset_index.shape[0]


def default_cache_dir(spec: DatasetSpec, class_name: str = "GPTDataset") -> str:
    """Megatron's default: <dataset prefix>/cache/<Class>_indices. (Megatron does not
    cache blends without a cache path; mmfs keeps them beside the first dataset's.)"""
    prefix = spec.file[:-5] if spec.file.endswith(".pbin") else spec.file
    return os.path.join(prefix, "cache", f"{class_name}_indices")


class Builder:
    """Builds (or loads) every split of a config. `datasets` maps DatasetSpec.file
    to the opened dataset (anything with sequence_lengths and num_sequences)."""

    def __init__(self, config: Config, datasets: dict) -> None:
        self.config = config
        self.datasets = datasets
        self.step = 0

    # -- errors --------------------------------------------------------------

    def fail(self, key: str, message: str) -> ConfigError:
        return ConfigError(f"{self.config.path}: {key}: {message}")

    # -- one GPTDataset ----------------------------------------------------------

    def gpt(self, spec: DatasetSpec, split: str, bookend: tuple, num_samples: int | None,
            key: str) -> GptIndices:
        c = self.config
        dataset = self.datasets[spec.file]
        beg, end = split_range(bookend, dataset.num_sequences)
        if end <= beg:
            raise self.fail(
                key,
                f"the {split} split gets 0 of the {dataset.num_sequences} sequences of "
                f"{spec.path}; Megatron cannot build it (it loops forever). Give {split} a "
                "larger share or set its share to 0",
            )
        params = GptParams(
            dataset_path=spec.path,
            split=split,
            beg=beg,
            end=end,
            num_samples=num_samples,
            sequence_length=c.sequence_length,
            seed=c.seed,
            add_extra_token=c.add_extra_token,
            drop_last_partial=c.drop_last_partial_validation_sequence if split == "valid" else True,
            config_split=c.split,
            config_split_matrix=None if c.split is None else split_matrix(c.split),
            tokenizer_identifiers=c.tokenizer_identifiers,
        )
        cache = IndexCache(c.cache_dir or default_cache_dir(spec), params.description(),
                           "GPTDataset", split)
        label = f"{split}/{spec.name}"
        arrays = cache.load(GPT_ARRAYS)
        if arrays is not None and self._gpt_arrays_fit(arrays, params):
            log.info("%s: indices loaded from cache %s", label, cache.path("*"))
            return GptIndices(spec, params, cache, from_cache=True, **arrays)
        check_gpt_build(dataset, params, cache.folder, c.path)
        lengths = dataset.sequence_lengths
        if int(np.asarray(lengths[beg:end]).sum(dtype=np.int64)) == 0:
            raise self.fail(key, f"the {split} split of {spec.path} (sequences {beg}..{end}) "
                                 "holds no tokens; nothing can be sampled from it")
        self.step += 1
        log.info("[%d] building %s indices", self.step, label)
        arrays = build_gpt_indices(lengths, params, label)
        cache.save(arrays)
        return GptIndices(spec, params, cache, from_cache=False, **arrays)

    @staticmethod
    def _gpt_arrays_fit(arrays: dict, p: GptParams) -> bool:
        """O(1) checks that cached arrays belong together (a mismatch means rebuild)."""
        doc, sample, shuffle = (arrays["document_index"], arrays["sample_index"],
                                arrays["shuffle_index"])
        n = p.end - p.beg
        ok = (sample.shape[1:] == (2,) and sample.shape[0] >= 1
              and shuffle.shape[0] == sample.shape[0] - 1
              and doc.shape[0] % n == 0 and doc.shape[0] >= n)
        if ok and sample.shape[0] > 0:
            ok = int(sample[0, 0]) == 0 and int(sample[0, 1]) == 0 and \
                0 <= int(sample[-1, 0]) < doc.shape[0]
        if not ok:
            log.warning("%s: cached indices do not fit together; rebuilding", p.dataset_path)
        return ok

    # -- one blend --------------------------------------------------------------

    def blend(self, split: str, gpts: list[GptIndices], weights: list, size: int | None,
              key: str) -> BlendIndices:
        c = self.config
        if size is not None:
            weights = normalize(weights)  # BlendedDataset normalises again, as Megatron does
        description = blend_description([g.params.identifiers() for g in gpts], split, weights, size)
        folder = c.cache_dir or default_cache_dir(gpts[0].spec, "BlendedDataset")
        cache = IndexCache(folder, description, "BlendedDataset", split)
        arrays = cache.load(BLEND_ARRAYS)
        expected = size if size is not None else sum(weights)
        if arrays is not None and arrays["dataset_index"].shape[0] == expected and \
                arrays["dataset_sample_index"].shape[0] == expected:
            log.info("%s/blend: indices loaded from cache", split)
            return BlendIndices(weights, size, cache, from_cache=True, **arrays)
        t0 = time.perf_counter()
        if size is not None:
            arrays = build_blending_indices(weights, size)
        else:
            arrays = build_exhaustive_blending_indices(weights)
        self._check_blend_fits(split, gpts, arrays, key)
        log.info("%s/blend: blending index of %d samples over %d datasets (%.2f s)", split,
                 expected, len(gpts), time.perf_counter() - t0)
        cache.save(arrays)
        return BlendIndices(weights, size, cache, from_cache=False, **arrays)

    def _check_blend_fits(self, split: str, gpts: list[GptIndices], arrays: dict, key: str) -> None:
        drawn = np.bincount(arrays["dataset_index"], minlength=len(gpts))
        for k, g in enumerate(gpts):
            if drawn[k] > len(g):
                raise self.fail(
                    key,
                    f"the {split} blend draws {drawn[k]} samples from {g.spec.name} but it has "
                    f"only {len(g)}; raise mid_level_dataset_surplus",
                )

    # -- all splits ------------------------------------------------------------------

    def build(self) -> dict[str, SplitIndices]:
        c = self.config
        if c.blend is not None:
            matrix = split_matrix(c.split)
            key = "datasets" if c.raw.get("datasets") is not None else "data_path"
            bookends = {s: matrix[i] for i, s in enumerate(SPLITS)}
            return self._build_blend(c.blend.datasets, c.blend.weights, bookends, key, per_split=False)
        out = {}
        for s in SPLITS:
            blend = c.blend_per_split[s]
            if blend is None:
                continue
            built = self._build_blend(blend.datasets, blend.weights, {s: (0.0, 1.0)},
                                      f"blend_per_split.{s}", per_split=True)
            out.update(built)
        return out

    def _build_blend(self, specs, weights, bookends: dict, key: str,
                     per_split: bool) -> dict[str, SplitIndices]:
        c = self.config
        if len(specs) > MAX_DATASETS:
            raise self.fail(key, f"{len(specs)} datasets; Megatron blends at most {MAX_DATASETS}")
        if weights is not None:
            weights = normalize(weights)
        out = {}
        for split, bookend in bookends.items():
            if bookend is None:
                continue
            size = c.samples[split]
            # Megatron: one prefix without weights is the GPTDataset itself; with
            # blend_per_split, one prefix is never blended.
            if len(specs) == 1 and (weights is None or per_split):
                out[split] = SplitIndices(split, [self.gpt(specs[0], split, bookend, size, key)])
                continue
            if weights is not None:
                if size is None:
                    raise self.fail(
                        f"samples.{split}",
                        f"missing: the datasets have weights, so the {split} split needs a "
                        "sample count (Megatron asserts here); give one or drop the weights",
                    )
                target = sizes_per_dataset(weights, size)
                buffer = sizes_per_dataset(weights, size, c.mid_level_dataset_surplus)
                gpts = [self.gpt(s, split, bookend, n, key) for s, n in zip(specs, buffer)]
                out[split] = SplitIndices(split, gpts,
                                          self.blend(split, gpts, weights, sum(target), key))
            else:
                gpts = [self.gpt(s, split, bookend, None, key) for s in specs]
                lengths = [len(g) for g in gpts]
                for g, n in zip(gpts, lengths):
                    if n == 0:
                        raise self.fail(key, f"{g.spec.path} has no {split} samples (its {split} "
                                             "tokens do not fill one sequence); Megatron "
                                             "cannot weight it by length")
                blend_size = None if size is None else min(size, sum(lengths))
                out[split] = SplitIndices(split, gpts,
                                          self.blend(split, gpts, lengths, blend_size, key))
        return out
