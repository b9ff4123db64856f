"""The indices a build yields: one GPTDataset's three arrays, a blend's two, and
what a split's top-level dataset is made of. Each array is in memory or a cache
file mapped on first use."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mmfs.config.schema import DatasetSpec
from mmfs.megatron.arrays import file_region
from mmfs.megatron.cache.index_cache import IndexCache
from mmfs.megatron.cache.npyfile import CachedArray
from mmfs.megatron.cache.resolved import RecordedArrays
from mmfs.megatron.indices.gpt import GptParams

GPT_ARRAYS = {
    "document_index": (("int32",), 1),
    "sample_index": (("int32", "int64"), 2),
    "shuffle_index": (("uint32", "int64"), 1),
}
BLEND_ARRAYS = {
    "dataset_index": (("int16",), 1),
    "dataset_sample_index": (("int64",), 1),
}


class _Arrays:
    """Named arrays, each in memory or a CachedArray mapped on first use, and the
    cache they belong to."""

    def __init__(self, arrays: dict | RecordedArrays, cache: IndexCache, from_cache: bool) -> None:
        # A record's arrays are made as they are asked for (cache/resolved.py).
        self._arrays = arrays if isinstance(arrays, RecordedArrays) else dict(arrays)
        self.cache = cache
        self.from_cache = from_cache

    def array(self, name: str) -> np.ndarray:
        a = self._arrays[name]
        if isinstance(a, CachedArray):
            a = self._arrays[name] = a.map()
        return a

    def shape(self, name: str) -> tuple[int, ...]:
        if isinstance(self._arrays, RecordedArrays):
            return self._arrays.shape_of(name)
        return tuple(self._arrays[name].shape)

    def names(self) -> list[str]:
        return list(self._arrays)

    def raw(self, name: str) -> np.ndarray | CachedArray:
        """The array as held: in memory, or (not mapped yet) a CachedArray."""
        return self._arrays[name]

    def recorded(self, names: tuple[str, ...]) -> list[tuple] | None:
        """(path, offset, dtype, shape, file identity, record) of each of the arrays
        `names` as a record gives them, none made yet (ArrayPlacer.place_file's
        arguments); else None."""
        return self._arrays.facts(names) if isinstance(self._arrays, RecordedArrays) else None

    def bytes_in_memory(self) -> int:
        """Bytes of these arrays held in memory rather than in cache files (which
        are mapped on first use); O(1) per array, maps nothing."""
        held = self._arrays.held() if isinstance(self._arrays, RecordedArrays) else self._arrays.values()
        if not held:  # (a record's 20,000 indices, none made)
            return 0
        return sum(int(a.nbytes) for a in held
                   if not isinstance(a, CachedArray) and file_region(a) is None)


class GptIndices(_Arrays):
    """One GPTDataset: a dataset, a split of its sequences, and its three indices."""

    def __init__(self, spec: DatasetSpec, params: GptParams, cache: IndexCache, arrays: dict,
                 from_cache: bool) -> None:
        super().__init__(arrays, cache, from_cache)
        self.spec = spec
        self.params = params

    document_index = property(lambda self: self.array("document_index"))
    sample_index = property(lambda self: self.array("sample_index"))
    shuffle_index = property(lambda self: self.array("shuffle_index"))

    def __len__(self) -> int:
        return self.shape("sample_index")[0] - 1


class BlendIndices(_Arrays):
    def __init__(self, weights: list, size: int | None, cache: IndexCache, arrays: dict,
                 from_cache: bool) -> None:
        super().__init__(arrays, cache, from_cache)
        self.weights = weights
        self.size = size

    dataset_index = property(lambda self: self.array("dataset_index"))
    dataset_sample_index = property(lambda self: self.array("dataset_sample_index"))


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
        return self.blend.shape("dataset_index")[0]
